//! Work handled a second time never makes a change twice. A message handled again (its first
//! run stopped before its reply was recorded: a crash, a full disk) that stored a write or asked
//! an owner is answered from what it stored, however the planner would plan it now. A write
//! with no idempotency key is not made again by a later run of its job after it was made but
//! its answer never kept, nor after it failed in a way that may still have taken effect; one
//! whose request never left is.

use serde_json::json;

use crate::{
    both_backends,
    lane::{PLANNER_MODEL, anthropic, tool_use},
    lane_e2e::{Rig, TOOLS, rig, rig_with},
    support::TestDb,
};

/// The shop's refund as a low-risk write, which a customer's message runs without an owner.
fn low_risk_refunds() -> String {
    let high = "operation = \"write\"\naudience = \"public\"\nrisk = \"high\"";
    assert!(TOOLS.contains(high), "the shop's refund tool");
    TOOLS.replacen(high, "operation = \"write\"\naudience = \"public\"\nrisk = \"low\"", 1)
}

/// From now on the planner proposes the refund with an argument it left out before: the same
/// request, planned again, as another call.
fn plan_refunds_differently(r: &Rig) {
    r.llm.always(|body| {
        if body["model"] == PLANNER_MODEL {
            return anthropic(json!([tool_use("t9", "refund_order", json!({ "order_id": "4821", "email": "ana@example.com" }))]), "tool_use");
        }
        anthropic(json!([{ "type": "text", "text": "Refunded again." }]), "end_turn")
    });
}

/// A write over GET, which carries no idempotency key, and a planner that proposes it.
const COUPONS: &str = r#"
[[tool]]
name = "issue_coupon"
title = "Issue a coupon"
description = "Issues a one-time apology coupon for an order."
triggers = ["coupon for my order"]
provider = "connector"
operation = "write"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 } } }
retry = { max_attempts = 3, backoff = "10ms" }
"#;

const COUPON_ACTION: &str = "\n[[connector.action]]\ntool = \"issue_coupon\"\nmethod = \"GET\"\npath = \"coupons/{order_id}\"\n";

async fn coupons(db: TestDb, tweak: impl FnOnce(&mut server::config::Settings) + Send + 'static) -> Rig {
    let r = rig_with(db, &format!("{TOOLS}{COUPONS}"), COUPON_ACTION, tweak).await;
    r.llm.always(|body| {
        if body["model"] == PLANNER_MODEL {
            let order = if body["messages"].to_string().contains("missing") { "missing" } else { "4821" };
            return anthropic(json!([tool_use("t1", "issue_coupon", json!({ "order_id": order }))]), "tool_use");
        }
        anthropic(json!([{ "type": "text", "text": "Here is your coupon: SORRY10." }]), "end_turn")
    });
    r
}

async fn count(r: &Rig, sql: &str) -> i64 {
    crate::whatsapp::count(&r.app, sql).await
}

async fn reply(r: &Rig, wamid: &str) -> String {
    sqlx::query_scalar("SELECT reply FROM message_replies WHERE message_id = $1").bind(wamid).fetch_one(&r.app.state.db.pool).await.expect("reply")
}

/// A message that made a change, handled again, is answered from the call it stored even
/// though the planner now proposes other arguments: the refund is made once, and the reply is
/// the kept answer. Before, the message was planned again and the refund made twice.
async fn a_write_is_not_made_again_when_its_message_is_planned_differently(db: TestDb) {
    let r = rig_with(db, &low_risk_refunds(), "", |_| {}).await;
    r.exchange(&[("wamid.W1", "Please refund my order 4821")], 1).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()]);
    let answer = r.graph.texts()[0].clone();
    let plans = r.planner_messages().len();
    plan_refunds_differently(&r);
    r.handle_again("wamid.W1").await;
    let steps = r.steps("wamid.W1").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "the refund was made once: {steps:?}");
    assert_eq!(r.planner_messages().len(), plans, "not planned again");
    assert!(steps.iter().any(|(s, d, _)| s == "AgentToolJobDedupe" && d == "handled_before"), "{steps:?}");
    assert_eq!(reply(&r, "wamid.W1").await, answer, "the kept answer is the reply again");
    assert_eq!(count(&r, "SELECT COUNT(*) FROM jobs WHERE kind = 'tool.call'").await, 1);
    assert_eq!(r.graph.texts(), vec![answer], "sent once");
}
both_backends!(again_write_planned_differently, a_write_is_not_made_again_when_its_message_is_planned_differently);

