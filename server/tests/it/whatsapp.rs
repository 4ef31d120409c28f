//! The WhatsApp channel end to end: the webhook on the real router, the job worker, and a fake
//! Graph API on a local port that answers in Meta's wire format.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, State},
    http::{HeaderMap, Request, StatusCode, header},
    response::IntoResponse,
    routing::post,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use server::{
    channel::{
        Handled, HandlerError, Inbound, InboundHandler, MessageKind, Presence,
        whatsapp::{Recipient, SendOutcome, WhatsApp, WhatsAppSender, signature},
    },
    domain::Role,
    config::{Secrets, Settings},
    db::{
        self,
        whatsapp::{self as store, DeliveryState, NewOutbound},
    },
    jobs::{Registry, Worker, WorkerSettings},
};
use tokio::sync::watch;
use tower::ServiceExt;

use crate::{
    both_backends,
    support::{Captured, Resp, TestApp, TestDb},
};

pub(crate) const APP_SECRET: &str = "test-app-secret";
pub(crate) const VERIFY_TOKEN: &str = "test-verify-token";
pub(crate) const ACCESS_TOKEN: &str = "test-access-token";
pub(crate) const PHONE_NUMBER_ID: &str = "106540352242922";
pub(crate) const VERSION: &str = "v25.0";

pub(crate) fn secrets() -> Secrets {
    Secrets::from_lookup(|name| match name {
        "WHATSAPP_APP_SECRET" => Some(APP_SECRET.into()),
        "WHATSAPP_VERIFY_TOKEN" => Some(VERIFY_TOKEN.into()),
        "WHATSAPP_ACCESS_TOKEN" => Some(ACCESS_TOKEN.into()),
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// The fake Graph API.

/// Answers a request instead of the default success: (HTTP status, JSON body).
type Rule = Box<dyn Fn(&Value, usize) -> Option<(u16, Value)> + Send + Sync>;

#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    path: String,
    body: Value,
}

#[derive(Clone, Default)]
pub(crate) struct FakeGraph {
    seen: Arc<Mutex<Vec<Seen>>>,
    rule: Arc<Mutex<Option<Rule>>>,
    /// How long a message send waits (after it is recorded, so it was accepted) before it
    /// is answered.
    pub(crate) delay: Arc<Mutex<Duration>>,
    pub(crate) base_url: String,
}

impl FakeGraph {
    pub(crate) async fn start() -> Self {
        let mut graph = FakeGraph::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake graph");
        graph.base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = Router::new().route("/{version}/{phone}/messages", post(graph_messages)).with_state(graph.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        graph
    }

    pub(crate) fn set_rule(&self, rule: impl Fn(&Value, usize) -> Option<(u16, Value)> + Send + Sync + 'static) {
        *self.rule.lock().expect("rule") = Some(Box::new(rule));
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Message sends (text and template), not read receipts.
    pub(crate) fn sends(&self) -> Vec<Value> {
        self.all().into_iter().map(|s| s.body).filter(|b| b.get("type").is_some()).collect()
    }

    pub(crate) fn texts(&self) -> Vec<String> {
        self.sends().iter().filter_map(|b| b["text"]["body"].as_str().map(str::to_string)).collect()
    }
}

pub(crate) fn graph_error(status: u16, code: i64, message: &str) -> (u16, Value) {
    (status, json!({ "error": { "message": message, "type": "OAuthException", "code": code,
        "error_data": { "messaging_product": "whatsapp", "details": message }, "fbtrace_id": "AtestTrace" } }))
}

async fn graph_messages(State(graph): State<FakeGraph>, Path((version, phone)): Path<(String, String)>, headers: HeaderMap, Json(body): Json<Value>) -> impl IntoResponse {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    if auth != format!("Bearer {ACCESS_TOKEN}") {
        let (s, b) = graph_error(401, 190, "Invalid OAuth access token");
        return (StatusCode::from_u16(s).expect("status"), Json(b));
    }
    let index = {
        let mut seen = graph.seen.lock().expect("seen");
        seen.push(Seen { at: Instant::now(), path: format!("/{version}/{phone}/messages"), body: body.clone() });
        seen.len() - 1
    };
    if let Some((status, answer)) = graph.rule.lock().expect("rule").as_ref().and_then(|r| r(&body, index)) {
        return (StatusCode::from_u16(status).expect("status"), Json(answer));
    }
    if body["status"] == "read" {
        return (StatusCode::OK, Json(json!({ "success": true })));
    }
    let delay = *graph.delay.lock().expect("delay");
    tokio::time::sleep(delay).await;
    let to = body["to"].as_str().unwrap_or_default();
    (StatusCode::OK, Json(json!({ "messaging_product": "whatsapp", "contacts": [{ "input": to, "wa_id": to }],
        "messages": [{ "id": format!("wamid.out.{index}") }] })))
}

// ---------------------------------------------------------------------------------------------
// Payloads in Meta's format.

pub(crate) fn text_message(from: &str, wamid: &str, text: &str) -> Value {
    json!({ "from": from, "id": wamid, "timestamp": "1739321024", "type": "text", "text": { "body": text } })
}

fn image_message(from: &str, wamid: &str) -> Value {
    json!({ "from": from, "id": wamid, "timestamp": "1739321024", "type": "image",
        "image": { "id": "media-1", "mime_type": "image/jpeg", "sha256": "abc", "caption": "look" } })
}

fn change(messages: Vec<Value>) -> Value {
    json!({ "field": "messages", "value": {
        "messaging_product": "whatsapp",
        "metadata": { "display_phone_number": "15550783881", "phone_number_id": PHONE_NUMBER_ID },
        "contacts": [{ "profile": { "name": "Test Customer" }, "wa_id": "16505551234" }],
        "messages": messages } })
}

/// One entry per group of messages.
pub(crate) fn envelope(entries: Vec<Vec<Value>>) -> String {
    let entry: Vec<Value> = entries.into_iter().map(|m| json!({ "id": "102290129340398", "changes": [change(m)] })).collect();
    json!({ "object": "whatsapp_business_account", "entry": entry }).to_string()
}

pub(crate) fn status_envelope(statuses: Vec<Value>) -> String {
    json!({ "object": "whatsapp_business_account", "entry": [{ "id": "102290129340398", "changes": [{ "field": "messages", "value": {
        "messaging_product": "whatsapp",
        "metadata": { "display_phone_number": "15550783881", "phone_number_id": PHONE_NUMBER_ID },
        "statuses": statuses } }] }] })
    .to_string()
}

fn status(wamid: &str, state: &str, recipient: &str) -> Value {
    json!({ "id": wamid, "status": state, "timestamp": "1739321030", "recipient_id": recipient,
        "pricing": { "billable": true, "pricing_model": "PMP", "type": "regular", "category": "service" } })
}

// ---------------------------------------------------------------------------------------------
// The app, the worker and a conversation runtime stand-in.

pub(crate) async fn app(db: TestDb, graph: Option<&FakeGraph>, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let base = graph.map(|g| g.base_url.clone());
    TestApp::with_secrets(db, secrets(), move |s| {
        if let Some(base) = base {
            s.whatsapp.graph_base_url = base;
        }
        s.whatsapp.graph_version = VERSION.into();
        s.whatsapp.phone_number_id = PHONE_NUMBER_ID.into();
        s.whatsapp.send_retry_base = Duration::from_millis(10);
        s.whatsapp.pair_burst = 50;
        s.whatsapp.pair_interval = Duration::from_millis(10);
        s.whatsapp.global_rate_per_second = 1000;
        s.whatsapp.typing_indicator = false;
        s.whatsapp.mark_read = false;
        tweak(s);
    })
    .await
}

async fn post_webhook(app: &TestApp, body: &str, signature: Option<String>) -> Resp {
    let mut req = Request::builder().method("POST").uri("/webhooks/whatsapp").header(header::CONTENT_TYPE, "application/json");
    if let Some(sig) = signature {
        req = req.header("X-Hub-Signature-256", sig);
    }
    let req = req.body(Body::from(body.to_string())).expect("request");
    let res = app.router.clone().oneshot(req).await.expect("infallible");
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    Resp { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

pub(crate) async fn post_signed(app: &TestApp, body: &str) -> Resp {
    post_webhook(app, body, Some(signature::sign(APP_SECRET.as_bytes(), body.as_bytes()))).await
}

/// Replies "echo: <text>" (quoting), or `fixed` when set; counts its calls.
#[derive(Default)]
struct Echo {
    calls: AtomicUsize,
    fixed: Option<String>,
}

#[async_trait::async_trait]
impl InboundHandler for Echo {
    async fn handle(&self, message: &Inbound, presence: &dyn Presence) -> Result<Handled, HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        presence.typing().await;
        // Like the runtime, a type the bot cannot read gets a note instead.
        let text = match &message.kind {
            MessageKind::Unknown(kind) => format!("note: cannot read {kind}"),
            _ => self.fixed.clone().unwrap_or_else(|| format!("echo: {}", message.text)),
        };
        Ok(Handled { trace_id: None, role: Role::Customer, route: "echo".into(), reply: Some(text), quote: true, error_code: None, acknowledgement: None })
    }
}

pub(crate) async fn count(app: &TestApp, sql: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&app.state.db.pool).await.expect("count");
    n
}

async fn inbound_jobs(app: &TestApp) -> i64 {
    count(app, "SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound'").await
}

/// Runs the worker until every `whatsapp.inbound` job has finished.
async fn run_jobs(app: &TestApp, handler: Arc<dyn InboundHandler>) {
    // The owners' notices of undelivered and unhandled messages are not the channel's jobs:
    // this worker does not take them, and they stay queued.
    run_jobs_until(
        app,
        handler,
        "SELECT CAST(CASE WHEN COUNT(*) = 0 THEN 1 ELSE 0 END AS BIGINT) FROM jobs WHERE kind LIKE 'whatsapp.%' \
         AND kind NOT IN ('whatsapp.undelivered', 'whatsapp.unhandled') AND state NOT IN ('completed', 'discarded', 'cancelled')",
    )
    .await;
}

/// Runs the channel's jobs with `handler` until the count `done` selects is above 0.
async fn run_jobs_until(app: &TestApp, handler: Arc<dyn InboundHandler>, done: &str) {
    let mut registry = Registry::new();
    app.gatehouse.whatsapp.register(&mut registry, &app.state.db, handler, &Default::default());
    let settings = WorkerSettings {
        concurrency: 4,
        poll_interval: Duration::from_millis(20),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(100),
        ..Default::default()
    };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(app.state.db.clone(), registry, settings, app.state.jobs.waker()).run(stopped));
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(app, done).await == 0 {
        assert!(Instant::now() < deadline, "not done within 20 s: {done}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
}

// ---------------------------------------------------------------------------------------------
// Verification and signatures.

#[tokio::test]
async fn verification_handshake_accepts_only_our_token() {
    let app = app(TestDb::sqlite(), None, |_| {}).await;
    let mut client = app.client();
    let ok = client.get(&format!("/webhooks/whatsapp?hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=1158201444")).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.body, "1158201444");
    for query in [
        "hub.mode=subscribe&hub.verify_token=wrong-token&hub.challenge=1",
        &format!("hub.mode=unsubscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=1"),
        &format!("hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}"),
        "hub.mode=subscribe&hub.challenge=1",
        "",
    ] {
        let res = client.get(&format!("/webhooks/whatsapp?{query}")).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{query}");
        assert!(res.body.starts_with("WEBHOOK_VERIFY_REFUSED:"), "{}", res.body);
        assert!(!res.body.contains('1'), "no challenge echoed: {query}");
    }

    // Without a configured token nothing verifies, not even an empty one.
    let bare = TestApp::new(TestDb::sqlite()).await;
    let res = bare.client().get("/webhooks/whatsapp?hub.mode=subscribe&hub.verify_token=&hub.challenge=5").await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
}

async fn signatures_are_required(db: TestDb) {
    let app = app(db, None, |_| {}).await;
    let body = envelope(vec![vec![text_message("16505551234", "wamid.SIG1", "hello")]]);

    let missing = post_webhook(&app, &body, None).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert!(missing.body.starts_with("SIGNATURE_MISSING:"), "{}", missing.body);
    let wrong = post_webhook(&app, &body, Some(signature::sign(b"not-the-secret", body.as_bytes()))).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert!(wrong.body.starts_with("SIGNATURE_INVALID:"), "{}", wrong.body);
    let garbage = post_webhook(&app, &body, Some("sha256=nothex".into())).await;
    assert_eq!(garbage.status, StatusCode::FORBIDDEN);
    let modified = body.replace("hello", "HELLO");
    let tampered = post_webhook(&app, &modified, Some(signature::sign(APP_SECRET.as_bytes(), body.as_bytes()))).await;
    assert_eq!(tampered.status, StatusCode::FORBIDDEN, "signature over the original, body modified");
    for malformed in ["not json", "[1,2]"] {
        let refused = post_webhook(&app, malformed, Some(signature::sign(APP_SECRET.as_bytes(), malformed.as_bytes()))).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{malformed}");
        assert!(refused.body.starts_with("WEBHOOK_NOT_A_NOTIFICATION:"), "{}", refused.body);
    }
    // Signed for another product of the app (a Page): accepted, so Meta does not send it again
    // for days, and nothing is stored.
    let page = "{\"object\":\"page\",\"entry\":[{\"changes\":[{\"field\":\"messages\",\"value\":{\"messages\":[{\"from\":\"1\",\"id\":\"m.PAGE\",\"type\":\"text\",\"text\":{\"body\":\"hi\"}}]}}]}]}";
    assert_eq!(post_webhook(&app, page, Some(signature::sign(APP_SECRET.as_bytes(), page.as_bytes()))).await.status, StatusCode::OK);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 0, "nothing stored from unsigned posts");
    assert_eq!(inbound_jobs(&app).await, 0);

    let ok = post_signed(&app, &body).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 1);
    assert_eq!(inbound_jobs(&app).await, 1);

    // No CSRF origin or session is needed, but the app secret is.
    let bare = TestApp::new(TestDb::sqlite()).await;
    let res = post_webhook(&bare, &body, Some(signature::sign(APP_SECRET.as_bytes(), body.as_bytes()))).await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE, "without WHATSAPP_APP_SECRET nothing is accepted");
    assert!(res.body.starts_with("WHATSAPP_NOT_CONFIGURED:"), "{}", res.body);
}
both_backends!(whatsapp_signatures, signatures_are_required);

/// A refused post is logged with its reason and size, never its body: the body is
/// unauthenticated and may be anyone's text.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_post_is_logged_without_its_body() {
    let (captured, _guard) = Captured::start();
    let app = app(TestDb::sqlite(), None, |_| {}).await;
    let body = envelope(vec![vec![text_message("16505551234", "wamid.LOGGED", "my card is 4111 1111 1111 1111")]]);
    let forged = signature::sign(b"not-the-app-secret", body.as_bytes());
    assert_eq!(post_webhook(&app, &body, Some(forged)).await.status, StatusCode::FORBIDDEN);
    assert_eq!(post_webhook(&app, &body, None).await.status, StatusCode::UNAUTHORIZED);
    let logs = captured.text();
    assert!(logs.contains("bad signature refused") && logs.contains(&format!("bytes={}", body.len())), "{logs}");
    assert!(!logs.contains("4111") && !logs.contains("wamid.LOGGED"), "the body never reaches the log: {logs}");
}

