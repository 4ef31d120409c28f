//! Elicitation forwarded to the owners (`elicitation = "owner"`), against the fixture server's
//! `ask` tool, which sends a real `elicitation/create` during its call: the form is stored and
//! shown, an owner's values are checked against the schema, one answer reaches the server once
//! (given in another "process": a second manager over the same database), an unanswered form is
//! cancelled in time, and with the default policy the capability is not even announced.

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use server::tools::mcp::{self, Answer, AuditActor, McpError, McpManager, PendingForm};
use sqlx::Row;

use crate::{
    both_backends,
    mcp::{Rig, TRUSTED_OPEN, fixture, stdio, text_of},
    support::TestDb,
};

fn owner() -> AuditActor {
    AuditActor { owner_id: None, login: Some("test-owner".into()), ip: Some("127.0.0.1".into()) }
}

/// The fixture's `ask` tool called as an owner (from a chat, or not), in a task of its own:
/// the call waits for the form's answer.
fn ask(rig: &Rig, args: Value, chat_id: Option<&str>, correlation_id: &str) -> tokio::task::JoinHandle<Result<server::tools::checkpoint::ToolSuccess, server::tools::checkpoint::ToolFailure>> {
    let ctx = server::tools::CallContext {
        actor: server::domain::Role::Owner,
        chat_type: server::tools::catalog::ChatKind::Direct,
        chat_id: chat_id.map(str::to_string),
        sender_id: None,
        correlation_id: correlation_id.to_string(),
        approved: None,
        trace_id: None,
    };
    let checkpoint = rig.checkpoint.clone();
    tokio::spawn(async move { checkpoint.execute(server::tools::ToolCall { name: "fx__ask".into(), args }, &ctx).await })
}

fn servers(policy: &str) -> String {
    stdio("fx", &format!("{TRUSTED_OPEN}\n{policy}"), "node", &[&fixture()], &[("FIXTURE_ELICIT", "1")])
}

