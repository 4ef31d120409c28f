//! A message Meta reports undelivered (a `failed` status after it accepted the send) leaves the
//! person waiting: the owners are told, in the console and on WhatsApp, once per chat per
//! period, never for a failed message to an owner.

use serde_json::json;

use crate::{
    both_backends,
    lane_e2e::{CUSTOMER, OWNER, rig},
    support::TestDb,
    whatsapp::{post_signed, status_envelope},
};

fn failed(wamid: &str, to: &str) -> String {
    status_envelope(vec![json!({ "id": wamid, "status": "failed", "timestamp": "1739321040", "recipient_id": to,
        "errors": [{ "code": 131026, "title": "Message undeliverable", "message": "Message undeliverable" }] })])
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