#[tokio::test]
async fn bodies_over_four_mebibytes_are_refused() {
    let app = app(TestDb::sqlite(), None, |_| {}).await;
    let big = format!("{{\"object\":\"whatsapp_business_account\",\"pad\":\"{}\",\"entry\":[]}}", "x".repeat(4 << 20));
    let res = post_signed(&app, &big).await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(res.body.starts_with("WEBHOOK_TOO_LARGE: "), "a stable code, as every refusal has: {}", res.body);
    let near = format!("{{\"object\":\"whatsapp_business_account\",\"pad\":\"{}\",\"entry\":[]}}", "x".repeat(3 << 20));
    assert_eq!(post_signed(&app, &near).await.status, StatusCode::OK, "Meta's 3 MB payloads fit");
}

// ---------------------------------------------------------------------------------------------
// Intake: batches, duplicates, statuses, storage failure.

async fn a_batch_is_stored_and_answered_message_by_message(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.mark_read = true).await;
    let button = json!({ "context": { "from": "15550783881", "id": "wamid.BUTTONS" }, "from": "16505551234", "id": "wamid.B2",
        "timestamp": "1739321025", "type": "interactive",
        "interactive": { "type": "button_reply", "button_reply": { "id": "confirm-yes", "title": "Yes, book it" } } });
    let template_button = json!({ "from": "16505550000", "id": "wamid.B4", "timestamp": "1739321027", "type": "button",
        "button": { "text": "Stop promotions", "payload": "STOP" } });
    let body = envelope(vec![
        vec![text_message("16505551234", "wamid.B1", "Do you open on Sunday?"), button],
        vec![image_message("16505559999", "wamid.B3"), template_button],
    ]);
    let res = post_signed(&app, &body).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(inbound_jobs(&app).await, 4);

    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let b2 = store::inbound_by_wamid(&mut conn, "wamid.B2").await.expect("get").expect("stored");
    assert_eq!(b2.msg_type, "interactive.button_reply");
    assert_eq!(b2.text.as_deref(), Some("Yes, book it"));
    assert_eq!(b2.reply_id.as_deref(), Some("confirm-yes"));
    assert_eq!(b2.context_id.as_deref(), Some("wamid.BUTTONS"));
    assert_eq!(b2.sent_at, 1_739_321_025_000);
    assert!(b2.raw.as_deref().is_some_and(|r| r.contains("button_reply")));
    let b4 = store::inbound_by_wamid(&mut conn, "wamid.B4").await.expect("get").expect("stored");
    assert_eq!((b4.msg_type.as_str(), b4.text.as_deref(), b4.reply_id.as_deref()), ("button", Some("Stop promotions"), Some("STOP")));
    let b3 = store::inbound_by_wamid(&mut conn, "wamid.B3").await.expect("get").expect("stored");
    assert_eq!((b3.msg_type.as_str(), b3.text.as_deref()), ("image", None), "unknown types are stored as such");
    drop(conn);

    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;
    assert_eq!(echo.calls.load(Ordering::SeqCst), 4, "text, both buttons and the image reach the runtime, which decides what each gets");
    let mut texts = graph.texts();
    texts.sort();
    assert_eq!(texts, {
        let mut want = vec!["echo: Do you open on Sunday?".to_string(), "echo: Yes, book it".into(), "echo: Stop promotions".into(), "note: cannot read image".into()];
        want.sort();
        want
    });
    let sends = graph.sends();
    let to_b1 = sends.iter().find(|b| b["text"]["body"] == "echo: Do you open on Sunday?").expect("reply");
    assert_eq!(to_b1["context"]["message_id"], "wamid.B1", "the reply quotes the message");
    assert_eq!(to_b1["to"], "16505551234");
    assert_eq!(to_b1["recipient_type"], "individual");
    assert!(graph.all().iter().all(|s| s.path == format!("/{VERSION}/{PHONE_NUMBER_ID}/messages")));
    let reads: Vec<Value> = graph.all().into_iter().map(|s| s.body).filter(|b| b["status"] == "read").collect();
    assert_eq!(reads.len(), 4, "each handled message is marked read: {reads:?}");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_outbound WHERE state = 'sent' AND wamid IS NOT NULL").await, 4);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound WHERE processed_at IS NOT NULL").await, 4);
}
both_backends!(whatsapp_batch, a_batch_is_stored_and_answered_message_by_message);

/// The Conversations page names a customer by the WhatsApp profile name the webhook sent with
/// their message (their latest), beside the number; a chat the webhook named nobody for keeps
/// its number alone.
async fn chats_show_the_customers_profile_name(db: TestDb) {
    let app = app(db, None, |_| {}).await;
    // `envelope` names 16505551234 "Test Customer" and nobody else.
    let body = envelope(vec![vec![text_message("16505551234", "wamid.N1", "Hello"), text_message("16505550000", "wamid.N2", "Hi")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let chats = owner.post_form("/api/list_chats", &[]).await.json();
    let name_of = |chat: &str| chats["chats"].as_array().and_then(|c| c.iter().find(|c| c["chat_id"] == chat)).map(|c| c["name"].clone());
    assert_eq!(name_of("16505551234"), Some(json!("Test Customer")), "{chats}");
    assert_eq!(name_of("16505550000"), Some(Value::Null), "{chats}");
    let chat = owner.post_form("/api/get_chat", &[("channel", "whatsapp"), ("chat_id", "16505551234")]).await.json();
    assert_eq!(chat["name"], "Test Customer");
    let page = owner.get("/conversations").await;
    assert!(page.body.contains("Test Customer") && page.body.contains("16505551234"), "the list shows the name and the number");
}
both_backends!(whatsapp_chat_names, chats_show_the_customers_profile_name);

/// The Conversations page counts each chat's messages both ways and lists the chat with the
/// latest first, from what the triggers of migration 0052 keep as messages are stored: a
/// redelivered message is not counted twice. The migration counts what an older database
/// already holds, and finds its customers' names.
async fn chats_count_their_messages_as_they_are_stored(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let (ada, bob) = ("16505551234", "16505550000");
    let first = envelope(vec![vec![text_message(ada, "wamid.C1", "Hello"), text_message(bob, "wamid.C2", "Hi")]]);
    assert_eq!(post_signed(&app, &first).await.status, StatusCode::OK);
    assert_eq!(post_signed(&app, &first).await.status, StatusCode::OK, "redelivered");
    run_jobs(&app, Arc::new(Echo::default())).await;
    let later = envelope(vec![vec![text_message(ada, "wamid.C3", "Still there?")]]);
    assert_eq!(post_signed(&app, &later).await.status, StatusCode::OK);
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let listed = |chats: &Value| -> Vec<(String, i64)> {
        chats["chats"].as_array().expect("chats").iter().map(|c| (c["chat_id"].as_str().unwrap_or_default().to_string(), c["messages"].as_i64().unwrap_or(-1))).collect()
    };
    let chats = owner.post_form("/api/list_chats", &[]).await.json();
    // Ada: two messages and one reply (the second waits for the worker); Bob: one and its reply.
    assert_eq!(listed(&chats), vec![(ada.to_string(), 3), (bob.to_string(), 2)], "{chats}");

    // An older database: its messages were stored before the counts were kept.
    let pool = &app.state.db.pool;
    let undo = if app.state.db.backend == db::Backend::Sqlite {
        "DROP TRIGGER chats_whatsapp_inbound; DROP TRIGGER chats_whatsapp_outbound; DROP TRIGGER chats_simulator; DROP TABLE chats"
    } else {
        "DROP FUNCTION chats_whatsapp_inbound CASCADE; DROP FUNCTION chats_whatsapp_outbound CASCADE; DROP FUNCTION chats_simulator CASCADE; DROP TABLE chats"
    };
    sqlx::raw_sql(undo).execute(pool).await.expect("undo migration 0052");
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 52").execute(pool).await.expect("forget migration 0052");
    let newest = envelope(vec![vec![text_message(bob, "wamid.C4", "Me again")]]);
    assert_eq!(post_signed(&app, &newest).await.status, StatusCode::OK);
    let applied = app.state.db.migrate().await.expect("migrate again");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), vec![52]);
    let chats = owner.post_form("/api/list_chats", &[]).await.json();
    assert_eq!(listed(&chats), vec![(bob.to_string(), 3), (ada.to_string(), 3)], "{chats}");
    assert_eq!(chats["chats"][1]["name"], "Test Customer", "the name is found again: {chats}");
    assert_eq!(chats["chats"][0]["name"], Value::Null, "{chats}");
}
both_backends!(whatsapp_chat_counts, chats_count_their_messages_as_they_are_stored);

async fn twenty_concurrent_deliveries_give_one_reply(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = Arc::new(app(db, Some(&graph), |_| {}).await);
    let body = Arc::new(envelope(vec![vec![text_message("16505551234", "wamid.DUP", "Are you there?")]]));
    let posts: Vec<_> = (0..20)
        .map(|_| {
            let (app, body) = (app.clone(), body.clone());
            tokio::spawn(async move { post_signed(&app, &body).await.status })
        })
        .collect();
    for p in posts {
        assert_eq!(p.await.expect("join"), StatusCode::OK, "every delivery is acknowledged");
    }
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 1);
    assert_eq!(inbound_jobs(&app).await, 1);
    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;
    // A redelivery after processing is still recognised.
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    assert_eq!(inbound_jobs(&app).await, 1);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
    assert_eq!(graph.texts(), vec!["echo: Are you there?".to_string()]);
}
both_backends!(whatsapp_concurrent_duplicates, twenty_concurrent_deliveries_give_one_reply);