/// A message that asked an owner, handled again while the request waits, is told again that it
/// waits: the owners are not asked a second time about another call, however it is planned now.
async fn an_owner_is_not_asked_again_when_the_message_is_planned_differently(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    let waits = r.app.state.config.settings.lane.approval_reply.clone();
    r.exchange(&[("wamid.A1", "Please refund my order 4821")], 2).await;
    assert_eq!(r.graph.texts(), vec![waits.clone()]);
    plan_refunds_differently(&r);
    r.handle_again("wamid.A1").await;
    let steps = r.steps("wamid.A1").await;
    assert_eq!(count(&r, "SELECT COUNT(*) FROM approvals").await, 1, "one request: {steps:?}");
    assert_eq!(count(&r, "SELECT COUNT(*) FROM jobs WHERE kind = 'approval.ask'").await, 1, "the owner was asked once");
    assert_eq!(reply(&r, "wamid.A1").await, waits, "still waiting for the owner");
    assert!(steps.iter().any(|(s, d, _)| s == "AgentToolJobDedupe" && d == "handled_before"), "{steps:?}");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "nothing ran");
}
both_backends!(again_owner_planned_differently, an_owner_is_not_asked_again_when_the_message_is_planned_differently);

/// A write's job run again after its call was made but its answer could not be kept (the keep
/// failed, then a later write in the same run did too) does not make the call again: whether
/// it took effect is unknown, so the person is told so, and every owner too. Before, the call
/// was made once more on each such run.
async fn a_write_whose_answer_was_not_kept_is_not_made_again(db: TestDb) {
    let r = coupons(db, |_| {}).await;
    r.add_owner().await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.K1", "Can I have a coupon for my order 4821?")], 1).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["coupons/4821".to_string()]);
    // As if the run had not kept the answer, and had then stopped.
    sqlx::query("DELETE FROM tool_answers").execute(&r.app.state.db.pool).await.expect("no answer kept");
    r.run_again("tool.call").await;
    r.exchange(&[], 2).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["coupons/4821".to_string()], "the coupon was not issued again");
    let texts = r.graph.texts();
    assert!(texts.contains(&lane.unknown_outcome_reply), "the customer is told the outcome is unknown: {texts:?}");
    let (code, state): (Option<String>, String) = sqlx::query_as("SELECT last_error_code, state FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((code.as_deref(), state.as_str()), (Some("TOOL_OUTCOME_UNKNOWN"), "discarded"));
    let notice: String = sqlx::query_scalar("SELECT message FROM owner_notifications WHERE reason_code = 'TOOL_OUTCOME_UNKNOWN'").fetch_one(&r.app.state.db.pool).await.expect("owners told");
    let job: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert!(notice.starts_with(&format!("issue_coupon was started (job {job})")) && notice.ends_with(&format!("/jobs/{job}")), "{notice}");
    assert!(texts.contains(&notice), "the owner got it on WhatsApp: {texts:?}");
    // The unknown answer could not be kept either: the next run comes to it again (its send is
    // in the delivery ledger already), and the owners, told once, are not told again.
    sqlx::query("DELETE FROM tool_answers").execute(&r.app.state.db.pool).await.expect("no answer kept");
    r.run_again("tool.call").await;
    r.exchange(&[], texts.len()).await;
    assert_eq!(count(&r, "SELECT COUNT(*) FROM tool_answers").await, 1, "the second run kept its answer");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["coupons/4821".to_string()], "still not issued again");
    assert_eq!(count(&r, "SELECT COUNT(*) FROM owner_notifications WHERE reason_code = 'TOOL_OUTCOME_UNKNOWN'").await, 1, "the owners were told once");
    assert_eq!(count(&r, "SELECT COUNT(*) FROM jobs WHERE kind = 'owner.notify'").await, 1, "one WhatsApp notice");
}
both_backends!(again_write_not_kept, a_write_whose_answer_was_not_kept_is_not_made_again);

