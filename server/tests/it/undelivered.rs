//! A message Meta reports undelivered (a `failed` status after it accepted the send) leaves the
//! person waiting: the owners are told, in the console and on WhatsApp, once per chat per
//! period, never for a failed message to an owner. So does a person's message dropped
//! unanswered (its job failed for good).

use serde_json::json;

use crate::{
    both_backends,
    lane_e2e::{CUSTOMER, OWNER, rig},
    support::TestDb,
    whatsapp::{envelope, graph_error, post_signed, status_envelope, text_message},
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
    // The message's job, failed for good with its reply, is dropped: the notice above says it
    // all, and no second one follows.
    assert!(unhandled_notices(&r).await.is_empty());
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'whatsapp.unhandled'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert!(preview.as_deref().is_some_and(|p| p.contains("refused its reply for good")), "{preview:?}");
}
both_backends!(undelivered_refused_send, the_owners_hear_of_a_refused_reply);

const OTHER_CUSTOMER: &str = "15550009876";

async fn unhandled_notices(r: &crate::lane_e2e::Rig) -> Vec<String> {
    sqlx::query_scalar("SELECT message FROM owner_notifications WHERE reason_code = 'MESSAGE_UNHANDLED' ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("notices")
}

/// A person's message whose job is dropped (here every send of its reply fails until its one
/// attempt is used up) leaves them waiting: the owners are told once per chat, with a link to
/// the job, and on WhatsApp once per cause; an owner's retry answers it. An owner's own message
/// raises none.
async fn the_owners_hear_of_an_unhandled_message(db: TestDb) {
    let r = rig(db, |s| {
        s.jobs.attempts.whatsapp_inbound = 1;
        s.whatsapp.send_attempts = 1;
    })
    .await;
    r.add_owner().await;
    r.graph.set_rule(|body, _| (body["to"] != OWNER).then(|| graph_error(503, 2, "Service temporarily unavailable")));
    r.exchange(&[("wamid.H1", "Hi there, are you open on Sunday?")], 2).await;
    let pool = &r.app.state.db.pool;
    let (job_id, state, code): (i64, String, String) =
        sqlx::query_as("SELECT id, state, last_error_code FROM jobs WHERE kind = 'whatsapp.inbound' AND message_id = 'wamid.H1'").fetch_one(pool).await.expect("job");
    assert_eq!(state, "discarded");
    let told = unhandled_notices(&r).await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(code, "2", "Meta's error code");
    assert!(told[0].contains(&format!("+{CUSTOMER}")) && told[0].contains(&format!("/jobs/{job_id}")) && told[0].contains("(WHATSAPP_2)"), "{}", told[0]);
    assert_eq!(r.graph.sends().last().and_then(|m| m["to"].as_str()), Some(OWNER), "told on WhatsApp too");
    let (of_notice, of_job): (String, String) = sqlx::query_as(
        "SELECT n.correlation_id, j.correlation_id FROM owner_notifications n, jobs j WHERE n.reason_code = 'MESSAGE_UNHANDLED' AND j.id = $1",
    )
    .bind(job_id)
    .fetch_one(pool)
    .await
    .expect("correlation ids");
    assert_eq!(of_notice, of_job, "the notice carries the dropped job's correlation id");
    let chat: Option<String> = sqlx::query_scalar("SELECT chat_id FROM jobs WHERE kind = 'whatsapp.unhandled'").fetch_one(pool).await.expect("the notice's job");
    assert_eq!(chat.as_deref(), Some(CUSTOMER), "listed under the chat");
    assert!(notices(&r).await.is_empty(), "no undelivered-reply notice beside it");

    // Another of the chat's messages dropped within the period: the owners were told already.
    r.exchange(&[("wamid.H2", "Hello? Anyone there?")], 3).await;
    assert_eq!(unhandled_notices(&r).await.len(), 1, "once per chat per period");

    // Another person's message dropped for the same cause: in the console, but the owners heard
    // of this cause on WhatsApp already.
    let to_owner = || r.graph.sends().iter().filter(|m| m["to"] == OWNER).count();
    assert_eq!(to_owner(), 1);
    let other = envelope(vec![vec![text_message(OTHER_CUSTOMER, "wamid.H3", "Are you open today?")]]);
    assert_eq!(post_signed(&r.app, &other).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 4).await;
    let told = unhandled_notices(&r).await;
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(told[1].contains(&format!("+{OTHER_CUSTOMER}")), "{}", told[1]);
    assert_eq!(to_owner(), 1, "one WhatsApp notice per cause per period");

    // An owner's own message dropped: they saw no answer, and are not told of it.
    let from_owner = envelope(vec![vec![text_message(OWNER, "wamid.H4", "How many orders today?")]]);
    r.graph.set_rule(|_, _| Some(graph_error(503, 2, "Service temporarily unavailable")));
    assert_eq!(post_signed(&r.app, &from_owner).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 5).await;
    assert_eq!(unhandled_notices(&r).await.len(), 2, "no notice of an owner's message");
    let previews: Vec<Option<String>> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'whatsapp.unhandled' ORDER BY id").fetch_all(pool).await.expect("jobs");
    assert!(previews.last().and_then(Option::as_deref).is_some_and(|p| p.contains("an owner's message")), "{previews:?}");

    // An owner retries the first once the trouble is over: the person is answered.
    r.graph.set_rule(|_, _| None);
    let retried = server::db::jobs::retry_now(&mut pool.acquire().await.expect("conn"), job_id, server::db::now_ms()).await.expect("retry");
    assert!(retried);
    r.exchange(&[], 6).await;
    assert_eq!(r.graph.sends().last().and_then(|m| m["to"].as_str()), Some(CUSTOMER));
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1").bind(job_id).fetch_one(pool).await.expect("job");
    assert_eq!(state, "completed");
}
both_backends!(unhandled_message_notice, the_owners_hear_of_an_unhandled_message);
