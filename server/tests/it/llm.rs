//! The LLM clients against local fakes that answer like the Anthropic Messages API and an
//! OpenAI-compatible chat completions server: real HTTP on 127.0.0.1, real wire format, a
//! script of answers, and every request kept for inspection.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};
use server::{
    config::{LlmProvider, ModelPrice, Secrets, Settings},
    llm::{self, ChatRequest, ContentBlock, ErrorCode, Message, Purpose, Role, StopReason, ToolChoice, ToolSpec},
};

use crate::{both_backends, support::TestDb};

const ANTHROPIC_KEY: &str = "sk-ant-api03-TESTKEYtestkeyTESTKEY-0123456789abcdef";
const OPENAI_KEY: &str = "sk-proj-OPENAIsecretOPENAIsecret-9876543210";
const CHAT_MODEL: &str = "test-chat-model";

/// One scripted answer.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
    delay: Duration,
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self { status: 200, headers: vec![], body, delay: Duration::ZERO }
    }

    fn status(status: u16, body: Value) -> Self {
        Self { status, headers: vec![], body, delay: Duration::ZERO }
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }

    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

struct Seen {
    headers: HeaderMap,
    body: Value,
}

#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    fn hits(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    fn body(&self, i: usize) -> Value {
        self.seen.lock().expect("lock")[i].body.clone()
    }

    fn header(&self, i: usize, name: &str) -> Option<String> {
        self.seen.lock().expect("lock")[i].headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    }
}

async fn answer(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.seen.lock().expect("lock").push(Seen { headers, body });
    let next = fake.script.lock().expect("lock").pop_front();
    let Some(reply) = next else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the fake's script ran out").into_response();
    };
    tokio::time::sleep(reply.delay).await;
    let mut res = (StatusCode::from_u16(reply.status).expect("status"), axum::Json(reply.body)).into_response();
    for (name, value) in reply.headers {
        res.headers_mut().insert(name, value.parse().expect("header value"));
    }
    res
}

/// Starts a fake answering `replies` in order; returns it and its base URL.
async fn start_fake(replies: Vec<Reply>) -> (Fake, String) {
    let fake = Fake { script: Arc::new(Mutex::new(replies.into())), ..Default::default() };
    let router = Router::new().route("/v1/messages", post(answer)).route("/v1/chat/completions", post(answer)).with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    (fake, format!("http://{addr}"))
}

fn settings(provider: LlmProvider, base: &str) -> Settings {
    let mut s = Settings::default();
    s.llm.provider = provider;
    s.llm.anthropic.base_url = base.to_string();
    s.llm.openai.base_url = format!("{base}/v1");
    s.llm.anthropic.timeout = Duration::from_secs(10);
    s.llm.openai.timeout = Duration::from_secs(10);
    s.llm.anthropic.max_tokens = 321;
    s.llm.openai.max_tokens = 321;
    s.llm.max_retries = 3;
    s.llm.retry_initial_delay = Duration::from_millis(10);
    s.llm.retry_max_delay = Duration::from_millis(40);
    s.models.chat = CHAT_MODEL.into();
    s.models.summarizer = "test-summary-model".into();
    s.models.prices = vec![ModelPrice { model: CHAT_MODEL.into(), input: 3.0, output: 15.0, cache_read: Some(0.3), cache_write: Some(3.75) }];
    s
}

fn keys() -> Secrets {
    Secrets::from_lookup(|name| match name {
        "ANTHROPIC_API_KEY" => Some(ANTHROPIC_KEY.into()),
        "OPENAI_API_KEY" => Some(OPENAI_KEY.into()),
        _ => None,
    })
}

fn chat(s: &Settings, text: &str) -> ChatRequest {
    ChatRequest::new(&s.models, Purpose::Chat, "corr-1", vec![Message::user(text)])
}

fn anthropic_message(content: Value, stop: &str) -> Value {
    json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "test-chat-model-20260101",
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": { "input_tokens": 1000, "output_tokens": 500, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 100 }
    })
}

fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({ "type": "error", "error": { "type": kind, "message": message }, "request_id": "req_err" })
}

