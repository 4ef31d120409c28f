//! `config/mcp.toml`: the MCP servers Gatehouse connects to. Loading checks every server on its
//! own (unknown keys, ids, transports, limits, secrets named by environment variable) and reports
//! every problem at once, with file and key, like `tools.toml`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{
    config::{Problem, duration_str},
    tools::{
        catalog::{Approval, Audience, Risk},
        toml_file,
    },
};

/// How far a server's own claims are believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Its first tools are approved without an owner; it may relax approval of destructive tools.
    Trusted,
    /// Every tool waits for an owner; annotations can only make a tool stricter.
    #[default]
    Untrusted,
}

/// A value written in the file, or the name of the environment variable that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ValueOrSecret {
    Plain(String),
    /// `{ secret = "VAR", prefix = "Bearer " }`: the value of `VAR`, after `prefix`.
    Secret {
        secret: String,
        #[serde(default)]
        prefix: String,
    },
}

impl ValueOrSecret {
    /// The value, reading secrets from `secrets`. `None` when a secret is unset.
    pub fn resolve(&self, secrets: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        match self {
            Self::Plain(v) => Some(v.clone()),
            Self::Secret { secret, prefix } => secrets(secret).map(|v| format!("{prefix}{v}")),
        }
    }

    fn secret_var(&self) -> Option<&str> {
        match self {
            Self::Plain(_) => None,
            Self::Secret { secret, .. } => Some(secret),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Transport {
    /// A child process speaking JSON-RPC on stdin and stdout.
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        /// Variables for the child. It does not inherit Gatehouse's environment (which holds
        /// keys), only PATH, HOME, LANG and TMPDIR.
        #[serde(default)]
        env: BTreeMap<String, ValueOrSecret>,
        #[serde(default)]
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP: one endpoint, such as `https://host/mcp`.
    Http {
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, ValueOrSecret>,
    },
}

impl Transport {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Stdio { .. } => "stdio",
            Self::Http { .. } => "http",
        }
    }

    /// Where it runs, safe to show: the command, or the URL without credentials.
    pub fn target(&self) -> String {
        match self {
            Self::Stdio { command, .. } => command.clone(),
            Self::Http { url, .. } => crate::config::load::display_url(url),
        }
    }
}

/// How Gatehouse authenticates to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// Static headers only (`transport.headers`), or nothing.
    #[default]
    None,
    /// OAuth 2.1 as the MCP authorization spec describes: an owner connects the server once
    /// (console or `gatehouse mcp login`), Gatehouse keeps and refreshes the tokens.
    Oauth,
}

/// `[server.oauth]`: a client registered with the authorization server beforehand. Without
/// it, Gatehouse registers itself (dynamic client registration).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthClient {
    pub client_id: Option<String>,
    /// `{ secret = "VAR" }`: confidential clients only.
    pub client_secret: Option<ValueOrSecret>,
    /// Scopes to ask for; empty follows the server (its challenge, then its metadata).
    pub scopes: Vec<String>,
}

/// What a server's `elicitation/create` during a call gets. Only declining is built: the
/// capability is not announced, and a request that comes anyway is declined (rmcp's default
/// answer). Forwarding to the owner is a later policy; a customer is never asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationPolicy {
    #[default]
    Decline,
}

/// Bounds on what discovery accepts from a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryLimits {
    /// Connecting, initializing and listing every page, together.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    pub max_pages: u32,
    /// A tool whose input plus output schema is larger (as JSON) is left out.
    pub max_schema_bytes: u32,
    /// Longer descriptions are cut.
    pub max_description_chars: u32,
}

impl Default for DiscoveryLimits {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(20), max_pages: 50, max_schema_bytes: 64_000, max_description_chars: 1_000 }
    }
}

/// The environment variable holding the key that encrypts OAuth tokens at rest: 64 hex digits
/// (32 bytes). Needed when any enabled server has `auth = "oauth"`.
pub const TOKEN_KEY_VAR: &str = "GATEHOUSE_MCP_TOKEN_KEY";

/// Hard ceiling of `max_tools`, whatever the file says.
pub const MAX_TOOLS_LIMIT: u32 = 1_000;