/// A job names its message by wamid (on PostgreSQL it is written by the statement that stores
/// the message); a message repeated within one post is stored and queued once, and a job queued
/// by an earlier build, naming the message's row id instead, still answers it.
async fn a_message_is_queued_once_and_older_jobs_still_run(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let twice = envelope(vec![vec![text_message("16505551234", "wamid.Q1", "Open today?"), text_message("16505551234", "wamid.Q1", "Open today?")]]);
    assert_eq!(post_signed(&app, &twice).await.status, StatusCode::OK);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 1);
    assert_eq!(inbound_jobs(&app).await, 1);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE message_id = 'wamid.Q1' AND args = '{}'").await, 1, "the job names its message by wamid");
    // A NUL is dropped from what is stored (PostgreSQL text cannot hold it), the job's wamid too.
    let nul = envelope(vec![vec![text_message("16505551234", "wamid.Q\u{0}3", "Still open?")]]);
    assert_eq!(post_signed(&app, &nul).await.status, StatusCode::OK);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE message_id = 'wamid.Q3'").await, 1);

    let body = envelope(vec![vec![text_message("16505551234", "wamid.Q2", "And tomorrow?")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    // As an earlier build queued it: the row id in its args. Without a wamid on the job, only
    // the id can find the message.
    let (id,): (i64,) = sqlx::query_as("SELECT id FROM whatsapp_inbound WHERE wamid = 'wamid.Q2'").fetch_one(&app.state.db.pool).await.expect("stored");
    let sql = format!("UPDATE jobs SET args = '{{\"inbound_id\":{id}}}', message_id = NULL WHERE dedupe_key = 'whatsapp.inbound:wamid.Q2'");
    assert_eq!(sqlx::query(&sql).execute(&app.state.db.pool).await.expect("update").rows_affected(), 1);

    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;
    let mut texts = graph.texts();
    texts.sort();
    assert_eq!(texts, vec!["echo: And tomorrow?".to_string(), "echo: Open today?".into(), "echo: Still open?".into()]);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'completed'").await, 3);
}
both_backends!(whatsapp_queued_once, a_message_is_queued_once_and_older_jobs_still_run);

/// Posts that arrive while the writer is busy are stored together in one transaction, and
/// each is still answered only after it committed.
async fn posts_arriving_during_a_commit_share_the_next_one(db: TestDb) {
    let app = Arc::new(app(db, None, |_| {}).await);
    // Another connection holds the write lock (SQLite) or a lock on the table (PostgreSQL), so
    // the writer blocks on its first group.
    let mut blocker = app.state.db.pool.acquire().await.expect("conn");
    let lock = match app.state.db.backend {
        db::Backend::Sqlite => "BEGIN IMMEDIATE",
        db::Backend::Postgres => "BEGIN; LOCK TABLE whatsapp_inbound IN EXCLUSIVE MODE",
    };
    sqlx::raw_sql(lock).execute(&mut *blocker).await.expect("lock");
    let posts: Vec<_> = (0..10)
        .map(|i| {
            let app = app.clone();
            let body = envelope(vec![vec![text_message("16505551234", &format!("wamid.G{i}"), "hello")]]);
            tokio::spawn(async move { post_signed(&app, &body).await.status })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.webhook.intake.counts().queued < 10 {
        assert!(Instant::now() < deadline, "posts never reached the writer");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 0, "nothing is stored while the lock is held");
    assert!(posts.iter().all(|p| !p.is_finished()), "no post is answered before its batch commits");
    sqlx::query("ROLLBACK").execute(&mut *blocker).await.expect("unlock");
    drop(blocker);
    for p in posts {
        assert_eq!(p.await.expect("join"), StatusCode::OK);
    }
    let counts = app.state.webhook.intake.counts();
    assert_eq!(counts.batches, 10);
    assert!(counts.groups <= 2, "the first group may hold one batch, the rest share one: {counts:?}");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 10);
    assert_eq!(inbound_jobs(&app).await, 10);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM job_events e JOIN jobs j ON j.id = e.job_id WHERE j.kind = 'whatsapp.inbound'").await, 10);
}
both_backends!(whatsapp_group_commit, posts_arriving_during_a_commit_share_the_next_one);

async fn statuses_update_the_ledger_and_never_wake_the_bot(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.ST1", "hi")]])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger").pop().expect("one row");
    let wamid = row.wamid.clone().expect("wamid recorded");
    assert_eq!(row.state, DeliveryState::Sent);
    drop(conn);

    let jobs_before = inbound_jobs(&app).await;
    let sends_before = graph.all().len();
    // One post with this message delivered and another's read: only the receipt that moved
    // the ledger reaches the live pages.
    let mut sub = app.state.events.subscribe().await;
    let mixed = status_envelope(vec![status(&wamid, "delivered", "16505551234"), status("wamid.SOMEONE-ELSE", "read", "1")]);
    assert_eq!(post_signed(&app, &mixed).await.status, StatusCode::OK);
    let mut receipts = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), sub.recv()).await {
        if let server::events::Event::ReplySent(d) | server::events::Event::ReplyDelivered(d) | server::events::Event::ReplyRead(d) = &e.event
            && d.trace_id.is_none()
        {
            receipts.push((d.wamid.clone(), d.reason_code.clone()));
        }
    }
    assert_eq!(receipts, vec![(Some(wamid.clone()), "DELIVERED".to_string())], "the ignored one is not published");
    for state in ["delivered", "read", "delivered", "sent"] {
        let res = post_signed(&app, &status_envelope(vec![status(&wamid, state, "16505551234")])).await;
        assert_eq!(res.status, StatusCode::OK);
    }
    // A status for a message we never sent is acknowledged and ignored.
    assert_eq!(post_signed(&app, &status_envelope(vec![status("wamid.SOMEONE-ELSE", "read", "1")])).await.status, StatusCode::OK);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_wamid(&mut conn, &wamid).await.expect("get").expect("row");
    assert_eq!(row.state, DeliveryState::Read, "late 'delivered' and 'sent' never move it back");
    assert!(row.delivered_at.is_some() && row.read_at.is_some());

    let failed = json!({ "id": wamid, "status": "failed", "timestamp": "1739321040", "recipient_id": "16505551234",
        "errors": [{ "code": 131026, "title": "Message undeliverable", "message": "Message undeliverable",
                     "error_data": { "details": "Message Undeliverable." } }] });
    assert_eq!(post_signed(&app, &status_envelope(vec![failed])).await.status, StatusCode::OK);
    let row = store::outbound_by_wamid(&mut conn, &wamid).await.expect("get").expect("row");
    assert_eq!((row.state, row.error_code.as_deref()), (DeliveryState::Failed, Some("131026")));
    drop(conn);

    assert_eq!(inbound_jobs(&app).await, jobs_before, "statuses enqueue nothing");
    assert_eq!(graph.all().len(), sends_before, "statuses send nothing");
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
}
both_backends!(whatsapp_statuses, statuses_update_the_ledger_and_never_wake_the_bot);

async fn storage_failure_answers_500(db: TestDb) {
    let app = app(db, None, |_| {}).await;
    sqlx::query("DROP TABLE whatsapp_inbound").execute(&app.state.db.pool).await.expect("drop table");
    let res = post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.LOST", "hello?")]])).await;
    assert_eq!(res.status, StatusCode::INTERNAL_SERVER_ERROR, "never 200 for what was not stored");
    assert_eq!(inbound_jobs(&app).await, 0, "no job without its message");

    // A closed pool too.
    app.state.db.close().await;
    let res = post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.LOST2", "hello?")]])).await;
    assert_eq!(res.status, StatusCode::INTERNAL_SERVER_ERROR);
}
both_backends!(whatsapp_storage_failure, storage_failure_answers_500);

/// A group whose messages cannot be stored after its jobs were written leaves neither behind,
/// and the writer connection is left outside any transaction: the next post is stored.
async fn a_group_that_fails_midway_leaves_nothing_and_the_next_is_stored(db: TestDb) {
    let app = app(db, None, |_| {}).await;
    let refuse = match app.state.db.backend {
        db::Backend::Sqlite => "CREATE TRIGGER refuse BEFORE INSERT ON whatsapp_inbound BEGIN SELECT RAISE(ABORT, 'refused'); END",
        db::Backend::Postgres => {
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER refuse BEFORE INSERT ON whatsapp_inbound FOR EACH ROW EXECUTE FUNCTION refuse()"
        }
    };
    sqlx::raw_sql(refuse).execute(&app.state.db.pool).await.expect("trigger");
    let res = post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.M1", "hello?")]])).await;
    assert_eq!(res.status, StatusCode::INTERNAL_SERVER_ERROR, "never 200 for what was not stored");
    assert_eq!(inbound_jobs(&app).await, 0, "no job without its message");

    let allow = match app.state.db.backend {
        db::Backend::Sqlite => "DROP TRIGGER refuse",
        db::Backend::Postgres => "DROP TRIGGER refuse ON whatsapp_inbound",
    };
    sqlx::query(allow).execute(&app.state.db.pool).await.expect("drop trigger");
    let res = post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.M1", "hello?")]])).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, 1);
    assert_eq!(inbound_jobs(&app).await, 1);
}
both_backends!(whatsapp_group_fails_midway, a_group_that_fails_midway_leaves_nothing_and_the_next_is_stored);

/// A group whose store is abandoned while it waits for the write lock (its future dropped, as
/// at shutdown) leaves the writer usable: on SQLite the query has begun a transaction that sqlx
/// does not know of, so the connection is closed rather than pooled inside it.
async fn an_abandoned_group_leaves_the_writer_usable(db: TestDb) {
    let app = app(db, None, |_| {}).await;
    let database = app.state.db.clone();
    let mut blocker = database.pool.acquire().await.expect("conn");
    let lock = match database.backend {
        db::Backend::Sqlite => "BEGIN IMMEDIATE",
        db::Backend::Postgres => "BEGIN; LOCK TABLE whatsapp_inbound IN EXCLUSIVE MODE",
    };
    sqlx::raw_sql(lock).execute(&mut *blocker).await.expect("lock");
    let message = store::NewInbound {
        wamid: "wamid.A1".into(),
        phone_number_id: PHONE_NUMBER_ID.into(),
        chat_id: "16505551234".into(),
        sender: "16505551234".into(),
        sender_name: None,
        is_group: false,
        msg_type: "text".into(),
        text: Some("hello?".into()),
        reply_id: None,
        context_id: None,
        raw: None,
        raw_truncated: false,
        sent_at: 0,
    };
    let job = db::jobs::NewJob {
        kind: "whatsapp.inbound".into(),
        dedupe_key: Some("whatsapp.inbound:wamid.A1".into()),
        message_id: Some("wamid.A1".into()),
        args: json!({}),
        max_attempts: 3,
        correlation_id: "abandoned".into(),
        ..Default::default()
    };
    let mut conn = database.acquire_write().await.expect("writer");
    let messages = [&message];
    let store = store::insert_inbound_and_enqueue(&mut conn, &messages, std::slice::from_ref(&job), db::now_ms());
    assert!(tokio::time::timeout(Duration::from_millis(200), store).await.is_err(), "the store waits for the lock");
    drop(conn);
    sqlx::query("ROLLBACK").execute(&mut *blocker).await.expect("unlock");
    drop(blocker);

    let res = post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.A2", "still there?")]])).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let mut tx = database.begin_write().await.expect("a write transaction begins");
    sqlx::query("DELETE FROM whatsapp_outbound").execute(&mut *tx).await.expect("write");
    tx.commit().await.expect("commit");
    // On PostgreSQL the abandoned statement still ran to its end; either way a message and its
    // job are stored together or not at all.
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound").await, inbound_jobs(&app).await);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_inbound WHERE wamid = 'wamid.A2'").await, 1);
}
both_backends!(whatsapp_group_abandoned, an_abandoned_group_leaves_the_writer_usable);

