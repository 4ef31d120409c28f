//! The tool lane against local fakes that speak the real wire formats (the Anthropic Messages
//! API and OpenAI-compatible chat completions), with the checkpoint on a real database where
//! the validator needs one.

mod planner;
mod summarizer;
mod validator;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};
use server::{
    config::{LlmProvider, Secrets, Settings},
    llm::{self, ChatModel},
};

pub const PLANNER_MODEL: &str = "test-planner-model";
pub const SUMMARIZER_MODEL: &str = "test-summarizer-model";

/// The `<runtime_facts>` a system prompt ends with, as JSON (the prompt itself may name the
/// block before it).
pub fn runtime_facts(system: &str) -> Value {
    let facts = system.rsplit("<runtime_facts>").next().filter(|_| system.contains("<runtime_facts>")).and_then(|rest| rest.split("</runtime_facts>").next()).unwrap_or_else(|| panic!("no runtime facts: {system}"));
    serde_json::from_str(facts).unwrap_or_else(|e| panic!("runtime facts {facts}: {e}"))
}

/// `now` of the runtime facts: today's date, weekday and time (to the minute) in time zone
/// `zone`, read within the minute around the check.
pub fn assert_now(now: &Value, zone: &str) {
    let zoned = |at: std::time::SystemTime| {
        let at = jiff::Timestamp::try_from(at).expect("timestamp").to_zoned_datetime(jiff::tz::TimeZone::get(zone).expect("zone"));
        json!({ "date": at.strftime("%Y-%m-%d").to_string(), "weekday": at.strftime("%A").to_string(), "time": at.strftime("%H:%M").to_string(), "timezone": zone })
    };
    let now_here = std::time::SystemTime::now();
    let within = [zoned(now_here), zoned(now_here - std::time::Duration::from_secs(60))];
    assert!(within.contains(now), "{now} is not the time in {zone}: {within:?}");
}

/// How the fake answers one request: a status and a body, from the request it got.
pub type Answer = Box<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

/// A fake LLM provider on loopback: answers from a script (in order), or from `fallback` when
/// the script is empty; keeps every request body.
#[derive(Clone, Default)]
pub struct Fake {
    script: Arc<Mutex<VecDeque<Answer>>>,
    fallback: Arc<Mutex<Option<Answer>>>,
    pub seen: Arc<Mutex<Vec<Value>>>,
}

impl Fake {
    pub async fn start() -> (Self, String) {
        let fake = Self::default();
        async fn answer(State(fake): State<Fake>, Json(body): Json<Value>) -> Response {
            fake.seen.lock().expect("lock").push(body.clone());
            let next = fake.script.lock().expect("lock").pop_front();
            let (status, reply) = match next {
                Some(answer) => answer(&body),
                None => match fake.fallback.lock().expect("lock").as_ref() {
                    Some(answer) => answer(&body),
                    None => (500, json!({"type": "error", "error": {"type": "api_error", "message": "the fake's script ran out"}})),
                },
            };
            (StatusCode::from_u16(status).expect("status"), Json(reply)).into_response()
        }
        let router = Router::new().route("/v1/messages", post(answer)).route("/v1/chat/completions", post(answer)).with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        (fake, format!("http://{addr}"))
    }

    pub fn then(&self, answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static) -> &Self {
        self.script.lock().expect("lock").push_back(Box::new(answer));
        self
    }

    pub fn always(&self, answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static) {
        *self.fallback.lock().expect("lock") = Some(Box::new(answer));
    }

    pub fn hits(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    pub fn body(&self, i: usize) -> Value {
        self.seen.lock().expect("lock")[i].clone()
    }
}

/// An Anthropic Messages API answer with `content` blocks.
pub fn anthropic(content: Value, stop: &str) -> (u16, Value) {
    (200, json!({
        "id": "msg_test", "type": "message", "role": "assistant", "model": PLANNER_MODEL,
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 20, "output_tokens": 5}
    }))
}

pub fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

/// The shipped configuration (its `[lane]` texts included) pointed at the fake.
pub fn settings(provider: LlmProvider, base: &str) -> Settings {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml"));
    let mut s = server::config::load(path).expect("shipped config").settings;
    s.llm.provider = provider;
    s.llm.anthropic.base_url = base.to_string();
    s.llm.openai.base_url = format!("{base}/v1");
    s.llm.max_retries = 0;
    s.models.planner = PLANNER_MODEL.into();
    s.models.summarizer = SUMMARIZER_MODEL.into();
    s
}

pub fn model(settings: &Settings) -> Arc<dyn ChatModel> {
    let secrets = Secrets::from_lookup(|name| matches!(name, "ANTHROPIC_API_KEY" | "OPENAI_API_KEY").then(|| "test-key".to_string()));
    llm::from_settings(settings, &secrets).expect("model")
}

/// The fixture catalog: tools named for these tests only.
pub const TOOLS: &str = r#"
approval_mode = "auto"

[[tool]]
name = "lookup_order"
title = "Order lookup"
description = "Finds an order by its number."
when_to_use = "The person gives an order number."
when_not_to_use = "Questions about payments."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
chainable = true
managed_fields = ["chat_id"]
secret_fields = { api_key = "TEST_SHOP_KEY" }
input_schema = { type = "object", required = ["order_id", "chat_id", "api_key"], properties = { order_id = { type = "string", title = "order number" }, chat_id = { type = "string" }, api_key = { type = "string" } } }

[[tool]]
name = "page_search"
title = "Page search"
description = "Searches the shop's pages."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
chainable = true
input_schema = { type = "object", required = ["query"], properties = { query = { type = "string" }, limit = { type = "integer" } } }

[[tool]]
name = "owner_report"
title = "Owner report"
description = "Sales figures for owners."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "owner_only"
risk = "low"
input_schema = { type = "object", properties = { period = { type = "string" } } }

[[tool]]
name = "refund"
title = "Refund"
description = "Refunds an order; an owner always approves."
provider = "builtin"
handler = "test.echo"
operation = "write"
audience = "public"
risk = "medium"
approval = "always"
async_policy = "required"
input_schema = { type = "object", required = ["order_id"], additionalProperties = false, properties = { order_id = { type = "string" } } }
"#;

/// The fixture catalog, loaded as the tools module loads `tools.toml`.
pub fn catalog(text: &str) -> Arc<server::tools::Catalog> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, text).expect("write");
    Arc::new(server::tools::Catalog::load(&path, &|var| var == "TEST_SHOP_KEY").expect("valid catalog"))
}