fn yes() -> bool {
    true
}
fn default_max_tools() -> u32 {
    100
}
fn default_call_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_audience() -> Audience {
    Audience::OwnerOnly
}
fn default_risk() -> Risk {
    Risk::Medium
}
fn default_approval() -> Approval {
    Approval::Ask
}

/// One `[[server]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Lower-case letters, digits and '-', at most 24; the prefix of its tools' names.
    pub id: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    pub transport: Transport,
    #[serde(default)]
    pub trust: Trust,
    /// Tool names (as the server names them) to take; empty takes all. `prefix*` matches a prefix.
    #[serde(default)]
    pub allow_tools: Vec<String>,
    /// Tool names never taken, even when allowed. `prefix*` matches a prefix.
    #[serde(default)]
    pub deny_tools: Vec<String>,
    #[serde(default = "default_max_tools")]
    pub max_tools: u32,
    #[serde(default = "default_call_timeout", with = "duration_str")]
    pub call_timeout: Duration,
    #[serde(default = "default_audience")]
    pub default_audience: Audience,
    /// The least risk its tools get; annotations can raise it, never lower it.
    #[serde(default = "default_risk")]
    pub default_risk: Risk,
    /// Approval rule for its tools (under the catalog's approval mode).
    #[serde(default = "default_approval")]
    pub approval: Approval,
    /// Destructive tools always need an owner. Only a trusted server may turn this off.
    #[serde(default = "yes")]
    pub destructive_needs_approval: bool,
    #[serde(default)]
    pub discovery: DiscoveryLimits,
    /// `"oauth"` for a Streamable HTTP server behind OAuth 2.1.
    #[serde(default)]
    pub auth: AuthMode,
    #[serde(default)]
    pub oauth: OAuthClient,
    #[serde(default)]
    pub elicitation: ElicitationPolicy,
}

impl ServerConfig {
    /// Whether the server's tool `name` passes the allow and deny lists.
    pub fn takes(&self, name: &str) -> bool {
        let matches = |pattern: &String| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pattern,
        };
        (self.allow_tools.is_empty() || self.allow_tools.iter().any(matches)) && !self.deny_tools.iter().any(matches)
    }

    /// Environment variables holding its secrets.
    pub fn secret_vars(&self) -> Vec<&str> {
        let mut vars: Vec<&str> = match &self.transport {
            Transport::Stdio { env, .. } => env.values().filter_map(ValueOrSecret::secret_var).collect(),
            Transport::Http { headers, .. } => headers.values().filter_map(ValueOrSecret::secret_var).collect(),
        };
        if self.auth == AuthMode::Oauth {
            vars.extend(self.oauth.client_secret.as_ref().and_then(ValueOrSecret::secret_var));
            vars.push(TOKEN_KEY_VAR);
        }
        vars
    }
}

/// Every server in `mcp.toml`, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpConfig {
    pub servers: Vec<ServerConfig>,
}