async fn unknown_types_get_the_note_once_per_period(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    // The runtime itself: the type is its first step, before any model.
    let runtime: Arc<dyn InboundHandler> = app.gatehouse.runtime.clone();
    let first = envelope(vec![vec![image_message("16505551234", "wamid.U1"), json!({ "from": "16505551234", "id": "wamid.U2",
        "timestamp": "1739321024", "type": "audio", "audio": { "id": "a1", "mime_type": "audio/ogg" } })]]);
    assert_eq!(post_signed(&app, &first).await.status, StatusCode::OK);
    run_jobs(&app, runtime.clone()).await;
    // Later, another unknown type in the same chat, and one from another chat.
    let second = envelope(vec![vec![
        json!({ "from": "16505551234", "id": "wamid.U3", "timestamp": "1739321099", "type": "sticker", "sticker": { "id": "s" } }),
        image_message("16505550000", "wamid.U4"),
    ]]);
    assert_eq!(post_signed(&app, &second).await.status, StatusCode::OK);
    run_jobs(&app, runtime).await;

    let note = app.state.config.settings.whatsapp.unknown_type_reply.clone();
    let to: Vec<String> = graph.sends().iter().map(|b| b["to"].as_str().unwrap_or_default().to_string()).collect();
    let mut to_sorted = to.clone();
    to_sorted.sort();
    assert_eq!(to_sorted, vec!["16505550000".to_string(), "16505551234".into()], "one note per chat: {to:?}");
    assert!(graph.texts().iter().all(|t| *t == note));
    assert_eq!(count(&app, "SELECT COUNT(*) FROM llm_calls").await, 0, "unknown types never reach a model");
    let already = count(&app, "SELECT COUNT(*) FROM trace_steps WHERE reason_code = 'NOTE_ALREADY_SENT'").await;
    assert_eq!(already, 2, "of three unknown messages in one chat, one got the note");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let audio = store::inbound_by_wamid(&mut conn, "wamid.U2").await.expect("get").expect("stored");
    assert_eq!(audio.msg_type, "audio");
    drop(conn);

    // Each one is traced: the type, and whether the note went out and was delivered.
    let traces: Vec<(String, String, String)> = sqlx::query_as("SELECT message_id, route, outcome FROM traces ORDER BY message_id")
        .fetch_all(&app.state.db.pool)
        .await
        .expect("traces");
    assert_eq!(traces.len(), 4, "{traces:?}");
    assert!(traces.iter().all(|(_, route, _)| route == "unknown_type"), "{traces:?}");
    assert_eq!(traces.iter().filter(|(_, _, outcome)| outcome == "replied").count(), 2, "{traces:?}");
    let (noted,): (i64,) = sqlx::query_as("SELECT id FROM traces WHERE message_id = 'wamid.U4'").fetch_one(&app.state.db.pool).await.expect("trace");
    let steps: Vec<(String, String, String)> = sqlx::query_as("SELECT step, decision, reason_code FROM trace_steps WHERE trace_id = $1 ORDER BY seq")
        .bind(noted)
        .fetch_all(&app.state.db.pool)
        .await
        .expect("steps");
    assert_eq!(
        steps,
        vec![
            ("message_type".into(), "not_read".into(), "UNSUPPORTED_TYPE".into()),
            ("reply".into(), "send".into(), "UNKNOWN_TYPE_NOTE".into()),
            ("delivery".into(), "sent".into(), "WHATSAPP_SENT".into()),
        ]
    );
}
both_backends!(whatsapp_unknown_types, unknown_types_get_the_note_once_per_period);

/// A reaction is not a message to answer, and in a group the note follows the group rules: a
/// sticker nobody addressed to the bot gets nothing, where a direct chat's image gets the note.
async fn reactions_and_unaddressed_group_stickers_get_no_note(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let runtime: Arc<dyn InboundHandler> = app.gatehouse.runtime.clone();
    let items = vec![
        json!({ "from": "16505551234", "id": "wamid.R1", "timestamp": "1739321030", "type": "reaction", "reaction": { "message_id": "wamid.out.0", "emoji": "\u{1F44D}" } }),
        json!({ "from": "16505551234", "id": "wamid.G1", "timestamp": "1739321031", "type": "sticker", "sticker": { "id": "s" }, "group_id": "g-1" }),
        image_message("16505550000", "wamid.I1"),
    ];
    assert_eq!(post_signed(&app, &envelope(vec![items])).await.status, StatusCode::OK);
    run_jobs(&app, runtime).await;
    let to: Vec<String> = graph.sends().iter().map(|b| b["to"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(to, vec!["16505550000".to_string()], "only the direct chat's image got the note");
    let routes: Vec<(String, String)> = sqlx::query_as("SELECT message_id, route FROM traces ORDER BY message_id").fetch_all(&app.state.db.pool).await.expect("traces");
    assert_eq!(routes, vec![("wamid.G1".to_string(), "ignored".to_string()), ("wamid.I1".into(), "unknown_type".into()), ("wamid.R1".into(), "unknown_type".into())]);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM trace_steps WHERE reason_code = 'SILENT_TYPE'").await, 1);
}
both_backends!(whatsapp_silent_types, reactions_and_unaddressed_group_stickers_get_no_note);

/// A message for another number on the same business account is stored and not answered from
/// ours; ours gets the read receipt with the typing indicator while the handler works.
async fn only_our_number_is_answered_and_typing_is_shown(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.typing_indicator = true;
        s.whatsapp.mark_read = true;
    })
    .await;
    let mut other = change(vec![text_message("16505551234", "wamid.OTHER", "hello other number")]);
    other["value"]["metadata"]["phone_number_id"] = json!("999999999999999");
    let body = json!({ "object": "whatsapp_business_account", "entry": [{ "id": "WABA", "changes": [other] }] }).to_string();
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.OURS", "hello")]])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1, "only our number's message reached the handler");
    assert_eq!(graph.texts(), vec!["echo: hello".to_string()]);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let other = store::inbound_by_wamid(&mut conn, "wamid.OTHER").await.expect("get").expect("stored");
    assert!(other.outcome.as_deref().is_some_and(|o| o.contains("not ours")), "{other:?}");
    let receipts: Vec<Value> = graph.all().into_iter().map(|s| s.body).filter(|b| b["status"] == "read").collect();
    assert!(receipts.iter().all(|b| b["message_id"] == "wamid.OURS"), "no receipt for another number's message: {receipts:?}");
    assert!(receipts.iter().any(|b| b["typing_indicator"]["type"] == "text"), "the typing indicator was shown: {receipts:?}");
}
both_backends!(whatsapp_our_number_only, only_our_number_is_answered_and_typing_is_shown);

/// Without whatsapp.phone_number_id nothing can be sent: the model is not asked, and the
/// message waits for the setting instead of being lost.
async fn without_a_phone_number_id_the_message_waits(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.phone_number_id = String::new()).await;
    messages_wait_until_they_can_be_answered(app, &graph, "whatsapp.phone_number_id").await;
}

/// Posts two messages of one chat and a day-old one of another to `app`, which cannot send
/// for want of `setting`: no model is asked, nothing is sent, and the two messages are not
/// settled; their jobs wait, using no attempt, the second due after the first, saying why. The
/// day-old one is settled unanswered (WhatsApp's window closed). The console says what is
/// missing. Restarted with the phone number id and the token on the same database, Gatehouse
/// makes them due at once (not at the end of their wait) and answers the two, once each and in
/// order.
async fn messages_wait_until_they_can_be_answered(app: TestApp, graph: &FakeGraph, setting: &str) {
    let sent = |from: &str, wamid: &str, text: &str, ago_secs: i64| {
        let mut message = text_message(from, wamid, text);
        message["timestamp"] = (server::db::now_ms() / 1000 - ago_secs).to_string().into();
        message
    };
    let messages = vec![sent("16505551234", "wamid.ONE", "one", 60), sent("16505551234", "wamid.TWO", "two", 30), sent("16505550000", "wamid.OLD", "yesterday", 25 * 3600)];
    assert_eq!(post_signed(&app, &envelope(vec![messages])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo::default());
    let waiting = "SELECT CAST(CASE WHEN COUNT(*) = 2 THEN 1 ELSE 0 END AS BIGINT) FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'scheduled' AND attempt = 0 AND result_preview LIKE 'waiting: %'";
    run_jobs_until(&app, echo.clone(), waiting).await;
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0, "no model is asked for a reply that cannot go out");
    assert!(graph.all().is_empty());
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    for wamid in ["wamid.ONE", "wamid.TWO"] {
        let row = store::inbound_by_wamid(&mut conn, wamid).await.expect("get").expect("stored");
        assert_eq!(row.outcome, None, "{wamid} is not settled");
    }
    let old = store::inbound_by_wamid(&mut conn, "wamid.OLD").await.expect("get").expect("stored");
    assert_eq!(old.outcome, Some(format!("not answered: {setting} was not set within WhatsApp's 24-hour window")));
    let jobs: Vec<(i64, String)> = sqlx::query_as("SELECT scheduled_at, result_preview FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'scheduled' ORDER BY id").fetch_all(&mut *conn).await.expect("jobs");
    assert_eq!(jobs.len(), 2);
    assert!(jobs[1].0 - jobs[0].0 >= 900, "the second comes due after the first, so they are answered in order: {jobs:?}");
    assert!(jobs[0].1.contains(setting), "the Jobs page says what is missing: {}", jobs[0].1);
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let page = owner.get("/jobs").await.body;
    assert!(page.contains("data-testid=\"sending-banner\"") && page.contains(setting), "{page}");
    // They wait for the next whole minute; made an hour, so that only the restart's release
    // (before, nothing) runs them within this test.
    sqlx::query("UPDATE jobs SET scheduled_at = scheduled_at + 3600000 WHERE kind = 'whatsapp.inbound' AND state = 'scheduled'").execute(&mut *conn).await.expect("wait");
    drop(conn);
    assert_eq!(app.gatehouse.release_waiting().await.expect("release"), 0, "still without {setting}");

    let TestApp { db, .. } = app;
    let restarted = self::app(db, Some(graph), |_| {}).await;
    assert_eq!(restarted.gatehouse.release_waiting().await.expect("release"), 2, "due at the start that has {setting}");
    run_jobs(&restarted, echo.clone()).await;
    assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
    assert_eq!(graph.texts(), vec!["echo: one".to_string(), "echo: two".to_string()], "answered once each, in order");
}
both_backends!(whatsapp_no_phone_number_id, without_a_phone_number_id_the_message_waits);

/// Without WHATSAPP_ACCESS_TOKEN nothing can be sent either: the message waits for it, as it
/// waits out a refused token, and no model is asked meanwhile.
async fn without_an_access_token_the_message_waits(db: TestDb) {
    let graph = FakeGraph::start().await;
    let base = graph.base_url.clone();
    let no_token = Secrets::from_lookup(|name| match name {
        "WHATSAPP_APP_SECRET" => Some(APP_SECRET.into()),
        "WHATSAPP_VERIFY_TOKEN" => Some(VERIFY_TOKEN.into()),
        _ => None,
    });
    let app = TestApp::with_secrets(db, no_token, move |s| {
        s.whatsapp.graph_base_url = base;
        s.whatsapp.graph_version = VERSION.into();
        s.whatsapp.phone_number_id = PHONE_NUMBER_ID.into();
    })
    .await;
    messages_wait_until_they_can_be_answered(app, &graph, "WHATSAPP_ACCESS_TOKEN").await;
}
both_backends!(whatsapp_no_access_token, without_an_access_token_the_message_waits);

/// Decides every message needs no answer.
struct Silent;

