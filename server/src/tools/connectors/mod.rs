//! Connector tools: HTTP actions on a business system, declared in `config/connectors.toml`.
//!
//! A connector fixes the base URL and the URL patterns its requests may reach; each action
//! binds one catalog tool (provider "connector") to a method, a path template, query
//! parameters, headers and a JSON body mapping, and names the response fields to keep.
//! Arguments fill templates as data: each one is percent-encoded into a single path segment or
//! query value, so no argument can change the scheme, host, port or path structure, and the
//! finished URL must still match an allowed pattern (`CONNECTOR_UNSUPPORTED_URL` otherwise).
//! Connector URLs come from configuration only; nothing is guessed.

mod executor;
mod load;
mod template;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use self::{
    executor::{ConnectorExecutor, IDEMPOTENCY_HEADER, hosts, keep_fields},
    load::load,
    template::{build_url, percent_decode, walks_up},
};

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum ConnectorCode {
    /// The request URL left the connector's base or matches no allowed pattern.
    #[strum(serialize = "CONNECTOR_UNSUPPORTED_URL")]
    UnsupportedUrl,
    /// A template names an argument the call did not supply, or one that cannot be placed there.
    #[strum(serialize = "CONNECTOR_PARAM_INVALID")]
    ParamInvalid,
    /// A header secret named by an environment variable is not set.
    #[strum(serialize = "CONNECTOR_SECRET_MISSING")]
    SecretMissing,
    /// The system answered with an error status.
    #[strum(serialize = "CONNECTOR_HTTP_STATUS")]
    HttpStatus,
    /// The system could not be reached, or did not answer in time.
    #[strum(serialize = "CONNECTOR_NETWORK_ERROR")]
    Network,
    /// The answer was larger than Gatehouse accepts.
    #[strum(serialize = "CONNECTOR_RESPONSE_TOO_LARGE")]
    TooLarge,
    /// An action that keeps only some fields got an answer that is not JSON: nothing can be
    /// picked from it, and the rest may be what `keep` leaves out.
    #[strum(serialize = "CONNECTOR_RESPONSE_NOT_JSON")]
    NotJson,
    /// A tool's secret field is templated into an action's URL (refused when the files load):
    /// URLs reach logs, errors and the other side's access logs.
    #[strum(serialize = "CONNECTOR_SECRET_IN_URL")]
    SecretInUrl,
}

impl ConnectorCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What the connectors file needs to know of a tools.toml tool.
#[derive(Debug, Clone, Default)]
pub struct DeclaredTool {
    pub is_connector: bool,
    /// Properties of its input schema.
    pub properties: BTreeSet<String>,
    /// Fields Gatehouse fills from a secret (`secret_fields`).
    pub secret_fields: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    fn as_reqwest(self) -> reqwest::Method {
        match self {
            Self::Get => reqwest::Method::GET,
            Self::Post => reqwest::Method::POST,
            Self::Put => reqwest::Method::PUT,
            Self::Patch => reqwest::Method::PATCH,
            Self::Delete => reqwest::Method::DELETE,
        }
    }
}

/// One HTTP action as written in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionSpec {
    /// The catalog tool this action runs.
    pub tool: String,
    pub method: Method,
    /// Appended to the connector's base URL; `{arg}` fills one whole or partial path segment.
    pub path: String,
    /// Query parameter -> template; a parameter whose arguments are all absent is left out.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Extra headers for this action (templates, like the connector's).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// JSON body template: a string that is exactly `"{arg}"` takes the argument's JSON value
    /// (and its key is dropped when the argument is absent); other strings interpolate.
    #[serde(default)]
    pub body: Option<Value>,
    /// Response fields to keep, as dotted paths (`order.status`); through an array they apply
    /// to each element. Empty keeps the whole response.
    #[serde(default)]
    pub keep: Vec<String>,
}

/// One connector as written in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorSpec {
    pub id: String,
    #[serde(default)]
    pub title: String,
    /// Scheme, host, optional port and base path of every request.
    pub base_url: String,
    /// URL patterns (without query) requests may reach: `*` matches within one path segment,
    /// `**` matches anything.
    pub allowed_urls: Vec<String>,
    /// Header -> template. `${VAR}` is the value of the environment variable VAR (a secret;
    /// never shown to the model, never audited); `{arg}` is an argument.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default)]
    pub action: Vec<ActionSpec>,
}

fn default_true() -> bool {
    true
}

/// The environment variables a connector's headers read (`${VAR}`), enabled or not: what an
/// owner sets before enabling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorSecrets {
    pub connector: String,
    pub enabled: bool,
    pub vars: Vec<String>,
}

/// A checked action with its connector, attached to the tool it runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectorAction {
    pub connector: String,
    pub base_url: String,
    pub allowed_urls: Vec<String>,
    /// `allowed_urls` compiled: `**` matches anything, `*` anything but '/'.
    #[serde(skip)]
    allowed: globset::GlobSet,
    /// Connector headers, then the action's own (which win).
    pub headers: BTreeMap<String, String>,
    pub action: ActionSpec,
}

/// `allowed_urls` as one matcher; a pattern that is not a glob is named in the error.
fn compile_allowed(patterns: &[String]) -> Result<globset::GlobSet, String> {
    let mut set = globset::GlobSetBuilder::new();
    for p in patterns {
        set.add(globset::GlobBuilder::new(p).literal_separator(true).build().map_err(|e| format!("{p:?} is not a URL pattern: {e}"))?);
    }
    set.build().map_err(|e| e.to_string())
}

impl ConnectorAction {
    pub fn new(connector: String, base_url: String, allowed_urls: Vec<String>, headers: BTreeMap<String, String>, action: ActionSpec) -> Result<Self, String> {
        let allowed = compile_allowed(&allowed_urls)?;
        Ok(Self { connector, base_url, allowed_urls, allowed, headers, action })
    }
}

#[cfg(test)]
mod tests;
