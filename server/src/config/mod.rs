//! Typed settings: built-in defaults, then `config/gatehouse.toml`, then `GATEHOUSE__SECTION__KEY`
//! environment variables. Secrets never live here; they come from named environment variables
//! only (see [`secrets`]).

pub mod conversation;
pub mod load;
pub mod net;
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
    pub jobs: JobSettings,
    pub web_fetch: WebFetchSettings,
    pub web_search: WebSearchSettings,
    pub conversation: conversation::ConversationSettings,
    pub private_data: conversation::PrivateDataSettings,
    pub whatsapp: WhatsAppSettings,
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
    /// Folder holding the compiled console assets (`pkg/gatehouse.js`, `pkg/gatehouse.wasm`).
    pub site_root: PathBuf,
    /// How long graceful shutdown waits for open requests.
    #[serde(with = "duration_str")]
    pub shutdown_grace: Duration,
    /// Reverse proxies whose `client_ip_header` is believed (addresses or networks). Empty: no
    /// proxy is trusted and the client address is the connection's peer.
    pub trusted_proxies: Vec<net::IpNet>,
    /// The header a trusted proxy puts the client's address in (`x-forwarded-for`,
    /// `x-real-ip`, ...). Empty: none.
    #[serde(deserialize_with = "net::header_name::deserialize")]
    pub client_ip_header: String,
}

impl ServerSettings {
    /// Combinations of the proxy keys that cannot work, as (key, message).
    pub fn proxy_problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.client_ip_header.is_empty() && !self.trusted_proxies.is_empty() {
            out.push(("server.client_ip_header", "must be set when server.trusted_proxies is: it names the header the proxies fill".into()));
        }
        if !self.client_ip_header.is_empty() && self.trusted_proxies.is_empty() {
            out.push(("server.trusted_proxies", format!("is empty, so server.client_ip_header ({}) is never read", self.client_ip_header)));
        }
        out
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            public_url: String::new(),
            strict_port: false,
            site_root: PathBuf::from("target/site"),
            shutdown_grace: Duration::from_secs(10),
            trusted_proxies: Vec::new(),
            client_ip_header: String::new(),
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

impl AuthSettings {
    pub fn min_password(&self) -> usize {
        usize::try_from(self.min_password_length).unwrap_or(12).max(12)
    }
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
        Self { format: LogFormat::Text, filter: "info,rmcp=warn".into() }
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

/// The language model provider, its endpoints, the retry budget and what happens without a key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    pub provider: LlmProvider,
    /// Retries after the first attempt, for errors the provider marks as retryable; all of them
    /// within the endpoint's `timeout`.
    pub max_retries: u32,
    /// First backoff delay; doubled per retry (with jitter) up to `retry_max_delay`.
    #[serde(with = "duration_str")]
    pub retry_initial_delay: Duration,
    #[serde(with = "duration_str")]
    pub retry_max_delay: Duration,
    /// What a customer is told when no model can answer (no key, or the provider failed).
    pub fallback_reply: String,
    /// The one line an owner is told in degraded mode. `{provider}` and `{variable}` are filled in.
    pub owner_instruction: String,
    pub anthropic: EndpointSettings,
    pub openai: EndpointSettings,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            provider: LlmProvider::default(),
            max_retries: 2,
            retry_initial_delay: Duration::from_millis(500),
            retry_max_delay: Duration::from_secs(8),
            fallback_reply: "Sorry, I can't answer right now. Please try again a little later.".into(),
            owner_instruction: "Gatehouse has no key for the {provider} model: set {variable} and restart to enable replies.".into(),
            anthropic: EndpointSettings::default(),
            openai: EndpointSettings::default(),
        }
    }
}

impl LlmSettings {
    /// The endpoint of the configured provider.
    pub fn endpoint(&self) -> &EndpointSettings {
        match self.provider {
            LlmProvider::Anthropic => &self.anthropic,
            LlmProvider::Openai => &self.openai,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointSettings {
    pub base_url: String,
    /// Deadline for one request, retries and backoff included.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// `max_tokens` sent when the caller does not ask for a different limit.
    pub max_tokens: u32,
}

impl Default for EndpointSettings {
    fn default() -> Self {
        Self { base_url: String::new(), timeout: Duration::from_secs(60), max_tokens: 1024 }
    }
}

/// Which model serves which purpose, and what each model costs. Names live in config only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSettings {
    pub chat: String,
    pub planner: String,
    pub summarizer: String,
    pub compaction: String,
    /// Prices per model, for the cost recorded with each call. A model without a price is
    /// recorded with its tokens and an unknown cost.
    pub prices: Vec<ModelPrice>,
}

impl ModelSettings {
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        self.prices.iter().find(|p| p.model == model)
    }
}

/// US dollars per million tokens, as providers publish them. Cache prices default to the input
/// price when not given.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub model: String,
    pub input: f64,
    pub output: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

/// The WhatsApp Cloud API channel: where the Graph API is, how replies are paced, and what
/// the bot says on its own (notes and templates). Tokens are secrets, never settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WhatsAppSettings {
    /// Graph API base URL without the version (tests point it at a local fake).
    pub graph_base_url: String,
    /// Graph API version path segment, such as "v25.0".
    pub graph_version: String,
    /// The business phone number's id (not the number itself). Empty: nothing is sent.
    pub phone_number_id: String,
    /// Deadline of one Graph API request.
    #[serde(with = "duration_str")]
    pub request_timeout: Duration,
    /// Mark each handled inbound message as read.
    pub mark_read: bool,
    /// Show the typing indicator while a reply is prepared.
    pub typing_indicator: bool,
    /// Said to a chat that sends a message type the bot cannot read yet. Empty: say nothing.
    pub unknown_type_reply: String,
    /// The note above goes to one chat at most once per this period.
    #[serde(with = "duration_str")]
    pub unknown_type_reply_every: Duration,
    /// Approved template sent when a reply falls outside the 24-hour window (error 131047).
    /// Empty: the reply is only marked failed.
    pub window_template: String,
    pub window_template_language: String,
    /// Messages to one recipient: a burst of this many, then one per `pair_interval`.
    pub pair_burst: u32,
    #[serde(with = "duration_str")]
    pub pair_interval: Duration,
    /// Messages per second across all recipients (the business number's throughput).
    pub global_rate_per_second: u32,
    /// Longest a send waits for pacing before the job is retried later instead.
    #[serde(with = "duration_str")]
    pub max_pacing_wait: Duration,
    /// Tries per message on rate limits (130429, 131056) and 5xx before the job is retried later.
    pub send_attempts: u32,
    /// Backoff between those tries: this, times 4 per further try.
    #[serde(with = "duration_str")]
    pub send_retry_base: Duration,
    /// Largest inbound message object kept verbatim, in bytes; larger ones keep only the parsed fields.
    pub raw_max_bytes: u64,
}