#[async_trait::async_trait]
impl InboundHandler for Silent {
    async fn handle(&self, _message: &Inbound, _presence: &dyn Presence) -> Result<Handled, HandlerError> {
        Ok(Handled { trace_id: None, role: Role::Customer, route: "silent".into(), reply: None, quote: false, error_code: None, acknowledgement: None })
    }
}

async fn a_message_without_an_answer_is_recorded_and_nothing_sent(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.R1", "hello")]])).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Silent)).await;
    assert!(graph.sends().is_empty());
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::inbound_by_wamid(&mut conn, "wamid.R1").await.expect("get").expect("stored");
    assert_eq!(row.outcome.as_deref(), Some("no reply: silent"));
}
both_backends!(whatsapp_no_answer, a_message_without_an_answer_is_recorded_and_nothing_sent);

// ---------------------------------------------------------------------------------------------
// The sender: splitting, the ledger across retries, the 24-hour window, pacing and retries.

async fn long_replies_are_split_and_only_the_first_part_quotes(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let paragraph = "This is a sentence about opening hours. ".repeat(50);
    let long = [paragraph.trim(), paragraph.trim(), paragraph.trim(), paragraph.trim(), paragraph.trim()].join("\n\n");
    assert!(long.chars().count() > 8192);
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.LONG", "tell me everything")]])).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Echo { fixed: Some(long.clone()), ..Default::default() })).await;
    let sends = graph.sends();
    assert_eq!(sends.len(), 3, "{} characters in parts of at most 4,096", long.chars().count());
    for (i, s) in sends.iter().enumerate() {
        let body = s["text"]["body"].as_str().expect("body");
        assert!(body.chars().count() <= 4096);
        assert!(body.ends_with("hours."), "parts end on a paragraph: part {i}");
        assert_eq!(s.get("context").is_some(), i == 0, "only the first part quotes");
    }
    let joined: String = graph.texts().join("\n\n");
    assert_eq!(joined, long);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM whatsapp_outbound WHERE state = 'sent'").await, 3);
}
both_backends!(whatsapp_split, long_replies_are_split_and_only_the_first_part_quotes);

async fn a_retried_job_never_sends_a_part_twice(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.send_attempts = 1).await;
    // The second send (part 1 of the first attempt) meets a Meta server error once.
    graph.set_rule(|_, index| (index == 1).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    let first = "The first part, long enough to split. ".repeat(60);
    let second = "The second part follows it here. ".repeat(60);
    let long = format!("{}\n\n{}", first.trim(), second.trim());
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.RETRY", "go")]])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo { fixed: Some(long), ..Default::default() });
    run_jobs(&app, echo.clone()).await;

    assert_eq!(echo.calls.load(Ordering::SeqCst), 2, "the job ran twice");
    let bodies = graph.texts();
    assert_eq!(bodies.len(), 3, "part 0, part 1 refused, part 1 again");
    assert_eq!(bodies.iter().filter(|b| **b == bodies[0]).count(), 1, "part 0 went out once");
    assert_eq!(bodies[1], bodies[2], "part 1 was retried");
    let (attempt,): (i64,) = sqlx::query_as("SELECT attempt FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!(attempt, 2);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.state == DeliveryState::Sent && r.wamid.is_some() && r.send_started_at.is_none()));
    assert_eq!(rows[1].attempts, 2);
    assert!(rows.iter().all(|r| r.idempotency_key.starts_with("job:") && r.idempotency_key.contains(":part:")));
}
both_backends!(whatsapp_ledger_retry, a_retried_job_never_sends_a_part_twice);

/// An outage of the Cloud API longer than `default_max_attempts` runs: a reply gets
/// `jobs.attempts.whatsapp_inbound` runs, so it goes out once the API is back instead of being
/// discarded, exactly once, and the model (here the echo handler's reply) is the same one.
async fn a_reply_rides_out_a_cloud_api_outage(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.send_attempts = 1;
        s.jobs.default_max_attempts = 3;
        s.jobs.attempts.whatsapp_inbound = 9;
    })
    .await;
    // Down for the first seven sends: the default three runs would all fail.
    graph.set_rule(|_, index| (index < 7).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.OUTAGE", "still there?")]])).await.status, StatusCode::OK);
    let (max_attempts,): (i64,) = sqlx::query_as("SELECT max_attempts FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!(max_attempts, 9, "the kind's own attempts, not the default");
    let echo = Arc::new(Echo::default());
    run_jobs(&app, echo.clone()).await;

    let (state, attempt): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!((state.as_str(), attempt), ("completed", 8));
    let texts = graph.texts();
    assert_eq!(texts.len(), 8, "seven refused, then the one that went out");
    assert!(texts.iter().all(|t| *t == texts[0]), "the same reply each time: {texts:?}");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].state, rows[0].attempts), (DeliveryState::Sent, 8));
}
both_backends!(whatsapp_outage, a_reply_rides_out_a_cloud_api_outage);

/// An expired or revoked access token is the deployment's failure, not the reply's: the job
/// waits without using its attempts (two here, against four refusals), every console page says
/// so, and the reply goes out once Meta accepts the token again; before, it was failed for good.
async fn a_rejected_token_holds_replies_until_it_works(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.send_attempts = 1;
        s.jobs.attempts.whatsapp_inbound = 2;
    })
    .await;
    let renewed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Refused until the test has seen the banner, then accepted (the token "renewed").
    let accepted = renewed.clone();
    graph.set_rule(move |_, index| (index < 4 || !accepted.load(Ordering::SeqCst)).then(|| graph_error(401, 190, "Error validating access token: Session has expired")));
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.TOKEN", "hello?")]])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo::default());
    let runner = {
        let (app_ref, echo) = (&app, echo.clone());
        async move { run_jobs(app_ref, echo).await }
    };
    let watcher = async {
        let mut owner = app.with_owner("ada", "correct horse battery").await;
        let deadline = Instant::now() + Duration::from_secs(15);
        while graph.all().len() < 4 {
            assert!(Instant::now() < deadline, "four refusals");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let page = owner.get("/jobs").await.body;
        assert!(page.contains("data-testid=\"token-banner\"") && page.contains("WHATSAPP_ACCESS_TOKEN"), "{page}");
        renewed.store(true, Ordering::SeqCst);
    };
    tokio::join!(runner, watcher);

    let (state, attempt): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!(state, "completed", "not discarded after its two attempts");
    assert!(attempt <= 2, "the refusals used no attempt: {attempt}");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, DeliveryState::Sent);
    assert_eq!(app.gatehouse.whatsapp.sender.token_rejected_since().await.expect("read"), None, "a send that went out clears it");
}
both_backends!(whatsapp_token_rejected, a_rejected_token_holds_replies_until_it_works);

/// A start is how an operator puts a renewed access token in place: the replies waiting on the
/// deployment run at once, not at the end of their wait (a minute each, before). Not while the
/// process holds the very token Meta refused: that start changed nothing.
async fn replies_waiting_on_the_deployment_run_at_start(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.send_attempts = 1).await;
    graph.set_rule(|_, _| Some(graph_error(401, 190, "Error validating access token")));
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.START", "hello?")]])).await.status, StatusCode::OK);
    let echo = Arc::new(Echo::default());
    run_jobs_until(&app, echo.clone(), "SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'scheduled'").await;
    // The wait a production worker gives it (a minute), made an hour: only a release runs it
    // within this test.
    let hour_from_now = db::now_ms() + 3_600_000;
    sqlx::query("UPDATE jobs SET scheduled_at = $1 WHERE kind = 'whatsapp.inbound'").bind(hour_from_now).execute(&app.state.db.pool).await.expect("wait an hour");
    graph.set_rule(|_, _| None);

    assert_eq!(app.gatehouse.release_waiting().await.expect("release"), 0, "started again with the refused token");
    // A preview left by an earlier wait for a setting (a snooze for a code keeps it) says
    // nothing of this wait.
    sqlx::query("UPDATE jobs SET result_preview = 'waiting: whatsapp.phone_number_id is not set' WHERE kind = 'whatsapp.inbound'").execute(&app.state.db.pool).await.expect("old preview");
    assert_eq!(app.gatehouse.release_waiting().await.expect("release"), 0, "still the refused token");
    // The refusal on record is of the token the operator replaced.
    sqlx::query("UPDATE whatsapp_token SET token_sha256 = 'the-replaced-token'").execute(&app.state.db.pool).await.expect("replace the token");
    assert_eq!(app.gatehouse.release_waiting().await.expect("release"), 1);
    assert_eq!(app.gatehouse.release_waiting().await.expect("release"), 0, "released once");
    let due = count(&app, &format!("SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'scheduled' AND scheduled_at < {hour_from_now}")).await;
    assert_eq!(due, 1, "due now, still unclaimed");
    run_jobs(&app, echo).await;
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!((rows.len(), rows[0].state), (1, DeliveryState::Sent));
}
both_backends!(whatsapp_released_at_start, replies_waiting_on_the_deployment_run_at_start);

/// Replies may go out from other processes (`gatehouse worker`) than the one serving the
/// console: a token Meta refused to any of them shows on every console that holds it, until a
/// send of any of them goes out; a process started with another token does not show it.
async fn a_refused_token_shows_on_every_console(db: TestDb) {
    let graph = FakeGraph::start().await;
    let console = app(db, Some(&graph), |s| s.whatsapp.send_attempts = 1).await;
    let mut owner = console.with_owner("ada", "correct horse battery").await;
    // The worker process's own pool and sender, on the same database and Graph API.
    let pool = server::db::Db::connect(&console.state.config.settings.database).await.expect("worker pool");
    let settings = console.state.config.settings.whatsapp.clone();
    let client = server::channel::whatsapp::graph::GraphClient::new(&settings, Some(ACCESS_TOKEN.to_string().into())).expect("client");
    let worker = WhatsAppSender::new(pool, client, settings);
    let to = Recipient { id: "16505551234".into(), group: false };
    assert!(!owner.get("/").await.body.contains("data-testid=\"token-banner\""));

    graph.set_rule(|_, _| Some(graph_error(401, 190, "Error validating access token")));
    let refused = worker.send_text(1, &to, "Hello.", None).await.expect_err("refused");
    assert_eq!(refused.code(), Some("CREDENTIALS_REJECTED"));
    let page = owner.get("/").await.body;
    assert!(page.contains("data-testid=\"token-banner\""), "the console's own process sent nothing: {page}");
    let since = console.gatehouse.whatsapp.sender.token_rejected_since().await.expect("read").expect("recorded");
    worker.send_text(2, &to, "Hello again.", None).await.expect_err("refused again");
    assert_eq!(console.gatehouse.whatsapp.sender.token_rejected_since().await.expect("read"), Some(since), "since the first refusal");
    // A process started with a new token says nothing of the old one's refusal.
    let settings = console.state.config.settings.whatsapp.clone();
    let renewed = server::channel::whatsapp::graph::GraphClient::new(&settings, Some("a-renewed-token".to_string().into())).expect("client");
    let restarted = WhatsAppSender::new(console.state.db.clone(), renewed, settings);
    assert_eq!(restarted.token_rejected_since().await.expect("read"), None);

    graph.set_rule(|_, _| None);
    let sent = worker.send_text(1, &to, "Hello.", None).await.expect("the token works again");
    assert_eq!(sent, SendOutcome::Sent { parts: 1, already_sent: 0 });
    assert!(!owner.get("/").await.body.contains("data-testid=\"token-banner\""), "a send that went out clears it everywhere");
}
both_backends!(whatsapp_token_banner_everywhere, a_refused_token_shows_on_every_console);

/// Meta refuses every send of the business account for a while (a policy block, 368): the
/// reply waits, using no attempt, and goes out once Meta takes sends again, instead of being
/// failed for good with every other reply of the incident.
async fn a_blocked_account_holds_replies_until_it_is_settled(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.send_attempts = 1;
        s.jobs.attempts.whatsapp_inbound = 2;
    })
    .await;
    graph.set_rule(|body, index| (body.get("type").is_some() && index < 4).then(|| graph_error(403, 368, "Temporarily blocked for policies violations")));
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.BLOCKED", "hello?")]])).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Echo::default())).await;

    let (state, attempt): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!(state, "completed", "not discarded after its two attempts");
    assert!(attempt <= 2, "the refusals used no attempt: {attempt}");
    assert!(graph.sends().len() >= 2, "refused, then sent: {:?}", graph.sends());
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!((rows.len(), rows[0].state), (1, DeliveryState::Sent));
}
both_backends!(whatsapp_account_blocked, a_blocked_account_holds_replies_until_it_is_settled);

