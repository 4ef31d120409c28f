//! The tool catalog, loaded from `config/tools.toml`. Loading checks everything (schemas
//! compile, names are valid for Anthropic and OpenAI and unique, managed and secret fields are
//! declared, referenced secrets are set) and reports every problem at once, with file and key.
//! Each definition carries a version hash, so an audit row names exactly what was called.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::schema::closed_schema;
use crate::config::{Problem, duration_str};

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
    #[serde(default = "default_true")]
    pub enabled: bool,
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
        let input_validator = compile(&closed_input_schema).map_err(|e| format!("the input schema does not compile: {e}"))?;
        let output_validator = spec.output_schema.as_ref().map(compile).transpose().map_err(|e| format!("the output schema does not compile: {e}"))?;
        let version = version_hash(&spec);
        Ok(Self { spec, version, closed_input_schema, input_validator, output_validator, connector: None })
    }
}

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef").field("name", &self.spec.name).field("version", &self.version).finish_non_exhaustive()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(default)]
    approval_mode: ApprovalMode,
    #[serde(default)]
    tool: Vec<toml::Value>,
    #[serde(default)]
    hook: Vec<toml::Value>,
    #[serde(default)]
    audit: AuditSettings,
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

fn hash_json(value: &serde_json::Value) -> String {
    let digest = Sha256::digest(value.to_string().as_bytes());
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn compile(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options().with_draft(jsonschema::Draft::Draft202012).build(schema).map_err(|e| e.to_string())
}

impl Catalog {
    /// Loads and checks `path`. `secret_is_set` says whether an environment variable holds a
    /// value. On failure, every problem is returned.
    pub fn load(path: &Path, secret_is_set: &dyn Fn(&str) -> bool) -> Result<Self, Vec<Problem>> {
        let source = path.display().to_string();
        let problem = |key: String, message: String| Problem { key, source: source.clone(), message };
        let text = std::fs::read_to_string(path).map_err(|e| vec![problem(String::new(), format!("cannot read the tools file: {e}"))])?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| vec![problem(String::new(), format!("not valid TOML: {e}"))])?;
        let mut problems = Vec::new();
        // Unknown top-level keys are reported with everything else, not instead of it.
        const KNOWN: [&str; 4] = ["approval_mode", "tool", "hook", "audit"];
        for key in table.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
            problems.push(problem(key.clone(), format!("unknown key; expected one of {}", KNOWN.join(", "))));
        }
        table.retain(|k, _| KNOWN.contains(&k));
        let file: ToolsFile = match table.try_into() {
            Ok(file) => file,
            Err(e) => {
                problems.push(problem(String::new(), e.to_string().trim().to_string()));
                return Err(problems);
            }
        };

        let mut tools = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (i, raw) in file.tool.into_iter().enumerate() {
            let label = raw.get("name").and_then(|n| n.as_str()).map_or_else(|| format!("tool[{i}]"), |n| format!("tool[{i}] ({n})"));
            let spec: ToolSpec = match raw.try_into() {
                Ok(spec) => spec,
                Err(e) => {
                    problems.push(problem(label, e.to_string().trim().to_string()));
                    continue;
                }
            };
            let before = problems.len();
            let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
            if !valid_tool_name(&spec.name) {
                bad("name", "must be 1 to 64 letters, digits, '_' or '-' (Anthropic and OpenAI tool-name rules)".into());
            }
            if !seen.insert(spec.name.clone()) {
                bad("name", format!("{:?} is defined more than once", spec.name));
            }
            if spec.description.trim().is_empty() {
                bad("description", "must say what the tool does; the planner chooses tools by it".into());
            }
            if spec.provider == Provider::Builtin && spec.handler.as_deref().is_none_or(str::is_empty) {
                bad("handler", "a builtin tool must name its implementation".into());
            }
            if spec.chat_types.is_empty() {
                bad("chat_types", "must allow at least one of \"direct\", \"group\"".into());
            }
            if spec.timeout.is_zero() {
                bad("timeout", "must be longer than zero".into());
            }
            if spec.retry.max_attempts == 0 {
                bad("retry.max_attempts", "must be at least 1".into());
            }
            if spec.max_result_bytes == 0 {
                bad("max_result_bytes", "must be at least 1".into());
            }
            let closed_input_schema = closed_schema(&spec.input_schema);
            let input = if spec.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
                bad("input_schema", "must be a JSON Schema with \"type\": \"object\"".into());
                None
            } else {
                match compile(&closed_input_schema) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        bad("input_schema", format!("does not compile: {e}"));
                        None
                    }
                }
            };
            let output = match spec.output_schema.as_ref().map(compile) {
                Some(Err(e)) => {
                    bad("output_schema", format!("does not compile: {e}"));
                    None
                }
                Some(Ok(v)) => Some(v),
                None => None,
            };
            let properties = spec.input_schema.get("properties").and_then(|p| p.as_object());
            let declared = |field: &str| properties.is_some_and(|p| p.contains_key(field));
            for field in &spec.managed_fields {
                if !declared(field) {
                    bad("managed_fields", format!("{field:?} is not a property of input_schema"));
                }
            }
            for (field, var) in &spec.secret_fields {
                if !declared(field) {
                    bad("secret_fields", format!("{field:?} is not a property of input_schema"));
                }
                if spec.managed_fields.contains(field) {
                    bad("secret_fields", format!("{field:?} cannot be both managed and secret"));
                }
                if spec.enabled && !secret_is_set(var) {
                    bad("secret_fields", format!("{field:?} needs the environment variable {var}, which is not set"));
                }
            }
            if problems.len() == before
                && let Some(input_validator) = input
            {
                let version = version_hash(&spec);
                tools.insert(spec.name.clone(), ToolDef { spec, version, closed_input_schema, input_validator, output_validator: output, connector: None });
            }
        }
        // Connector actions, from connectors.toml beside this file.
        let connectors_path = path.with_file_name("connectors.toml");
        let declared: BTreeMap<String, super::connectors::DeclaredTool> = tools
            .values()
            .map(|t| {
                let properties = t.spec.input_schema.get("properties").and_then(|p| p.as_object()).map(|p| p.keys().cloned().collect()).unwrap_or_default();
                let secret_fields = t.spec.secret_fields.keys().cloned().collect();
                (t.spec.name.clone(), super::connectors::DeclaredTool { is_connector: t.spec.provider == Provider::Connector, properties, secret_fields })
            })
            .collect();
        let mut actions = BTreeMap::new();
        if connectors_path.is_file() {
            match super::connectors::load(&connectors_path, &declared, secret_is_set) {
                Ok(found) => actions = found,
                Err(found) => problems.extend(found),
            }
        }
        for tool in tools.values_mut() {
            if tool.spec.provider != Provider::Connector {
                continue;
            }
            match actions.remove(&tool.spec.name) {
                Some(action) => {
                    // The version covers the HTTP action too: editing it is a new version.
                    tool.version = hash_json(&serde_json::json!({ "tool": tool.spec, "connector": *action }));
                    tool.connector = Some(action);
                }
                None if tool.spec.enabled => problems.push(problem(
                    format!("tool ({}).provider", tool.spec.name),
                    format!("no enabled action in {} runs this connector tool", connectors_path.display()),
                )),
                None => {}
            }
        }
        let tools: BTreeMap<String, Arc<ToolDef>> = tools.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        let mut hooks = Vec::new();
        for (i, raw) in file.hook.into_iter().enumerate() {
            let label = raw.get("name").and_then(|n| n.as_str()).map_or_else(|| format!("hook[{i}]"), |n| format!("hook[{i}] ({n})"));
            let spec: super::hooks::HookSpec = match raw.try_into() {
                Ok(spec) => spec,
                Err(e) => {
                    problems.push(problem(label, e.to_string().trim().to_string()));
                    continue;
                }
            };
            for t in spec.tools.iter().filter(|t| *t != "*" && !tools.contains_key(*t) && !seen.contains(*t)) {
                problems.push(problem(format!("{label}.tools"), format!("there is no tool named {t:?}")));
            }
            if let Some(why) = spec.problem() {
                problems.push(problem(format!("{label}.kind"), why.into()));
            }
            match regex::Regex::new(&spec.pattern) {
                Ok(regex) => hooks.push(super::hooks::Hook { spec, regex }),
                Err(e) => problems.push(problem(format!("{label}.pattern"), format!("not a regular expression: {e}"))),
            }
        }
        hooks.sort_by_key(|h| h.spec.priority);
        if problems.is_empty() { Ok(Self { approval_mode: file.approval_mode, tools, hooks, audit: file.audit, withheld: BTreeMap::new() }) } else { Err(problems) }
    }

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
        (Self { approval_mode: self.approval_mode, tools, hooks: self.hooks.clone(), audit: self.audit.clone(), withheld: all_withheld }, clashes)
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

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, secrets: &[&str]) -> Result<Catalog, Vec<Problem>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tools.toml");
        std::fs::write(&path, text).expect("write");
        let set: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
        Catalog::load(&path, &move |v| set.iter().any(|s| s == v))
    }

    const GOOD: &str = r#"
