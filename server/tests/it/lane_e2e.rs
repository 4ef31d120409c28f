//! The tool lane end to end through the WhatsApp webhook: a fake planner (the Anthropic
//! Messages API on loopback) proposes a call, a local fake connector answers, and the customer
//! gets exactly one summarised reply through the fake Graph API; a slow tool gives one
//! acknowledgement and one later answer; an owner-only tool never reaches its system.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    routing::get,
};
use serde_json::{Value, json};
use server::config::{Secrets, Settings};
use tokio::sync::watch;

use crate::{
    both_backends,
    lane::{Fake, PLANNER_MODEL, SUMMARIZER_MODEL, anthropic, tool_use},
    support::{TestApp, TestDb},
    whatsapp::{FakeGraph, PHONE_NUMBER_ID, VERSION, count, envelope, graph_error, post_signed, text_message},
};

pub(crate) const CUSTOMER: &str = "16505550100";
/// The number of the owner [`Rig::add_owner`] adds.
pub(crate) const OWNER: &str = "16505550001";

/// The shop a connector reaches: orders (slow ones sleep), and a sales report owners may see.
#[derive(Clone, Default)]
pub(crate) struct Shop {
    pub(crate) requests: Arc<Mutex<Vec<String>>>,
    pub(crate) slow: Arc<Mutex<Duration>>,
    /// The `Idempotency-Key` of every refund request, in order.
    pub(crate) refund_keys: Arc<Mutex<Vec<String>>>,
    /// Coupon requests still to be answered 503 (a provider's transient error).
    pub(crate) coupon_failures: Arc<Mutex<u32>>,
    /// Order lookups still to be answered 503.
    pub(crate) order_failures: Arc<Mutex<u32>>,
}

pub(crate) async fn shop() -> (SocketAddr, Shop) {
    let shop = Shop::default();
    let app = Router::new()
        .route(
            "/api/orders/{id}",
            get(|State(shop): State<Shop>, Path(id): Path<String>| async move {
                shop.requests.lock().expect("lock").push(format!("orders/{id}"));
                if id.starts_with("slow") {
                    let wait = *shop.slow.lock().expect("lock");
                    tokio::time::sleep(wait).await;
                }
                {
                    let mut failures = shop.order_failures.lock().expect("lock");
                    if *failures > 0 {
                        *failures -= 1;
                        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "try again" })));
                    }
                }
                (StatusCode::OK, Json(json!({ "id": id, "status": "shipped", "carrier": "Parcel Co", "tracking_url": "https://track.example/42" })))
            }),
        )
        .route(
            "/api/refunds/{id}",
            axum::routing::post(|State(shop): State<Shop>, Path(id): Path<String>, headers: axum::http::HeaderMap| async move {
                shop.requests.lock().expect("lock").push(format!("refunds/{id}"));
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                shop.refund_keys.lock().expect("lock").push(key);
                Json(json!({ "id": id, "refunded": true }))
            }),
        )
        .route(
            // A write over GET, as some older systems have: it carries no idempotency key.
            "/api/coupons/{id}",
            get(|State(shop): State<Shop>, Path(id): Path<String>| async move {
                shop.requests.lock().expect("lock").push(format!("coupons/{id}"));
                if id == "missing" {
                    return (StatusCode::NOT_FOUND, Json(json!({ "error": "no such order" })));
                }
                let mut failures = shop.coupon_failures.lock().expect("lock");
                if *failures > 0 {
                    *failures -= 1;
                    return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": "try again" })));
                }
                (StatusCode::OK, Json(json!({ "order": id, "coupon": "SORRY10" })))
            }),
        )
        .route(
            "/api/forecast/{place}",
            get(|State(shop): State<Shop>, Path(place): Path<String>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>| async move {
                let date = q.get("date").cloned().unwrap_or_default();
                shop.requests.lock().expect("lock").push(format!("forecast/{place}/{date}"));
                let sky = if date == "tomorrow" { "rain" } else { "sunny" };
                Json(json!({ "place": place, "date": date, "sky": sky, "high_c": 24 }))
            }),
        )
        .route(
            "/api/search",
            get(|State(shop): State<Shop>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>| async move {
                shop.requests.lock().expect("lock").push("search".into());
                if q.get("q").is_some_and(|q| q == "slow") {
                    let wait = *shop.slow.lock().expect("lock");
                    tokio::time::sleep(wait).await;
                }
                if q.get("q").is_some_and(|q| q == "fail") {
                    return (StatusCode::BAD_REQUEST, Json(json!({ "error": "broken" })));
                }
                // The shop echoes who asked (the sender's number): never shown to a model.
                (StatusCode::OK, Json(json!({ "asked_by": CUSTOMER, "results": [
                    { "title": "Opening hours", "url": "https://shop.example/pages/hours" },
                    { "title": "Returns policy", "url": "https://shop.example/pages/returns" },
                ] })))
            }),
        )
        .route(
            "/api/pages/{page}",
            get(|State(shop): State<Shop>, Path(page): Path<String>| async move {
                shop.requests.lock().expect("lock").push(format!("pages/{page}"));
                Json(json!({ "title": page, "text": "Returns are free within 30 days." }))
            }),
        )
        .route(
            "/api/report",
            get(|| async move {
                let lines: Vec<String> = (1..=400).map(|n| format!("line {n:03} of the yearly report")).collect();
                Json(json!({ "title": "Yearly report", "text": lines.join("\n") }))
            }),
        )
        .route(
            "/api/sales",
            get(|State(shop): State<Shop>| async move {
                shop.requests.lock().expect("lock").push("sales".into());
                // A session token the report's API echoes: never shown or summarised.
                (StatusCode::OK, Json(json!({ "total": 1234, "session_token": "tok-live-sales-9f8e" })))
            }),
        )
        .with_state(shop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (addr, shop)
}

pub(crate) const TOOLS: &str = r#"
approval_mode = "auto"

[audit]
pii_fields = ["email"]

[[tool]]
name = "order_status"
title = "Order status"
description = "Looks up where an order is: its status, carrier and tracking link."
when_to_use = "The person asks where their order is and gives its number."
triggers = ["where is my order", "order status", "track my order"]
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
timeout = "20s"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 } } }

[[tool]]
name = "refund_order"
title = "Refund an order"
description = "Refunds an order in full."
triggers = ["refund my order", "refund order"]
provider = "connector"
operation = "write"
audience = "public"
risk = "high"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 }, email = { type = "string" }, card_token = { type = "string" } } }

[[tool]]
name = "forecast"
title = "Weather forecast"
description = "The weather forecast for a place on a day."
triggers = ["the weather in", "weather forecast"]
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["place", "date"], properties = { place = { type = "string", maxLength = 80 }, date = { type = "string", maxLength = 40 } } }

[[tool]]
name = "page_search"
title = "Shop page search"
description = "Searches the shop's help pages and lists the matching pages with their links."
triggers = ["search the shop", "find the returns page"]
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
chainable = true
input_schema = { type = "object", additionalProperties = false, required = ["query"], properties = { query = { type = "string", maxLength = 80 } } }

[[tool]]
name = "open_page"
title = "Open a shop page"
description = "Opens one of the shop's help pages by its name and returns its text."
triggers = ["open the page"]
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
chainable = true
input_schema = { type = "object", additionalProperties = false, required = ["page"], properties = { page = { type = "string", maxLength = 40, pattern = "^[a-z-]+$" } } }

[[tool]]
name = "sales_report"
title = "Sales report"
description = "The shop's sales figures for the owner."
triggers = ["sales report", "sales figures"]
provider = "connector"
operation = "read"
audience = "owner_only"
risk = "low"
input_schema = { type = "object", additionalProperties = false, properties = {} }
"#;

pub(crate) fn connectors(addr: SocketAddr) -> String {
    format!(
        r#"
[[connector]]
id = "shop"
title = "Test shop"
base_url = "http://{addr}/api"
allowed_urls = ["http://{addr}/api/orders/*", "http://{addr}/api/refunds/*", "http://{addr}/api/coupons/*", "http://{addr}/api/forecast/*", "http://{addr}/api/search", "http://{addr}/api/pages/*", "http://{addr}/api/report", "http://{addr}/api/sales"]

[[connector.action]]
tool = "refund_order"
method = "POST"
path = "refunds/{{order_id}}"

[[connector.action]]
tool = "order_status"
method = "GET"
path = "orders/{{order_id}}"

[[connector.action]]
tool = "forecast"
method = "GET"
path = "forecast/{{place}}"
query = {{ date = "{{date}}" }}

[[connector.action]]
tool = "page_search"
method = "GET"
path = "search"
query = {{ q = "{{query}}" }}

[[connector.action]]
tool = "open_page"
method = "GET"
path = "pages/{{page}}"

[[connector.action]]
tool = "sales_report"
method = "GET"
path = "sales"
"#
    )
}

/// The shipped `[lane]` (texts and detector) as `gatehouse.toml` ships it.
fn shipped_lane() -> server::config::LaneSettings {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml"));
    server::config::load(path).expect("shipped config").settings.lane
}