/// The crash edge: a send that went out but was never recorded is recognised from Meta's status
/// callback (which carries the idempotency key back) and not sent again.
async fn a_send_lost_in_a_crash_is_settled_by_its_status_callback(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let sender = app.gatehouse.whatsapp.sender.clone();
    let key = "job:777:part:0";
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::reserve_outbound(&mut conn, &NewOutbound {
        idempotency_key: key, job_id: Some(777), part: 0, recipient: "16505551234", is_group: false, kind: "text", body: "Your table is booked.", quoted_id: None,
    }, db::now_ms()).await.expect("reserve");
    // A sender that died mid-request: its send lease has run out by the time the job reruns.
    assert!(store::mark_sending(&mut conn, row.id, "crashed-run", db::now_ms(), db::now_ms() - 1).await.expect("sending"));
    drop(conn);
    // ... the process died here; Meta had accepted the message and reports it:
    let cb = json!({ "id": "wamid.CRASHED", "status": "sent", "timestamp": "1739321030", "recipient_id": "16505551234", "biz_opaque_callback_data": key });
    assert_eq!(post_signed(&app, &status_envelope(vec![cb])).await.status, StatusCode::OK);

    let to = Recipient { id: "16505551234".into(), group: false };
    let outcome = sender.send_text(777, &to, "Your table is booked.", None).await.expect("send");
    assert_eq!(outcome, SendOutcome::Sent { parts: 1, already_sent: 1 });
    assert!(graph.sends().is_empty(), "not sent a second time");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, key).await.expect("get").expect("row");
    assert_eq!((row.state, row.wamid.as_deref()), (DeliveryState::Sent, Some("wamid.CRASHED")));

    // Without a callback the outcome stays unknown and the part is sent again (at least once).
    let key2 = "job:778:part:0";
    let row = store::reserve_outbound(&mut conn, &NewOutbound {
        idempotency_key: key2, job_id: Some(778), part: 0, recipient: "16505551234", is_group: false, kind: "text", body: "Again.", quoted_id: None,
    }, db::now_ms()).await.expect("reserve");
    assert!(store::mark_sending(&mut conn, row.id, "crashed-run", db::now_ms(), db::now_ms() - 1).await.expect("sending"));
    drop(conn);
    let outcome = sender.send_text(778, &to, "Again.", None).await.expect("send");
    assert_eq!(outcome, SendOutcome::Sent { parts: 1, already_sent: 0 });
    assert_eq!(graph.texts(), vec!["Again.".to_string()]);

    // A failure reported before the send's answer was recorded keeps its code.
    let key3 = "job:779:part:0";
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::reserve_outbound(&mut conn, &NewOutbound {
        idempotency_key: key3, job_id: Some(779), part: 0, recipient: "16505551234", is_group: false, kind: "text", body: "Late.", quoted_id: None,
    }, db::now_ms()).await.expect("reserve");
    assert!(store::mark_sending(&mut conn, row.id, "slow-run", db::now_ms(), db::now_ms() + 60_000).await.expect("sending"));
    let failed = store::StatusUpdate { wamid: "wamid.LATE".into(), state: DeliveryState::Failed, at: db::now_ms(), error_code: Some("131047".into()), error_message: Some("Re-engagement message".into()), opaque: Some(key3.into()) };
    assert!(store::apply_status(&mut conn, &failed, db::now_ms()).await.expect("status"));
    store::mark_sent(&mut conn, row.id, "wamid.LATE", db::now_ms()).await.expect("sent");
    let row = store::outbound_by_key(&mut conn, key3).await.expect("get").expect("row");
    assert_eq!((row.state, row.error_code.as_deref()), (DeliveryState::Failed, Some("131047")));
}
both_backends!(whatsapp_crash_edge, a_send_lost_in_a_crash_is_settled_by_its_status_callback);

/// Meta answers a send with a server error after it accepted the message (a 500 from its side,
/// a 502 from its edge): the outcome is unknown, not "not sent". The part stays marked as begun,
/// so the status callback that carries its key back settles it, and it is not sent again.
async fn a_server_error_leaves_the_outcome_unknown(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.send_attempts = 1).await;
    graph.set_rule(|body, _| (body.get("type").is_some()).then(|| graph_error(500, 2, "Service temporarily unavailable")));
    let sender = app.gatehouse.whatsapp.sender.clone();
    let to = Recipient { id: "16505551234".into(), group: false };
    let first = sender.send_text(780, &to, "Your order ships today.", None).await;
    assert!(first.is_err(), "a server error is retried: {first:?}");
    let key = "job:780:part:0";
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, key).await.expect("get").expect("row");
    assert!(row.send_started_at.is_some(), "the part may have gone out: {row:?}");
    drop(conn);
    // Meta had accepted it, and says so.
    let cb = json!({ "id": "wamid.ACCEPTED", "status": "sent", "timestamp": "1739321030", "recipient_id": "16505551234", "biz_opaque_callback_data": key });
    assert_eq!(post_signed(&app, &status_envelope(vec![cb])).await.status, StatusCode::OK);
    graph.set_rule(|_, _| None);
    let outcome = sender.send_text(780, &to, "Your order ships today.", None).await.expect("send");
    assert_eq!(outcome, SendOutcome::Sent { parts: 1, already_sent: 1 });
    assert_eq!(graph.sends().len(), 1, "sent once");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, key).await.expect("get").expect("row");
    assert_eq!((row.state, row.wamid.as_deref()), (DeliveryState::Sent, Some("wamid.ACCEPTED")));
}
both_backends!(whatsapp_server_error_unknown, a_server_error_leaves_the_outcome_unknown);

/// A reply Meta refused (here an invalid parameter, 100) fails its job for good; an owner who
/// retries the job from the console gets the reply sent, rather than a run that finds the
/// failed part in the ledger, sends nothing and calls itself done.
async fn an_owners_retry_sends_a_refused_reply(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let refusing = refuse.clone();
    graph.set_rule(move |body, _| (body.get("type").is_some() && refusing.load(Ordering::SeqCst)).then(|| graph_error(400, 100, "Invalid parameter")));
    assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.REFUSED", "hello?")]])).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Echo::default())).await;
    let (id, state): (i64, String) = sqlx::query_as("SELECT id, state FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
    assert_eq!(state, "discarded", "a refusal is permanent");
    assert_eq!(graph.sends().len(), 1);

    // The owner fixed what Meta refused, and retries the job.
    refuse.store(false, Ordering::SeqCst);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    assert!(server::db::jobs::retry_now(&mut conn, id, db::now_ms()).await.expect("retry"));
    drop(conn);
    run_jobs(&app, Arc::new(Echo::default())).await;
    assert_eq!(graph.sends().len(), 2, "sent on the owner's retry");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
    assert_eq!((rows.len(), rows[0].state), (1, DeliveryState::Sent), "{rows:?}");
}
both_backends!(whatsapp_owner_retry_refused, an_owners_retry_sends_a_refused_reply);

/// Meta accepts a part with an answer that names no wamid: the part counts as sent (never failed,
/// nor sent again), the reply's next part goes out, and the status callback fills the wamid in by
/// the key the send carried. Before, the part was failed for good and the rest of the reply lost.
async fn an_accepted_part_without_a_wamid_is_sent(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    graph.set_rule(|_, index| (index == 0).then(|| (200, json!({ "messaging_product": "whatsapp" }))));
    let sender = app.gatehouse.whatsapp.sender.clone();
    let to = Recipient { id: "16505551234".into(), group: false };
    let long = "Your order is on its way to you. ".repeat(160);
    assert_eq!(sender.send_text(960, &to, &long, None).await.expect("send"), SendOutcome::Sent { parts: 2, already_sent: 0 });
    assert_eq!(graph.sends().len(), 2, "each part once");
    let key = "job:960:part:0";
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, key).await.expect("get").expect("row");
    assert_eq!((row.state, row.wamid.as_deref()), (DeliveryState::Sent, None));
    drop(conn);
    let cb = json!({ "id": "wamid.NAMED_LATER", "status": "delivered", "timestamp": "1739321030", "recipient_id": "16505551234", "biz_opaque_callback_data": key });
    assert_eq!(post_signed(&app, &status_envelope(vec![cb])).await.status, StatusCode::OK);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, key).await.expect("get").expect("row");
    assert_eq!((row.state, row.wamid.as_deref()), (DeliveryState::Delivered, Some("wamid.NAMED_LATER")));
    drop(conn);
    assert_eq!(sender.send_text(960, &to, &long, None).await.expect("again"), SendOutcome::Sent { parts: 2, already_sent: 2 }, "a rerun sends nothing");
    assert_eq!(graph.sends().len(), 2);

    // A callback under the key of a part nobody began to send (a late one of another
    // database's message: job ids start again after a restore) marks nothing; the part goes out.
    let key = "job:961:part:0";
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    store::reserve_outbound(&mut conn, &NewOutbound { idempotency_key: key, job_id: Some(961), part: 0, recipient: "16505551234", is_group: false, kind: "text", body: "Fresh.", quoted_id: None }, db::now_ms())
        .await
        .expect("reserve");
    drop(conn);
    let cb = json!({ "id": "wamid.OLD_LIFE", "status": "read", "timestamp": "1739321030", "recipient_id": "16505551234", "biz_opaque_callback_data": key });
    assert_eq!(post_signed(&app, &status_envelope(vec![cb])).await.status, StatusCode::OK);
    assert_eq!(sender.send_text(961, &to, "Fresh.", None).await.expect("send"), SendOutcome::Sent { parts: 1, already_sent: 0 });
    assert_eq!(graph.texts().last().map(String::as_str), Some("Fresh."));

    // A part accepted without a wamid went out: whoever asks (a stopped call's notice, the
    // unhandled-message notice, a stale acknowledgement) is not told otherwise.
    graph.set_rule(|_, _| Some((200, json!({ "messaging_product": "whatsapp" }))));
    assert_eq!(sender.send_text(963, &to, "Short.", None).await.expect("send"), SendOutcome::Sent { parts: 1, already_sent: 0 });
    graph.set_rule(|_, _| None);
    let outbox = server::channel::Outbox::new(app.state.db.clone(), sender.clone(), app.gatehouse.jobs.telemetry().clone());
    let reply_to = server::channel::ReplyTo { channel: server::channel::WHATSAPP.into(), chat_id: to.id.clone(), chat_kind: server::domain::ChatKind::Direct, message_id: "wamid.ASKED".into() };
    assert!(server::channel::Outbound::went_out(&outbox, &reply_to, 963).await.expect("went out"), "accepted without a wamid is sent");
}
both_backends!(whatsapp_accepted_without_wamid, an_accepted_part_without_a_wamid_is_sent);