/// A write whose call failed in a way that may still have taken effect (the provider answered
/// 503: it may have issued the coupon before failing) is not made again, neither by the
/// checkpoint's own retries (the tool allows three tries) nor by a later attempt of its job:
/// the person is told its outcome is unknown. Before, it was sent up to three times in the run,
/// and again in the job's next run.
async fn a_write_that_may_have_taken_effect_is_not_made_again(db: TestDb) {
    let r = coupons(db, |s| {
        s.jobs.retry_base = std::time::Duration::from_millis(50);
        s.jobs.retry_max = std::time::Duration::from_millis(200);
    })
    .await;
    *r.shop.coupon_failures.lock().expect("lock") = 1;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.F1", "Can I have a coupon for my order 4821?")], 1).await;
    let texts = r.graph.texts();
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["coupons/4821".to_string()], "sent once: {texts:?}");
    assert_eq!(texts, vec![lane.unknown_outcome_reply.clone()]);
    let (code, state): (Option<String>, String) = sqlx::query_as("SELECT last_error_code, state FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((code.as_deref(), state.as_str()), (Some("TOOL_OUTCOME_UNKNOWN"), "discarded"));
}
both_backends!(again_write_maybe_applied, a_write_that_may_have_taken_effect_is_not_made_again);

/// A write its system refused with a definite answer (404: no such order) surely did not take
/// effect: the person is told it failed, not that its outcome is unknown, and no mark is left.
async fn a_write_refused_by_its_system_is_a_failure_not_an_unknown(db: TestDb) {
    let r = coupons(db, |_| {}).await;
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.M1", "Can I have a coupon for my order missing?")], 1).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["coupons/missing".to_string()], "sent once");
    assert_eq!(r.graph.texts(), vec![lane.failed_reply.clone()]);
    assert_eq!(count(&r, "SELECT COUNT(*) FROM tool_call_starts").await, 0, "no mark left");
    assert_eq!(count(&r, "SELECT COUNT(*) FROM owner_notifications WHERE reason_code = 'TOOL_OUTCOME_UNKNOWN'").await, 0, "nobody alarmed");
}
both_backends!(again_write_refused, a_write_refused_by_its_system_is_a_failure_not_an_unknown);

/// A write whose request never left (its system refuses connections) surely did not take
/// effect: its mark is removed and the job's next attempt makes it again, and the person is
/// told it failed, not that its outcome is unknown.
async fn a_write_that_never_left_is_tried_again(db: TestDb) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let tool = COUPONS.replace("issue_coupon", "issue_voucher").replace("coupon for my order", "voucher for my order");
    let connector = format!(
        "\n[[connector]]\nid = \"closed\"\ntitle = \"A system that is down\"\nbase_url = \"http://{closed}/api\"\nallowed_urls = [\"http://{closed}/api/vouchers/*\"]\n\n[[connector.action]]\ntool = \"issue_voucher\"\nmethod = \"GET\"\npath = \"vouchers/{{order_id}}\"\n"
    );
    let r = rig_with(db, &format!("{TOOLS}{tool}"), &connector, |s| {
        s.jobs.default_max_attempts = 2;
        s.jobs.retry_base = std::time::Duration::from_millis(50);
        s.jobs.retry_max = std::time::Duration::from_millis(200);
    })
    .await;
    r.llm.always(|body| {
        if body["model"] == PLANNER_MODEL {
            return anthropic(json!([tool_use("t1", "issue_voucher", json!({ "order_id": "4821" }))]), "tool_use");
        }
        anthropic(json!([{ "type": "text", "text": "unused" }]), "end_turn")
    });
    let lane = r.app.state.config.settings.lane.clone();
    r.exchange(&[("wamid.V1", "Can I have a voucher for my order 4821?")], 2).await;
    let texts = r.graph.texts();
    assert_eq!(texts, vec![lane.pending_reply.clone(), lane.failed_reply.clone()], "tried again, then told it failed");
    let (attempt, state): (i64, String) = sqlx::query_as("SELECT attempt, state FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((attempt, state.as_str()), (2, "discarded"));
    assert_eq!(count(&r, "SELECT COUNT(*) FROM tool_call_starts").await, 0, "no mark left: nothing was made");
}
both_backends!(again_write_never_left, a_write_that_never_left_is_tried_again);
