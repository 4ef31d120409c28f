//! Typed settings: built-in defaults, then `config/gatehouse.toml`, then `GATEHOUSE__SECTION__KEY`
//! environment variables. Secrets never live here; they come from named environment variables
//! only (see [`secrets`]).

pub mod load;
pub mod secrets;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

pub use load::{ConfigError, LoadedConfig, Problem, load};
pub use secrets::Secrets;

/// Default path of the main config file, relative to the working directory.
pub const DEFAULT_CONFIG_PATH: &str = "config/gatehouse.toml";

/// Every key of `config/gatehouse.toml`. Unknown keys are rejected by the loader.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
    pub llm: LlmSettings,
    pub models: ModelSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// The URL owners use to reach the console. Empty: derived from the bound address.
    pub public_url: String,
    /// When false and the port is taken, the next two ports are tried.
    pub strict_port: bool,
    /// Folder holding the compiled console assets (`pkg/gatehouse.js`, `pkg/gatehouse_bg.wasm`).
    pub site_root: PathBuf,
    /// How long graceful shutdown waits for open requests.
    #[serde(with = "duration_str")]
    pub shutdown_grace: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            public_url: String::new(),
            strict_port: false,
            site_root: PathBuf::from("target/site"),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://path/to/file.db` or `postgres://user@host:port/db`.
    pub url: String,
    pub max_connections: u32,
    #[serde(with = "duration_str")]
    pub busy_timeout: Duration,
    #[serde(with = "duration_str")]
    pub acquire_timeout: Duration,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://data/gatehouse.db".into(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// A session unused for this long ends.
    #[serde(with = "duration_str")]
    pub session_idle_timeout: Duration,
    /// A session ends this long after login, however active.
    #[serde(with = "duration_str")]
    pub session_absolute_timeout: Duration,
    /// Failed logins per account or per IP address before further attempts get 429.
    pub login_max_failures: u32,
    #[serde(with = "duration_str")]
    pub login_failure_window: Duration,
    /// At least 12.
    pub min_password_length: u32,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            session_idle_timeout: Duration::from_secs(12 * 3600),
            session_absolute_timeout: Duration::from_secs(7 * 24 * 3600),
            login_max_failures: 5,
            login_failure_window: Duration::from_secs(15 * 60),
            min_password_length: 12,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing filter such as `info` or `server=debug,info`. `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { format: LogFormat::Text, filter: "info".into() }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    #[default]
    Anthropic,
    Openai,
}

impl LlmProvider {
    /// The environment variable that holds this provider's key.
    pub fn key_var(self) -> &'static str {
        match self {
            Self::Anthropic => secrets::ANTHROPIC_API_KEY,
            Self::Openai => secrets::OPENAI_API_KEY,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    pub provider: LlmProvider,
    pub anthropic: EndpointSettings,
    pub openai: EndpointSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointSettings {
    pub base_url: String,
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    pub max_tokens: u32,
}

impl Default for EndpointSettings {
    fn default() -> Self {
        Self { base_url: String::new(), timeout: Duration::from_secs(60), max_tokens: 1024 }
    }
}

/// Which model serves which purpose. Names live in config only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSettings {
    pub chat: String,
    pub planner: String,
    pub summarizer: String,
    pub compaction: String,
}

/// Durations as human-readable strings: "500ms", "15m", "12h", "7d".
pub(crate) mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim())
            .map_err(|e| D::Error::custom(format!("invalid duration {text:?} ({e}); use forms like \"30s\", \"15m\", \"12h\"")))
    }
}