async fn outside_the_window(db: TestDb, template: &'static str) {
    {
        let graph = FakeGraph::start().await;
        let app = app(db, Some(&graph), |s| {
            s.whatsapp.window_template = template.into();
            s.whatsapp.window_template_language = "en_GB".into();
        })
        .await;
        graph.set_rule(|body, _| (body["type"] == "text").then(|| graph_error(400, 131047, "Re-engagement message")));
        assert_eq!(post_signed(&app, &envelope(vec![vec![text_message("16505551234", "wamid.OLD", "hello after two days")]])).await.status, StatusCode::OK);
        let echo = Arc::new(Echo { fixed: Some(format!("{}\n\n{}", "a. ".repeat(1500), "b. ".repeat(1500))), ..Default::default() });
        run_jobs(&app, echo.clone()).await;

        let mut conn = app.state.db.pool.acquire().await.expect("conn");
        let rows = store::outbound_for_recipient(&mut conn, "16505551234").await.expect("ledger");
        let text_rows: Vec<_> = rows.iter().filter(|r| r.kind == "text").collect();
        assert_eq!(text_rows.len(), 1, "the first refused part stops the reply");
        assert_eq!((text_rows[0].state, text_rows[0].error_code.as_deref()), (DeliveryState::Failed, Some("131047")));
        assert!(text_rows[0].error_message.as_deref().is_some_and(|m| m.contains("24-hour")));
        let templates: Vec<Value> = graph.sends().into_iter().filter(|b| b["type"] == "template").collect();
        if template.is_empty() {
            assert!(templates.is_empty());
            assert!(rows.iter().all(|r| r.kind == "text"));
        } else {
            assert_eq!(templates.len(), 1);
            assert_eq!(templates[0]["template"]["name"], template);
            assert_eq!(templates[0]["template"]["language"]["code"], "en_GB");
            let t = rows.iter().find(|r| r.kind == "template").expect("template in the ledger");
            assert_eq!(t.state, DeliveryState::Sent);
        }
        let (state,): (String,) = sqlx::query_as("SELECT state FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&app.state.db.pool).await.expect("job");
        assert_eq!(state, "completed", "a closed window is an outcome, not a retry");
    }
}

async fn outside_the_window_without_a_template(db: TestDb) {
    outside_the_window(db, "").await;
}
both_backends!(whatsapp_window_no_template, outside_the_window_without_a_template);

async fn outside_the_window_with_a_template(db: TestDb) {
    outside_the_window(db, "reopen_conversation").await;
}
both_backends!(whatsapp_window_template, outside_the_window_with_a_template);

/// Meta accepted a message and reported later that it could not be delivered outside the
/// person's 24-hour window (a `failed` status with 131047): the window template goes in its
/// place, once for the job however many of its parts were refused, as when the send itself is
/// refused.
async fn a_window_refusal_reported_later_sends_the_template(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.window_template = "reopen_conversation".into();
        s.whatsapp.window_template_language = "en_GB".into();
    })
    .await;
    let sender = app.gatehouse.whatsapp.sender.clone();
    let to = Recipient { id: "16505550000".into(), group: false };
    let long = "Approval #7 is waiting for you. ".repeat(160);
    assert_eq!(sender.send_text(950, &to, &long, None).await.expect("send"), SendOutcome::Sent { parts: 2, already_sent: 0 });
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let mut failed = Vec::new();
    for part in 0..2 {
        let wamid = store::outbound_by_key(&mut conn, &format!("job:950:part:{part}")).await.expect("get").expect("row").wamid.expect("accepted");
        failed.push(json!({ "id": wamid, "status": "failed", "timestamp": "1739321040", "recipient_id": "16505550000",
            "errors": [{ "code": 131047, "title": "Re-engagement message", "message": "Re-engagement message",
                         "error_data": { "details": "Message failed to send because more than 24 hours have passed since the customer last replied to this number." } }] }));
    }
    drop(conn);
    // Both parts refused in one post, then the first again in another.
    assert_eq!(post_signed(&app, &status_envelope(failed.clone())).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Echo::default())).await;
    assert_eq!(post_signed(&app, &status_envelope(vec![failed[0].clone()])).await.status, StatusCode::OK);
    run_jobs(&app, Arc::new(Echo::default())).await;
    let templates: Vec<Value> = graph.sends().into_iter().filter(|b| b["type"] == "template").collect();
    assert_eq!(templates.len(), 1, "{:?}", graph.sends());
    assert_eq!((templates[0]["to"].as_str(), templates[0]["template"]["name"].as_str()), (Some("16505550000"), Some("reopen_conversation")));
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, "job:950:template").await.expect("get").expect("the template in the ledger");
    assert_eq!(row.state, DeliveryState::Sent);
    drop(conn);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.window_template'").await, 1, "one job for the two refused parts");
}
both_backends!(whatsapp_window_template_later, a_window_refusal_reported_later_sends_the_template);


async fn rate_limit_answers_are_retried_with_backoff(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| s.whatsapp.send_attempts = 3).await;
    graph.set_rule(|_, index| match index {
        0 => Some(graph_error(400, 131056, "(#131056) (Business Account, Consumer Account) pair rate limit hit")),
        1 => Some(graph_error(429, 130429, "Rate limit hit")),
        // The app's and the account's call rates, and a throughput upgrade: limits too.
        3 => Some(graph_error(400, 80007, "(#80007) Rate limit issues")),
        4 => Some(graph_error(400, 4, "(#4) Application request limit reached")),
        6 => Some(graph_error(400, 131057, "Account in maintenance mode")),
        _ => None,
    });
    let sender = app.gatehouse.whatsapp.sender.clone();
    let to = Recipient { id: "16505551234".into(), group: false };
    let outcome = sender.send_text(900, &to, "Thanks for waiting.", None).await.expect("send");
    assert_eq!(outcome, SendOutcome::Sent { parts: 1, already_sent: 0 });
    let seen = graph.all();
    assert_eq!(seen.len(), 3);
    assert!(seen[1].at.duration_since(seen[0].at) >= Duration::from_millis(10), "backoff before the second try");
    assert!(seen[2].at.duration_since(seen[1].at) >= Duration::from_millis(40), "four times longer before the third");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::outbound_by_key(&mut conn, "job:900:part:0").await.expect("get").expect("row");
    assert_eq!((row.state, row.attempts), (DeliveryState::Sent, 3));
    for (job, tries) in [(902, 3), (903, 2)] {
        let outcome = sender.send_text(job, &to, "Still here.", None).await.expect("a rate limit is waited out");
        assert_eq!(outcome, SendOutcome::Sent { parts: 1, already_sent: 0 });
        let row = store::outbound_by_key(&mut conn, &format!("job:{job}:part:0")).await.expect("get").expect("row");
        assert_eq!((row.state, row.attempts), (DeliveryState::Sent, tries), "job {job}");
    }

    // A token problem is not retried within the send (the same token fails again), and not
    // the reply's failure either: the part stays unsent, for the job to send once the token works.
    graph.set_rule(|_, _| Some(graph_error(401, 190, "Error validating access token")));
    let before = graph.all().len();
    let err = sender.send_text(901, &to, "Hello.", None).await.expect_err("refused");
    assert!(err.to_string().contains("190") && !err.to_string().contains(ACCESS_TOKEN), "{err}");
    assert_eq!(err.code(), Some("CREDENTIALS_REJECTED"));
    assert_eq!(graph.all().len(), before + 1, "one try");
    let row = store::outbound_by_key(&mut conn, "job:901:part:0").await.expect("get").expect("row");
    assert_eq!((row.state, row.error_code.as_deref()), (DeliveryState::Queued, Some("190")));
    assert!(sender.token_rejected_since().await.expect("read").is_some());
}
both_backends!(whatsapp_rate_limit_retries, rate_limit_answers_are_retried_with_backoff);

async fn sends_to_one_recipient_are_paced(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |s| {
        s.whatsapp.pair_burst = 1;
        s.whatsapp.pair_interval = Duration::from_millis(300);
    })
    .await;
    let sender = app.gatehouse.whatsapp.sender.clone();
    let to = Recipient { id: "16505551234".into(), group: false };
    let other = Recipient { id: "16505550000".into(), group: false };
    let t0 = Instant::now();
    let (a, b, c) = tokio::join!(
        sender.send_text(1, &to, "one", None),
        sender.send_text(2, &to, "two", None),
        sender.send_text(3, &other, "elsewhere", None),
    );
    a.expect("a");
    b.expect("b");
    c.expect("c");
    let seen = graph.all();
    let at = |text: &str| seen.iter().find(|s| s.body["text"]["body"] == text).map(|s| s.at.duration_since(t0)).expect("sent");
    let (one, two) = (at("one").min(at("two")), at("one").max(at("two")));
    assert!(two - one >= Duration::from_millis(250), "one message per pair interval: {one:?} then {two:?}");
    assert!(at("elsewhere") < Duration::from_millis(250), "another recipient is not held up: {:?}", at("elsewhere"));

    // A wait beyond max_pacing_wait is left to a later retry of the job, without sending.
    let impatient = app_sender_with(&app, |s| {
        s.pair_burst = 1;
        s.pair_interval = Duration::from_secs(60);
        s.max_pacing_wait = Duration::from_millis(100);
    });
    impatient.send_text(4, &to, "first", None).await.expect("first goes");
    let err = impatient.send_text(5, &to, "second", None).await.expect_err("paced");
    assert!(err.to_string().contains("WHATSAPP_PACED"), "{err}");
    assert!(!graph.texts().contains(&"second".to_string()));
}
both_backends!(whatsapp_pacing, sends_to_one_recipient_are_paced);

fn app_sender_with(app: &TestApp, tweak: impl FnOnce(&mut server::config::WhatsAppSettings)) -> Arc<WhatsAppSender> {
    let mut settings = app.state.config.settings.whatsapp.clone();
    tweak(&mut settings);
    WhatsApp::new(&settings, &app.state.config.secrets, &app.state.db, &app.state.jobs, &app.state.events).expect("sender").sender
}

