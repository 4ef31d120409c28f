//! Typed settings: built-in defaults, then `config/gatehouse.toml`, then `GATEHOUSE__SECTION__KEY`
//! environment variables. Secrets never live here; they come from named environment variables
//! only (see [`secrets`]).

/// The texts of a settings section by their keys, for `check-config`: each key is
/// `section.field`, made from the field's own name.
macro_rules! texts_by_key {
    ($settings:expr, $section:literal: $($field:ident),+ $(,)?) => {
        [$((concat!($section, ".", stringify!($field)), $settings.$field.as_str())),+]
    };
}
pub(crate) use texts_by_key;

mod builtins;
mod check;
pub mod detector;
pub mod conversation;
mod jobs;
pub mod approvals;
pub mod budget;
pub mod evals;
pub mod events;
pub mod lane;
mod llm;
pub mod load;
mod mcp;
pub mod net;
pub mod retention;
pub mod secrets;
mod server;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod tests;
mod whatsapp;

use serde::{Deserialize, Serialize};

pub use builtins::{SearchProvider, WebFetchSettings, WebSearchSettings};
pub use detector::{DetectorSettings, FieldWeights, Language};
pub use evals::EvalSettings;
pub use events::EventSettings;
pub use jobs::{JobAttempts, JobSettings, JobTimeouts};
pub use approvals::ApprovalSettings;
pub use budget::{AtLimit, BudgetSettings};
pub use lane::LaneSettings;
pub use llm::{EndpointSettings, LlmProvider, LlmSettings, ModelPrice, ModelSettings};
pub use mcp::McpSettings;
pub use retention::RetentionSettings;
pub use load::{ConfigError, LoadedConfig, Problem, ProblemCode, load};
pub use secrets::{SecretSource, Secrets};
pub use server::{AuthSettings, DatabaseKind, DatabaseSettings, LogFormat, LogSettings, ServerSettings, SqliteSynchronous};
pub use telemetry::TelemetrySettings;
pub use whatsapp::WhatsAppSettings;

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
    pub lane: LaneSettings,
    pub approvals: ApprovalSettings,
    pub budget: BudgetSettings,
    pub retention: RetentionSettings,
    pub evals: EvalSettings,
    pub events: EventSettings,
    pub mcp: McpSettings,
    pub whatsapp: WhatsAppSettings,
    pub telemetry: TelemetrySettings,
}

impl Settings {
    /// What a job that answers needs besides its own work: one model call (the reply, or a tool
    /// result's summary) and the answer's sends.
    pub fn reply_reserve(&self) -> std::time::Duration {
        self.llm.endpoint().timeout.saturating_add(self.whatsapp.send_reserve())
    }
}

/// Durations as human-readable strings: "500ms", "15m", "12h", "7d".
pub mod duration_str {
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
