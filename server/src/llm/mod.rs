//! Language models behind one trait. The runtime holds an `Arc<dyn ChatModel>` built by
//! [`from_settings`] (usually wrapped by [`recorded`], which writes one `llm_calls` row per
//! call) and asks [`degraded`] whether the configured provider has its key.
//!
//! Provider facts (wire formats, stop reasons, retry rules) are in
//! shared/reference/llm-apis.md; the clients follow it.

pub mod anthropic;
mod error;
mod http;
pub mod openai;
mod record;
mod retry;
mod types;

use std::sync::Arc;

pub use error::{ErrorCode, LlmError};
pub use record::{CallObserver, Observers, Recorded, call_row, cost_micro_usd};
pub use retry::RetryPolicy;
pub use types::{ChatRequest, ChatResponse, ContentBlock, Message, Purpose, Role, StopReason, ToolChoice, ToolSpec, Usage};

use crate::{
    config::{LlmProvider, Settings, secrets::Secrets},
    db::Db,
};

/// A model that answers a [`ChatRequest`]. Implementations retry within their own deadline; an
/// error returned is final for this call.
#[async_trait::async_trait]
pub trait ChatModel: Send + Sync {
    /// `"anthropic"` or `"openai"`, for records and logs.
    fn provider(&self) -> &'static str;

    /// Whether the provider honours `strict` tool definitions (arguments constrained to the
    /// schema). Callers set [`ToolSpec::strict`] only where this is true; the arguments are
    /// validated either way.
    fn supports_strict_tools(&self) -> bool {
        false
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError>;
}

/// The client for the configured provider. Without its key the client still exists and answers
/// every call with `LLM_NOT_CONFIGURED` at once (see [`degraded`]); an error here means the key
/// cannot be used at all (e.g. it holds a line break).
pub fn from_settings(settings: &Settings, secrets: &Secrets) -> Result<Arc<dyn ChatModel>, LlmError> {
    let llm = &settings.llm;
    let policy = RetryPolicy::from_settings(llm);
    let var = llm.provider.key_var();
    let key = secrets.by_name(var);
    Ok(match llm.provider {
        LlmProvider::Anthropic => Arc::new(anthropic::AnthropicClient::new(http::Endpoint::new(&llm.anthropic, policy, key, var, "")?)),
        LlmProvider::Openai => Arc::new(openai::OpenAiClient::new(http::Endpoint::new(&llm.openai, policy, key, var, "Bearer ")?)),
    })
}

/// `model` with every call recorded in `llm_calls`, priced from `[models]`, and then told to
/// `observer`.
pub fn recorded(model: Arc<dyn ChatModel>, db: Db, settings: &Settings, observer: Option<Arc<dyn CallObserver>>) -> Arc<dyn ChatModel> {
    Arc::new(Recorded::new(model, db, settings.models.prices.clone(), observer))
}

/// Degraded mode: the configured provider has no key, so no model can answer. Customers get
/// `customer_reply`, owners get `owner_instruction`, the console shows a banner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degraded {
    pub provider: &'static str,
    /// The environment variable to set.
    pub variable: &'static str,
    pub customer_reply: String,
    pub owner_instruction: String,
}

/// `Some` when the configured provider's key is missing.
pub fn degraded(settings: &Settings, secrets: &Secrets) -> Option<Degraded> {
    let llm = &settings.llm;
    let provider = llm.provider.as_str();
    let variable = llm.provider.key_var();
    secrets.by_name(variable).is_none().then(|| Degraded {
        provider,
        variable,
        customer_reply: llm.fallback_reply.clone(),
        owner_instruction: llm.owner_instruction.replace("{provider}", provider).replace("{variable}", variable),
    })
}
