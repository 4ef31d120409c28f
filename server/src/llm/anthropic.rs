//! The Anthropic Messages API: `POST {base_url}/v1/messages` with `x-api-key` and
//! `anthropic-version`.

use serde_json::{Map, Value, json};

use super::{
    ChatModel, ChatRequest, ChatResponse, ContentBlock, Message, Role, StopReason, ToolChoice, Usage,
    error::{ErrorCode, LlmError, Redactor},
    http::{Endpoint, Parsed, Reader},
};

/// The API version this client's request and response shapes follow. It belongs to the code
/// (changing it can change the wire format), not to the configuration.
pub const API_VERSION: &str = "2023-06-01";

pub struct AnthropicClient {
    endpoint: Endpoint,
}

impl AnthropicClient {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self { endpoint }
    }
}

#[async_trait::async_trait]
impl ChatModel for AnthropicClient {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    /// The Messages API constrains a `strict` tool's input to its schema (within the subset of
    /// JSON Schema structured outputs support).
    fn supports_strict_tools(&self) -> bool {
        true
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = request_body(req, req.max_tokens.unwrap_or(self.endpoint.max_tokens));
        let url = format!("{}/v1/messages", self.endpoint.base_url);
        let redactor = self.endpoint.redactor();
        self.endpoint
            .call(
                req,
                &url,
                "request-id",
                &|builder, key| builder.header("x-api-key", key.clone()).header("anthropic-version", API_VERSION).json(&body),
                &|status, raw| classify(redactor, status, raw),
                &Reader { parse: &parse_response, usage: &usage_of },
            )
            .await
    }
}

/// The JSON body for `req`.
pub fn request_body(req: &ChatRequest, max_tokens: u32) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(req.messages.iter().map(message).collect()));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let mut tool = json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema });
                if t.strict {
                    tool["strict"] = json!(true);
                }
                tool
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let mut choice = match &req.tool_choice {
            ToolChoice::Auto => json!({ "type": "auto" }),
            ToolChoice::Any => json!({ "type": "any" }),
            ToolChoice::Tool(name) => json!({ "type": "tool", "name": name }),
            ToolChoice::None => json!({ "type": "none" }),
        };
        if req.disable_parallel_tool_use && req.tool_choice != ToolChoice::None {
            choice["disable_parallel_tool_use"] = json!(true);
        }
        body.insert("tool_choice".into(), choice);
    }
    Value::Object(body)
}

fn message(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    // tool_result blocks must come first in their user message.
    let mut blocks: Vec<&ContentBlock> = m.content.iter().collect();
    blocks.sort_by_key(|b| !matches!(b, ContentBlock::ToolResult { .. }));
    let content: Vec<Value> = blocks
        .into_iter()
        .map(|b| match b {
            ContentBlock::Text { text } => json!({ "type": "text", "text": text }),
            ContentBlock::ToolUse { id, name, input } => json!({ "type": "tool_use", "id": id, "name": name, "input": input }),
            ContentBlock::ToolResult { tool_use_id, content, is_error } => {
                let mut block = json!({ "type": "tool_result", "tool_use_id": tool_use_id, "content": content });
                if *is_error {
                    block["is_error"] = json!(true);
                }
                block
            }
            ContentBlock::Other(v) => v.clone(),
        })
        .collect();
    json!({ "role": role, "content": content })
}

/// The tokens an answer says it used (zero where it says nothing).
fn usage_of(body: &Value) -> Usage {
    let count = |k: &str| body.pointer(&format!("/usage/{k}")).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: count("input_tokens"),
        output_tokens: count("output_tokens"),
        cache_read_tokens: count("cache_read_input_tokens"),
        cache_write_tokens: count("cache_creation_input_tokens"),
    }
}

fn parse_response(body: &Value) -> Result<Parsed, String> {
    let blocks = body.get("content").and_then(Value::as_array).ok_or("no content array")?;
    let content = blocks
        .iter()
        .map(|b| match b.get("type").and_then(Value::as_str) {
            Some("text") => b.get("text").and_then(Value::as_str).map(ContentBlock::text).ok_or("a text block without text"),
            Some("tool_use") => {
                let id = b.get("id").and_then(Value::as_str).ok_or("a tool_use block without id")?;
                let name = b.get("name").and_then(Value::as_str).ok_or("a tool_use block without name")?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                Ok(ContentBlock::ToolUse { id: id.into(), name: name.into(), input })
            }
            _ => Ok(ContentBlock::Other(b.clone())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let stop = body.get("stop_reason").and_then(Value::as_str).ok_or("no stop_reason")?;
    let stop_details = body.get("stop_details").filter(|v| !v.is_null()).cloned();
    if body.get("usage").is_none() {
        return Err("no usage".into());
    }
    let usage = usage_of(body);
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok((content, StopReason::from_anthropic(stop), stop_details, usage, model))
}

/// Reads `{"type":"error","error":{"type","message","details"}}`. The error type decides the
/// code when it is known; otherwise the status does.
fn classify(redactor: &Redactor, status: u16, raw: &[u8]) -> (ErrorCode, String) {
    let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let error = body.get("error").cloned().unwrap_or(Value::Null);
    let kind = error.get("type").and_then(Value::as_str).unwrap_or_default();
    let text = error.get("message").and_then(Value::as_str).map(str::to_string);
    let mut code = match kind {
        "authentication_error" | "permission_error" => ErrorCode::Auth,
        "billing_error" => ErrorCode::SpendLimit,
        "rate_limit_error" => ErrorCode::RateLimited,
        "overloaded_error" => ErrorCode::Overloaded,
        "timeout_error" => ErrorCode::Timeout,
        "invalid_request_error" | "not_found_error" | "request_too_large" => ErrorCode::BadRequest,
        "api_error" => ErrorCode::ProviderError,
        _ => ErrorCode::for_status(status),
    };
    if super::http::is_spend_limit(&error, text.as_deref()) {
        code = ErrorCode::SpendLimit;
    }
    let message = match text {
        Some(text) if !kind.is_empty() => format!("HTTP {status} {kind}: {text}"),
        Some(text) => format!("HTTP {status}: {text}"),
        None => format!("HTTP {status}: {}", String::from_utf8_lossy(&raw[..raw.len().min(200)])),
    };
    (code, redactor.clean(&message))
}
