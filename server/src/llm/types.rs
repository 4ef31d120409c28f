//! Provider-neutral request and response. The shapes follow the Anthropic Messages API (content
//! blocks, tool_use / tool_result), which is the richer of the two wire formats; the OpenAI
//! client maps them to and from chat completions.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::ModelSettings;

/// What a call is for. It picks the model from `[models]` and labels the recorded call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumIter)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Purpose {
    Chat,
    Planner,
    Summarizer,
    Compaction,
    /// Repair proposals for failing eval cases (self-improvement).
    Repair,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The configured model for this purpose (empty when the operator left it unset).
    pub fn model(self, models: &ModelSettings) -> &str {
        match self {
            Self::Chat => &models.chat,
            Self::Planner => &models.planner,
            Self::Summarizer => &models.summarizer,
            Self::Compaction => &models.compaction,
            Self::Repair => &models.repair,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// One block of a message. Blocks this crate does not model (thinking, server tool results)
/// are kept verbatim in `Other`, because the Anthropic API wants them passed back unchanged.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    Text { text: String },
    ToolUse { id: String, name: String, input: Value },
    ToolResult { tool_use_id: String, content: String, is_error: bool },
    Other(Value),
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<ContentBlock>,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Self {
        Self { role: Role::User, content: vec![ContentBlock::text(text)] }
    }

    pub fn assistant(text: impl Into<String>) -> Self {
        Self { role: Role::Assistant, content: vec![ContentBlock::text(text)] }
    }
}

/// A tool the model may call. `strict` asks the provider for schema-constrained arguments; only
/// set it for schemas inside the provider's supported subset (our own built-ins, not arbitrary
/// MCP schemas).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema whose type is "object".
    pub input_schema: Value,
    pub strict: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (the providers' default when tools are given).
    #[default]
    Auto,
    /// The model must call some tool.
    Any,
    /// The model must call this tool.
    Tool(String),
    /// The model must not call a tool.
    None,
}

/// One model call. `correlation_id` is recorded with the call and never sent to the provider.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub purpose: Purpose,
    /// From `[models]`; see [`ChatRequest::new`].
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// At most one tool call per reply.
    pub disable_parallel_tool_use: bool,
    /// `None`: the endpoint's configured `max_tokens`.
    pub max_tokens: Option<u32>,
    pub correlation_id: String,
}

impl ChatRequest {
    /// A request for `purpose`, with the model configured for it.
    pub fn new(models: &ModelSettings, purpose: Purpose, correlation_id: impl Into<String>, messages: Vec<Message>) -> Self {
        Self {
            purpose,
            model: purpose.model(models).to_string(),
            system: None,
            messages,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            disable_parallel_tool_use: false,
            max_tokens: None,
            correlation_id: correlation_id.into(),
        }
    }

    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>, choice: ToolChoice) -> Self {
        self.tools = tools;
        self.tool_choice = choice;
        self
    }
}

/// Why the model stopped, the same for every provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    /// Run the tool calls and send their results.
    ToolUse,
    /// A server-side loop paused; send the assistant content back as it is to continue.
    PauseTurn,
    /// The model declined; do not retry the same prompt blindly.
    Refusal,
    /// The context window filled up; treat as truncated.
    ContextWindowExceeded,
    /// A value this build does not know, kept as the provider sent it.
    Other(String),
}

impl StopReason {
    pub fn from_anthropic(value: &str) -> Self {
        match value {
            "end_turn" => Self::EndTurn,
            "max_tokens" => Self::MaxTokens,
            "stop_sequence" => Self::StopSequence,
            "tool_use" => Self::ToolUse,
            "pause_turn" => Self::PauseTurn,
            "refusal" => Self::Refusal,
            "model_context_window_exceeded" => Self::ContextWindowExceeded,
            other => Self::Other(other.to_string()),
        }
    }

    pub fn from_openai(value: &str) -> Self {
        match value {
            "stop" => Self::EndTurn,
            "length" => Self::MaxTokens,
            "tool_calls" | "function_call" => Self::ToolUse,
            "content_filter" => Self::Refusal,
            other => Self::Other(other.to_string()),
        }
    }

    /// Whether the model finished what it was writing (and was not cut off by a token limit,
    /// a full context, a refusal or a filter).
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::EndTurn | Self::StopSequence)
    }

    /// The provider-neutral name (`end_turn`, `tool_use`, ...; an unknown value as sent).
    pub fn as_str(&self) -> &str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::StopSequence => "stop_sequence",
            Self::ToolUse => "tool_use",
            Self::PauseTurn => "pause_turn",
            Self::Refusal => "refusal",
            Self::ContextWindowExceeded => "model_context_window_exceeded",
            Self::Other(other) => other,
        }
    }

    /// The reply was cut off; a tool call in it may be incomplete.
    pub fn is_truncated(&self) -> bool {
        matches!(self, Self::MaxTokens | Self::ContextWindowExceeded)
    }
}

/// Tokens of one call. `input_tokens` excludes cached input on every provider (OpenAI counts
/// cached tokens inside `prompt_tokens`; they are moved to `cache_read_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    pub content: Vec<ContentBlock>,
    pub stop_reason: StopReason,
    /// Anthropic's `stop_details` (for a refusal: its category and explanation).
    pub stop_details: Option<Value>,
    pub usage: Usage,
    /// The model that answered, as the provider names it.
    pub model: String,
    pub request_id: Option<String>,
    /// From the first attempt to the parsed answer, backoff included.
    pub latency: Duration,
    pub attempts: u32,
}

impl ChatResponse {
    /// The text blocks joined, for plain chat replies.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }

    /// `(id, name, input)` of each tool call, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }

    /// The assistant message to append to the history before sending tool results (or, after
    /// `pause_turn`, before calling again).
    pub fn to_message(&self) -> Message {
        Message { role: Role::Assistant, content: self.content.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_round_trip_and_unknown_ones_are_kept() {
        for name in ["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded", "something_new"] {
            assert_eq!(StopReason::from_anthropic(name).as_str(), name);
        }
        assert_eq!(StopReason::from_openai("tool_calls"), StopReason::ToolUse);
        assert_eq!(StopReason::from_openai("stop").as_str(), "end_turn");
        assert!(StopReason::from_anthropic("model_context_window_exceeded").is_truncated());
        assert!(!StopReason::from_openai("stop").is_truncated());
    }

    #[test]
    fn each_purpose_takes_its_configured_model() {
        let models = ModelSettings { chat: "a".into(), planner: "b".into(), summarizer: "c".into(), compaction: "d".into(), repair: "e".into(), prices: vec![] };
        let picked: Vec<&str> = <Purpose as strum::IntoEnumIterator>::iter().map(|p| p.model(&models)).collect();
        assert_eq!(picked, ["a", "b", "c", "d", "e"]);
        let req = ChatRequest::new(&models, Purpose::Summarizer, "c1", vec![Message::user("x")]);
        assert_eq!((req.model.as_str(), req.purpose.as_str()), ("c", "summarizer"));
    }
}
