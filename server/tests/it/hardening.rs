//! Hardening found by review (issue 15), each test failing without its fix: audit rows that
//! must never be dropped, and a model reply with a NUL that must not be lost.

use std::sync::Arc;

use serde_json::json;
use server::{
    config::SecretSource,
    domain::{ChatKind, Role},
    jobs::JobQueue,
    tools::{CallContext, Catalog, Checkpoint, ToolCall, checkpoint::AuditWriter},
};

use crate::{both_backends, support::TestDb};

/// A tool name with a NUL byte (PostgreSQL refuses NUL in TEXT) used to fail its whole batch
/// ten times and then drop it, taking every other call's audit row with it.
async fn a_nul_in_one_call_loses_no_audit_row(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let cp = Checkpoint::new(pool.clone(), Arc::new(Catalog::default()), AuditWriter::spawn(pool.clone(), JobQueue::new(pool.clone())), SecretSource::empty());
    let ctx = CallContext {
        actor: Role::Customer,
        chat_type: ChatKind::Direct,
        chat_id: Some("chat-nul".into()),
        sender_id: None,
        correlation_id: "corr-nul".into(),
        approved: None,
        trace_id: None,
    };
    for name in ["first", "with\0nul", "third", "fourth"] {
        assert!(cp.execute(ToolCall { name: name.into(), args: json!({"q": "a\0b"}) }, &ctx).await.is_err(), "unknown tools are refused");
    }
    cp.audit().flush().await;
    let tools: Vec<(String,)> = sqlx::query_as("SELECT tool FROM tool_audit WHERE correlation_id = 'corr-nul' ORDER BY id").fetch_all(&pool.pool).await.expect("rows");
    let tools: Vec<String> = tools.into_iter().map(|(t,)| t).collect();
    assert_eq!(tools, vec!["first", "withnul", "third", "fourth"], "every row written, the NUL removed");
}
both_backends!(hardening_audit_nul, a_nul_in_one_call_loses_no_audit_row);

/// A model reply with a NUL used to fail the PostgreSQL insert after the model was paid for, so
/// the retried message asked the model again. Now the reply is kept (without the NUL) and a
/// retry gets it back from the record.
async fn a_nul_in_a_model_reply_keeps_the_reply(db: TestDb) {
    let (url, fake) = crate::conversation::fake_anthropic_saying("Open until\u{0} six").await;
    let secrets = server::config::Secrets::from_lookup(|name| (name == "ANTHROPIC_API_KEY").then(|| "test-key".to_string()));
    let app = crate::support::TestApp::with_secrets(db, secrets, |s| {
        s.llm.anthropic.base_url = url.clone();
        s.llm.max_retries = 0;
        s.models.chat = crate::conversation::CHAT_MODEL.into();
    })
    .await;
    let inbound = server::channel::Inbound {
        channel: "simulator".into(),
        message_id: "sim_nul".into(),
        chat_id: "sim-nul".into(),
        sender: "15550107777".into(),
        text: "When do you close?".into(),
        correlation_id: "corr-reply-nul".into(),
        ..Default::default()
    };
    let first = app.state.runtime.handle(&inbound).await.expect("handled");
    assert_eq!(first.reply.as_deref(), Some("Open until six"));
    let again = app.state.runtime.handle(&inbound).await.expect("handled again");
    assert_eq!(again.reply.as_deref(), Some("Open until six"), "a retry gets the recorded reply");
    assert_eq!(fake.lock().expect("lock").requests.len(), 1, "the model was asked once");
}
both_backends!(hardening_reply_nul, a_nul_in_a_model_reply_keeps_the_reply);