/// The planner proposes `refund_order`, `sales_report` or `order_status` for the order number in
/// the message; the summarizer answers with a fixed summary; chat gets a chat reply.
fn plan_for_the_shop(llm: &Fake) {
    llm.always(|body| {
        let model = body["model"].as_str().unwrap_or_default();
        let text = body["messages"].to_string();
        if model == PLANNER_MODEL {
            let offered = body["tools"].to_string();
            // The person's message alone: the chat's earlier messages (its memory, which holds
            // the lane's exchanges too) are in the same request, and must not steer the plan.
            let asked = text.split(r#"kind=\"message\""#).nth(1).and_then(|rest| rest.split("untrusted_data>").next()).unwrap_or(&text).to_string();
            // A model that ignores the no-parallel request: two calls in one answer.
            if asked.contains("both at once") {
                let query = if asked.contains("broken") { "fail" } else if asked.contains("search is slow") { "slow" } else { "returns" };
                return anthropic(json!([tool_use("p1", "page_search", json!({ "query": query })), tool_use("p2", "open_page", json!({ "page": "returns" }))]), "tool_use");
            }
            // The detector could not tell which result a follow-up means: ask.
            // (The facts sit in the system prompt, which JSON-escapes them here.)
            if body["system"].to_string().contains(r#"\"kind\":\"clarify\""#) {
                let respond = json!({ "decision": "clarify", "reply": "Do you mean the weather or your order?", "reason": "two results fit", "requires_async": false, "requires_owner_approval": false });
                return anthropic(json!([tool_use("r1", "respond_without_tool", respond)]), "tool_use");
            }
            let later_round = body["messages"].as_array().is_some_and(|m| m.len() > 1);
            // After a step's result, no further step unless the message asks for a chain.
            if later_round && !asked.contains("Find the returns page") && !text.contains("tool_search_results") {
                let respond = json!({ "decision": "no_tool", "reply": "", "reason": "the result answers it", "requires_async": false, "requires_owner_approval": false });
                return anthropic(json!([tool_use("r1", "respond_without_tool", respond)]), "tool_use");
            }
            // A chain whose first plan looks in the catalog first: then the search, then the
            // page, each once the one before came back.
            if asked.contains("the catalog first") {
                if text.contains(r#"\"id\":\"c1\""#) || text.contains(r#""id":"c1""#) {
                    return anthropic(json!([tool_use("c2", "open_page", json!({ "page": "returns" }))]), "tool_use");
                }
                if !text.contains("tool_search_results") {
                    return anthropic(json!([tool_use("s1", "search_tools", json!({ "query": "shop pages" }))]), "tool_use");
                }
                return anthropic(json!([tool_use("c1", "page_search", json!({ "query": "returns" }))]), "tool_use");
            }
            // A chain: search first; once a result came back, the step the message asks for.
            if asked.contains("Find the returns page") {
                let second_round = body["messages"].as_array().is_some_and(|m| m.len() > 1);
                if !second_round {
                    let query = if asked.contains("break it") { "fail" } else { "returns" };
                    return anthropic(json!([tool_use("c1", "page_search", json!({ "query": query }))]), "tool_use");
                }
                if asked.contains("open both") {
                    return anthropic(json!([tool_use("c2", "open_page", json!({ "page": "hours" })), tool_use("c3", "open_page", json!({ "page": "returns" }))]), "tool_use");
                }
                if asked.contains("flag it") {
                    return anthropic(json!([tool_use("c2", "flag_page", json!({ "page": "returns" }))]), "tool_use");
                }
                if asked.contains("refund it") {
                    return anthropic(json!([tool_use("c2", "refund_order", json!({ "order_id": "4821" }))]), "tool_use");
                }
                if asked.contains("the one I mean") {
                    return anthropic(json!([tool_use("c2", "open_page", json!({}))]), "tool_use");
                }
                if asked.contains("show sales") {
                    return anthropic(json!([tool_use("c2", "sales_report", json!({}))]), "tool_use");
                }
                return anthropic(json!([tool_use("c2", "open_page", json!({ "page": "returns" }))]), "tool_use");
            }
            // Tool search: the forecast tool is not among the candidates; search until it is.
            if asked.contains("umbrella") || asked.contains("endless") {
                if asked.contains("umbrella") && offered.contains("\"forecast\"") {
                    return anthropic(json!([tool_use("t2", "forecast", json!({ "place": "Lisbon", "date": "today" }))]), "tool_use");
                }
                return anthropic(json!([tool_use("s1", "search_tools", json!({ "query": "weather forecast" }))]), "tool_use");
            }
            // "The second one": the second link the context listed, opened with the page tool.
            if asked.contains("the second one") && text.contains("recent_tool_results") {
                let links: Vec<&str> = text.match_indices("https://shop.example/pages/").map(|(i, _)| &text[i + 27..]).map(|rest| rest.split(|c: char| !c.is_ascii_lowercase() && c != '-').next().unwrap_or_default()).collect();
                let mut distinct: Vec<&str> = Vec::new();
                for l in links {
                    if !distinct.contains(&l) {
                        distinct.push(l);
                    }
                }
                if let Some(page) = distinct.get(1) {
                    return anthropic(json!([tool_use("t1", "open_page", json!({ "page": page }))]), "tool_use");
                }
            }
            if asked.contains("search the shop") {
                return anthropic(json!([tool_use("t1", "page_search", json!({ "query": "returns" }))]), "tool_use");
            }
            // No order number: the plan leaves it out, and the validator asks for it; the
            // answer to that question gives it.
            if text.contains("track my order please") {
                let args = if text.contains("A-77") { json!({ "order_id": "A-77" }) } else { json!({}) };
                return anthropic(json!([tool_use("q1", "order_status", args)]), "tool_use");
            }
            // "There": the chat's latest messages, which the lane passes, say which place.
            if text.contains("forecast there tomorrow") {
                if text.contains("Porto") {
                    return anthropic(json!([tool_use("m1", "forecast", json!({ "place": "Porto", "date": "tomorrow" }))]), "tool_use");
                }
                let respond = json!({ "decision": "clarify", "reply": "Which place do you mean?", "reason": "no place given", "requires_async": false, "requires_owner_approval": false });
                return anthropic(json!([tool_use("m1", "respond_without_tool", respond)]), "tool_use");
            }
            // A follow-up: the context the lane passed says which place; the fake changes the date.
            if asked.contains("what about tomorrow") && text.contains("recent_tool_results") && text.contains("Lisbon") {
                return anthropic(json!([tool_use("t1", "forecast", json!({ "place": "Lisbon", "date": "tomorrow" }))]), "tool_use");
            }
            if asked.contains("will it be sunny") && text.contains("recent_tool_results") {
                let respond = json!({ "decision": "answer_from_context", "reply": "Yes: the forecast said sunny in Lisbon today.", "reason": "the result answers it", "requires_async": false, "requires_owner_approval": false });
                return anthropic(json!([tool_use("t1", "respond_without_tool", respond)]), "tool_use");
            }
            if asked.contains("weather in Lisbon") {
                return anthropic(json!([tool_use("t1", "forecast", json!({ "place": "Lisbon", "date": "today" }))]), "tool_use");
            }
            if asked.contains("refund") {
                return anthropic(json!([tool_use("t1", "refund_order", json!({ "order_id": "4821" }))]), "tool_use");
            }
            if asked.contains("sales") {
                return anthropic(json!([tool_use("t1", "sales_report", json!({}))]), "tool_use");
            }
            let id = if asked.contains("slow-7") { "slow-7" } else { "4821" };
            anthropic(json!([tool_use("t1", "order_status", json!({ "order_id": id }))]), "tool_use")
        } else if model == SUMMARIZER_MODEL {
            let summary = if text.contains("Returns are free") {
                "Returns are free within 30 days: https://shop.example/pages/returns"
            } else if text.contains("Returns policy") {
                "I found two pages: Opening hours and Returns policy."
            } else if text.contains("rain") {
                "Tomorrow: rain in Lisbon."
            } else if text.contains("sunny") {
                "Today: sunny in Lisbon, 24°C."
            } else {
                "Your order has shipped with Parcel Co: https://track.example/42"
            };
            anthropic(json!([{ "type": "text", "text": summary }]), "end_turn")
        } else {
            anthropic(json!([{ "type": "text", "text": "a chat reply" }]), "end_turn")
        }
    });
}

pub(crate) struct Rig {
    pub(crate) app: TestApp,
    pub(crate) graph: FakeGraph,
    pub(crate) llm: Fake,
    pub(crate) shop: Shop,
    pub(crate) dir: tempfile::TempDir,
}

/// The app over the shop, with the fake planner of [`plan_for_the_shop`].
pub(crate) async fn rig(db: TestDb, tweak: impl FnOnce(&mut Settings) + Send + 'static) -> Rig {
    rig_with(db, TOOLS, "", tweak).await
}

/// [`rig`] with other tools (and connector actions appended to the shop's).
pub(crate) async fn rig_with(db: TestDb, tools: &str, actions: &str, tweak: impl FnOnce(&mut Settings) + Send + 'static) -> Rig {
    let (addr, shop) = shop().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tools.toml"), tools).expect("tools");
    std::fs::write(dir.path().join("connectors.toml"), connectors(addr) + actions).expect("connectors");
    let graph = FakeGraph::start().await;
    let (llm, llm_url) = Fake::start().await;
    plan_for_the_shop(&llm);
    let secrets = Secrets::from_lookup(|name| match name {
        "ANTHROPIC_API_KEY" => Some("test-llm-key".into()),
        other => crate::whatsapp::secrets().by_name(other).map(|s| secrecy::ExposeSecret::expose_secret(s).to_string()),
    });
    let base = graph.base_url.clone();
    let app = TestApp::in_dir_with(db, dir.path(), secrets, move |s| {
        s.whatsapp.graph_base_url = base;
        s.whatsapp.graph_version = VERSION.into();
        s.whatsapp.phone_number_id = PHONE_NUMBER_ID.into();
        s.whatsapp.typing_indicator = false;
        s.whatsapp.mark_read = false;
        s.llm.anthropic.base_url = llm_url;
        s.llm.max_retries = 0;
        s.models.chat = "test-chat-model".into();
        s.models.planner = PLANNER_MODEL.into();
        s.models.summarizer = SUMMARIZER_MODEL.into();
        s.lane = shipped_lane();
        tweak(s);
    })
    .await;
    Rig { app, graph, llm, shop, dir }
}

/// The customer's order lookup for WhatsApp message `message`, validated against the tool's
/// definition `version`, as the lane stores it.
pub(crate) fn order_lookup(version: &str, message: &str) -> server::tools::job::ToolCallJob {
    use server::{channel::ReplyTo, domain::{ChatKind, Role}};
    server::tools::job::ToolCallJob {
        tool: "order_status".into(),
        version: version.into(),
        args: json!({ "order_id": "4821" }),
        actor: Role::Customer,
        chat_kind: ChatKind::Direct,
        sender: CUSTOMER.into(),
        request: "Where is my order 4821?".into(),
        reply_to: ReplyTo { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), chat_kind: ChatKind::Direct, message_id: message.into() },
        trace_id: None,
        approval: None,
        again_of: None,
    }
}

