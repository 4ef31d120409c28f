//! OpenAI-compatible chat completions (OpenAI, OpenRouter, Ollama's /v1, vLLM):
//! `POST {base_url}/chat/completions` with `Authorization: Bearer`.
//!
//! Mapping from the neutral shapes: the system prompt becomes the first `system` message;
//! assistant `tool_use` blocks become `tool_calls` (arguments as a JSON string); `tool_result`
//! blocks become `tool` messages placed before the user's text; blocks with no equivalent
//! (thinking and the like) are left out. Back again, `tool_calls` become `tool_use` blocks; an
//! `arguments` string that is not JSON is kept as a JSON string so that schema validation
//! rejects it and the model can be told.

use serde_json::{Map, Value, json};

use super::{
    ChatModel, ChatRequest, ChatResponse, ContentBlock, Message, Role, StopReason, ToolChoice, Usage,
    error::{ErrorCode, LlmError, Redactor},
    http::{Endpoint, Parsed, Reader},
};

pub struct OpenAiClient {
    endpoint: Endpoint,
}

impl OpenAiClient {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self { endpoint }
    }
}

#[async_trait::async_trait]
impl ChatModel for OpenAiClient {
    fn provider(&self) -> &'static str {
        "openai"
    }

    // `supports_strict_tools` stays false. OpenAI's strict mode wants every property listed in
    // `required` (optional ones as nullable unions), which catalog schemas with optional
    // arguments do not meet, so the request would be refused or the model made to invent
    // values; and the other servers this client talks to (Ollama, vLLM, OpenRouter's upstreams)
    // ignore `strict` or reject it. Arguments are validated by the checkpoint either way.

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = request_body(req, req.max_tokens.unwrap_or(self.endpoint.max_tokens));
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        let redactor = self.endpoint.redactor();
        self.endpoint
            .call(
                req,
                &url,
                "x-request-id",
                &|builder, key| builder.header(reqwest::header::AUTHORIZATION, key.clone()).json(&body),
                &|status, raw| classify(redactor, status, raw),
                &Reader { parse: &parse_response, usage: &usage_of },
            )
            .await
    }
}

/// The JSON body for `req`.
pub fn request_body(req: &ChatRequest, max_tokens: u32) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(json!({ "role": "system", "content": system }));
    }
    for m in &req.messages {
        push_message(&mut messages, m);
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(max_tokens));
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let mut function = json!({ "name": t.name, "description": t.description, "parameters": t.input_schema });
                if t.strict {
                    function["strict"] = json!(true);
                }
                json!({ "type": "function", "function": function })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &req.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Any => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Tool(name) => json!({ "type": "function", "function": { "name": name } }),
        };
        body.insert("tool_choice".into(), choice);
        if req.disable_parallel_tool_use {
            body.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    Value::Object(body)
}

fn push_message(out: &mut Vec<Value>, m: &Message) {
    let text: String = m
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n\n");
    match m.role {
        Role::User => {
            for b in &m.content {
                if let ContentBlock::ToolResult { tool_use_id, content, is_error } = b {
                    let content = if *is_error { format!("Error: {content}") } else { content.clone() };
                    out.push(json!({ "role": "tool", "tool_call_id": tool_use_id, "content": content }));
                }
            }
            if !text.is_empty() {
                out.push(json!({ "role": "user", "content": text }));
            }
        }
        Role::Assistant => {
            let calls: Vec<Value> = m
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::ToolUse { id, name, input } => Some(json!({
                        "id": id, "type": "function", "function": { "name": name, "arguments": input.to_string() }
                    })),
                    _ => None,
                })
                .collect();
            let mut msg = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) } });
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
    }
}

/// The tokens an answer says it used (zero where it says nothing); cached input is counted
/// apart from the rest.
fn usage_of(body: &Value) -> Usage {
    let count = |p: &str| body.pointer(&format!("/usage{p}")).and_then(Value::as_u64).unwrap_or(0);
    let cached = count("/prompt_tokens_details/cached_tokens");
    Usage { input_tokens: count("/prompt_tokens").saturating_sub(cached), output_tokens: count("/completion_tokens"), cache_read_tokens: cached, cache_write_tokens: 0 }
}

fn parse_response(body: &Value) -> Result<Parsed, String> {
    let choice = body.pointer("/choices/0").ok_or("no choices")?;
    let message = choice.get("message").ok_or("no message in the first choice")?;
    let mut content = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) if !text.is_empty() => content.push(ContentBlock::text(text.as_str())),
        Some(Value::Array(parts)) => {
            content.extend(parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(ContentBlock::text));
        }
        _ => {}
    }
    for call in message.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let id = call.get("id").and_then(Value::as_str).ok_or("a tool call without id")?;
        let function = call.get("function").ok_or("a tool call without function")?;
        let name = function.get("name").and_then(Value::as_str).ok_or("a tool call without a function name")?;
        let input = match function.get("arguments") {
            Some(Value::String(args)) if args.trim().is_empty() => json!({}),
            Some(Value::String(args)) => serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.clone())),
            Some(other) => other.clone(),
            None => json!({}),
        };
        content.push(ContentBlock::ToolUse { id: id.into(), name: name.into(), input });
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str).ok_or("no finish_reason")?;
    let usage = usage_of(body);
    let refusal = message.get("refusal").filter(|v| v.is_string()).map(|r| json!({ "type": "refusal", "explanation": r }));
    let stop = if refusal.is_some() { StopReason::Refusal } else { StopReason::from_openai(finish) };
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok((content, stop, refusal, usage, model))
}

/// Reads `{"error":{"message","type","code"}}` (OpenAI, OpenRouter, vLLM) or
/// `{"error":"message"}` (Ollama).
fn classify(redactor: &Redactor, status: u16, raw: &[u8]) -> (ErrorCode, String) {
    let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let error = body.get("error").cloned().unwrap_or(Value::Null);
    let text = match &error {
        Value::String(s) => Some(s.clone()),
        e => e.get("message").and_then(Value::as_str).map(str::to_string),
    };
    let mut code = ErrorCode::for_status(status);
    if super::http::is_spend_limit(&error, text.as_deref()) {
        code = ErrorCode::SpendLimit;
    }
    let message = match text {
        Some(text) => format!("HTTP {status}: {text}"),
        None => format!("HTTP {status}: {}", String::from_utf8_lossy(&raw[..raw.len().min(200)])),
    };
    (code, redactor.clean(&message))
}
