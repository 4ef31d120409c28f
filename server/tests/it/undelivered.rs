//! A message Meta reports undelivered (a `failed` status after it accepted the send) leaves the
//! person waiting: the owners are told, in the console and on WhatsApp, once per chat per
//! period, never for a failed message to an owner.

use serde_json::json;

use crate::{
    both_backends,
    lane_e2e::{CUSTOMER, OWNER, rig},
    support::TestDb,
    whatsapp::{graph_error, post_signed, status_envelope},
};

fn failed(wamid: &str, to: &str) -> String {
    failed_with(wamid, to, 131026)
}

fn failed_with(wamid: &str, to: &str, code: i64) -> String {
    status_envelope(vec![json!({ "id": wamid, "status": "failed", "timestamp": "1739321040", "recipient_id": to,
        "errors": [{ "code": code, "title": "Message undeliverable", "message": "Message undeliverable" }] })])
}

async fn notices(r: &crate::lane_e2e::Rig) -> Vec<String> {
    sqlx::query_scalar("SELECT message FROM owner_notifications WHERE reason_code = 'REPLY_UNDELIVERED' ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("notices")
}

async fn last_wamid_to(r: &crate::lane_e2e::Rig, to: &str) -> String {
    sqlx::query_scalar("SELECT wamid FROM whatsapp_outbound WHERE recipient = $1 AND wamid IS NOT NULL ORDER BY id DESC LIMIT 1").bind(to).fetch_one(&r.app.state.db.pool).await.expect("a sent message")
}

async fn the_owners_hear_of_an_undelivered_reply_once(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.add_owner().await;
    r.exchange(&[("wamid.U1", "Hi there, are you open on Sunday?")], 1).await;
    let reply = last_wamid_to(&r, CUSTOMER).await;
    assert_eq!(post_signed(&r.app, &failed(&reply, CUSTOMER)).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 2).await;
    let told = notices(&r).await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains(&format!("+{CUSTOMER}")) && told[0].contains("WHATSAPP_131026") && told[0].contains("/traces/"), "{}", told[0]);
    let sent = r.graph.sends();
    let to_owner = sent.last().expect("a send");
    assert_eq!((to_owner["to"].as_str(), to_owner["text"]["body"].as_str()), (Some(OWNER), Some(told[0].as_str())));
    // It carries the correlation id of the work whose reply failed.
    let pool = &r.app.state.db.pool;
    let of_notice: String = sqlx::query_scalar("SELECT correlation_id FROM owner_notifications WHERE reason_code = 'REPLY_UNDELIVERED'").fetch_one(pool).await.expect("notice");
    let of_reply: String = sqlx::query_scalar("SELECT j.correlation_id FROM jobs j JOIN whatsapp_outbound o ON o.job_id = j.id WHERE o.recipient = $1 ORDER BY o.id LIMIT 1").bind(CUSTOMER).fetch_one(pool).await.expect("reply's job");
    assert_eq!(of_notice, of_reply);

    // Another failure in the same chat within the period: the owners were told already.
    r.exchange(&[("wamid.U2", "Hello? Anyone?")], 3).await;
    let reply = last_wamid_to(&r, CUSTOMER).await;
    assert_eq!(post_signed(&r.app, &failed(&reply, CUSTOMER)).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 3).await;
    assert_eq!(notices(&r).await.len(), 1, "once per chat per period");

    // The owner's own notice failing raises none.
    let notice = last_wamid_to(&r, OWNER).await;
    assert_eq!(post_signed(&r.app, &failed(&notice, OWNER)).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 3).await;
    assert_eq!(notices(&r).await.len(), 1, "no notice about a notice");
    let previews: Vec<Option<String>> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'whatsapp.undelivered' ORDER BY id").fetch_all(&r.app.state.db.pool).await.unwrap_or_default();
    assert_eq!(previews.len(), 3, "{previews:?}");
}
both_backends!(undelivered_reply_notice, the_owners_hear_of_an_undelivered_reply_once);

/// Outside the 24-hour window the configured template goes in the reply's place: that is no
/// undelivered message, and the owners are not told.
async fn a_reply_the_window_template_replaces_raises_no_notice(db: TestDb) {
    let r = rig(db, |s| s.whatsapp.window_template = "back_soon".into()).await;
    r.add_owner().await;
    r.exchange(&[("wamid.T1", "Hi there, are you open on Sunday?")], 1).await;
    let reply = last_wamid_to(&r, CUSTOMER).await;
    assert_eq!(post_signed(&r.app, &failed_with(&reply, CUSTOMER, 131047)).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 2).await;
    assert_eq!(r.graph.sends().last().and_then(|m| m["type"].as_str()), Some("template"), "the template went instead");
    assert!(notices(&r).await.is_empty(), "no notice");
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'whatsapp.undelivered'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert!(preview.is_some_and(|p| p.contains("window template")));
}
both_backends!(undelivered_window_template, a_reply_the_window_template_replaces_raises_no_notice);

/// A reply Meta refuses for good when it is sent (not later, by a status) also leaves the person
/// waiting: the owners are told, and the notice links to the chat.
async fn the_owners_hear_of_a_refused_reply(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.add_owner().await;
    r.graph.set_rule(|body, _| (body["to"] == CUSTOMER).then(|| graph_error(400, 131026, "Message undeliverable")));
    r.exchange(&[("wamid.R1", "Hi there, are you open on Sunday?")], 1).await;
    let told = notices(&r).await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains(&format!("+{CUSTOMER}")) && told[0].contains("WHATSAPP_131026") && told[0].contains(&format!("/conversations/whatsapp/{CUSTOMER}")), "{}", told[0]);
    assert_eq!(r.graph.sends().last().and_then(|m| m["to"].as_str()), Some(OWNER));
}
both_backends!(undelivered_refused_send, the_owners_hear_of_a_refused_reply);