impl Rig {
    /// Adds an owner, Olga, with the number [`OWNER`].
    pub(crate) async fn add_owner(&self) {
        let mut tx = self.app.state.db.begin_write().await.expect("tx");
        sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('Olga Owner', 'olga', 'x', 1, 0, 0)").execute(&mut *tx).await.expect("owner");
        sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ($1, (SELECT MAX(id) FROM owners), 0)").bind(format!("+{OWNER}")).execute(&mut *tx).await.expect("phone");
        tx.commit().await.expect("commit");
    }

    /// Posts the messages and runs the worker until every job (messages and tool calls) has
    /// finished and `sends` messages went out.
    pub(crate) async fn exchange(&self, messages: &[(&str, &str)], sends: usize) {
        let items: Vec<Value> = messages.iter().map(|(wamid, text)| text_message(CUSTOMER, wamid, text)).collect();
        assert_eq!(post_signed(&self.app, &envelope(vec![items])).await.status, axum::http::StatusCode::OK);
        let (stop, stopped) = watch::channel(false);
        let worker = tokio::spawn(self.app.gatehouse.worker().run(stopped));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // An approval's expiry waits a day: not work this exchange waits for.
            let later = server::db::now_ms() + 60_000;
            let open = count(&self.app, &format!("SELECT COUNT(*) FROM jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled') AND scheduled_at < {later}")).await;
            if open == 0 && self.graph.sends().len() >= sends {
                break;
            }
            assert!(Instant::now() < deadline, "{open} job(s) open; sent so far: {:?}", self.graph.texts());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop.send(true);
        let _ = worker.await;
    }

    /// Runs the jobs of `kind` again, as if their runs had stopped before recording their end.
    pub(crate) async fn run_again(&self, kind: &str) {
        sqlx::query("UPDATE jobs SET state = 'available', completed_at = NULL, scheduled_at = 0 WHERE kind = $1").bind(kind).execute(&self.app.state.db.pool).await.expect("run again");
    }

    /// Handles message `wamid` again, as if its first run had stopped before its reply was
    /// recorded (a crash, a full disk), and waits for the work that follows.
    pub(crate) async fn handle_again(&self, wamid: &str) {
        let pool = &self.app.state.db.pool;
        sqlx::query("DELETE FROM message_replies WHERE message_id = $1").bind(wamid).execute(pool).await.expect("no reply recorded");
        sqlx::query("UPDATE whatsapp_inbound SET outcome = NULL, processed_at = NULL WHERE wamid = $1").bind(wamid).execute(pool).await.expect("not processed");
        self.run_again("whatsapp.inbound").await;
        self.exchange(&[], 1).await;
    }

    /// The planner's requests so far, their messages as JSON text.
    pub(crate) fn planner_messages(&self) -> Vec<String> {
        self.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == PLANNER_MODEL).map(|b| b["messages"].to_string()).collect()
    }

    /// The detail of message `wamid`'s first trace step named `step`.
    pub(crate) async fn step_detail(&self, wamid: &str, step: &str) -> Value {
        let detail: String = sqlx::query_scalar("SELECT s.detail FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = $1 AND s.step = $2 ORDER BY s.seq")
            .bind(wamid)
            .bind(step)
            .fetch_one(&self.app.state.db.pool)
            .await
            .expect("the step");
        serde_json::from_str(&detail).expect("json")
    }

    pub(crate) async fn steps(&self, wamid: &str) -> Vec<(String, String, String)> {
        sqlx::query_as("SELECT s.step, s.decision, s.reason_code FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = $1 ORDER BY s.seq")
            .bind(wamid)
            .fetch_all(&self.app.state.db.pool)
            .await
            .expect("steps")
    }
}