/// The one form waiting, as another process (the console beside a worker) sees it.
async fn waiting_form(manager: &McpManager) -> PendingForm {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let forms = manager.forms().await.expect("forms");
        if let Some(f) = forms.into_iter().next() {
            return f;
        }
        assert!(Instant::now() < deadline, "no form appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A manager over the same database that runs no server: the console of another process.
fn console_of(rig: &Rig, policy: &str) -> McpManager {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp.toml");
    std::fs::write(&path, servers(policy)).expect("write");
    McpManager::new(rig.db.clone(), &mcp::config::load(&path, &|_| true).expect("config"), server::tools::checkpoint::SecretSource::empty())
}

fn answer_of(out: &Value) -> Value {
    serde_json::from_str(&text_of(out)).expect("the fixture returns the answer as JSON")
}

async fn a_form_goes_to_the_owner_and_its_answer_back_once(db: TestDb) {
    let policy = "elicitation = \"owner\"\nelicitation_ttl = \"30s\"";
    let rig = Rig::new(db, &servers(policy)).await;
    rig.connected("fx").await;
    // Owners are told on WhatsApp, with the link to the form.
    sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('O', 'o', 'x', 1, 0, 0)").execute(&rig.db.pool).await.expect("owner");
    sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ('+15550002222', (SELECT MAX(id) FROM owners), 0)").execute(&rig.db.pool).await.expect("phone");
    rig.manager.set_owner_notices(mcp::OwnerNotices {
        queue: server::jobs::JobQueue::new(rig.db.clone()),
        public_url: "https://console.example".into(),
        settings: server::config::McpSettings::default(),
    });
    let console = console_of(&rig, policy);
    let call = ask(&rig, json!({ "message": "<b>Book</b> for <script>x</script>?" }), Some("chat-1"), "elicit-test");
    let form = waiting_form(&console).await;
    assert_eq!(form.server, "fx");
    assert_eq!(form.message, "<b>Book</b> for <script>x</script>?", "the server's text is kept as text (the page escapes it)");
    let defaults: Vec<(String, Option<Value>, bool)> = form.fields.iter().map(|f| (f.name.clone(), f.default.clone(), f.required)).collect();
    assert!(defaults.contains(&("seats".into(), Some(json!(2)), false)) && defaults.contains(&("confirm".into(), None, true)), "{defaults:?}");

    // Values that do not fit the schema are refused with the field named; nothing is sent.
    let bad = console.answer_form(form.id, Answer::AcceptText(vec![("seats".into(), "50".into()), ("confirm".into(), "true".into())]), &owner()).await;
    assert!(matches!(&bad, Err(McpError::FormInvalid(e)) if e.field == "seats"), "{bad:?}");
    assert!(bad.expect_err("invalid").to_string().starts_with("MCP_ELICITATION_INVALID"));
    let missing = console.answer_form(form.id, Answer::Accept(Map::new()), &owner()).await;
    assert!(matches!(&missing, Err(McpError::FormInvalid(e)) if e.field == "confirm"), "a required field without a default: {missing:?}");

    // The owner accepts in another process; the waiting call polls the database for it.
    let accepted = console.answer_form(form.id, Answer::AcceptText(vec![("confirm".into(), "true".into()), ("name".into(), "Grace".into())]), &owner()).await;
    assert_eq!(accepted.expect("accepted"), "accepted");
    let again = console.answer_form(form.id, Answer::Decline, &owner()).await;
    assert!(matches!(again, Err(McpError::FormClosed(_))), "one answer: {again:?}");
    let out = tokio::time::timeout(Duration::from_secs(20), call).await.expect("the call ends").expect("task").expect("the call succeeds").output;
    assert_eq!(answer_of(&out), json!({ "action": "accept", "content": { "name": "Grace", "seats": 2, "plan": "basic", "confirm": true } }));
    assert!(console.forms().await.expect("forms").is_empty());

    let mut conn = rig.db.pool.acquire().await.expect("conn");
    let row = sqlx::query("SELECT state, delivered_at FROM mcp_elicitations WHERE id = $1").bind(form.id).fetch_one(&mut *conn).await.expect("row");
    assert_eq!(row.get::<String, _>("state"), "accepted");
    assert!(row.get::<Option<i64>, _>("delivered_at").is_some(), "taken by the call");
    // Audited with the fields, not the values; the owners were told.
    let audit: Vec<String> = sqlx::query_scalar("SELECT detail FROM owner_audit WHERE event = 'mcp_elicitation_answered'").fetch_all(&mut *conn).await.expect("audit");
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("\"confirm\"") && !audit[0].contains("Grace"), "{}", audit[0]);
    let notices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM owner_notifications WHERE reason_code = 'MCP_ELICITATION_WAITING'").fetch_one(&mut *conn).await.expect("notices");
    assert_eq!(notices, 1);
    let deliveries: Vec<String> = sqlx::query_scalar("SELECT args FROM jobs WHERE kind = 'owner.notify'").fetch_all(&mut *conn).await.expect("jobs");
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    let delivery: Value = serde_json::from_str(&deliveries[0]).expect("json");
    assert_eq!(delivery["to"], "15550002222");
    let text = delivery["message"].as_str().unwrap_or_default();
    assert!(text.contains(&format!("https://console.example/mcp#elicitation-{}", form.id)) && !text.contains("<script>"), "the link, not the server's words: {text}");
    drop(conn);
    rig.manager.shutdown().await;
}
both_backends!(mcp_elicitation_owner_answers, a_form_goes_to_the_owner_and_its_answer_back_once);

async fn an_unanswered_form_is_cancelled_in_time_and_a_decline_goes_back(db: TestDb) {
    let policy = "elicitation = \"owner\"\nelicitation_ttl = \"1s\"";
    let rig = Rig::new(db, &servers(policy)).await;
    rig.connected("fx").await;
    let started = Instant::now();
    let out = rig.call("fx__ask", json!({})).await.expect("the call goes on").output;
    assert_eq!(answer_of(&out)["action"], "cancel", "nobody answered");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let mut conn = rig.db.pool.acquire().await.expect("conn");
    let (id, state): (i64, String) = sqlx::query_as("SELECT id, state FROM mcp_elicitations").fetch_one(&mut *conn).await.expect("row");
    drop(conn);
    assert_eq!(state, "expired");
    let late = rig.manager.answer_form(id, Answer::Accept(Map::new()), &owner()).await;
    assert!(matches!(late, Err(McpError::FormClosed(_))), "{late:?}");
    assert!(matches!(rig.manager.answer_form(id + 100, Answer::Decline, &owner()).await, Err(McpError::FormUnknown(_))));

    // A decline in this process reaches the server at once.
    let call = ask(&rig, json!({}), None, "elicit-decline");
    let form = waiting_form(&rig.manager).await;
    assert_eq!(rig.manager.answer_form(form.id, Answer::Decline, &owner()).await.expect("declined"), "declined");
    let out = call.await.expect("task").expect("the call goes on").output;
    assert_eq!(answer_of(&out), json!({ "action": "decline" }));
    rig.manager.shutdown().await;
}
both_backends!(mcp_elicitation_expiry_and_decline, an_unanswered_form_is_cancelled_in_time_and_a_decline_goes_back);

/// A server that asks for many forms at once has only a few wait for the owners (each one is a
/// notice to every owner); the rest are declined at once.
async fn a_flood_of_forms_is_bounded(db: TestDb) {
    let policy = "elicitation = \"owner\"\nelicitation_ttl = \"3s\"";
    let rig = Rig::new(db, &servers(policy)).await;
    rig.connected("fx").await;
    let calls: Vec<_> = (0..5)
        .map(|n| {
            ask(&rig, json!({}), None, &format!("elicit-flood-{n}"))
        })
        .collect();
    let mut actions = Vec::new();
    for call in calls {
        let out = tokio::time::timeout(Duration::from_secs(30), call).await.expect("the call ends").expect("task").expect("the call goes on").output;
        actions.push(answer_of(&out)["action"].as_str().unwrap_or_default().to_string());
    }
    actions.sort();
    assert_eq!(actions, ["cancel", "cancel", "cancel", "decline", "decline"], "three waited (and nobody answered), two were declined");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mcp_elicitations").fetch_one(&rig.db.pool).await.expect("count");
    assert_eq!(stored, 3);
    // Those three are over (no owner answered), but asking again within the minute is declined
    // too: asking, withdrawing and asking again does not page the owners without end.
    let again = tokio::time::timeout(Duration::from_secs(30), ask(&rig, json!({}), None, "elicit-flood-again")).await.expect("the call ends").expect("task").expect("the call goes on").output;
    assert_eq!(answer_of(&again)["action"], "decline", "{again}");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mcp_elicitations").fetch_one(&rig.db.pool).await.expect("count");
    assert_eq!(stored, 3, "no fourth form, no fourth notice");
    rig.manager.shutdown().await;
}
both_backends!(mcp_elicitation_flood, a_flood_of_forms_is_bounded);

/// With the default policy nobody is asked: the capability is not announced, so the server
/// cannot even send its request, and no form is stored.
async fn by_default_no_one_is_asked(db: TestDb) {
    let rig = Rig::new(db, &servers("")).await;
    rig.connected("fx").await;
    let failure = rig.call("fx__ask", json!({})).await.expect_err("the server reports its error");
    assert!(failure.message.contains("does not support form elicitation"), "{failure:?}");
    assert!(rig.manager.forms().await.expect("forms").is_empty());
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mcp_elicitations").fetch_one(&rig.db.pool).await.expect("count");
    assert_eq!(stored, 0);
    rig.manager.shutdown().await;
}
both_backends!(mcp_elicitation_declined_by_default, by_default_no_one_is_asked);

/// The console over HTTP: the form on the MCP servers page (the server's message escaped and
/// labelled as the server's, defaults filled in), and the answer through the server function
/// with its stable codes.
async fn the_console_shows_the_form_and_takes_one_answer(db: TestDb) {
    let app = crate::support::TestApp::new(db).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let schema = json!({ "type": "object", "properties": {
        "seats": { "type": "integer", "minimum": 1, "maximum": 10, "default": 2 },
        "plan": { "type": "string", "enum": ["basic", "pro"], "default": "pro" }
    } });
    let id = {
        let mut conn = app.state.db.pool.acquire().await.expect("conn");
        let expires = server::db::now_ms() + 60_000;
        server::db::mcp_elicitations::insert(&mut conn, "fx", "Pick <script>alert(1)</script> now", &schema.to_string(), expires, 3).await.expect("insert").expect("below the limit")
    };
    let page = owner.get("/mcp").await;
    assert_eq!(page.status, axum::http::StatusCode::OK);
    assert!(page.body.contains(&format!("elicitation-{id}")), "the form is on the page");
    assert!(page.body.contains("Message from the server fx (untrusted"), "labelled as the server's");
    assert!(page.body.contains("Pick &lt;script&gt;alert(1)&lt;/script&gt; now") && !page.body.contains("<script>alert(1)"), "escaped");
    assert!(page.body.contains("name=\"values[seats]\"") && page.body.contains("value=\"2\""), "the default is filled in");

    let bad = owner.post_form("/api/mcp_answer_form", &[("id", &id.to_string()), ("decision", "accept"), ("values[seats]", "11")]).await;
    assert_eq!(bad.status, axum::http::StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains("MCP_ELICITATION_INVALID") && bad.body.contains("seats"), "{}", bad.body);
    let ok = owner.post_form("/api/mcp_answer_form", &[("id", &id.to_string()), ("decision", "accept"), ("values[seats]", "3")]).await;
    assert_eq!(ok.status, axum::http::StatusCode::OK, "{}", ok.body);
    let again = owner.post_form("/api/mcp_answer_form", &[("id", &id.to_string()), ("decision", "decline")]).await;
    assert_eq!(again.status, axum::http::StatusCode::CONFLICT, "{}", again.body);
    assert!(again.body.contains("MCP_ELICITATION_CLOSED"), "{}", again.body);
    let content: Option<String> = sqlx::query_scalar("SELECT content FROM mcp_elicitations WHERE id = $1").bind(id).fetch_one(&app.state.db.pool).await.expect("row");
    assert_eq!(serde_json::from_str::<Value>(&content.expect("content")).expect("json"), json!({ "seats": 3, "plan": "pro" }));
    let unknown = owner.post_form("/api/mcp_answer_form", &[("id", "999999"), ("decision", "cancel")]).await;
    assert!(unknown.body.contains("MCP_ELICITATION_UNKNOWN"), "{}", unknown.body);
}
both_backends!(mcp_elicitation_console, the_console_shows_the_form_and_takes_one_answer);
