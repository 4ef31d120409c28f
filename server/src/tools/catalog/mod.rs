//! The tool catalog, loaded from `config/tools.toml`. Loading checks everything (schemas
//! compile, names are valid for Anthropic and OpenAI and unique, managed and secret fields are
//! declared, referenced secrets are set) and reports every problem at once, with file and key.
//! Each definition carries a version hash, so an audit row names exactly what was called.

mod load;

pub use load::fits_tool_call_budget;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::schema::closed_schema;
use crate::config::duration_str;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Builtin,
    Connector,
    Mcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Read,
    Write,
    Admin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Audience {
    Public,
    OwnerOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Low,
    Medium,
    High,
}

/// Per-tool approval rule, applied under the global [`ApprovalMode`] (the table is
/// [`super::policy::decide`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Exempt from ASK mode's blanket question; medium and high risk still ask.
    Never,
    /// Follows the approval mode.
    #[default]
    Ask,
    /// Asks in every mode, YOLO included.
    Always,
}

/// Global approval mode: `yolo` never asks (except tools marked `always`), `auto` asks for
/// medium and high risk, `ask` asks for everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    Yolo,
    #[default]
    Auto,
    Ask,
}

pub use crate::domain::ChatKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AsyncPolicy {
    #[default]
    Allowed,
    Required,
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    #[serde(with = "duration_str")]
    pub backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 1, backoff: Duration::from_millis(500) }
    }
}

fn default_chat_types() -> Vec<ChatKind> {
    vec![ChatKind::Direct, ChatKind::Group]
}
fn default_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_max_result_bytes() -> u64 {
    50_000
}
fn default_true() -> bool {
    true
}

/// One tool as written in the config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub name: String,
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub when_to_use: String,
    #[serde(default)]
    pub when_not_to_use: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Phrases the cheap candidate detector matches on.
    #[serde(default)]
    pub triggers: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// The candidate detector's plan threshold (0..1) for messages where this tool is the best
    /// candidate; unset follows `[lane.detector] plan_threshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_threshold: Option<f32>,
    pub provider: Provider,
    /// For built-in tools: which implementation runs it.
    #[serde(default)]
    pub handler: Option<String>,
    pub operation: Operation,
    pub audience: Audience,
    pub risk: Risk,
    #[serde(default)]
    pub approval: Approval,
    #[serde(default = "default_chat_types")]
    pub chat_types: Vec<ChatKind>,
    pub input_schema: serde_json::Value,
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// Filled by the runtime (chat id, sender, ...), never by the model.
    #[serde(default)]
    pub managed_fields: Vec<String>,
    /// Field name to the environment variable that holds its value; the model never sees it.
    #[serde(default)]
    pub secret_fields: BTreeMap<String, String>,
    #[serde(default = "default_timeout", with = "duration_str")]
    pub timeout: Duration,
    #[serde(default)]
    pub retry: RetryPolicy,
    #[serde(default)]
    pub async_policy: AsyncPolicy,
    #[serde(default)]
    pub chainable: bool,
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: u64,
    /// The reply to a complete result, written by the owner and sent as written with the
    /// result's values in it (`{field}`, `{a.b}`, `{items.0.title}`), instead of the one the
    /// summarizer writes (`tools::answer`). Unset: the summarizer writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_template: Option<String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
}

impl ToolSpec {
    /// Result fields never shown, stored as text or given to a model: the tool's managed and
    /// secret fields.
    pub fn hidden_fields(&self) -> Vec<String> {
        self.managed_fields.iter().chain(self.secret_fields.keys()).cloned().collect()
    }

    /// A result as it may be shown or stored as text: fields whose names look secret, and the
    /// [`Self::hidden_fields`], replaced.
    pub fn redact_result(&self, value: &mut serde_json::Value) {
        crate::redact::redact(value);
        crate::redact::redact_named(value, &self.hidden_fields(), crate::redact::REDACTED);
    }
}

/// A checked tool, ready for the checkpoint.
pub struct ToolDef {
    pub spec: ToolSpec,
    /// `sha256:` of the definition's canonical JSON.
    pub version: String,
    /// The input schema as the checkpoint validates it (see [`closed_schema`]): objects that do
    /// not say whether they take other properties take none. `spec.input_schema` stays as
    /// written, for owners and the version hash; the planner is shown this one, since it is
    /// what a call must satisfy.
    pub closed_input_schema: serde_json::Value,
    pub input_validator: jsonschema::Validator,
    pub output_validator: Option<jsonschema::Validator>,
    /// For connector tools: the HTTP action from `connectors.toml` that runs it.
    pub connector: Option<Arc<super::connectors::ConnectorAction>>,
}