approval_mode = "auto"

[[tool]]
name = "lookup_order"
title = "Look up an order"
description = "Finds an order by its number."
provider = "builtin"
handler = "shop.lookup"
operation = "read"
audience = "public"
risk = "low"
managed_fields = ["chat_id"]
secret_fields = { api_key = "SHOP_API_KEY" }
timeout = "5s"
retry = { max_attempts = 3, backoff = "200ms" }
[tool.input_schema]
type = "object"
additionalProperties = false
required = ["order_id"]
[tool.input_schema.properties.order_id]
type = "string"
[tool.input_schema.properties.chat_id]
type = "string"
[tool.input_schema.properties.api_key]
type = "string"
"#;

    #[test]
    fn loads_a_valid_catalog_with_a_version_hash() {
        let catalog = load(GOOD, &["SHOP_API_KEY"]).expect("valid");
        let tool = catalog.get("lookup_order").expect("tool");
        assert!(tool.version.starts_with("sha256:") && tool.version.len() == 71, "{}", tool.version);
        assert_eq!(tool.spec.retry.max_attempts, 3);
        assert_eq!(tool.spec.chat_types, vec![ChatKind::Direct, ChatKind::Group]);
        assert!(tool.input_validator.is_valid(&serde_json::json!({"order_id": "42"})));
        assert!(!tool.input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})));
        let edited = load(&GOOD.replace("Finds an order", "Finds any order"), &["SHOP_API_KEY"]).expect("valid");
        assert_ne!(edited.get("lookup_order").expect("tool").version, tool.version, "any edit changes the version");
    }

    #[test]
    fn reports_every_problem_with_file_and_key() {
        let text = format!(
            "{GOOD}\n{}\n{}\n{}",
            // Duplicate name, bad schema, undeclared managed field.
            GOOD.replace("approval_mode = \"auto\"", "").replace("managed_fields = [\"chat_id\"]", "managed_fields = [\"sender\"]").replace("type = \"object\"", "type = \"objekt\""),
            "[[tool]]\nname = \"has space\"\ntitle = \"t\"\ndescription = \"d\"\nprovider = \"builtin\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = { type = \"object\" }\n",
            "[[tool]]\nname = \"typo\"\ntitle = \"t\"\ndescription = \"d\"\nprovider = \"connector\"\noperation = \"read\"\naudience = \"everyone\"\nrisk = \"low\"\ninput_schema = { type = \"object\" }\nretries = 3\n",
        );
        let problems = load(&text, &[]).expect_err("invalid");
        let shown: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
        assert!(has("tool[0] (lookup_order).secret_fields: \"api_key\" needs the environment variable SHOP_API_KEY"), "{shown:#?}");
        assert!(has("tool[1] (lookup_order).name: \"lookup_order\" is defined more than once"), "{shown:#?}");
        assert!(has("tool[1] (lookup_order).managed_fields: \"sender\" is not a property"), "{shown:#?}");
        assert!(has("tool[2] (has space).name: must be 1 to 64"), "{shown:#?}");
        assert!(has("tool[2] (has space).handler: a builtin tool must name its implementation"), "{shown:#?}");
        assert!(has("tool[3] (typo)") && (has("everyone") || has("retries")), "{shown:#?}");
        assert!(problems.iter().all(|p| p.source.ends_with("tools.toml")));
    }

    #[test]
    fn extra_arguments_are_refused_unless_the_schema_allows_them() {
        let open = GOOD.replace("additionalProperties = false\n", "");
        let catalog = load(&open, &["SHOP_API_KEY"]).expect("valid");
        let tool = catalog.get("lookup_order").expect("tool");
        assert!(tool.spec.input_schema.get("additionalProperties").is_none(), "the schema as written is kept");
        assert!(tool.input_validator.is_valid(&serde_json::json!({"order_id": "42"})));
        assert!(!tool.input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})), "a missing additionalProperties means none");

        let allowed = load(&GOOD.replace("additionalProperties = false", "additionalProperties = true"), &["SHOP_API_KEY"]).expect("valid");
        assert!(allowed.get("lookup_order").expect("tool").input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})), "an explicit true is kept");

        let mcp = ToolDef::from_spec(ToolSpec { input_schema: serde_json::json!({"type": "object", "properties": {"a": {"type": "number"}}}), ..tool.spec.clone() }).expect("spec");
        assert!(!mcp.input_validator.is_valid(&serde_json::json!({"a": 1, "b": 2})), "definitions made at run time (MCP) are closed too");
        assert!(mcp.spec.input_schema.get("additionalProperties").is_none());
    }

    #[test]
    fn names_follow_provider_rules() {
        assert!(valid_tool_name("web_fetch"));
        assert!(valid_tool_name("server-everything__get-sum"));
        assert!(!valid_tool_name(""));
        assert!(!valid_tool_name("a.b"));
        assert!(!valid_tool_name(&"x".repeat(65)));
    }
}
