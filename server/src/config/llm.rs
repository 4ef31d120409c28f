//! The language model provider, its endpoints, and which model serves which purpose.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration_str, secrets};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
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
        self.into()
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
    /// Repair proposals for failing eval cases; empty: only the deterministic strategies.
    pub repair: String,
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

