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
    whatsapp::{FakeGraph, PHONE_NUMBER_ID, VERSION, count, envelope, post_signed, text_message},
};

const CUSTOMER: &str = "16505550100";

/// The shop a connector reaches: orders (slow ones sleep), and a sales report owners may see.
#[derive(Clone, Default)]
struct Shop {
    requests: Arc<Mutex<Vec<String>>>,
    slow: Arc<Mutex<Duration>>,
}

async fn shop() -> (SocketAddr, Shop) {
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
                Json(json!({ "id": id, "status": "shipped", "carrier": "Parcel Co", "tracking_url": "https://track.example/42" }))
            }),
        )
        .route(
            "/api/refunds/{id}",
            axum::routing::post(|State(shop): State<Shop>, Path(id): Path<String>| async move {
                shop.requests.lock().expect("lock").push(format!("refunds/{id}"));
                Json(json!({ "id": id, "refunded": true }))
            }),
        )
        .route(
            "/api/sales",
            get(|State(shop): State<Shop>| async move {
                shop.requests.lock().expect("lock").push("sales".into());
                (StatusCode::OK, Json(json!({ "total": 1234 })))
            }),
        )
        .with_state(shop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (addr, shop)
}

const TOOLS: &str = r#"
approval_mode = "auto"

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
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 } } }

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