async fn a_tool_request_gets_one_summarised_reply(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.LANE1", "Where is my order 4821?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Your order has shipped with Parcel Co: https://track.example/42".to_string()], "exactly one reply, the summary");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["orders/4821".to_string()], "the tool ran once");
    let steps = r.steps("wamid.LANE1").await;
    let names: Vec<&str> = steps.iter().map(|(s, _, _)| s.as_str()).collect();
    for expected in ["AgentToolCandidate", "AgentToolPlannerResult", "AgentToolPlanAccepted", "AgentToolJobEnqueued", "AgentToolImmediateStart", "AgentToolExecutionSucceeded", "AgentToolContextStored", "tool_lane", "reply", "delivery"] {
        assert!(names.contains(&expected), "{expected} missing from {steps:?}");
    }
    let (route, trace_id): (String, i64) = sqlx::query_as("SELECT route, id FROM traces WHERE message_id = 'wamid.LANE1'").fetch_one(&r.app.state.db.pool).await.expect("trace");
    assert_eq!(route, "tool_lane");
    r.app.state.tools.audit().flush().await;
    let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit WHERE trace_id = $1 AND tool = 'order_status' AND decision = 'allow'")
        .bind(trace_id)
        .fetch_one(&r.app.state.db.pool)
        .await
        .expect("audit");
    assert_eq!(audited, 1, "the call's audit row names the message's trace");
    let (state, kind): (String, String) = sqlx::query_as("SELECT state, kind FROM jobs WHERE tool_name = 'order_status'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((state.as_str(), kind.as_str()), ("completed", "tool.call"));
    let turns = memory_of(&r).await;
    let answer = "Your order has shipped with Parcel Co: https://track.example/42";
    assert_eq!(turns, vec![turn("user", "Where is my order 4821?", "wamid.LANE1"), turn("assistant", answer, "wamid.LANE1")], "memory holds what was said and sent, never the tool's prompt or raw result");
}
both_backends!(lane_e2e_summary, a_tool_request_gets_one_summarised_reply);

/// A tool with its own answer (`answer_template`) replies with the owner's words and the
/// result's values, and no model writes a summary; a result that lacks a value the template
/// names is summarised as any other.
async fn a_tool_s_own_answer_is_sent_as_written(db: TestDb) {
    let template = "\nanswer_template = \"Order {data.id} is {data.status} with {data.carrier}. Track it here: {data.tracking_url}\"";
    let tools = TOOLS.replacen("timeout = \"20s\"\n", &format!("timeout = \"20s\"{template}\n"), 1);
    assert_ne!(tools, TOOLS);
    let r = rig_with(db, &tools, "", |_| {}).await;
    r.exchange(&[("wamid.TPL1", "Where is my order 4821?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Order 4821 is shipped with Parcel Co. Track it here: https://track.example/42".to_string()], "{:?}", r.steps("wamid.TPL1").await);
    let summaries = r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == SUMMARIZER_MODEL).count();
    assert_eq!(summaries, 0, "no model wrote it");
    let ran = r.step_detail("wamid.TPL1", "AgentToolExecutionSucceeded").await;
    assert_eq!(ran["reply_by"], "answer_template", "the trace says who wrote it, not that the model failed: {ran}");
    // The owner sees it on the tool's page.
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let detail = owner.post_form("/api/get_tool", &[("name", "order_status")]).await.json();
    assert_eq!(detail["answer_template"], "Order {data.id} is {data.status} with {data.carrier}. Track it here: {data.tracking_url}", "{detail}");
}
both_backends!(lane_e2e_answer_template, a_tool_s_own_answer_is_sent_as_written);

/// A result without a value the tool's own answer names is summarised as any other.
async fn a_tool_s_own_answer_without_its_values_is_summarised(db: TestDb) {
    let template = "\nanswer_template = \"Order {data.id} is with {data.courier}\"";
    let r = rig_with(db, &TOOLS.replacen("timeout = \"20s\"\n", &format!("timeout = \"20s\"{template}\n"), 1), "", |_| {}).await;
    r.exchange(&[("wamid.TPL2", "Where is my order 4821?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Your order has shipped with Parcel Co: https://track.example/42".to_string()], "the summarizer's: the result names no courier");
    let ran = r.step_detail("wamid.TPL2", "AgentToolExecutionSucceeded").await;
    assert!(ran["reply_by"] == "model" && ran.get("summary_fallback").is_none(), "{ran}");
}
both_backends!(lane_e2e_answer_template_missed, a_tool_s_own_answer_without_its_values_is_summarised);

/// The chat's memory, oldest first: (role, text, message id).
async fn memory_of(r: &Rig) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT role, text, message_id FROM chat_turns ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("turns")
}

fn turn(role: &str, text: &str, message_id: &str) -> (String, String, String) {
    (role.into(), text.into(), message_id.into())
}

/// Normal chat reads what the tool lane answered: the person's question and the answer they
/// were sent are in the chat's memory, as any chat turn. Before, a tool's answer was missing
/// from it, and the next message in normal chat read a conversation without it.
async fn normal_chat_reads_what_the_tool_lane_answered(db: TestDb) {
    let r = rig(db, |s| s.conversation.timezone = "Asia/Tokyo".into()).await;
    r.exchange(&[("wamid.MEMLANE1", "Where is my order 4821?")], 1).await;
    r.exchange(&[("wamid.MEMLANE2", "Thank you so much!")], 2).await;
    let steps = r.steps("wamid.MEMLANE2").await;
    assert_eq!(r.graph.texts()[1], "a chat reply", "normal chat: {steps:?}");
    let chat = r.llm.seen.lock().expect("lock").iter().rev().find(|b| b["model"] != PLANNER_MODEL && b["model"] != SUMMARIZER_MODEL).cloned().expect("the chat's request");
    let messages = chat["messages"].as_array().cloned().unwrap_or_default();
    let said: Vec<(String, String)> = messages.iter().map(|m| (m["role"].as_str().unwrap_or_default().to_string(), m["content"].to_string())).collect();
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(said[0].0 == "user" && said[0].1.contains("Where is my order 4821?"), "{said:?}");
    assert!(said[1].0 == "assistant" && said[1].1.contains("Your order has shipped with Parcel Co"), "{said:?}");
    // Made from a tool's result: read again as data, not as the assistant's own word.
    assert!(said[1].1.contains(r#"<untrusted_data kind=\"tool_answer\">"#), "{said:?}");
    assert!(said[2].0 == "user" && said[2].1.contains("Thank you so much!"), "{said:?}");
    assert!(!chat["messages"].to_string().contains("order_status") && !chat["messages"].to_string().contains("tracking_url"), "no tool prompt or raw result: {said:?}");
    // Told the date and time where the business is, as the planner and the summarizer are.
    let system = chat["system"].as_str().unwrap_or_default();
    assert!(system.starts_with(r.app.state.config.settings.conversation.system_prompt.trim()), "{system}");
    crate::lane::assert_now(&crate::lane::runtime_facts(system)["now"], "Asia/Tokyo");
    let plan = r.llm.seen.lock().expect("lock").iter().find(|b| b["model"] == PLANNER_MODEL).cloned().expect("a plan");
    crate::lane::assert_now(&crate::lane::runtime_facts(plan["system"].as_str().unwrap_or_default())["now"], "Asia/Tokyo");
}
both_backends!(lane_e2e_memory, normal_chat_reads_what_the_tool_lane_answered);

/// An answer made from a private-data tool (tagged with one of `lane.private_data_tags`) is
/// sent, but chat memory keeps `lane.private_answer_memory` in its place, as the tool's context
/// is not kept either: later chat, compaction and eval cases never hold the figures.
async fn a_private_answer_is_not_kept_in_chat_memory(db: TestDb) {
    let tools = TOOLS.replacen("audience = \"owner_only\"\nrisk = \"low\"", "audience = \"owner_only\"\nrisk = \"low\"\ntags = [\"private_data\"]", 1);
    assert_ne!(tools, TOOLS, "the sales report is tagged");
    let r = rig_with(db, &tools, "", |_| {}).await;
    r.add_owner().await;
    let message = envelope(vec![vec![text_message(OWNER, "wamid.PRIV1", "Send me the sales report")]]);
    assert_eq!(post_signed(&r.app, &message).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 1).await;
    let steps = r.steps("wamid.PRIV1").await;
    assert!(r.shop.requests.lock().expect("lock").contains(&"sales".to_string()), "the report ran: {steps:?}");
    let sent = r.graph.texts();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let marker = r.app.state.config.settings.lane.private_answer_memory.clone();
    assert!(!marker.is_empty() && sent[0] != marker, "the owner got the answer itself: {sent:?}");
    assert_eq!(memory_of(&r).await, vec![turn("user", "Send me the sales report", "wamid.PRIV1"), turn("assistant", &marker, "wamid.PRIV1")]);
}
both_backends!(lane_e2e_private_memory, a_private_answer_is_not_kept_in_chat_memory);

async fn a_slow_tool_gets_one_acknowledgement_and_one_later_answer(db: TestDb) {
    let r = rig(db, |s| s.lane.immediate_deadline = Duration::from_millis(500)).await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(2);
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    r.exchange(&[("wamid.SLOW", "Where is my order slow-7?")], 2).await;
    assert_eq!(
        r.graph.texts(),
        vec![pending, "Your order has shipped with Parcel Co: https://track.example/42".to_string()],
        "one acknowledgement, then one answer"
    );
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "the tool ran once");
    let steps = r.steps("wamid.SLOW").await;
    assert!(steps.iter().any(|(s, _, c)| s == "AgentToolImmediateTimeout" && c == "IMMEDIATE_DEADLINE"), "{steps:?}");
    assert!(steps.iter().any(|(s, d, _)| s == "later_delivery" && d == "sent"), "the later answer is in the trace: {steps:?}");
    // Memory holds the conversation as the person had it: the note, and the answer when it came.
    let job: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    assert_eq!(
        memory_of(&r).await,
        vec![
            turn("user", "Where is my order slow-7?", "wamid.SLOW"),
            turn("assistant", &pending, "wamid.SLOW"),
            turn("assistant", "Your order has shipped with Parcel Co: https://track.example/42", &format!("job:{job}")),
        ]
    );
}
both_backends!(lane_e2e_slow, a_slow_tool_gets_one_acknowledgement_and_one_later_answer);

/// An acknowledgement whose send is retried after the answer went out is not sent: "I'm
/// checking" after the answer only confuses.
async fn an_acknowledgement_overtaken_by_its_answer_is_not_sent(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.immediate_deadline = Duration::from_millis(300);
        s.whatsapp.send_attempts = 1;
        // The message's job tries its reply again well after the slow call has answered.
        s.jobs.retry_base = Duration::from_secs(3);
        s.jobs.retry_max = Duration::from_secs(3);
    })
    .await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(1);
    // The acknowledgement's first send meets a Meta server error.
    r.graph.set_rule(|_, index| (index == 0).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    r.exchange(&[("wamid.LATE_ACK", "Where is my order slow-7?")], 2).await;
    let answer = "Your order has shipped with Parcel Co: https://track.example/42".to_string();
    assert_eq!(r.graph.texts(), vec![pending, answer], "the refused acknowledgement, the answer, and nothing after it");
    let steps = r.steps("wamid.LATE_ACK").await;
    assert!(steps.iter().any(|(s, d, c)| s == "delivery" && d == "skipped" && c == "REPLY_SUPERSEDED"), "{steps:?}");
    let (state, attempt, preview): (String, i64, Option<String>) =
        sqlx::query_as("SELECT state, attempt, result_preview FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&r.app.state.db.pool).await.expect("the message's job");
    assert_eq!((state.as_str(), attempt), ("completed", 2), "{preview:?}");
    assert!(preview.is_some_and(|p| p.contains("went out first")));
}
both_backends!(lane_e2e_late_acknowledgement, an_acknowledgement_overtaken_by_its_answer_is_not_sent);

/// Asks for a slow call (`slow` long), and cancels its job on the Jobs page once the person was
/// told its answer would follow; returns once the cancel's `tool.stopped` job and every other
/// has finished, with that job's preview and the owner's console session.
async fn stop_a_slow_call(r: &Rig, slow: Duration) -> (String, crate::support::Client) {
    *r.shop.slow.lock().expect("lock") = slow;
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let message = envelope(vec![vec![text_message(CUSTOMER, "wamid.STOPPED", "Where is my order slow-7?")]]);
    assert_eq!(post_signed(&r.app, &message).await.status, axum::http::StatusCode::OK);
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(r.app.gatehouse.worker().run(stopped));
    let deadline = Instant::now() + Duration::from_secs(60);
    while r.graph.texts().is_empty() {
        assert!(Instant::now() < deadline, "no acknowledgement");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let job: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    let cancelled = owner.post_form("/api/cancel_job", &[("id", job.to_string().as_str())]).await;
    assert_eq!(cancelled.status, axum::http::StatusCode::OK, "{}", cancelled.body);
    let preview = loop {
        let done: Option<Option<String>> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'tool.stopped' AND state = 'completed'").fetch_optional(&r.app.state.db.pool).await.expect("the cancel's job");
        if let Some(preview) = done {
            break preview.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "the cancel's job never finished; sent so far: {:?}", r.graph.texts());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Whatever else would follow has had its chance.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    let _ = worker.await;
    (preview, owner)
}

/// A slow call an owner cancels after the person was told its answer would follow, stopped
/// before it answers (its heartbeat finds the lease gone): the person is told it was stopped,
/// once, after the run has stopped.
async fn a_call_an_owner_stops_is_told_to_the_person(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.immediate_deadline = Duration::from_millis(300);
        // A heartbeat each half second finds the cancel long before the call would answer.
        s.jobs.lease = Duration::from_secs(2);
    })
    .await;
    let (preview, mut owner) = stop_a_slow_call(&r, Duration::from_secs(5)).await;
    assert!(preview.contains("told the call was stopped"), "{preview}");
    let lane = &r.app.state.config.settings.lane;
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone(), lane.cancelled_reply.clone()], "told it was stopped, and nothing after");
    let steps = r.steps("wamid.STOPPED").await;
    assert!(steps.iter().any(|(s, d, _)| s == "later_delivery" && d == "sent"), "the notice is in the trace: {steps:?}");

    // The owner retries it, and cancels it again before it runs: the same attempt, a second
    // `tool.stopped` (the first has finished, so its key dedupes nothing), and no second notice.
    let job: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    for action in ["/api/retry_job", "/api/cancel_job"] {
        let res = owner.post_form(action, &[("id", job.to_string().as_str())]).await;
        assert_eq!(res.status, axum::http::StatusCode::OK, "{action}: {}", res.body);
    }
    r.exchange(&[], 2).await;
    let previews: Vec<Option<String>> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'tool.stopped' ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("the cancels' jobs");
    assert_eq!(previews.len(), 2, "{previews:?}");
    assert!(previews[1].as_deref().is_some_and(|p| p.contains("told the person the call was stopped: nothing more")), "{previews:?}");
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone(), lane.cancelled_reply.clone()], "told once");
}
both_backends!(lane_e2e_owner_stops_a_call, a_call_an_owner_stops_is_told_to_the_person);