impl Default for WhatsAppSettings {
    fn default() -> Self {
        Self {
            graph_base_url: "https://graph.facebook.com".into(),
            graph_version: "v25.0".into(),
            phone_number_id: String::new(),
            request_timeout: Duration::from_secs(15),
            mark_read: true,
            typing_indicator: true,
            unknown_type_reply: "Sorry, I can only read text messages for now. Please send your question as text.".into(),
            unknown_type_reply_every: Duration::from_secs(24 * 3600),
            window_template: String::new(),
            window_template_language: "en_US".into(),
            pair_burst: 5,
            pair_interval: Duration::from_secs(6),
            global_rate_per_second: 80,
            max_pacing_wait: Duration::from_secs(20),
            send_attempts: 3,
            send_retry_base: Duration::from_secs(2),
            raw_max_bytes: 65_536,
        }
    }
}

/// The built-in `web_search` provider.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebSearchSettings {
    pub provider: crate::tools::builtins::web_search::SearchProvider,
    /// SearXNG: the instance's base URL; Brave: the API endpoint.
    pub base_url: String,
    pub max_results: u32,
    #[serde(with = "duration_str")]
    pub timeout: Duration,
}

impl Default for WebSearchSettings {
    fn default() -> Self {
        Self { provider: Default::default(), base_url: String::new(), max_results: 5, timeout: Duration::from_secs(10) }
    }
}

/// Limits of the built-in `web_fetch` implementation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebFetchSettings {
    pub max_bytes: u64,
    pub max_redirects: u32,
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// Hosts (`host` or `host:port`) fetched even when their address is not public.
    pub allowed_hosts: Vec<String>,
    pub denied_hosts: Vec<String>,
    pub user_agent: String,
}

impl Default for WebFetchSettings {
    fn default() -> Self {
        let d = crate::tools::builtins::web_fetch::FetchLimits::default();
        Self {
            max_bytes: d.max_bytes as u64,
            max_redirects: d.max_redirects as u32,
            timeout: d.timeout,
            allowed_hosts: d.allowed_hosts,
            denied_hosts: d.denied_hosts,
            user_agent: d.user_agent,
        }
    }
}

impl WebFetchSettings {
    pub fn limits(&self) -> crate::tools::builtins::web_fetch::FetchLimits {
        crate::tools::builtins::web_fetch::FetchLimits {
            max_bytes: usize::try_from(self.max_bytes).unwrap_or(usize::MAX),
            max_redirects: self.max_redirects as usize,
            timeout: self.timeout,
            allowed_hosts: self.allowed_hosts.clone(),
            denied_hosts: self.denied_hosts.clone(),
            user_agent: self.user_agent.clone(),
        }
    }
}

/// The durable job queue's worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobSettings {
    /// Run a worker inside `gatehouse serve`; `gatehouse worker` runs one alone.
    pub worker_in_serve: bool,
    pub queue: String,
    pub concurrency: u32,
    #[serde(with = "duration_str")]
    pub poll_interval: Duration,
    #[serde(with = "duration_str")]
    pub lease: Duration,
    #[serde(with = "duration_str")]
    pub job_timeout: Duration,
    #[serde(with = "duration_str")]
    pub shutdown_grace: Duration,
    #[serde(with = "duration_str")]
    pub retry_base: Duration,
    #[serde(with = "duration_str")]
    pub retry_max: Duration,
    pub default_max_attempts: u32,
    #[serde(with = "duration_str")]
    pub maintenance_interval: Duration,
}

impl Default for JobSettings {
    fn default() -> Self {
        let w = crate::jobs::WorkerSettings::default();
        Self {
            worker_in_serve: true,
            queue: w.queue,
            concurrency: u32::try_from(w.concurrency).unwrap_or(8),
            poll_interval: w.poll_interval,
            lease: w.lease,
            job_timeout: w.job_timeout,
            shutdown_grace: w.shutdown_grace,
            retry_base: w.retry_base,
            retry_max: w.retry_max,
            default_max_attempts: 5,
            maintenance_interval: w.maintenance_interval,
        }
    }
}

impl JobSettings {
    pub fn worker(&self) -> crate::jobs::WorkerSettings {
        crate::jobs::WorkerSettings {
            queue: self.queue.clone(),
            concurrency: usize::try_from(self.concurrency).unwrap_or(8).max(1),
            poll_interval: self.poll_interval,
            lease: self.lease,
            job_timeout: self.job_timeout,
            shutdown_grace: self.shutdown_grace,
            retry_base: self.retry_base,
            retry_max: self.retry_max,
            maintenance_interval: self.maintenance_interval,
        }
    }
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