/// A WhatsApp message through the real conversation runtime and a fake Anthropic API: the reply
/// goes out through the Graph API, and the trace ends with its delivery. A send that fails once
/// makes the job run again; the runtime gives back its earlier reply (the model is asked once)
/// and the ledger sends it once.
async fn messages_go_through_the_runtime_and_their_trace_shows_the_delivery(db: TestDb) {
    let graph = FakeGraph::start().await;
    let (llm_url, llm) = crate::conversation::fake_anthropic().await;
    let secrets = Secrets::from_lookup(|name| match name {
        "ANTHROPIC_API_KEY" => Some("test-llm-key".into()),
        other => secrets().by_name(other).map(|s| secrecy::ExposeSecret::expose_secret(s).to_string()),
    });
    let base = graph.base_url.clone();
    let app = TestApp::with_secrets(db, secrets, move |s| {
        s.whatsapp.graph_base_url = base;
        s.whatsapp.graph_version = VERSION.into();
        s.whatsapp.phone_number_id = PHONE_NUMBER_ID.into();
        s.whatsapp.send_retry_base = Duration::from_millis(10);
        s.whatsapp.send_attempts = 1;
        s.whatsapp.typing_indicator = false;
        s.whatsapp.mark_read = false;
        s.llm.anthropic.base_url = llm_url;
        s.llm.max_retries = 0;
        s.models.chat = crate::conversation::CHAT_MODEL.into();
    })
    .await;
    graph.set_rule(|_, index| (index == 0).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    let body = envelope(vec![vec![text_message("16505550000", "wamid.RUNTIME", "Do you deliver on Sundays?")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    run_jobs(&app, app.state.runtime.clone()).await;

    assert_eq!(graph.texts(), vec!["reply 1".to_string(), "reply 1".to_string()], "refused once, then sent; never two replies");
    assert_eq!(llm.lock().expect("lock").requests.len(), 1, "the model was asked once");
    let (trace_id, route): (i64, String) = sqlx::query_as("SELECT id, route FROM traces WHERE message_id = 'wamid.RUNTIME'").fetch_one(&app.state.db.pool).await.expect("trace");
    assert_eq!(route, "chat");
    let steps: Vec<(String, String)> = sqlx::query_as("SELECT step, decision FROM trace_steps WHERE trace_id = $1 ORDER BY seq").bind(trace_id).fetch_all(&app.state.db.pool).await.expect("steps");
    assert_eq!(steps.last(), Some(&("delivery".to_string(), "sent".to_string())), "{steps:?}");
    assert!(steps.contains(&("delivery".to_string(), "retry".to_string())), "the refused first try is in the trace: {steps:?}");
    let calls: i64 = count(&app, "SELECT COUNT(*) FROM llm_calls WHERE purpose = 'chat'").await;
    assert_eq!(calls, 1, "the call's usage was recorded");
    let outcome = |wamid: &'static str| {
        let pool = app.state.db.pool.clone();
        async move {
            sqlx::query_as::<_, (String, Option<String>, String)>(
                "SELECT t.outcome, t.error_code, s.decision FROM traces t JOIN trace_steps s ON s.trace_id = t.id \
                 WHERE t.message_id = $1 ORDER BY s.seq DESC LIMIT 1",
            )
            .bind(wamid)
            .fetch_one(&pool)
            .await
            .expect("trace")
        }
    };
    assert_eq!(outcome("wamid.RUNTIME").await, ("replied".into(), None, "sent".into()));

    // A list reply reaches the runtime with its title as text and its id kept in the trace.
    let choice = json!({ "from": "16505550000", "id": "wamid.CHOICE", "timestamp": "1739321025", "type": "interactive",
        "interactive": { "type": "list_reply", "list_reply": { "id": "slot-tuesday", "title": "Tuesday" } } });
    assert_eq!(post_signed(&app, &envelope(vec![vec![choice]])).await.status, StatusCode::OK);
    run_jobs(&app, app.state.runtime.clone()).await;
    let (first,): (String,) = sqlx::query_as("SELECT s.detail FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = 'wamid.CHOICE' ORDER BY s.seq LIMIT 1")
        .fetch_one(&app.state.db.pool)
        .await
        .expect("first step");
    let first: Value = serde_json::from_str(&first).expect("json");
    assert_eq!((first["reply_id"].as_str(), first["chars"].as_u64()), (Some("slot-tuesday"), Some(7)), "{first}");
    assert!(llm.lock().expect("lock").requests.iter().any(|r| r.to_string().contains("Tuesday")), "the title reached the model as the message");

    // A reply WhatsApp refuses marks the trace failed with the reason, so the Traces page's
    // outcome and error-code filters find it: outside the 24-hour window, and a permanent error.
    graph.set_rule(|body, _| (body["type"] == "text").then(|| graph_error(400, 131047, "Re-engagement message")));
    let body = envelope(vec![vec![text_message("16505550000", "wamid.WINDOW", "Are you open?")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    run_jobs(&app, app.state.runtime.clone()).await;
    assert_eq!(outcome("wamid.WINDOW").await, ("failed".into(), Some("WHATSAPP_131047".into()), "failed".into()));
    graph.set_rule(|body, _| (body["type"] == "text").then(|| graph_error(400, 131026, "Message undeliverable")));
    let body = envelope(vec![vec![text_message("16505550000", "wamid.UNDELIVERABLE", "Hello?")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    run_jobs(&app, app.state.runtime.clone()).await;
    assert_eq!(outcome("wamid.UNDELIVERABLE").await, ("failed".into(), Some("WHATSAPP_131026".into()), "failed".into()));
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let filter = db::traces::TraceFilter { outcome: "failed".into(), ..Default::default() };
    let failed: Vec<String> = db::traces::list(&mut conn, &filter, 50).await.expect("list").into_iter().map(|t| t.trace.message_id).collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    // Each listed with its message's text, as the channel keeps it.
    let filter = db::traces::TraceFilter { error_code: "WHATSAPP_131047".into(), ..Default::default() };
    let window: Vec<(String, Option<String>)> = db::traces::list(&mut conn, &filter, 50).await.expect("list").into_iter().map(|t| (t.trace.message_id, t.text)).collect();
    assert_eq!(window, vec![("wamid.WINDOW".to_string(), Some("Are you open?".to_string()))]);
    let filter = db::traces::TraceFilter { chat_id: "16505550000".into(), route: "chat".into(), ..Default::default() };
    assert_eq!(db::traces::list(&mut conn, &filter, 50).await.expect("list").len(), 4, "four messages went through the runtime");
    let filter = db::traces::TraceFilter { chat_id: "someone-else".into(), ..Default::default() };
    assert!(db::traces::list(&mut conn, &filter, 50).await.expect("list").is_empty());
    let filter = db::traces::TraceFilter { since_ms: db::now_ms() + 60_000, ..Default::default() };
    assert!(db::traces::list(&mut conn, &filter, 50).await.expect("list").is_empty(), "the time filter");

    // Meta accepts a reply and later reports it undelivered: the trace learns it from the status.
    let sent = store::outbound_for_recipient(&mut conn, "16505550000").await.expect("ledger");
    let wamid = sent.iter().find(|r| r.state == DeliveryState::Sent).and_then(|r| r.wamid.clone()).expect("a sent reply");
    drop(conn);
    let failed = json!({ "id": wamid, "status": "failed", "timestamp": "1739321040", "recipient_id": "16505550000",
        "errors": [{ "code": 131026, "title": "Message undeliverable", "message": "Message undeliverable" }] });
    assert_eq!(post_signed(&app, &status_envelope(vec![failed])).await.status, StatusCode::OK);
    assert_eq!(outcome("wamid.RUNTIME").await, ("failed".into(), Some("WHATSAPP_131026".into()), "failed".into()));

    // The console's Conversations page lists the WhatsApp chat, and its messages show the
    // failed replies with their codes and link to their traces.
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let chats = owner.post_form("/api/list_chats", &[]).await.json();
    assert!(chats["chats"].as_array().is_some_and(|c| c.iter().any(|c| c["chat_id"] == "16505550000" && c["channel"] == "whatsapp")), "{chats}");
    let chat = owner.post_form("/api/get_chat", &[("channel", "whatsapp"), ("chat_id", "16505550000")]).await;
    assert_eq!(chat.status, StatusCode::OK, "{}", chat.body);
    let messages = chat.json()["messages"].as_array().cloned().expect("messages");
    let failed: Vec<Option<&str>> = messages.iter().filter(|m| m["direction"] == "out" && m["state"] == "failed").map(|m| m["error_code"].as_str()).collect();
    assert!(failed.contains(&Some("131047")) && failed.contains(&Some("131026")), "{messages:?}");
    assert!(messages.iter().filter(|m| m["direction"] == "in").all(|m| m["trace_id"].is_i64()), "every message links its trace: {messages:?}");
}
both_backends!(whatsapp_through_the_runtime, messages_go_through_the_runtime_and_their_trace_shows_the_delivery);

/// A slow model (40 s, past the default 30 s job timeout) and a Graph API that accepts a send and
/// answers late: the run's budget fits the work, so each message is answered exactly once and
/// the model asked once per message (a run cut in the middle used to lose the reply after the
/// paid call, or send it twice).
async fn slow_work_is_answered_once_within_its_budget(db: TestDb) {
    let graph = FakeGraph::start().await;
    *graph.delay.lock().expect("delay") = Duration::from_secs(10);
    let (llm_url, llm) = crate::conversation::fake_anthropic_after(Duration::from_secs(40)).await;
    let secrets = Secrets::from_lookup(|name| match name {
        "ANTHROPIC_API_KEY" => Some("test-llm-key".into()),
        other => secrets().by_name(other).map(|s| secrecy::ExposeSecret::expose_secret(s).to_string()),
    });
    let base = graph.base_url.clone();
    let app = TestApp::with_secrets(db, secrets, move |s| {
        s.whatsapp.graph_base_url = base;
        s.whatsapp.graph_version = VERSION.into();
        s.whatsapp.phone_number_id = PHONE_NUMBER_ID.into();
        s.whatsapp.typing_indicator = false;
        s.whatsapp.mark_read = false;
        s.llm.anthropic.base_url = llm_url;
        s.llm.max_retries = 0;
        s.models.chat = crate::conversation::CHAT_MODEL.into();
    })
    .await;
    let body = envelope(vec![vec![text_message("16505550000", "wamid.SLOW1", "Anyone there?"), text_message("16505550001", "wamid.SLOW2", "Hello?")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK);
    // The worker as `gatehouse serve` runs it: the configured settings and budgets.
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(app.gatehouse.worker().run(stopped));
    let deadline = Instant::now() + Duration::from_secs(200);
    while count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound' AND state = 'completed'").await < 2 {
        assert!(Instant::now() < deadline, "the slow messages were not answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
    let mut to: Vec<String> = graph.sends().iter().map(|b| b["to"].as_str().unwrap_or_default().to_string()).collect();
    to.sort();
    assert_eq!(to, vec!["16505550000".to_string(), "16505550001".into()], "one reply each: {:?}", graph.texts());
    assert!(graph.texts().iter().all(|t| t.starts_with("reply ")), "the model's answers, not the fallback: {:?}", graph.texts());
    assert_eq!(llm.lock().expect("lock").requests.len(), 2, "the model was asked once per message");
}
both_backends!(whatsapp_slow_work, slow_work_is_answered_once_within_its_budget);

/// An owner notice's delivery job sends it to the owner's number through the Graph API.
async fn owner_notices_are_delivered_on_whatsapp(db: TestDb) {
    let graph = FakeGraph::start().await;
    let app = app(db, Some(&graph), |_| {}).await;
    let notice = server::db::owner_notifications::Notification {
        at: server::db::now_ms(),
        hook: "timeouts".into(),
        tool: "web_fetch".into(),
        reason_code: "TOOL_TIMEOUT".into(),
        message: "A tool is slow or down: web_fetch ended with TOOL_TIMEOUT.".into(),
        correlation_id: "corr-n".into(),
    };
    {
        let mut tx = app.state.db.begin_write().await.expect("tx");
        sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('O', 'o', 'x', 1, 0, 0)").execute(&mut *tx).await.expect("owner");
        sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ('+16505550001', (SELECT MAX(id) FROM owners), 0)").execute(&mut *tx).await.expect("phone");
        assert_eq!(server::owners::notices::raise(&mut tx, &app.state.jobs, &notice, true).await.expect("enqueue"), 1);
        app.state.jobs.commit(tx).await.expect("commit");
    }
    let mut registry = Registry::new();
    app.gatehouse.whatsapp.register(&mut registry, &app.state.db, Arc::new(Echo::default()), &Default::default());
    let settings = WorkerSettings { concurrency: 1, poll_interval: Duration::from_millis(20), ..Default::default() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(app.state.db.clone(), registry, settings, app.state.jobs.waker()).run(stopped));
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'owner.notify' AND state = 'completed'").await == 0 {
        assert!(Instant::now() < deadline, "the delivery job did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
    assert_eq!(graph.texts(), vec![notice.message.clone()]);
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let sent = store::outbound_for_recipient(&mut conn, "16505550001").await.expect("ledger");
    assert_eq!(sent.len(), 1, "recorded in the delivery ledger like any reply");
}
both_backends!(whatsapp_owner_notices, owner_notices_are_delivered_on_whatsapp);

/// A secret written to an env file with `echo` ends with a newline. It is the same secret: the
/// webhook's signatures still verify.
async fn a_secret_with_a_trailing_newline_still_verifies(db: TestDb) {
    let padded = Secrets::from_lookup(|name| match name {
        "WHATSAPP_APP_SECRET" => Some(format!("{APP_SECRET}\n")),
        "WHATSAPP_VERIFY_TOKEN" => Some(format!(" {VERIFY_TOKEN}\r\n")),
        _ => None,
    });
    let app = TestApp::with_secrets(db, padded, |_| {}).await;
    let body = envelope(vec![vec![text_message("16505551234", "wamid.NEWLINE", "hello")]]);
    assert_eq!(post_signed(&app, &body).await.status, StatusCode::OK, "signed with the secret itself");
    let verify = format!("/webhooks/whatsapp?hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=42");
    let res = app.client().get(&verify).await;
    assert_eq!((res.status, res.body.as_str()), (StatusCode::OK, "42"));
}
both_backends!(whatsapp_secret_newline, a_secret_with_a_trailing_newline_still_verifies);

/// The console's shell (every page, every live stream's session check) reads whether Meta
/// refused the access token, and the dashboard its budgets, without holding a second
/// connection: with one connection in the pool they answer, where they used to wait for the
/// pool's timeout and answer 503.
async fn the_console_shell_needs_one_connection_at_a_time(db: TestDb) {
    let app = app(db, None, |s| {
        s.database.max_connections = 1;
        s.budget.daily_usd = 5.0;
    })
    .await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let shell = owner.post_form("/api/current_owner", &[]).await;
    assert_eq!(shell.status, axum::http::StatusCode::OK, "{}", shell.body);
    // The dashboard too, with a budget to read.
    let dashboard = owner.post_form("/api/dashboard_facts", &[]).await;
    assert_eq!(dashboard.status, axum::http::StatusCode::OK, "{}", dashboard.body);
}
both_backends!(whatsapp_shell_one_connection, the_console_shell_needs_one_connection_at_a_time);