/// A cancelled call whose run answers before it sees the cancel: its answer reaches the person,
/// and no "stopped" contradicts it.
async fn a_cancelled_call_that_answered_first_says_nothing_more(db: TestDb) {
    let r = rig(db, |s| s.lane.immediate_deadline = Duration::from_millis(300)).await;
    let (preview, _) = stop_a_slow_call(&r, Duration::from_secs(1)).await;
    assert!(preview.contains("its answer went out"), "{preview}");
    let lane = &r.app.state.config.settings.lane;
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone(), "Your order has shipped with Parcel Co: https://track.example/42".to_string()]);
}
both_backends!(lane_e2e_owner_stops_an_answered_call, a_cancelled_call_that_answered_first_says_nothing_more);

/// The same in the console's simulator: the answer its chat got is seen, and no "stopped"
/// follows it.
async fn a_cancelled_simulated_call_that_answered_first_says_nothing_more(db: TestDb) {
    let r = rig(db, |s| s.lane.immediate_deadline = Duration::from_millis(300)).await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(1);
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let sent = owner.post_form("/api/simulate_message", &[("from", "+15550100000"), ("text", "Where is my order slow-7?"), ("chat_id", "")]).await;
    assert_eq!(sent.status, axum::http::StatusCode::OK, "{}", sent.body);
    let chat_id = sent.json()["chat_id"].as_str().expect("a chat").to_string();
    let job: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    let cancelled = owner.post_form("/api/cancel_job", &[("id", job.to_string().as_str())]).await;
    assert_eq!(cancelled.status, axum::http::StatusCode::OK, "{}", cancelled.body);
    r.exchange(&[], 0).await;
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'tool.stopped'").fetch_one(&r.app.state.db.pool).await.expect("the cancel's job");
    assert!(preview.as_deref().is_some_and(|p| p.contains("its answer went out")), "{preview:?}");
    let said: Vec<String> = sqlx::query_scalar("SELECT text FROM simulator_messages WHERE chat_id = $1 AND direction = 'out' ORDER BY id").bind(&chat_id).fetch_all(&r.app.state.db.pool).await.expect("messages");
    let lane = &r.app.state.config.settings.lane;
    assert_eq!(said, vec![lane.pending_reply.clone(), "Your order has shipped with Parcel Co: https://track.example/42".to_string()]);
}
both_backends!(lane_e2e_owner_stops_a_simulated_call, a_cancelled_simulated_call_that_answered_first_says_nothing_more);

/// A later answer whose send fails is sent again by the job's next attempt, and only sent: the
/// tool is not asked again, nor the summarizer (an approved write must not run twice because
/// WhatsApp was briefly down).
async fn a_failed_send_of_a_later_answer_never_runs_the_tool_again(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.immediate_deadline = Duration::from_millis(500);
        s.whatsapp.send_attempts = 1;
        s.jobs.retry_base = Duration::from_millis(50);
        s.jobs.retry_max = Duration::from_millis(200);
    })
    .await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(2);
    // The acknowledgement goes out; the later answer's first send meets a Meta server error.
    r.graph.set_rule(|_, index| (index == 1).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    r.exchange(&[("wamid.RESEND", "Where is my order slow-7?")], 3).await;
    let answer = "Your order has shipped with Parcel Co: https://track.example/42".to_string();
    assert_eq!(r.graph.texts(), vec![pending, answer.clone(), answer], "the acknowledgement, the refused send, the same answer again");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["orders/slow-7".to_string()], "the tool ran once");
    let summaries = r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == SUMMARIZER_MODEL).count();
    assert_eq!(summaries, 1, "the answer was summarised once");
    let (state, attempt): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt), ("completed", 2), "the second attempt sent the kept answer");
    let steps = r.steps("wamid.RESEND").await;
    let later: Vec<_> = steps.iter().filter(|(s, d, _)| s == "AgentToolExecutionSucceeded" && d == "later").collect();
    assert_eq!(later.len(), 1, "the call's outcome is in the trace once: {steps:?}");
    let stored: Vec<_> = steps.iter().filter(|(s, d, _)| s == "AgentToolContextStored" && d == "stored").collect();
    assert_eq!(stored.len(), 1, "the later run's stored context is in the trace once: {steps:?}");
}
both_backends!(lane_e2e_resend, a_failed_send_of_a_later_answer_never_runs_the_tool_again);

/// An owner who cancels a call the lane is running at once stops it, as a worker's run is
/// stopped: the person has the acknowledgement and nothing after it, and the job stays
/// cancelled. (The run used to go on and send its answer when the tool replied.)
async fn cancelling_a_call_run_at_once_stops_it(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.immediate_deadline = Duration::from_millis(300);
        s.jobs.lease = Duration::from_millis(1500);
    })
    .await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(3);
    let items = vec![text_message(CUSTOMER, "wamid.CANCEL", "Where is my order slow-7?")];
    assert_eq!(post_signed(&r.app, &envelope(vec![items])).await.status, axum::http::StatusCode::OK);
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(r.app.gatehouse.worker().run(stopped));
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.shop.requests.lock().expect("lock").is_empty() || r.graph.sends().is_empty() {
        assert!(Instant::now() < deadline, "the call never started: {:?}", r.graph.texts());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = Instant::now();
    let id: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    assert!(server::db::jobs::cancel(&mut conn, id, "owner cancelled", server::db::now_ms()).await.expect("cancel"), "the run holds it");
    drop(conn);
    // Past the tool's answer, with time for a summary and a send.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(asked.elapsed()) + Duration::from_secs(1)).await;
    let _ = stop.send(true);
    let _ = worker.await;
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    assert_eq!(r.graph.texts(), vec![pending], "the acknowledgement only");
    let (state, code): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_code FROM jobs WHERE id = $1").bind(id).fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!(state, "cancelled", "{code:?}");
    let summaries = r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == SUMMARIZER_MODEL).count();
    assert_eq!(summaries, 0, "the stopped run asked for no summary");
}
both_backends!(lane_e2e_cancel_inline, cancelling_a_call_run_at_once_stops_it);

/// The console's "Try it" shows a result as every other place keeps one: a field whose name
/// looks secret is replaced, the rest is shown.
async fn try_it_shows_a_result_without_its_secrets(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let tried = owner.post_form("/api/try_tool", &[("name", "sales_report"), ("args", "{}"), ("chat_type", "direct")]).await;
    assert_eq!(tried.status, axum::http::StatusCode::OK, "{}", tried.body);
    let output = tried.json()["output"].as_str().unwrap_or_default().to_string();
    assert!(output.contains("1234") && output.contains("[REDACTED]"), "{}", tried.body);
    assert!(!output.contains("tok-live-sales-9f8e"), "{output}");
}
both_backends!(tools_try_it_redacted, try_it_shows_a_result_without_its_secrets);

