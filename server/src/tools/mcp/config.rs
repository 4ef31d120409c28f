//! `config/mcp.toml`: the MCP servers Gatehouse connects to. Loading checks every server on its
//! own (unknown keys, ids, transports, limits, secrets named by environment variable) and reports
//! every problem at once, with file and key, like `tools.toml`.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    config::duration_str,
    tools::catalog::{Approval, Audience, Risk},
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
#[serde(untagged, try_from = "WrittenValue")]
pub enum ValueOrSecret {
    Plain(String),
    /// `{ secret = "VAR", prefix = "Bearer " }`: the value of `VAR`, after `prefix`.
    Secret {
        secret: String,
        #[serde(default)]
        prefix: String,
    },
}

/// A [`ValueOrSecret`] as written: a string, or a table read key by key, so that a misspelt key
/// (`prefx`) is refused by name instead of dropped (the token then went out without its prefix).
#[derive(Deserialize)]
#[serde(untagged)]
enum WrittenValue {
    Plain(String),
    Table(std::collections::BTreeMap<String, String>),
}

impl TryFrom<WrittenValue> for ValueOrSecret {
    type Error = String;

    fn try_from(written: WrittenValue) -> Result<Self, String> {
        let mut table = match written {
            WrittenValue::Plain(v) => return Ok(Self::Plain(v)),
            WrittenValue::Table(table) => table,
        };
        let secret = table.remove("secret");
        let prefix = table.remove("prefix").unwrap_or_default();
        if let Some(unknown) = table.keys().next() {
            return Err(format!("unknown key {unknown:?}: a secret value is {{ secret = \"VAR\", prefix = \"...\" }}"));
        }
        match secret {
            Some(secret) if !secret.trim().is_empty() => Ok(Self::Secret { secret, prefix }),
            _ => Err("a secret value needs `secret`, the name of the environment variable that holds it".into()),
        }
    }
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

/// What a server's `elicitation/create` during a call gets. A customer is never asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationPolicy {
    /// The capability is not announced; a request that comes anyway is declined at once.
    #[default]
    Decline,
    /// The capability (form mode) is announced; a request becomes a form the owners answer in
    /// the console (or with `gatehouse mcp answer`) while the call waits.
    Owner,
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
fn default_ping_interval() -> Duration {
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
    /// How often a connected server is pinged: one that does not answer within `call_timeout`
    /// is restarted (stdio) or connected again, and each answer is when it was last seen.
    #[serde(default = "default_ping_interval", with = "duration_str")]
    pub ping_interval: Duration,
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
    /// How long an owner has to answer a form (`elicitation = "owner"`); default: call_timeout.
    #[serde(default, with = "opt_duration", skip_serializing_if = "Option::is_none")]
    pub elicitation_ttl: Option<Duration>,
}

/// An optional duration written like `call_timeout` ("30s", "5m").
mod opt_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => crate::config::duration_str::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        crate::config::duration_str::deserialize(d).map(Some)
    }
}

impl ServerConfig {
    /// How long after it was last seen a server's recorded health is no longer believed: three
    /// pings missed by every process (each connected process pings it), and a minute for the
    /// clocks of the hosts that wrote and read it.
    pub fn seen_lately(&self) -> Duration {
        self.ping_interval * 3 + self.call_timeout + Duration::from_secs(60)
    }

    /// How long a form of this server waits for an owner (zero: the server's requests are
    /// declined, nobody is asked).
    pub fn owner_wait(&self) -> Duration {
        match self.elicitation {
            ElicitationPolicy::Decline => Duration::ZERO,
            ElicitationPolicy::Owner => self.elicitation_ttl.unwrap_or(self.call_timeout),
        }
    }

    /// The whole time a call may take: the server's own time, plus the time a form may wait for
    /// an owner (waiting for a person does not use up the server's time).
    pub fn call_deadline(&self) -> Duration {
        self.call_timeout + self.owner_wait()
    }

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

mod check;
pub use check::{fits_tool_call_budget, load, valid_server_id};

#[cfg(test)]
mod tests;