fn order_tool(strict: bool) -> ToolSpec {
    ToolSpec {
        name: "lookup_order".into(),
        description: "Looks up an order by id.".into(),
        input_schema: json!({ "type": "object", "properties": { "order_id": { "type": "string" } }, "required": ["order_id"], "additionalProperties": false }),
        strict,
    }
}

#[tokio::test]
async fn anthropic_text_reply_with_usage_and_headers() {
    let (fake, base) = start_fake(vec![Reply::ok(anthropic_message(json!([{ "type": "text", "text": "Hello there." }]), "end_turn")).header("request-id", "req_123")]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let model = llm::from_settings(&s, &keys()).expect("client");
    assert_eq!(model.provider(), "anthropic");
    let res = model.chat(&chat(&s, "Hi").with_system("Be brief.")).await.expect("reply");
    assert_eq!(res.text(), "Hello there.");
    assert_eq!(res.stop_reason, StopReason::EndTurn);
    assert_eq!((res.usage.input_tokens, res.usage.output_tokens, res.usage.cache_read_tokens, res.usage.cache_write_tokens), (1000, 500, 2000, 100));
    assert_eq!(res.model, "test-chat-model-20260101");
    assert_eq!(res.request_id.as_deref(), Some("req_123"));
    assert_eq!(res.attempts, 1);
    assert_eq!(fake.header(0, "x-api-key").as_deref(), Some(ANTHROPIC_KEY));
    assert_eq!(fake.header(0, "anthropic-version").as_deref(), Some("2023-06-01"));
    assert_eq!(
        fake.body(0),
        json!({ "model": CHAT_MODEL, "max_tokens": 321, "system": "Be brief.",
                "messages": [{ "role": "user", "content": [{ "type": "text", "text": "Hi" }] }] }),
        "no tools: no tools or tool_choice keys"
    );
}

#[tokio::test]
async fn anthropic_tool_use_and_request_serialization() {
    let reply = anthropic_message(
        json!([{ "type": "text", "text": "Let me check." }, { "type": "tool_use", "id": "toolu_01A", "name": "lookup_order", "input": { "order_id": "42" } }]),
        "tool_use",
    );
    let (fake, base) = start_fake(vec![Reply::ok(reply)]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let model = llm::from_settings(&s, &keys()).expect("client");
    let history = vec![
        Message::user("Where is order 41?"),
        Message { role: Role::Assistant, content: vec![ContentBlock::ToolUse { id: "toolu_00".into(), name: "lookup_order".into(), input: json!({ "order_id": "41" }) }] },
        Message {
            role: Role::User,
            content: vec![
                ContentBlock::text("And order 42?"),
                ContentBlock::ToolResult { tool_use_id: "toolu_00".into(), content: "{\"status\":\"lost\"}".into(), is_error: true },
            ],
        },
    ];
    let mut plain = order_tool(false);
    plain.name = "other_tool".into();
    let mut req = ChatRequest::new(&s.models, Purpose::Chat, "corr-2", history).with_tools(vec![order_tool(true), plain], ToolChoice::Tool("lookup_order".into()));
    req.disable_parallel_tool_use = true;
    req.max_tokens = Some(50);
    let res = model.chat(&req).await.expect("reply");
    assert_eq!(res.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = res.tool_calls().collect();
    assert_eq!(calls, vec![("toolu_01A", "lookup_order", &json!({ "order_id": "42" }))]);
    assert_eq!(res.text(), "Let me check.");

    let sent = fake.body(0);
    assert_eq!(sent["max_tokens"], 50, "the caller's limit wins over the configured one");
    assert_eq!(sent["tools"][0]["strict"], true);
    assert_eq!(sent["tools"][0]["input_schema"]["additionalProperties"], false);
    assert!(sent["tools"][1].get("strict").is_none(), "strict only where asked: {}", sent["tools"][1]);
    assert_eq!(sent["tool_choice"], json!({ "type": "tool", "name": "lookup_order", "disable_parallel_tool_use": true }));
    assert_eq!(sent["messages"][1]["content"][0], json!({ "type": "tool_use", "id": "toolu_00", "name": "lookup_order", "input": { "order_id": "41" } }));
    assert_eq!(
        sent["messages"][2]["content"],
        json!([{ "type": "tool_result", "tool_use_id": "toolu_00", "content": "{\"status\":\"lost\"}", "is_error": true }, { "type": "text", "text": "And order 42?" }]),
        "tool results come first in their user message"
    );

    for (choice, expected) in [
        (ToolChoice::Auto, json!({ "type": "auto" })),
        (ToolChoice::Any, json!({ "type": "any" })),
        (ToolChoice::None, json!({ "type": "none" })),
    ] {
        let req = chat(&s, "x").with_tools(vec![order_tool(false)], choice);
        assert_eq!(llm::anthropic::request_body(&req, 10)["tool_choice"], expected);
    }
}

#[tokio::test]
async fn anthropic_pause_turn_and_refusal() {
    let server_block = json!({ "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": { "query": "tea" } });
    let (fake, base) = start_fake(vec![
        Reply::ok(anthropic_message(json!([server_block.clone()]), "pause_turn")),
        Reply::ok({
            let mut m = anthropic_message(json!([]), "refusal");
            m["stop_details"] = json!({ "type": "refusal", "category": "cyber", "explanation": "declined" });
            m
        }),
    ])
    .await;
    let s = settings(LlmProvider::Anthropic, &base);
    let model = llm::from_settings(&s, &keys()).expect("client");
    let mut req = chat(&s, "Search for tea");
    let paused = model.chat(&req).await.expect("paused");
    assert_eq!(paused.stop_reason, StopReason::PauseTurn);
    assert_eq!(paused.content, vec![ContentBlock::Other(server_block.clone())], "unknown blocks are kept verbatim");
    req.messages.push(paused.to_message());
    let refused = model.chat(&req).await.expect("refusal is an answer, not an error");
    assert_eq!(refused.stop_reason, StopReason::Refusal);
    assert_eq!(refused.stop_details.as_ref().and_then(|d| d.get("category")), Some(&json!("cyber")));
    assert_eq!(fake.body(1)["messages"][1], json!({ "role": "assistant", "content": [server_block] }), "paused content is sent back unchanged");
}

#[tokio::test]
async fn retries_on_429_529_and_500_then_succeed() {
    let ok = Reply::ok(anthropic_message(json!([{ "type": "text", "text": "fine" }]), "end_turn"));
    let (fake, base) = start_fake(vec![
        Reply::status(429, anthropic_error("rate_limit_error", "slow down")).header("retry-after-ms", "30"),
        Reply::status(529, anthropic_error("overloaded_error", "Overloaded")),
        Reply::status(500, anthropic_error("api_error", "Internal server error")),
        ok.clone(),
    ])
    .await;
    let s = settings(LlmProvider::Anthropic, &base);
    let res = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect("succeeds on the 4th attempt");
    assert_eq!((res.attempts, fake.hits()), (4, 4));
    assert!(res.latency >= Duration::from_millis(30), "retry-after-ms was waited: {:?}", res.latency);

    // 408 (request timeout) and 409 (conflict) are retried too, as the official SDKs do.
    let (fake, base) = start_fake(vec![
        Reply::status(408, anthropic_error("timeout_error", "Request timed out")),
        Reply::status(409, anthropic_error("conflict_error", "Conflict")),
        ok.clone(),
    ])
    .await;
    let s = settings(LlmProvider::Anthropic, &base);
    let res = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect("succeeds on the 3rd attempt");
    assert_eq!((res.attempts, fake.hits()), (3, 3));

    // retry-after in seconds is honoured over the (much shorter) configured backoff.
    let (fake, base) = start_fake(vec![Reply::status(429, anthropic_error("rate_limit_error", "slow down")).header("retry-after", "1"), ok.clone()]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let started = Instant::now();
    let res = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect("second attempt");
    assert_eq!((res.attempts, fake.hits()), (2, 2));
    assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());

    // Retries run out: the last error is returned with every attempt counted.
    let busy = Reply::status(529, anthropic_error("overloaded_error", "Overloaded"));
    let (fake, base) = start_fake(vec![busy.clone(), busy.clone(), busy.clone(), busy.clone(), ok]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("out of retries");
    assert_eq!((err.code, err.attempts, err.status, fake.hits()), (ErrorCode::Overloaded, 4, Some(529), 4));
    assert!(err.retryable);
}

#[tokio::test]
async fn x_should_retry_header_decides() {
    let ok = Reply::ok(anthropic_message(json!([{ "type": "text", "text": "fine" }]), "end_turn"));
    let (fake, base) = start_fake(vec![Reply::status(500, anthropic_error("api_error", "boom")).header("x-should-retry", "false"), ok.clone()]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("not retried");
    assert_eq!((err.code, err.attempts, fake.hits()), (ErrorCode::ProviderError, 1, 1));
    assert!(!err.retryable);

    let (fake, base) = start_fake(vec![Reply::status(400, anthropic_error("invalid_request_error", "try again")).header("x-should-retry", "true"), ok]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let res = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect("retried because the header said so");
    assert_eq!((res.attempts, fake.hits()), (2, 2));
}

#[tokio::test]
async fn spend_limit_is_never_retried() {
    let ok = Reply::ok(anthropic_message(json!([{ "type": "text", "text": "fine" }]), "end_turn"));
    let body = json!({ "type": "error", "error": { "type": "rate_limit_error", "message": "Spend limit reached",
                       "details": { "error_code": "enforced_spend_limit_reached" } } });
    let (fake, base) = start_fake(vec![Reply::status(429, body).header("retry-after", "1").header("x-should-retry", "true"), ok]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("spend limit");
    assert_eq!((err.code, err.attempts, fake.hits()), (ErrorCode::SpendLimit, 1, 1));
    assert!(!err.retryable);
    assert_eq!(err.code.as_str(), "LLM_SPEND_LIMIT");

    let quota = json!({ "error": { "message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota" } });
    let (fake, base) = start_fake(vec![Reply::status(429, quota)]).await;
    let s = settings(LlmProvider::Openai, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("quota");
    assert_eq!((err.code, err.attempts, fake.hits()), (ErrorCode::SpendLimit, 1, 1));
}

#[tokio::test]
async fn client_errors_map_to_codes_without_retry() {
    for (status, kind, code) in [
        (400, "invalid_request_error", ErrorCode::BadRequest),
        (401, "authentication_error", ErrorCode::Auth),
        (403, "permission_error", ErrorCode::Auth),
        (404, "not_found_error", ErrorCode::BadRequest),
    ] {
        let (fake, base) = start_fake(vec![Reply::status(status, anthropic_error(kind, "provider says no")).header("request-id", "req_e")]).await;
        let s = settings(LlmProvider::Anthropic, &base);
        let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("error");
        assert_eq!((err.code, err.status, err.attempts, fake.hits()), (code, Some(status), 1, 1), "{status}");
        assert!(!err.retryable, "{status}");
        assert!(err.message.contains("provider says no"), "the provider's message is kept: {err}");
        assert_eq!(err.request_id.as_deref(), Some("req_e"));
        assert!(err.to_string().starts_with(code.as_str()), "{err}");
    }
    // A 2xx that is not a message.
    let (_fake, base) = start_fake(vec![Reply::ok(json!({ "hello": "world" }))]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("invalid");
    assert_eq!(err.code, ErrorCode::InvalidResponse);
}

/// A redirect from the configured endpoint is not followed: the key travels in `x-api-key`
/// (Anthropic), which an HTTP client keeps on a redirect to another host, so following it would
/// hand the key to whoever the answer names.
#[tokio::test]
async fn a_redirect_is_not_followed_with_the_key() {
    let (elsewhere, other) = start_fake(vec![Reply::ok(anthropic_message(json!([{ "type": "text", "text": "hi" }]), "end_turn"))]).await;
    for provider in [LlmProvider::Anthropic, LlmProvider::Openai] {
        let path = if provider == LlmProvider::Anthropic { "/v1/messages" } else { "/v1/chat/completions" };
        let (fake, base) = start_fake(vec![Reply::status(307, json!({})).header("location", &format!("{other}{path}"))]).await;
        let s = settings(provider, &base);
        let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("a redirect is an error");
        assert_eq!((err.status, fake.hits()), (Some(307), 1), "{provider:?}: {err}");
    }
    assert_eq!(elsewhere.hits(), 0, "nothing reached the host the redirect named");
}

#[tokio::test]
async fn the_deadline_covers_attempts_and_backoff() {
    let ok = Reply::ok(anthropic_message(json!([{ "type": "text", "text": "late" }]), "end_turn"));
    let (_fake, base) = start_fake(vec![ok.clone().after(Duration::from_secs(5))]).await;
    let mut s = settings(LlmProvider::Anthropic, &base);
    s.llm.anthropic.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("too slow");
    assert_eq!(err.code, ErrorCode::Timeout);
    assert!(started.elapsed() < Duration::from_secs(2), "gave up at the deadline: {:?}", started.elapsed());

    // A retry-after that would pass the deadline is not waited for.
    let (fake, base) = start_fake(vec![Reply::status(429, anthropic_error("rate_limit_error", "later")).header("retry-after", "5"), ok]).await;
    let mut s = settings(LlmProvider::Anthropic, &base);
    s.llm.anthropic.timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("no time to retry");
    assert_eq!((err.code, err.attempts, fake.hits()), (ErrorCode::RateLimited, 1, 1));
    assert!(err.retryable, "the caller may try again later");
    assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
}

fn openai_completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-chat-model-v2",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": { "prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280, "prompt_tokens_details": { "cached_tokens": 200 } }
    })
}

#[tokio::test]
async fn openai_text_and_tool_calls_both_ways() {
    let (fake, base) = start_fake(vec![
        Reply::ok(openai_completion(json!({ "role": "assistant", "content": "Hi!" }), "stop")).header("x-request-id", "oa_req_1"),
        Reply::ok(openai_completion(
            json!({ "role": "assistant", "content": null, "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "lookup_order", "arguments": "{\"order_id\":\"42\"}" } },
                { "id": "call_2", "type": "function", "function": { "name": "lookup_order", "arguments": "{not json" } }
            ]}),
            "tool_calls",
        )),
        Reply::ok(openai_completion(json!({ "role": "assistant", "content": "cut" }), "length")),
        Reply::ok(openai_completion(json!({ "role": "assistant", "content": "" }), "content_filter")),
    ])
    .await;
    let s = settings(LlmProvider::Openai, &base);
    let model = llm::from_settings(&s, &keys()).expect("client");
    assert_eq!(model.provider(), "openai");

    let res = model.chat(&chat(&s, "Hello").with_system("Be kind.")).await.expect("text");
    assert_eq!((res.text().as_str(), res.stop_reason.clone(), res.request_id.as_deref()), ("Hi!", StopReason::EndTurn, Some("oa_req_1")));
    assert_eq!((res.usage.input_tokens, res.usage.cache_read_tokens, res.usage.output_tokens), (1000, 200, 80), "cached tokens are not counted twice");
    assert_eq!(fake.header(0, "authorization"), Some(format!("Bearer {OPENAI_KEY}")));
    assert_eq!(
        fake.body(0),
        json!({ "model": CHAT_MODEL, "max_tokens": 321, "messages": [{ "role": "system", "content": "Be kind." }, { "role": "user", "content": "Hello" }] })
    );

    let history = vec![
        Message::user("Where is order 41?"),
        Message { role: Role::Assistant, content: vec![ContentBlock::text("Checking."), ContentBlock::ToolUse { id: "call_0".into(), name: "lookup_order".into(), input: json!({ "order_id": "41" }) }] },
        Message { role: Role::User, content: vec![ContentBlock::ToolResult { tool_use_id: "call_0".into(), content: "shipped".into(), is_error: false }, ContentBlock::text("And 42?")] },
    ];
    let mut req = ChatRequest::new(&s.models, Purpose::Chat, "corr-3", history).with_tools(vec![order_tool(true)], ToolChoice::Any);
    req.disable_parallel_tool_use = true;
    let res = model.chat(&req).await.expect("tool calls");
    assert_eq!(res.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = res.tool_calls().collect();
    assert_eq!(calls[0], ("call_1", "lookup_order", &json!({ "order_id": "42" })));
    assert_eq!(calls[1], ("call_2", "lookup_order", &json!("{not json")), "bad arguments are kept for the validator to reject");
    let sent = fake.body(1);
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["tools"][0]["type"], "function");
    assert_eq!(sent["tools"][0]["function"]["name"], "lookup_order");
    assert_eq!(sent["tools"][0]["function"]["strict"], true);
    assert_eq!(sent["tools"][0]["function"]["parameters"]["required"], json!(["order_id"]));
    assert_eq!(
        sent["messages"],
        json!([
            { "role": "user", "content": "Where is order 41?" },
            { "role": "assistant", "content": "Checking.", "tool_calls": [{ "id": "call_0", "type": "function", "function": { "name": "lookup_order", "arguments": "{\"order_id\":\"41\"}" } }] },
            { "role": "tool", "tool_call_id": "call_0", "content": "shipped" },
            { "role": "user", "content": "And 42?" }
        ])
    );
    let named = chat(&s, "x").with_tools(vec![order_tool(false)], ToolChoice::Tool("lookup_order".into()));
    assert_eq!(llm::openai::request_body(&named, 5)["tool_choice"], json!({ "type": "function", "function": { "name": "lookup_order" } }));
    let none = chat(&s, "x").with_tools(vec![order_tool(false)], ToolChoice::None);
    assert_eq!(llm::openai::request_body(&none, 5)["tool_choice"], "none");

    assert_eq!(model.chat(&chat(&s, "long")).await.expect("length").stop_reason, StopReason::MaxTokens);
    assert_eq!(model.chat(&chat(&s, "bad")).await.expect("filtered").stop_reason, StopReason::Refusal);
}

#[tokio::test]
async fn openai_errors_map_and_retry() {
    let ok = Reply::ok(openai_completion(json!({ "role": "assistant", "content": "ok" }), "stop"));
    let (fake, base) = start_fake(vec![Reply::status(503, json!({ "error": "model is loading" })), Reply::status(429, json!({ "error": { "message": "rate limited", "type": "requests" } })), ok]).await;
    let s = settings(LlmProvider::Openai, &base);
    let model = llm::from_settings(&s, &keys()).expect("client");
    assert_eq!(model.chat(&chat(&s, "Hi")).await.expect("third attempt").attempts, 3);
    assert_eq!(fake.hits(), 3);

    let (_fake, base) = start_fake(vec![Reply::status(401, json!({ "error": { "message": format!("Incorrect API key provided: {}", &OPENAI_KEY[..12]), "type": "invalid_request_error", "code": "invalid_api_key" } }))]).await;
    let s = settings(LlmProvider::Openai, &base);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&chat(&s, "Hi")).await.expect_err("auth");
    assert_eq!((err.code, err.attempts), (ErrorCode::Auth, 1));
    assert!(err.message.contains("Incorrect API key provided"), "{err}");
    assert!(!format!("{err} {err:?}").contains(&OPENAI_KEY[..12]), "{err:?}");
}

#[tokio::test]
async fn degraded_without_a_key() {
    let (fake, base) = start_fake(vec![]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let none = Secrets::default();
    let d = llm::degraded(&s, &none).expect("degraded without ANTHROPIC_API_KEY");
    assert_eq!((d.provider, d.variable), ("anthropic", "ANTHROPIC_API_KEY"));
    assert_eq!(d.customer_reply, s.llm.fallback_reply);
    assert!(d.owner_instruction.contains("ANTHROPIC_API_KEY") && !d.owner_instruction.contains('{'), "{}", d.owner_instruction);
    assert!(!d.owner_instruction.contains('\n'), "one line");
    assert_eq!(llm::degraded(&s, &keys()), None);

    let err = llm::from_settings(&s, &none).expect("a client exists").chat(&chat(&s, "Hi")).await.expect_err("no key");
    assert_eq!((err.code, err.attempts, err.retryable), (ErrorCode::NotConfigured, 0, false));
    assert!(err.message.contains("ANTHROPIC_API_KEY"), "{err}");
    assert_eq!(fake.hits(), 0, "nothing was sent");

    let mut o = settings(LlmProvider::Openai, &base);
    o.llm.owner_instruction = "Set {variable} for {provider}.".into();
    let only_anthropic = Secrets::from_lookup(|n| (n == "ANTHROPIC_API_KEY").then(|| ANTHROPIC_KEY.to_string()));
    assert_eq!(llm::degraded(&o, &only_anthropic).map(|d| d.owner_instruction), Some("Set OPENAI_API_KEY for openai.".into()));

    // A purpose without a model is not configured either.
    let summary = ChatRequest::new(&s.models, Purpose::Compaction, "corr", vec![Message::user("x")]);
    let err = llm::from_settings(&s, &keys()).expect("client").chat(&summary).await.expect_err("no compaction model");
    assert_eq!(err.code, ErrorCode::NotConfigured);
    assert!(err.message.contains("models.compaction"), "{err}");
    assert_eq!(fake.hits(), 0);
}

async fn usage_and_cost_are_recorded(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let secret_text = "Where is order 42? My card ends 4242.";
    let (_fake, base) = start_fake(vec![
        Reply::ok(anthropic_message(json!([{ "type": "text", "text": "It shipped." }]), "end_turn")).header("request-id", "req_ok"),
        Reply::status(401, anthropic_error("authentication_error", &format!("invalid x-api-key {ANTHROPIC_KEY}"))),
        Reply::ok(anthropic_message(json!([{ "type": "text", "text": "Summary." }]), "end_turn")),
    ])
    .await;
    let s = settings(LlmProvider::Anthropic, &base);
    let model = llm::recorded(llm::from_settings(&s, &keys()).expect("client"), pool.clone(), &s, None);
    let req = ChatRequest::new(&s.models, Purpose::Chat, "corr-rec", vec![Message::user(secret_text)]).with_system("secret system prompt");
    model.chat(&req).await.expect("ok");
    let err = model.chat(&req).await.expect_err("auth");
    assert!(!format!("{err} {err:?}").contains(ANTHROPIC_KEY), "{err:?}");
    let summary = ChatRequest::new(&s.models, Purpose::Summarizer, "corr-rec", vec![Message::user(secret_text)]);
    model.chat(&summary).await.expect("unpriced model still answers");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let rows = server::db::llm_calls::for_correlation(&mut conn, "corr-rec").await.expect("rows");
    assert_eq!(rows.len(), 3);
    let ok = &rows[0];
    assert_eq!((ok.provider.as_str(), ok.model.as_str(), ok.purpose.as_str(), ok.outcome.as_str()), ("anthropic", CHAT_MODEL, "chat", "ok"));
    assert_eq!((ok.input_tokens, ok.output_tokens, ok.cache_read_tokens, ok.cache_write_tokens), (1000, 500, 2000, 100));
    // 1000 × 3.0 + 500 × 15.0 + 2000 × 0.3 + 100 × 3.75 micro-dollars.
    assert_eq!(ok.cost_micro_usd, Some(3000 + 7500 + 600 + 375));
    assert_eq!((ok.stop_reason.as_deref(), ok.http_status, ok.attempts, ok.request_id.as_deref()), (Some("end_turn"), Some(200), 1, Some("req_ok")));
    let failed = &rows[1];
    assert_eq!((failed.outcome.as_str(), failed.http_status, failed.attempts, failed.input_tokens), ("LLM_AUTH", Some(401), 1, 0));
    assert_eq!(failed.cost_micro_usd, Some(0));
    let unpriced = &rows[2];
    assert_eq!((unpriced.purpose.as_str(), unpriced.model.as_str(), unpriced.cost_micro_usd), ("summarizer", "test-summary-model", None));
    assert_eq!(unpriced.output_tokens, 500, "tokens are kept even without a price");

    // The times are cleared first: a millisecond clock reading may hold "4242" itself.
    let all = format!("{:?}", rows.iter().map(|r| server::db::llm_calls::LlmCallRow { at: 0, ..r.clone() }).collect::<Vec<_>>());
    for forbidden in [ANTHROPIC_KEY, &ANTHROPIC_KEY[..12], "order 42", "4242", "secret system prompt", "It shipped."] {
        assert!(!all.contains(forbidden), "{forbidden:?} must not be recorded: {all}");
    }
    let (cost, calls) = server::db::llm_calls::cost_since(&mut conn, 0).await.expect("cost");
    assert_eq!((cost, calls), (11_475, 3));
    assert_eq!(server::db::llm_calls::recent(&mut conn, 1).await.expect("recent")[0].purpose, "summarizer");
}
both_backends!(usage_and_cost_recorded, usage_and_cost_are_recorded);

/// A caller that stops waiting (a message's deadline, a job's timeout) does not stop the call's
/// record: the provider answers, and may bill, after the wait was dropped, and the call is
/// still written with its tokens and cost, so the budget counts it.
async fn a_call_nobody_waits_for_is_still_recorded(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let (_fake, base) = start_fake(vec![Reply::ok(anthropic_message(json!([{ "type": "text", "text": "Late." }]), "end_turn")).after(Duration::from_millis(300))]).await;
    let s = settings(LlmProvider::Anthropic, &base);
    let model = llm::recorded(llm::from_settings(&s, &keys()).expect("client"), pool.clone(), &s, None);
    let req = ChatRequest::new(&s.models, Purpose::Chat, "corr-late", vec![Message::user("hello")]);
    assert!(tokio::time::timeout(Duration::from_millis(50), model.chat(&req)).await.is_err(), "the caller stopped waiting");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let mut conn = pool.pool.acquire().await.expect("conn");
        let rows = server::db::llm_calls::for_correlation(&mut conn, "corr-late").await.expect("rows");
        if !rows.is_empty() || tokio::time::Instant::now() > deadline {
            break rows;
        }
        drop(conn);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(rows.len(), 1, "the call was recorded after its caller left");
    assert_eq!((rows[0].outcome.as_str(), rows[0].input_tokens, rows[0].cost_micro_usd), ("ok", 1000, Some(3000 + 7500 + 600 + 375)));
}
both_backends!(abandoned_call_recorded, a_call_nobody_waits_for_is_still_recorded);

/// An answer that cannot be used (an OpenAI-compatible server that leaves out the finish
/// reason) is a failed call, but the tokens it says it used are recorded and priced: the
/// provider bills them, and the budget counts them.
async fn an_unusable_answer_still_counts_its_tokens(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let mut unusable = openai_completion(json!({ "role": "assistant", "content": "Hi." }), "stop");
    unusable["choices"][0]["finish_reason"] = Value::Null;
    unusable["usage"] = json!({ "prompt_tokens": 1000, "completion_tokens": 50 });
    let (_fake, base) = start_fake(vec![Reply::ok(unusable)]).await;
    let s = settings(LlmProvider::Openai, &base);
    let model = llm::recorded(llm::from_settings(&s, &keys()).expect("client"), pool.clone(), &s, None);
    let req = ChatRequest::new(&s.models, Purpose::Chat, "corr-unusable", vec![Message::user("hello")]);
    let err = model.chat(&req).await.expect_err("no finish reason");
    assert_eq!(err.code, ErrorCode::InvalidResponse);
    let mut conn = pool.pool.acquire().await.expect("conn");
    let rows = server::db::llm_calls::for_correlation(&mut conn, "corr-unusable").await.expect("rows");
    assert_eq!((rows[0].outcome.as_str(), rows[0].input_tokens, rows[0].output_tokens), ("LLM_INVALID_RESPONSE", 1000, 50));
    assert_eq!(rows[0].cost_micro_usd, Some(1000 * 3 + 50 * 15), "priced as the model's tokens");
}
both_backends!(unusable_answer_counted, an_unusable_answer_still_counts_its_tokens);