/// The planner reads the chat's latest messages (seed §5.2, recent memory): a place the person
/// named in normal chat is where "there" is, without asking again.
async fn the_planner_reads_what_the_chat_said_before(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.MEM1", "Hi! I'm staying in Porto this week.")], 1).await;
    assert_eq!(r.graph.texts(), vec!["a chat reply".to_string()], "normal chat: {:?}", r.steps("wamid.MEM1").await);
    r.exchange(&[("wamid.MEM2", "What's the weather forecast there tomorrow?")], 2).await;
    let steps = r.steps("wamid.MEM2").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Porto/tomorrow".to_string()], "{steps:?}");
    let plan = r.llm.seen.lock().expect("lock").iter().rev().find(|b| b["model"] == PLANNER_MODEL).cloned().expect("a plan");
    let said = plan["messages"].to_string();
    // The chat's words reach the planner as data, in the chat's own block.
    let block = said.split(r#"kind=\"chat_summary\""#).nth(1).and_then(|rest| rest.split("untrusted_data>").next()).unwrap_or_default();
    assert!(block.contains("person: Hi! I'm staying in Porto this week.") && block.contains("assistant: a chat reply"), "{said}");
}
both_backends!(lane_e2e_recent_memory, the_planner_reads_what_the_chat_said_before);

/// With `lane.planner_recent_turns = 0` the planner reads no earlier messages, only the chat's
/// summary (none here), and asks which place.
async fn without_recent_turns_the_planner_asks(db: TestDb) {
    let r = rig(db, |s| s.lane.planner_recent_turns = 0).await;
    r.exchange(&[("wamid.MEM3", "Hi! I'm staying in Porto this week.")], 1).await;
    r.exchange(&[("wamid.MEM4", "What's the weather forecast there tomorrow?")], 2).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty());
    assert_eq!(r.graph.texts()[1], "Which place do you mean?");
}
both_backends!(lane_e2e_no_recent_memory, without_recent_turns_the_planner_asks);

/// A rig whose order tool times out (after 300 ms, `extra` added to its definition) against a
/// shop that takes 5 s, with the settings `tweak` makes.
async fn timing_out(db: TestDb, extra: &str, tweak: impl FnOnce(&mut Settings) + Send + 'static) -> Rig {
    let tools = TOOLS.replacen("timeout = \"20s\"", &format!("timeout = \"300ms\"{extra}"), 1);
    let r = rig_with(db, &tools, "", tweak).await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(5);
    r
}

/// A call the lane runs at once that fails in a way worth retrying goes back to the queue after
/// the backoff the deployment configured (`jobs.retry_base`), as a worker's failed run does.
async fn a_failed_immediate_run_waits_the_configured_backoff(db: TestDb) {
    let r = timing_out(db, "", |s| {
        s.jobs.retry_base = Duration::from_secs(3600);
        s.jobs.retry_max = Duration::from_secs(7200);
    })
    .await;
    let before = server::db::now_ms();
    r.exchange(&[("wamid.RETRY", "Where is my order slow-7?")], 1).await;
    let (state, attempt, scheduled_at, code): (String, i64, i64, Option<String>) =
        sqlx::query_as("SELECT state, attempt, scheduled_at, last_error_code FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt), ("retryable", 1), "{code:?}");
    let waits = scheduled_at - before;
    assert!(waits >= 2_880_000, "at least 0.8 of the configured hour (the jitter's floor), not the default backoff: {waits} ms ({code:?})");
    let steps = r.steps("wamid.RETRY").await;
    assert!(steps.iter().any(|(s, _, _)| s == "AgentToolImmediateStart"), "the lane ran it at once: {steps:?}");
}
both_backends!(lane_e2e_immediate_backoff, a_failed_immediate_run_waits_the_configured_backoff);

/// The call itself is made in the first `jobs.default_max_attempts` runs of its job only. A
/// later run with no answer kept (the runs before it stopped before keeping one: a crash, a
/// lost lease, each time) does not make it again: a call that brings its run down is not made
/// for each of the job's longer `jobs.attempts.tool_call`. The person is told it could not be
/// done, and the job ends with a code that says why. Before, each such run made the call.
async fn a_call_past_its_runs_with_nothing_kept_is_not_made_again(db: TestDb) {
    let r = timing_out(db, "", |s| {
        s.jobs.default_max_attempts = 3;
        s.jobs.attempts.tool_call = 8;
        s.jobs.retry_base = Duration::from_secs(3600);
        s.jobs.retry_max = Duration::from_secs(7200);
    })
    .await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.CAP", "Where is my order slow-7?")], 1).await;
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone()]);
    let made = r.shop.requests.lock().expect("lock").len();
    assert!(made >= 1, "the lane's run made the call");
    // Runs 2 and 3 stopped before they kept anything; the job is due for its fourth.
    let pool = &r.app.state.db.pool;
    sqlx::query("UPDATE jobs SET attempt = 3, scheduled_at = 0 WHERE kind = 'tool.call'").execute(pool).await.expect("runs used");
    r.exchange(&[], 2).await;
    assert_eq!(r.shop.requests.lock().expect("lock").len(), made, "the call was not made a fourth time");
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone(), lane.failed_reply.clone()], "told it could not be done");
    let (state, attempt, code): (String, i64, Option<String>) = sqlx::query_as("SELECT state, attempt, last_error_code FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt, code.as_deref()), ("discarded", 4, Some("TOOL_ATTEMPTS_EXHAUSTED")));
    let kept: Option<String> = sqlx::query_scalar("SELECT failure FROM tool_answers").fetch_optional(pool).await.expect("kept");
    assert_eq!(kept.as_deref(), Some("TOOL_ATTEMPTS_EXHAUSTED"), "kept, so a retry only sends what did not go out");
}
both_backends!(lane_e2e_call_runs_capped, a_call_past_its_runs_with_nothing_kept_is_not_made_again);

/// A tool that may not run as a job (`async_policy = "never"`) is called in the lane's own run
/// only. A worker's run of its job follows one the lane could not finish (its lease lost, the
/// process gone) before it kept an answer, when the person stopped waiting for it: it does not
/// make the call, and the person is told it could not be done. Before, the worker made the call
/// and sent its answer later.
async fn a_tool_never_run_as_a_job_is_not_called_by_a_worker(db: TestDb) {
    let tools = TOOLS.replacen("timeout = \"20s\"", "timeout = \"1s\"\nasync_policy = \"never\"", 1);
    let r = rig_with(db, &tools, "", |_| {}).await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.NEVER", "Where is my order 4821?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Your order has shipped with Parcel Co: https://track.example/42".to_string()], "the lane's own run answered");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1);
    // As if the lane's run had stopped before it kept its answer: the job is due again.
    let pool = &r.app.state.db.pool;
    sqlx::query("DELETE FROM tool_answers").execute(pool).await.expect("nothing kept");
    sqlx::query("UPDATE jobs SET state = 'retryable', scheduled_at = 0, completed_at = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE kind = 'tool.call'")
        .execute(pool)
        .await
        .expect("due again");
    r.exchange(&[], 2).await;
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "a worker's run did not make the call");
    assert_eq!(r.graph.texts().last(), Some(&lane.failed_reply), "told it could not be done");
    let (state, attempt, code): (String, i64, Option<String>) = sqlx::query_as("SELECT state, attempt, last_error_code FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt, code.as_deref()), ("discarded", 2, Some("TOOL_NOT_RUN_AS_JOB")));
}
both_backends!(lane_e2e_never_async_worker, a_tool_never_run_as_a_job_is_not_called_by_a_worker);

/// A tool that may not run as a job (`async_policy = "never"`) is tried in the lane's run only:
/// a timeout is said at once, and nothing is retried in the background after a "please wait".
async fn a_call_that_may_not_run_as_a_job_is_never_retried_later(db: TestDb) {
    let r = timing_out(db, "\nasync_policy = \"never\"", |s| {
        s.jobs.retry_base = Duration::from_millis(50);
        s.jobs.retry_max = Duration::from_millis(200);
    })
    .await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.NEVER", "Where is my order slow-7?")], 1).await;
    let (state, attempt): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt), ("discarded", 1), "one run, then told");
    let texts = r.graph.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert_ne!(texts[0], lane.pending_reply, "never told to wait: {texts:?}");
}
both_backends!(lane_e2e_never_async, a_call_that_may_not_run_as_a_job_is_never_retried_later);