impl McpConfig {
    pub fn get(&self, id: &str) -> Option<&ServerConfig> {
        self.servers.iter().find(|s| s.id == id)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpFile {
    #[serde(default)]
    server: Vec<toml::Value>,
}

/// Server ids become tool-name prefixes, so they are short and plain.
pub fn valid_server_id(id: &str) -> bool {
    (1..=24).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !name.as_bytes()[0].is_ascii_digit()
}

/// Loads and checks `path`. `secret_is_set` says whether an environment variable holds a value.
pub fn load(path: &Path, secret_is_set: &dyn Fn(&str) -> bool) -> Result<McpConfig, Vec<Problem>> {
    let problem = toml_file::problem_at(path);
    let text = toml_file::read(path, "the MCP servers file", &problem)?;
    let file: McpFile = toml::from_str(&text).map_err(|e| vec![problem(String::new(), format!("not valid TOML for an MCP servers file: {e}"))])?;

    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in toml_file::entries::<ServerConfig>(file.server, "server", "id", &problem) {
        let Ok((label, server)) = entry.map_err(|p| problems.push(p)) else { continue };
        let before = problems.len();
        let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
        if !valid_server_id(&server.id) {
            bad("id", "must be 1 to 24 lower-case letters, digits or '-', starting with a letter or digit".into());
        }
        if !seen.insert(server.id.clone()) {
            bad("id", format!("{:?} is used by more than one server", server.id));
        }
        if !(1..=MAX_TOOLS_LIMIT).contains(&server.max_tools) {
            bad("max_tools", format!("must be 1 to {MAX_TOOLS_LIMIT}"));
        }
        if server.call_timeout.is_zero() {
            bad("call_timeout", "must be longer than zero".into());
        }
        let d = &server.discovery;
        if d.timeout.is_zero() {
            bad("discovery.timeout", "must be longer than zero".into());
        }
        if d.max_pages == 0 {
            bad("discovery.max_pages", "must be at least 1".into());
        }
        if d.max_schema_bytes < 64 {
            bad("discovery.max_schema_bytes", "must be at least 64".into());
        }
        if d.max_description_chars == 0 {
            bad("discovery.max_description_chars", "must be at least 1".into());
        }
        if server.trust == Trust::Untrusted && !server.destructive_needs_approval {
            bad("destructive_needs_approval", "only a trusted server may run destructive tools without an owner's approval".into());
        }
        for (field, list) in [("allow_tools", &server.allow_tools), ("deny_tools", &server.deny_tools)] {
            if list.iter().any(|p| p.trim().is_empty()) {
                bad(field, "holds an empty name".into());
            }
        }
        match &server.transport {
            Transport::Stdio { command, env, cwd, .. } => {
                if command.trim().is_empty() {
                    bad("transport.command", "must name the program to start".into());
                }
                for name in env.keys().filter(|n| !valid_env_name(n)) {
                    bad("transport.env", format!("{name:?} is not a valid environment variable name"));
                }
                if let Some(dir) = cwd.as_ref().filter(|d| server.enabled && !d.is_dir()) {
                    bad("transport.cwd", format!("{} is not a folder", dir.display()));
                }
            }
            Transport::Http { url, headers } => {
                let ok = url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
                if !ok {
                    bad("transport.url", format!("{:?} is not an http(s) URL", crate::config::load::display_url(url)));
                }
                for name in headers.keys().filter(|n| http::HeaderName::from_bytes(n.as_bytes()).is_err()) {
                    bad("transport.headers", format!("{name:?} is not a valid HTTP header name"));
                }
                for (name, value) in headers {
                    if let ValueOrSecret::Plain(v) = value
                        && http::HeaderValue::from_str(v).is_err()
                    {
                        bad("transport.headers", format!("the value of {name:?} is not a valid HTTP header value"));
                    }
                }
            }
        }
        if server.auth == AuthMode::Oauth {
            if server.transport.kind() != "http" {
                bad("auth", "\"oauth\" needs an http transport (a stdio server gets its credentials through env)".into());
            }
            if let Some(ValueOrSecret::Plain(_)) = &server.oauth.client_secret {
                bad("oauth.client_secret", "must be { secret = \"VAR\" }: a secret is never written in the file".into());
            }
            if server.oauth.client_secret.is_some() && server.oauth.client_id.is_none() {
                bad("oauth.client_secret", "needs oauth.client_id".into());
            }
            if server.oauth.client_id.as_deref().is_some_and(|c| c.trim().is_empty()) {
                bad("oauth.client_id", "is empty".into());
            }
            if server.oauth.scopes.iter().any(|s| s.is_empty() || s.contains(char::is_whitespace)) {
                bad("oauth.scopes", "holds an empty scope or one with spaces".into());
            }
        } else if server.oauth != OAuthClient::default() {
            bad("oauth", "is only read with auth = \"oauth\"".into());
        }
        if server.enabled {
            for var in server.secret_vars() {
                if !secret_is_set(var) {
                    bad("transport", format!("needs the environment variable {var}, which is not set"));
                }
            }
        }
        if problems.len() == before {
            servers.push(server);
        }
    }
    if problems.is_empty() { Ok(McpConfig { servers }) } else { Err(problems) }
}

#[cfg(test)]
mod tests;