fn connectors(addr: SocketAddr) -> String {
    format!(
        r#"
[[connector]]
id = "shop"
title = "Test shop"
base_url = "http://{addr}/api"
allowed_urls = ["http://{addr}/api/orders/*", "http://{addr}/api/refunds/*", "http://{addr}/api/sales"]

[[connector.action]]
tool = "refund_order"
method = "POST"
path = "refunds/{{order_id}}"

[[connector.action]]
tool = "order_status"
method = "GET"
path = "orders/{{order_id}}"

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

struct Rig {
    app: TestApp,
    graph: FakeGraph,
    llm: Fake,
    shop: Shop,
    _dir: tempfile::TempDir,
}

/// The planner proposes `order_status` for the order number in the message, or `sales_report`
/// when asked for sales; the summarizer answers with a fixed summary.
async fn rig(db: TestDb, tweak: impl FnOnce(&mut Settings) + Send + 'static) -> Rig {
    let (addr, shop) = shop().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tools.toml"), TOOLS).expect("tools");
    std::fs::write(dir.path().join("connectors.toml"), connectors(addr)).expect("connectors");
    let graph = FakeGraph::start().await;
    let (llm, llm_url) = Fake::start().await;
    llm.always(|body| {
        let model = body["model"].as_str().unwrap_or_default();
        let text = body["messages"].to_string();
        if model == PLANNER_MODEL {
            if text.contains("refund") {
                return anthropic(json!([tool_use("t1", "refund_order", json!({ "order_id": "4821" }))]), "tool_use");
            }
            if text.contains("sales") {
                return anthropic(json!([tool_use("t1", "sales_report", json!({}))]), "tool_use");
            }
            let id = if text.contains("slow-7") { "slow-7" } else { "4821" };
            anthropic(json!([tool_use("t1", "order_status", json!({ "order_id": id }))]), "tool_use")
        } else if model == SUMMARIZER_MODEL {
            anthropic(json!([{ "type": "text", "text": "Your order has shipped with Parcel Co: https://track.example/42" }]), "end_turn")
        } else {
            anthropic(json!([{ "type": "text", "text": "a chat reply" }]), "end_turn")
        }
    });
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
    Rig { app, graph, llm, shop, _dir: dir }
}

impl Rig {
    /// Posts the messages and runs the worker until every job (messages and tool calls) has
    /// finished and `sends` messages went out.
    async fn exchange(&self, messages: &[(&str, &str)], sends: usize) {
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

    async fn steps(&self, wamid: &str) -> Vec<(String, String, String)> {
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
    for expected in ["AgentToolCandidate", "AgentToolPlannerResult", "AgentToolPlanAccepted", "AgentToolJobEnqueued", "AgentToolImmediateStart", "AgentToolExecutionSucceeded", "tool_lane", "reply", "delivery"] {
        assert!(names.contains(&expected), "{expected} missing from {steps:?}");
    }
    let (route, trace_id): (String, i64) = sqlx::query_as("SELECT route, id FROM traces WHERE message_id = 'wamid.LANE1'").fetch_one(&r.app.state.db.pool).await.expect("trace");
    assert_eq!(route, "tool_lane");
    let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit WHERE trace_id = $1 AND tool = 'order_status' AND decision = 'allow'")
        .bind(trace_id)
        .fetch_one(&r.app.state.db.pool)
        .await
        .expect("audit");
    assert_eq!(audited, 1, "the call's audit row names the message's trace");
    let (state, kind): (String, String) = sqlx::query_as("SELECT state, kind FROM jobs WHERE tool_name = 'order_status'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((state.as_str(), kind.as_str()), ("completed", "tool.call"));
    let turns: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM chat_turns").fetch_one(&r.app.state.db.pool).await.expect("turns");
    assert_eq!(turns, 0, "tool prompts and results never enter chat memory");
}
both_backends!(lane_e2e_summary, a_tool_request_gets_one_summarised_reply);

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
}
both_backends!(lane_e2e_slow, a_slow_tool_gets_one_acknowledgement_and_one_later_answer);

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

const OWNER: &str = "16505550001";

fn button_press(from: &str, wamid: &str, id: &str) -> Value {
    json!({ "from": from, "id": wamid, "timestamp": "1739321030", "type": "interactive",
        "interactive": { "type": "button_reply", "button_reply": { "id": id, "title": "Approve" } } })
}

impl Rig {
    async fn add_owner(&self) {
        let mut tx = self.app.state.db.begin_write().await.expect("tx");
        sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('Olga Owner', 'olga', 'x', 1, 0, 0)").execute(&mut *tx).await.expect("owner");
        sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ($1, (SELECT MAX(id) FROM owners), 0)").bind(format!("+{OWNER}")).execute(&mut *tx).await.expect("phone");
        tx.commit().await.expect("commit");
    }

    async fn press(&self, items: Vec<Value>, sends: usize) {
        assert_eq!(post_signed(&self.app, &envelope(vec![items])).await.status, axum::http::StatusCode::OK);
        self.exchange(&[], sends).await;
    }
}

/// A customer's high-risk write waits for an owner: stored before the customer is told, the
/// owner gets Approve and Reject buttons, a press that WhatsApp delivers twice and a second
/// press decide once, the call runs once, the customer gets the answer and the owner the
/// outcome. A customer pressing the button, or a forged nonce, changes nothing.
async fn an_approved_call_runs_once_after_the_owners_button(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    let approval_reply = r.app.state.config.settings.lane.approval_reply.clone();
    r.exchange(&[("wamid.REFUND", "Please refund my order 4821")], 2).await;
    assert_eq!(r.graph.texts(), vec![approval_reply.clone()], "the customer is told an owner must approve, nothing more");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "nothing ran before the decision");
    let (id, state, args, nonce): (i64, String, String, String) = sqlx::query_as("SELECT id, state, args, nonce FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!((state.as_str(), args.as_str()), ("pending", r#"{"order_id":"4821"}"#));
    let steps = r.steps("wamid.REFUND").await;
    assert!(steps.iter().any(|(s, d, _)| s == "ApprovalRequested" && d == "pending"), "{steps:?}");
    let asks: Vec<Value> = r.graph.sends().into_iter().filter(|b| b["type"] == "interactive").collect();
    assert_eq!(asks.len(), 1, "one question to the one owner number");
    assert_eq!(asks[0]["to"], OWNER);
    let buttons = asks[0]["interactive"]["action"]["buttons"].as_array().cloned().unwrap_or_default();
    let approve_id = buttons[0]["reply"]["id"].as_str().expect("button id").to_string();
    assert!(approve_id.ends_with(&nonce) && approve_id.contains(&format!(":{id}:approve:")), "{approve_id}");
    assert!(asks[0]["interactive"]["body"]["text"].as_str().is_some_and(|t| t.contains("refund_order") && t.contains("4821")));

    // A customer pressing the owner's button, and a forged nonce: nothing changes.
    r.press(vec![button_press(CUSTOMER, "wamid.FORGE1", &approve_id)], 3).await;
    r.press(vec![button_press(OWNER, "wamid.FORGE2", &format!("gh-approval:{id}:approve:0000"))], 4).await;
    let state: String = sqlx::query_scalar("SELECT state FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("state");
    assert_eq!(state, "pending");
    let settings = &r.app.state.config.settings.approvals;
    let texts = r.graph.texts();
    assert_eq!(texts[1], settings.not_an_owner_reply);
    assert_eq!(texts[2], settings.invalid_button_reply);

    // The press delivered twice in one webhook, and once more: one decision, one run.
    let press = button_press(OWNER, "wamid.PRESS", &approve_id);
    r.press(vec![press.clone(), press], 7).await;
    r.press(vec![button_press(OWNER, "wamid.PRESS2", &approve_id)], 8).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "the approved call ran exactly once");
    let (state, outcome, by): (String, Option<String>, Option<String>) = sqlx::query_as("SELECT state, outcome_code, decided_by FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!((state.as_str(), outcome.as_deref(), by.as_deref()), ("approved", Some("OK"), Some("Olga Owner")));
    let texts = r.graph.texts();
    let summary = "Your order has shipped with Parcel Co: https://track.example/42".to_string();
    assert_eq!(texts.iter().filter(|t| **t == summary).count(), 1, "the customer got the answer once: {texts:?}");
    assert!(texts.iter().any(|t| t.starts_with(&format!("Approved #{id}"))), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("already approved by Olga Owner")), "the later press is told who decided: {texts:?}");
    assert!(texts.iter().any(|t| t.starts_with(&format!("Approval #{id} (refund_order):"))), "the owner is told the outcome: {texts:?}");
    let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM owner_audit WHERE event = 'approval_approved'").fetch_one(&r.app.state.db.pool).await.expect("audit");
    assert_eq!(audited, 1);
    let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("jobs");
    assert_eq!(runs, 1);
}
both_backends!(approvals_button_runs_once, an_approved_call_runs_once_after_the_owners_button);

/// Twenty owners deciding at once give one decision and one run; the losers are told who won.
async fn twenty_concurrent_approvals_give_one_run(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let who = server::approvals::Requester {
        actor: server::domain::Role::Owner,
        channel: server::approvals::CONSOLE.into(),
        chat_kind: server::domain::ChatKind::Direct,
        chat_id: "console".into(),
        sender: "owner:1".into(),
        message_id: "console-1".into(),
        request: "refund".into(),
        correlation_id: "corr-20".into(),
    };
    let call = server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": "4821" }) };
    let approvals = r.app.gatehouse.approvals.clone();
    let requested = approvals.request(&call, &who, None, None).await.expect("request");
    assert!(approvals.request(&call, &who, None, None).await.expect("again").reused, "the same call while pending reuses the request");
    let mut tasks = Vec::new();
    for n in 0..20 {
        let approvals = approvals.clone();
        tasks.push(tokio::spawn(async move {
            let by = server::db::approvals::Decider { name: format!("owner-{n}"), owner_id: None, phone: None, via: "console" };
            approvals.decide(requested.id, server::approvals::Verdict::Approve, &by, None, None).await
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => won += 1,
            Err(e) => assert_eq!(e.code(), "APPROVAL_ALREADY_DECIDED", "{e}"),
        }
    }
    assert_eq!(won, 1, "one decision");
    r.exchange(&[], 0).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "one run");
    // A rejected call never reaches the tool; a tampered argument makes an approval stale.
    let other = server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": "9000" }) };
    let rejected = approvals.request(&other, &who, None, None).await.expect("request");
    let by = server::db::approvals::Decider { name: "o".into(), owner_id: None, phone: None, via: "cli" };
    approvals.decide(rejected.id, server::approvals::Verdict::Reject { reason: Some("no".into()) }, &by, None, None).await.expect("reject");
    let stale = approvals.request(&json_call("9001"), &who, None, None).await.expect("request");
    let decided = approvals.decide(stale.id, server::approvals::Verdict::Approve, &by, None, None).await.expect("approve");
    let job = decided.job_id.expect("job");
    sqlx::query("UPDATE jobs SET args = REPLACE(args, '9001', '9002') WHERE id = $1").bind(job).execute(&r.app.state.db.pool).await.expect("tamper");
    r.exchange(&[], 0).await;
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "neither the rejected nor the tampered call reached the shop");
    let outcome: Option<String> = sqlx::query_scalar("SELECT outcome_code FROM approvals WHERE id = $1").bind(stale.id).fetch_one(&r.app.state.db.pool).await.expect("outcome");
    assert_eq!(outcome.as_deref(), Some("APPROVAL_STALE"));
}
both_backends!(approvals_concurrent_once, twenty_concurrent_approvals_give_one_run);

fn json_call(order: &str) -> server::tools::ToolCall {
    server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": order }) }
}