/// A call accepted against an earlier definition of its tool (the catalog was reloaded while its
/// job waited) is judged again by the lane's own rules before it runs: here the tool is now
/// private data, which a customer may not use without an owner, and which the checkpoint alone
/// would have run. The same call accepted against the definition in force runs.
async fn a_call_whose_tool_changed_while_it_waited_is_judged_again(db: TestDb) {
    let tools = TOOLS.replacen("risk = \"low\"\ntimeout = \"20s\"", "risk = \"low\"\ntimeout = \"20s\"\ntags = [\"private_data\"]", 1);
    let r = rig_with(db, &tools, "", |_| {}).await;
    let current = r.app.state.tools.catalog().get("order_status").expect("tool").version.clone();
    let queue = &r.app.gatehouse.jobs;
    queue.enqueue(&queue.job(&order_lookup("sha256:before-the-reload", "wamid.STALE"))).await.expect("enqueue");
    r.exchange(&[], 1).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "not run");
    let (state, code): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_code FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((state.as_str(), code.as_deref()), ("discarded", Some("TOOL_CHANGED")));
    queue.enqueue(&queue.job(&order_lookup(&current, "wamid.CURRENT"))).await.expect("enqueue");
    r.exchange(&[], 2).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["orders/4821".to_string()], "accepted against this definition: run");
}
both_backends!(lane_e2e_tool_changed, a_call_whose_tool_changed_while_it_waited_is_judged_again);

/// A call that ran is answered as it came out, even when the catalog changed while it ran (a
/// reload left the tool out, or an MCP rediscovery quarantined it): the person is not told it
/// failed, which would have them ask again.
async fn a_call_answered_while_its_tool_left_the_catalog_is_answered(db: TestDb) {
    let r = rig(db, |s| s.lane.immediate_deadline = Duration::from_millis(300)).await;
    *r.shop.slow.lock().expect("lock") = Duration::from_secs(2);
    let (shop, dir, state) = (r.shop.clone(), r.dir.path().to_path_buf(), r.app.state.clone());
    let reload = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        while shop.requests.lock().expect("lock").is_empty() {
            assert!(Instant::now() < deadline, "the call never reached the shop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The tool and its connector action leave the files.
        let start = TOOLS.find("[[tool]]\nname = \"order_status\"").expect("order_status");
        let end = start + 1 + TOOLS[start + 1..].find("[[tool]]").expect("the next tool");
        std::fs::write(dir.join("tools.toml"), format!("{}{}", &TOOLS[..start], &TOOLS[end..])).expect("tools");
        let actions = std::fs::read_to_string(dir.join("connectors.toml")).expect("connectors");
        let action = "[[connector.action]]\ntool = \"order_status\"\nmethod = \"GET\"\npath = \"orders/{order_id}\"\n";
        assert!(actions.contains(action), "{actions}");
        std::fs::write(dir.join("connectors.toml"), actions.replacen(action, "", 1)).expect("connectors");
        let report = state.reloads.reload().await.expect("reload");
        assert_eq!(report.changed, vec!["order_status".to_string()], "{report:?}");
        assert!(state.tools.catalog().get("order_status").is_none(), "gone from the catalog");
        assert!(!shop.requests.lock().expect("lock").is_empty() && shop.requests.lock().expect("lock").len() == 1, "while the call runs");
    });
    let pending = r.app.state.config.settings.lane.pending_reply.clone();
    r.exchange(&[("wamid.LEFT", "Where is my order slow-7?")], 2).await;
    reload.await.expect("reload task");
    assert_eq!(r.graph.texts(), vec![pending, "Your order has shipped with Parcel Co: https://track.example/42".to_string()], "answered as it came out");
}
both_backends!(lane_e2e_tool_left_while_running, a_call_answered_while_its_tool_left_the_catalog_is_answered);

/// A tool call's job has `jobs.attempts.tool_call` runs, so its answer rides out a WhatsApp
/// outage; the call itself is tried in the first `jobs.default_max_attempts` of them only, and
/// then the person is told it failed.
async fn a_call_is_tried_default_max_attempts_times_within_its_longer_job(db: TestDb) {
    let r = timing_out(db, "", |s| {
        s.jobs.default_max_attempts = 2;
        s.jobs.attempts.tool_call = 6;
        s.jobs.retry_base = Duration::from_millis(50);
        s.jobs.retry_max = Duration::from_millis(200);
    })
    .await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.TRIES", "Where is my order slow-7?")], 2).await;
    let (state, attempt, max_attempts): (String, i64, i64) =
        sqlx::query_as("SELECT state, attempt, max_attempts FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("the call's job");
    assert_eq!((state.as_str(), attempt, max_attempts), ("discarded", 2, 6), "tried twice, then told");
    let steps = r.steps("wamid.TRIES").await;
    // The tool's timeout and the connector's own request timeout are the same here: whichever
    // ends the call first names the failure, and the person is told accordingly.
    let last = steps.iter().find(|(s, d, _)| s == "AgentToolExecutionFailed" && d == "later").map(|(_, _, c)| c.as_str());
    let told = match last {
        Some("TOOL_TIMEOUT") => lane.timed_out_reply.clone(),
        Some("TOOL_PROVIDER_ERROR") => lane.failed_reply.clone(),
        other => panic!("the last run's failure is in the trace, not {other:?}: {steps:?}"),
    };
    assert_eq!(r.graph.texts(), vec![lane.pending_reply.clone(), told], "{steps:?}");

    // An owner retries the job (the Jobs page's Retry): the answer it came to is kept, so the
    // retry only sends what was not sent (here nothing); the call does not run again.
    let tried = r.shop.requests.lock().expect("lock").len();
    let id: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("id");
    let mut tx = r.app.state.db.begin_write().await.expect("tx");
    assert!(server::db::jobs::retry_now(&mut tx, id, server::db::now_ms()).await.expect("retry"));
    tx.commit().await.expect("commit");
    r.exchange(&[], 2).await;
    assert_eq!(r.shop.requests.lock().expect("lock").len(), tried, "the call did not run again");
    assert_eq!(r.graph.texts().len(), 2, "nothing was sent twice: {:?}", r.graph.texts());
}
both_backends!(lane_e2e_call_attempts, a_call_is_tried_default_max_attempts_times_within_its_longer_job);

/// A call answered once is neither run nor sent twice. Its job run again after the lane took
/// its answer as the message's reply (the run that gave it never recorded its end) sends
/// nothing: the reply holds the answer. The message handled again (its first run stopped before
/// its reply was recorded: a crash, a full disk) does not run the call again: the kept answer is
/// its reply again.
async fn a_call_answered_once_is_neither_run_nor_sent_twice(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.ONCE", "Where is my order 4821?")], 1).await;
    let answer = "Your order has shipped with Parcel Co: https://track.example/42".to_string();
    assert_eq!(r.graph.texts(), vec![answer.clone()]);
    let calls = r.shop.requests.lock().expect("lock").len();
    let pool = &r.app.state.db.pool;
    r.run_again("tool.call").await;
    r.exchange(&[], 1).await;
    assert_eq!(r.graph.texts(), vec![answer.clone()], "the job sent nothing: the reply held its answer");
    // As if an earlier run had stored another reply for it: memory keeps the one it got last.
    sqlx::query("UPDATE chat_turns SET text = 'an earlier reply' WHERE message_id = 'wamid.ONCE' AND role = 'assistant'").execute(pool).await.expect("earlier reply");
    r.handle_again("wamid.ONCE").await;
    let remembered: String = sqlx::query_scalar("SELECT text FROM chat_turns WHERE message_id = 'wamid.ONCE' AND role = 'assistant'").fetch_one(pool).await.expect("remembered");
    assert_eq!(remembered, answer, "remembered as it was answered again");
    let steps = r.steps("wamid.ONCE").await;
    assert_eq!(r.shop.requests.lock().expect("lock").len(), calls, "the call ran once: {steps:?}");
    assert!(steps.iter().any(|(s, d, _)| s == "AgentToolJobDedupe" && d == "already_answered"), "{steps:?}");
    let reply: String = sqlx::query_scalar("SELECT reply FROM message_replies WHERE message_id = 'wamid.ONCE'").fetch_one(pool).await.expect("reply");
    assert_eq!(reply, answer, "the kept answer is the reply again");
    let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("jobs");
    assert_eq!(jobs, 1, "no second job for the same call");
    assert_eq!(r.graph.texts(), vec![answer], "sent once");
}
both_backends!(lane_e2e_answered_once, a_call_answered_once_is_neither_run_nor_sent_twice);

async fn a_customer_never_reaches_an_owner_only_tool(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.SALES", "Send me the sales report")], 1).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "the owner-only tool never reached its system");
    let steps = r.steps("wamid.SALES").await;
    let planned = steps.iter().any(|(s, _, _)| s == "AgentToolPlanRejected");
    let detected_none = steps.iter().any(|(s, d, _)| s == "AgentToolCandidate" && d == "normal_chat");
    assert!(planned || detected_none, "refused by the validator, or never a candidate: {steps:?}");
    let offered = r.llm.seen.lock().expect("lock").iter().any(|b| b["model"] == PLANNER_MODEL && b["tools"].to_string().contains("sales_report"));
    assert!(!offered, "the planner never saw the owner-only tool for a customer");
    assert_eq!(r.graph.texts().len(), 1);
}
both_backends!(lane_e2e_owner_only, a_customer_never_reaches_an_owner_only_tool);

/// A tool the planner made up is its mistake, not a refusal of what the person asked: the
/// message goes on to normal chat (seed §15), nothing runs, and the trace says why. A plan the
/// validator refuses for a reason of policy is still refused.
async fn a_made_up_tool_hands_the_message_to_normal_chat(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.llm.then(|_| anthropic(json!([tool_use("t1", "delete_everything", json!({}))]), "tool_use"));
    r.exchange(&[("wamid.MADEUP", "Where is my order 4821?")], 1).await;
    let steps = r.steps("wamid.MADEUP").await;
    assert_eq!(r.graph.texts(), vec!["a chat reply".to_string()], "{steps:?}");
    assert!(r.shop.requests.lock().expect("lock").is_empty());
    assert!(steps.contains(&("AgentToolPlanRejected".into(), "normal_chat".into(), "TOOL_UNKNOWN".into())), "{steps:?}");

    r.llm.then(|_| anthropic(json!([tool_use("t1", "order_status", json!({ "order_id": "4821", "note": "extra" }))]), "tool_use"));
    r.exchange(&[("wamid.EXTRA", "Where is my order 4821 now?")], 2).await;
    assert_eq!(r.graph.texts()[1], r.app.state.config.settings.lane.denied_reply);
}
both_backends!(lane_e2e_made_up_tool, a_made_up_tool_hands_the_message_to_normal_chat);


/// A slow tool's acknowledgement and its later answer across a crash: `gatehouse serve` is
/// killed with SIGKILL while the call is in flight, after the customer was told it is underway;
/// the restarted server rescues the call and the customer gets exactly one acknowledgement and
/// exactly one answer.
async fn a_slow_answer_survives_kill_nine_of_the_server(db: TestDb) {
    use crate::procs::{Gatehouse, kill_nine, wait_for};
    let (addr, shop) = shop().await;
    *shop.slow.lock().expect("lock") = Duration::from_secs(3);
    let graph = FakeGraph::start().await;
    let (llm, llm_url) = Fake::start().await;
    plan_for_the_shop(&llm);
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("GATEHOUSE__WHATSAPP__GRAPH_BASE_URL", graph.base_url.as_str()),
        ("GATEHOUSE__WHATSAPP__GRAPH_VERSION", VERSION),
        ("GATEHOUSE__WHATSAPP__PHONE_NUMBER_ID", PHONE_NUMBER_ID),
        ("GATEHOUSE__WHATSAPP__TYPING_INDICATOR", "false"),
        ("GATEHOUSE__WHATSAPP__MARK_READ", "false"),
        ("GATEHOUSE__LLM__ANTHROPIC__BASE_URL", llm_url.as_str()),
        ("GATEHOUSE__LLM__MAX_RETRIES", "0"),
        ("GATEHOUSE__MODELS__PLANNER", PLANNER_MODEL),
        ("GATEHOUSE__MODELS__SUMMARIZER", SUMMARIZER_MODEL),
        ("GATEHOUSE__LANE__IMMEDIATE_DEADLINE", "500ms"),
        ("ANTHROPIC_API_KEY", "test-llm-key"),
        ("WHATSAPP_APP_SECRET", crate::whatsapp::APP_SECRET),
        ("WHATSAPP_ACCESS_TOKEN", crate::whatsapp::ACCESS_TOKEN),
        ("WHATSAPP_VERIFY_TOKEN", crate::whatsapp::VERIFY_TOKEN),
    ];
    let gh = Gatehouse::new(dir.path(), &db, TOOLS, &connectors(addr), &env);
    let log = dir.path().join("serve.log");
    let logs = || std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert_eq!(gh.run(&["migrate"]).await.code, 0);
    let mut server = gh.serve(&log).await;

    let body = envelope(vec![vec![text_message(CUSTOMER, "wamid.K9", "Where is my order slow-7?")]]);
    let posted = crate::procs::post_signed(&gh.addr(), body).await;
    assert_eq!(posted.status().as_u16(), 200);
    let pending = shipped_lane().pending_reply;
    let (graph_ref, shop_ref) = (&graph, &shop);
    wait_for("the acknowledgement, with the call in flight", Duration::from_secs(30), async || {
        graph_ref.texts().contains(&pending) && !shop_ref.requests.lock().expect("lock").is_empty()
    })
    .await;
    kill_nine(&mut server).await;
    assert_eq!(graph.texts(), vec![pending.clone()], "nothing but the acknowledgement before the crash");

    let mut server = gh.serve(&log).await;
    let summary = "Your order has shipped with Parcel Co: https://track.example/42".to_string();
    wait_for("the answer after the restart", Duration::from_secs(60), async || graph_ref.texts().contains(&summary)).await;
    // Time for a second answer, were one on its way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(graph.texts(), vec![pending, summary], "one acknowledgement and one answer: {}", logs());
    let requests = shop.requests.lock().expect("lock").clone();
    assert_eq!(requests, vec!["orders/slow-7".to_string(); 2], "the killed run and the rescued one");
    kill_nine(&mut server).await;
}
both_backends!(lane_e2e_slow_kill_nine, a_slow_answer_survives_kill_nine_of_the_server);