impl ToolDef {
    /// A definition made at run time (from MCP discovery), under the same rules as the file:
    /// a valid name, an object input schema, schemas that compile.
    pub fn from_spec(spec: ToolSpec) -> Result<Self, String> {
        if !valid_tool_name(&spec.name) {
            return Err(format!("{:?} is not a valid tool name", spec.name));
        }
        if spec.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
            return Err("the input schema must have \"type\": \"object\"".into());
        }
        let closed_input_schema = closed_schema(&spec.input_schema);
        let input_validator = compile(&closed_input_schema, true).map_err(|e| format!("the input schema does not compile: {e}"))?;
        let output_validator = spec.output_schema.as_ref().map(|s| compile(s, false)).transpose().map_err(|e| format!("the output schema does not compile: {e}"))?;
        let version = version_hash(&spec);
        Ok(Self { spec, version, closed_input_schema, input_validator, output_validator, connector: None })
    }
}

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef").field("name", &self.spec.name).field("version", &self.version).finish_non_exhaustive()
    }
}

/// `[audit]` in tools.toml: what the tool-call audit keeps out of its rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// Argument names (at any depth, case-insensitive) whose values are personal data and are
    /// replaced in audit rows. Secret fields are always replaced.
    #[serde(default)]
    pub pii_fields: Vec<String>,
}

/// The loaded catalog. Swapped whole on reload; a call in flight keeps the `Arc` it started with.
#[derive(Debug, Default)]
pub struct Catalog {
    pub approval_mode: ApprovalMode,
    tools: BTreeMap<String, Arc<ToolDef>>,
    /// In priority order (lower first).
    pub hooks: Vec<super::hooks::Hook>,
    pub audit: AuditSettings,
    /// Tools that exist but are not offered (an MCP tool waiting for an owner, say): a call
    /// fails with the given code instead of `TOOL_UNKNOWN`.
    withheld: BTreeMap<String, Withheld>,
    /// Each connector's secret variables, enabled or not (see `tools::secrets_named`).
    pub connector_secrets: Vec<super::connectors::ConnectorSecrets>,
}

/// Why a known tool is not offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// A stable error code, such as `TOOL_QUARANTINED`.
    pub code: &'static str,
    pub reason: String,
}

/// Valid under both Anthropic's and OpenAI's tool-name rules: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `sha256:<hex>` of the canonical (key-sorted) JSON of a definition.
pub fn version_hash(spec: &ToolSpec) -> String {
    hash_json(&serde_json::to_value(spec).unwrap_or_default())
}

/// A validator for `schema`. With `formats`, a known `format` (email, uri, date, uuid, ...) is
/// checked as well, as the arguments a model proposes must be: draft 2020-12 makes it only an
/// annotation by default. A format the validator does not know is ignored, so a server's own
/// formats still compile. Results are checked for their shape only: a result is data the tool
/// gave, whatever its formats.
fn compile(schema: &serde_json::Value, formats: bool) -> Result<jsonschema::Validator, String> {
    jsonschema::options().with_draft(jsonschema::Draft::Draft202012).should_validate_formats(formats).build(schema).map_err(|e| e.to_string())
}

fn hash_json(value: &serde_json::Value) -> String {
    let digest = Sha256::digest(value.to_string().as_bytes());
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

impl Catalog {
    /// This catalog plus tools from other sources (MCP servers), keeping the approval mode,
    /// hooks and every existing definition (and so its version). A name already taken is
    /// refused and reported, never overwritten.
    pub fn with_extra(&self, extra: impl IntoIterator<Item = Arc<ToolDef>>, withheld: BTreeMap<String, Withheld>) -> (Self, Vec<String>) {
        let mut tools = self.tools.clone();
        let mut clashes = Vec::new();
        for tool in extra {
            if tools.contains_key(&tool.spec.name) {
                clashes.push(tool.spec.name.clone());
            } else {
                tools.insert(tool.spec.name.clone(), tool);
            }
        }
        let mut all_withheld = self.withheld.clone();
        all_withheld.extend(withheld.into_iter().filter(|(name, _)| !tools.contains_key(name)));
        (Self { approval_mode: self.approval_mode, tools, hooks: self.hooks.clone(), audit: self.audit.clone(), withheld: all_withheld, connector_secrets: self.connector_secrets.clone() }, clashes)
    }

    /// Masks what of a call of `tool` with `args` must not be kept or shown: what its
    /// before-call redact hooks mask for the tool, secrets (by name and shape) and the audit's
    /// personal-data fields. For the audit row and the owners' approval prompt.
    pub fn redact_for_record(&self, tool: &str, args: &mut serde_json::Value) {
        super::hooks::redact_as_before(&self.hooks, tool, args);
        crate::redact::redact_args(args);
        crate::redact::redact_named(args, &self.audit.pii_fields, crate::redact::PII_REDACTED);
    }

    /// Why `name` is known but not offered, if it is.
    pub fn withheld(&self, name: &str) -> Option<&Withheld> {
        self.withheld.get(name)
    }

    pub fn get(&self, name: &str) -> Option<Arc<ToolDef>> {
        self.tools.get(name).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ToolDef>> {
        self.tools.values()
    }

    /// The enabled tools with neither triggers nor aliases. The candidate detector plans one of
    /// these only when a message shares many words with its name and description, so most short
    /// requests for it ("where is my order 4821?") stay in normal chat.
    pub fn without_phrases(&self) -> impl Iterator<Item = &str> {
        self.tools.values().filter(|t| t.spec.enabled && t.spec.triggers.is_empty() && t.spec.aliases.is_empty()).map(|t| t.spec.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testing;