/// The planner sees the candidates only; through the search tool it finds another tool of the
/// catalog, which is then offered and called. Searches are bounded.
async fn the_planner_finds_a_tool_through_search(db: TestDb) {
    let r = rig(db, |s| s.lane.detector.max_candidates = 1).await;
    r.exchange(&[("wamid.S1", "Track my order 4821: do I need an umbrella in Lisbon today?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Today: sunny in Lisbon, 24°C.".to_string()], "{:?}", r.steps("wamid.S1").await);
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Lisbon/today".to_string()]);
    let plans: Vec<Value> = r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == PLANNER_MODEL).cloned().collect();
    let names = |b: &Value| -> Vec<String> { b["tools"].as_array().map(|t| t.iter().filter_map(|t| t["name"].as_str().map(String::from)).collect()).unwrap_or_default() };
    assert_eq!(plans.len(), 2, "one search, then the call");
    assert!(!names(&plans[0]).contains(&"forecast".to_string()) && names(&plans[0]).contains(&"search_tools".to_string()), "{:?}", names(&plans[0]));
    assert!(names(&plans[0]).len() <= 3, "the candidate, respond and search only: {:?}", names(&plans[0]));
    assert!(names(&plans[1]).contains(&"forecast".to_string()), "the found tool is offered: {:?}", names(&plans[1]));
    let second = plans[1]["messages"].to_string();
    assert!(second.contains("tool_result") && second.contains("tool_search_results") && second.contains("forecast"), "{second}");
    let steps = r.steps("wamid.S1").await;
    let order: Vec<(&str, &str)> = steps.iter().filter(|(s, _, _)| s.starts_with("AgentToolPlanner") || s == "AgentToolSearch").map(|(s, d, _)| (s.as_str(), d.as_str())).collect();
    assert_eq!(order, vec![("AgentToolPlannerResult", "search"), ("AgentToolSearch", "searched"), ("AgentToolPlannerResult", "tool_use")], "{steps:?}");

    // A planner that keeps searching is stopped at lane.max_search_calls; the message goes to chat.
    r.exchange(&[("wamid.S2", "Track my order 4821, endless please")], 2).await;
    assert_eq!(r.graph.texts()[1], "a chat reply");
    let steps = r.steps("wamid.S2").await;
    let searched = steps.iter().filter(|(s, d, _)| s == "AgentToolSearch" && d == "searched").count();
    assert_eq!(searched, 2, "{steps:?}");
    assert!(steps.iter().any(|(s, _, c)| s == "AgentToolSearch" && c == "SEARCH_LIMIT"), "{steps:?}");
}
both_backends!(lane_e2e_tool_search, the_planner_finds_a_tool_through_search);


/// A catalog of a thousand tools never reaches the model whole: the planner is offered the
/// detector's candidates (and, after a search, a few more), never the catalog.
async fn a_large_catalog_never_reaches_the_planner_whole(db: TestDb) {
    let mut tools = TOOLS.to_string();
    let mut actions = String::new();
    for i in 0..1000 {
        tools.push_str(&format!(
            "\n[[tool]]\nname = \"gadget_{i:04}\"\ntitle = \"Gadget {i}\"\ndescription = \"Shows the stock level of gadget model {i} in warehouse {w}.\"\nprovider = \"connector\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = {{ type = \"object\", additionalProperties = false, properties = {{}} }}\n",
            w = i % 7
        ));
        actions.push_str(&format!("\n[[connector.action]]\ntool = \"gadget_{i:04}\"\nmethod = \"GET\"\npath = \"orders/gadget-{i}\"\n"));
    }
    let r = rig_with(db, &tools, &actions, |_| {}).await;
    assert!(r.app.state.tools.catalog().len() > 1000);
    r.exchange(&[("wamid.BIG", "Track my order 4821: do I need an umbrella in Lisbon today?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Today: sunny in Lisbon, 24°C.".to_string()], "{:?}", r.steps("wamid.BIG").await);
    let max = r.app.state.config.settings.lane.detector.max_candidates + 2 + r.app.state.config.settings.lane.search_results as usize;
    for body in r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == PLANNER_MODEL) {
        let offered = body["tools"].as_array().map_or(0, Vec::len);
        assert!(offered <= max, "{offered} tools offered; at most {max}");
    }
}
both_backends!(lane_e2e_large_catalog, a_large_catalog_never_reaches_the_planner_whole);
