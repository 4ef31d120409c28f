//! Owner approvals end to end: a customer's high-risk write waits for an owner's WhatsApp
//! button (pressed twice, delivered twice, by the wrong person, with a forged nonce), twenty
//! owners deciding at once, expiry, a tool whose definition changed since the request, and the
//! `gatehouse approvals` commands with real processes killed with SIGKILL between the request
//! and the decision and in the middle of the approved call.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Json, Router, extract::State, http::HeaderMap};
use serde_json::{Value, json};

use crate::{
    both_backends,
    lane_e2e::{CUSTOMER, Rig, TOOLS, connectors, rig},
    procs::{Gatehouse, kill_nine, wait_for},
    support::TestDb,
    whatsapp::{envelope, post_signed, text_message},
};

use crate::lane_e2e::OWNER;

fn button_press(from: &str, wamid: &str, id: &str) -> Value {
    json!({ "from": from, "id": wamid, "timestamp": "1739321030", "type": "interactive",
        "interactive": { "type": "button_reply", "button_reply": { "id": id, "title": "Approve" } } })
}

impl Rig {
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
    // Why it waits is said in words (config), and the code is kept beside them.
    let words = r.app.state.config.settings.approvals.reason_words("APPROVAL_CUSTOMER_HIGH_RISK_WRITE").expect("shipped words");
    let body = asks[0]["interactive"]["body"]["text"].as_str().unwrap_or_default();
    assert!(body.contains(&format!("Why it waits: {words}")) && !body.contains("APPROVAL_"), "{body}");
    let (code, reason): (String, String) = sqlx::query_as("SELECT reason_code, reason FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("reason");
    assert_eq!((code.as_str(), reason.as_str()), ("APPROVAL_CUSTOMER_HIGH_RISK_WRITE", words.as_str()));

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
    let keys = r.shop.refund_keys.lock().expect("lock").clone();
    assert!(keys.len() == 1 && keys[0].starts_with("gatehouse-") && keys[0].len() > 20, "the write carries an idempotency key: {keys:?}");
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

/// The approved call ran, but its answer cannot reach the customer (Meta refuses it for good):
/// the outcome is still recorded, and the deciding owner still told.
async fn an_undeliverable_answer_still_records_the_outcome(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    r.exchange(&[("wamid.UNDELIVERABLE", "Please refund my order 4821")], 2).await;
    let (id, nonce): (i64, String) = sqlx::query_as("SELECT id, nonce FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    r.graph.set_rule(|body, _| (body["to"] == CUSTOMER).then(|| crate::whatsapp::graph_error(400, 131026, "Message undeliverable")));
    r.press(vec![button_press(OWNER, "wamid.OK", &format!("gh-approval:{id}:approve:{nonce}"))], 3).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "the call ran");
    let outcome: Option<String> = sqlx::query_scalar("SELECT outcome_code FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!(outcome.as_deref(), Some("OK"));
    let told: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE dedupe_key = $1").bind(format!("approval:{id}:outcome")).fetch_one(&r.app.state.db.pool).await.expect("notice");
    assert_eq!(told, 1, "the deciding owner is told the outcome");
}
both_backends!(approvals_undeliverable_outcome, an_undeliverable_answer_still_records_the_outcome);

/// The expiry's message reaches WhatsApp after the person's 24-hour window closed (a ttl past
/// it, no template): Meta refuses it, and the job says so instead of "told the person who asked".
async fn an_expiry_outside_the_window_is_not_called_told(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.customer_max_risk = server::config::lane::RiskCeiling::High;
        s.approvals.ttl = Duration::from_secs(1);
    })
    .await;
    r.add_owner().await;
    let expired = r.app.state.config.settings.approvals.requester_expired.clone();
    r.graph.set_rule(move |body, _| (body["to"] == CUSTOMER && body["text"]["body"] == expired.as_str()).then(|| crate::whatsapp::graph_error(400, 131047, "Re-engagement message")));
    // The request's reply, the owner's question, then (a second later) the refused expiry notice.
    r.exchange(&[("wamid.EXP2", "Please refund my order 4821")], 3).await;
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'approval.settle' AND state = 'completed'").fetch_one(&r.app.state.db.pool).await.expect("job");
    let preview = preview.unwrap_or_default();
    assert_eq!(preview, "not delivered to the person who asked (WHATSAPP_131047)");
}
both_backends!(approvals_expiry_outside_window, an_expiry_outside_the_window_is_not_called_told);

/// A rig in which customers may ask for high-risk calls, the first send of `lane.approval_reply`
/// meets a Meta server error, and the message's job tries its reply again long after any
/// decision. With that reply and `approvals.requester_rejected`.
async fn waiting_reply_refused_once(db: TestDb) -> (Rig, String, String) {
    let r = rig(db, |s| {
        s.lane.customer_max_risk = server::config::lane::RiskCeiling::High;
        s.whatsapp.send_attempts = 1;
        s.jobs.retry_base = Duration::from_secs(3600);
        s.jobs.retry_max = Duration::from_secs(7200);
    })
    .await;
    let waiting = r.app.state.config.settings.lane.approval_reply.clone();
    let told = r.app.state.config.settings.approvals.requester_rejected.clone();
    let (failed, reply) = (Arc::new(AtomicBool::new(false)), waiting.clone());
    r.graph.set_rule(move |body, _| (body["text"]["body"] == reply.as_str() && !failed.swap(true, Ordering::SeqCst)).then(|| crate::whatsapp::graph_error(503, 2, "Service temporarily unavailable")));
    (r, waiting, told)
}

/// "That needs the owner's approval" is said only while it is true: the reply whose send is
/// retried after the owner's decision reached the customer is not sent (`REPLY_SUPERSEDED`).
/// Before, the customer read that an owner was asked after they were told the decision.
async fn a_wait_for_an_owner_overtaken_by_the_decision_is_not_said(db: TestDb) {
    let (r, waiting, told) = waiting_reply_refused_once(db).await;
    r.add_owner().await;
    // The refused reply and the owner's question.
    r.exchange(&[("wamid.WAITING", "Please refund my order 4821")], 2).await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let rejected = owner.post_form("/api/decide_approval", &[("id", id.to_string().as_str()), ("decision", "reject")]).await;
    assert_eq!(rejected.status, axum::http::StatusCode::OK, "{}", rejected.body);
    let to_customer = || r.graph.sends().into_iter().filter(|b| b["to"] == CUSTOMER).filter_map(|b| b["text"]["body"].as_str().map(String::from)).collect::<Vec<_>>();
    r.exchange(&[], 3).await;
    assert_eq!(to_customer(), vec![waiting.clone(), told.clone()], "the refused reply, then the decision");
    // The message's job tries its reply again.
    sqlx::query("UPDATE jobs SET scheduled_at = 0 WHERE kind = 'whatsapp.inbound' AND state = 'retryable'").execute(&r.app.state.db.pool).await.expect("due");
    r.exchange(&[], 3).await;
    assert_eq!(to_customer(), vec![waiting, told], "nothing after the decision");
    let steps = r.steps("wamid.WAITING").await;
    assert!(steps.iter().any(|(s, d, c)| s == "delivery" && d == "skipped" && c == "REPLY_SUPERSEDED"), "{steps:?}");
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&r.app.state.db.pool).await.expect("the message's job");
    assert_eq!(state, "completed");
}
both_backends!(approvals_wait_superseded, a_wait_for_an_owner_overtaken_by_the_decision_is_not_said);

/// A message that asked two requests (a message handled again, whose first run asked one and
/// whose second asked another), one of them decided: the other still waits, so the word that an
/// owner was asked, sent again, still goes out.
async fn a_wait_for_two_requests_is_said_while_one_waits(db: TestDb) {
    let (r, waiting, told) = waiting_reply_refused_once(db).await;
    r.exchange(&[("wamid.TWO", "Please refund my order 4821")], 1).await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), message_id: "wamid.TWO".into(), actor: server::domain::Role::Customer, ..console_requester("corr-two") };
    r.app.gatehouse.approvals.request(&json_call("4822"), &who, None, None).await.expect("the second request");
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM approvals ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("approvals");
    assert_eq!(ids.len(), 2);
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let rejected = owner.post_form("/api/decide_approval", &[("id", ids[0].to_string().as_str()), ("decision", "reject")]).await;
    assert_eq!(rejected.status, axum::http::StatusCode::OK, "{}", rejected.body);
    r.exchange(&[], 2).await;
    sqlx::query("UPDATE jobs SET scheduled_at = 0 WHERE kind = 'whatsapp.inbound' AND state = 'retryable'").execute(&r.app.state.db.pool).await.expect("due");
    r.exchange(&[], 3).await;
    let to_customer: Vec<String> = r.graph.sends().into_iter().filter(|b| b["to"] == CUSTOMER).filter_map(|b| b["text"]["body"].as_str().map(String::from)).collect();
    assert_eq!(to_customer, vec![waiting.clone(), told, waiting], "the other request still waits");
}
both_backends!(approvals_wait_one_of_two, a_wait_for_two_requests_is_said_while_one_waits);

/// Requests `order`'s refund for `who`, approves it and cancels its job on the console: the job.
async fn approve_then_cancel(r: &Rig, owner: &mut crate::support::Client, who: &server::approvals::Requester, order: &str) -> i64 {
    let requested = r.app.gatehouse.approvals.request(&json_call(order), who, None, None).await.expect("request");
    let id = requested.id.to_string();
    let approved = owner.post_form("/api/decide_approval", &[("id", id.as_str()), ("decision", "approve")]).await;
    assert_eq!(approved.status, axum::http::StatusCode::OK, "{}", approved.body);
    let job: i64 = sqlx::query_scalar("SELECT job_id FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&r.app.state.db.pool).await.expect("job");
    let cancelled = owner.post_form("/api/cancel_job", &[("id", job.to_string().as_str())]).await;
    assert_eq!(cancelled.status, axum::http::StatusCode::OK, "{}", cancelled.body);
    job
}

/// A customer's approved call whose job an owner cancels, then retries: the person, told it was
/// stopped, hears nothing more, and the call is not made; nor when the retry comes before the
/// cancel's follow-up has run.
async fn a_cancelled_approved_call_retried_is_not_made(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let stopped = r.app.state.config.settings.lane.cancelled_reply.clone();
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, ..console_requester("corr-cancel-chat") };
    let to_customer = || r.graph.sends().into_iter().filter(|b| b["to"] == CUSTOMER).filter_map(|b| b["text"]["body"].as_str().map(String::from)).collect::<Vec<_>>();
    let first = approve_then_cancel(&r, &mut owner, &who, "7272").await;
    r.exchange(&[], 1).await;
    assert_eq!(to_customer(), vec![stopped.clone()]);
    let retried = owner.post_form("/api/retry_job", &[("id", first.to_string().as_str())]).await;
    assert_eq!(retried.status, axum::http::StatusCode::OK, "{}", retried.body);
    r.exchange(&[], 1).await;
    assert_eq!(to_customer(), vec![stopped.clone()], "nothing more said");
    // Nor is it run again as a job of its own: an approval runs its call once.
    let again = owner.post_form("/api/run_job_again", &[("id", first.to_string().as_str())]).await;
    assert_eq!((again.status, again.json()["code"].as_str()), (axum::http::StatusCode::CONFLICT, Some("RUN_AGAIN_APPROVED")), "{}", again.body);
    // Retried at once, before the cancel's follow-up ran.
    let second = approve_then_cancel(&r, &mut owner, &who, "7373").await;
    let retried = owner.post_form("/api/retry_job", &[("id", second.to_string().as_str())]).await;
    assert_eq!(retried.status, axum::http::StatusCode::OK, "{}", retried.body);
    r.exchange(&[], 2).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "neither call was made");
    assert_eq!(to_customer(), vec![stopped.clone(), stopped.clone()], "each person told once that it stopped, the retry at once too");
    for job in [first, second] {
        let (state, code): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_code FROM jobs WHERE id = $1").bind(job).fetch_one(&r.app.state.db.pool).await.expect("job");
        assert_eq!((state.as_str(), code.as_deref()), ("discarded", Some("APPROVAL_NOT_GRANTED")), "job {job}");
    }
    let outcomes: Vec<Option<String>> = sqlx::query_scalar("SELECT outcome_code FROM approvals ORDER BY id").fetch_all(&r.app.state.db.pool).await.expect("outcomes");
    assert_eq!(outcomes, vec![Some("JOB_CANCELLED".to_string()); 2]);
}
both_backends!(approvals_cancelled_retry_chat, a_cancelled_approved_call_retried_is_not_made);

/// Twenty owners deciding at once give one decision and one run; the losers are told who won.
async fn twenty_concurrent_approvals_give_one_run(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let who = console_requester("corr-20");
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

/// An approval runs its own job only: a job written by hand that names it (a copy of the run's
/// job, one from `gatehouse jobs enqueue`) never reaches the tool, and records no outcome on it.
async fn a_job_naming_an_approval_it_was_not_given_does_not_run(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let who = console_requester("corr-copy");
    let approvals = r.app.gatehouse.approvals.clone();
    let requested = approvals.request(&json_call("4821"), &who, None, None).await.expect("request");
    let by = server::db::approvals::Decider { name: "o".into(), owner_id: None, phone: None, via: "cli" };
    let run = approvals.decide(requested.id, server::approvals::Verdict::Approve, &by, None, None).await.expect("approve").job_id.expect("job");
    let args: String = sqlx::query_scalar("SELECT args FROM jobs WHERE id = $1").bind(run).fetch_one(&r.app.state.db.pool).await.expect("args");
    let copy: server::lane::job::ToolCallJob = serde_json::from_str(&args).expect("a tool call");
    let queue = &r.app.gatehouse.jobs;
    let forged = queue.enqueue(&queue.job(&copy)).await.expect("enqueue the copy").job.id;
    r.exchange(&[], 0).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "the approval's own job ran, once");
    let (code, state): (Option<String>, String) = sqlx::query_as("SELECT last_error_code, state FROM jobs WHERE id = $1").bind(forged).fetch_one(&r.app.state.db.pool).await.expect("copy");
    assert_eq!((code.as_deref(), state.as_str()), (Some("APPROVAL_NOT_GRANTED"), "discarded"));
    let outcome: Option<String> = sqlx::query_scalar("SELECT outcome_code FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&r.app.state.db.pool).await.expect("outcome");
    assert_eq!(outcome.as_deref(), Some("OK"), "the outcome is the approved run's");
}
both_backends!(approvals_forged_job, a_job_naming_an_approval_it_was_not_given_does_not_run);

fn json_call(order: &str) -> server::tools::ToolCall {
    server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": order }) }
}

/// A request nobody decides expires: the customer is told, nothing runs, and a decision after
/// that (a button or the console) is refused with APPROVAL_EXPIRED.
async fn an_expired_request_tells_the_requester_and_runs_nothing(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.customer_max_risk = server::config::lane::RiskCeiling::High;
        s.approvals.ttl = Duration::from_secs(1);
    })
    .await;
    r.add_owner().await;
    let settings = r.app.state.config.settings.approvals.clone();
    // The request's reply, the owner's question, then (a second later) the expiry notice.
    r.exchange(&[("wamid.EXP", "Please refund my order 4821")], 3).await;
    let (id, state, nonce): (i64, String, String) = sqlx::query_as("SELECT id, state, nonce FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!(state, "expired");
    let texts = r.graph.texts();
    assert_eq!(texts.last(), Some(&settings.requester_expired), "the customer is told: {texts:?}");
    assert_eq!(texts.iter().filter(|t| **t == settings.requester_expired).count(), 1);
    let steps = r.steps("wamid.EXP").await;
    assert!(steps.iter().any(|(s, d, c)| s == "ApprovalExpired" && d == "expired" && c == "APPROVAL_EXPIRED"), "{steps:?}");

    let by = server::db::approvals::Decider { name: "late".into(), owner_id: None, phone: None, via: "console" };
    let late = r.app.gatehouse.approvals.decide(id, server::approvals::Verdict::Approve, &by, None, None).await.expect_err("expired");
    assert_eq!(late.code(), "APPROVAL_EXPIRED");
    r.press(vec![button_press(OWNER, "wamid.LATE", &format!("gh-approval:{id}:approve:{nonce}"))], 4).await;
    assert_eq!(r.graph.texts().last(), Some(&settings.expired_reply.replace("{id}", &id.to_string())), "the owner is told why");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "nothing ran");
    let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'tool.call'").fetch_one(&r.app.state.db.pool).await.expect("jobs");
    assert_eq!(jobs, 0);
}
both_backends!(approvals_expiry, an_expired_request_tells_the_requester_and_runs_nothing);

/// The expiry job run before its time (an owner's "run now" on the Jobs page) waits for the
/// expiry again, using up no attempt: it never fails until discarded, which would leave the
/// request pending for good and the customer never told.
async fn an_early_expiry_run_waits_for_its_time(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    r.exchange(&[("wamid.EARLY", "Please refund my order 4821")], 2).await;
    let (job, expires_at): (i64, i64) = sqlx::query_as("SELECT j.id, a.expires_at FROM jobs j, approvals a WHERE j.kind = 'approval.settle'").fetch_one(&r.app.state.db.pool).await.expect("settle job");
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    assert!(server::db::jobs::retry_now(&mut conn, job, server::db::now_ms()).await.expect("run now"));
    drop(conn);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(r.app.gatehouse.worker().run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let row = loop {
        let row: (String, i64, i64, Option<String>) = sqlx::query_as("SELECT state, attempt, scheduled_at, last_error_code FROM jobs WHERE id = $1").bind(job).fetch_one(&r.app.state.db.pool).await.expect("job");
        if row.0 != "available" && row.0 != "running" {
            break row;
        }
        assert!(std::time::Instant::now() < deadline, "the early run did not end: {row:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = stop.send(true);
    let _ = worker.await;
    let (state, _, scheduled_at, code) = row;
    assert_eq!((state.as_str(), code), ("scheduled", None), "snoozed, not failed");
    assert!(scheduled_at >= expires_at, "until the expiry: {scheduled_at} < {expires_at}");
    let approval: String = sqlx::query_scalar("SELECT state FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!(approval, "pending");
    assert_eq!(r.graph.sends().len(), 2, "nobody is told anything yet");
}
both_backends!(approvals_early_expiry_run, an_early_expiry_run_waits_for_its_time);

/// The tool's definition changed (a catalog reload) between the request and the decision: the
/// approval does not apply to the new definition, so the call never reaches the shop.
async fn a_changed_tool_definition_makes_the_approval_stale(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let who = console_requester("corr-stale");
    let approvals = r.app.gatehouse.approvals.clone();
    let requested = approvals.request(&json_call("4821"), &who, None, None).await.expect("request");
    let tools = r.dir.path().join("tools.toml");
    let changed = TOOLS.replace("Refunds an order in full.", "Refunds an order in full, and cancels its delivery.");
    std::fs::write(&tools, changed).expect("tools");
    let state = &r.app.state;
    let report = state.reloads.reload().await.expect("reload");
    assert_eq!(report.changed, vec!["refund_order".to_string()], "the reload changed the tool's version");
    let by = server::db::approvals::Decider { name: "o".into(), owner_id: None, phone: None, via: "console" };
    approvals.decide(requested.id, server::approvals::Verdict::Approve, &by, None, None).await.expect("approve");
    r.exchange(&[], 0).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "the changed tool never ran on an approval given for the old one");
    let outcome: Option<String> = sqlx::query_scalar("SELECT outcome_code FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&state.db.pool).await.expect("outcome");
    assert_eq!(outcome.as_deref(), Some("APPROVAL_STALE"));
    // The audit writer batches its rows: flush before reading them.
    state.tools.audit().flush().await;
    let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit WHERE tool = 'refund_order' AND reason_code = 'APPROVAL_STALE'").fetch_one(&state.db.pool).await.expect("audit");
    assert_eq!(audited, 1, "the refusal is in the tool audit");
}
both_backends!(approvals_stale_version, a_changed_tool_definition_makes_the_approval_stale);

/// A customer's message handled again after its request was decided (its first run stopped
/// before its reply was recorded: a crash, a failed write) finds that request: the owners are
/// not asked again, and an approved call gets no second approval to run on.
async fn a_message_handled_again_finds_its_decided_request(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.add_owner().await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, message_id: "wamid.AGAIN".into(), ..console_requester("corr-again") };
    let approvals = r.app.gatehouse.approvals.clone();
    let first = approvals.request(&json_call("5150"), &who, None, None).await.expect("request");
    // The customer asked twice: the second message finds the first one's request pending.
    let twice = server::approvals::Requester { message_id: "wamid.TWICE".into(), ..who.clone() };
    assert_eq!(approvals.request(&json_call("5150"), &twice, None, None).await.expect("twice").id, first.id);
    let by = server::db::approvals::Decider { name: "o".into(), owner_id: None, phone: None, via: "console" };
    approvals.decide(first.id, server::approvals::Verdict::Approve, &by, None, None).await.expect("approve");
    for asker in [&who, &twice] {
        let again = approvals.request(&json_call("5150"), asker, None, None).await.expect("again");
        assert_eq!((again.id, again.reused, again.state), (first.id, true, server::db::approvals::State::Approved), "the decided request, not a new one");
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("count");
    assert_eq!(rows, 1);
    let asks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'approval.ask'").fetch_one(&r.app.state.db.pool).await.expect("asks");
    let owners: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM owner_phones").fetch_one(&r.app.state.db.pool).await.expect("owners");
    assert_eq!(asks, owners, "the owners were asked once");
    // Another message asking for the same call is a new request.
    let other = server::approvals::Requester { message_id: "wamid.OTHER".into(), ..who };
    let fresh = approvals.request(&json_call("5150"), &other, None, None).await.expect("fresh");
    assert!(fresh.id != first.id && !fresh.reused && fresh.state == server::db::approvals::State::Pending, "{fresh:?}");
}
both_backends!(approvals_message_again, a_message_handled_again_finds_its_decided_request);

/// A message handled again after its request was settled (its first run stopped before its
/// reply was recorded) says nothing more: the settlement's own job tells the person, once.
/// Before, it repeated the rejection (or said "still checking" after the answer had gone out).
async fn a_message_handled_again_after_its_request_was_settled_says_nothing_more(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    let settings = r.app.state.config.settings.clone();
    let inbound = server::channel::Inbound {
        channel: "simulator".into(),
        message_id: "sim_settled".into(),
        chat_id: "sim-settled".into(),
        sender: CUSTOMER.into(),
        text: "Please refund my order 4821".into(),
        correlation_id: "corr-settled".into(),
        ..Default::default()
    };
    let first = r.app.state.runtime.handle(&inbound).await.expect("handled");
    assert_eq!(first.reply.as_deref(), Some(settings.lane.approval_reply.as_str()));
    let id: i64 = sqlx::query_scalar("SELECT id FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("approval");
    let by = server::db::approvals::Decider { name: "o".into(), owner_id: None, phone: None, via: "console" };
    r.app.gatehouse.approvals.decide(id, server::approvals::Verdict::Reject { reason: None }, &by, None, None).await.expect("reject");
    r.exchange(&[], 0).await;
    let told = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM simulator_messages WHERE chat_id = 'sim-settled' AND direction = 'out' AND text = $1")
            .bind(&settings.approvals.requester_rejected)
            .fetch_one(&r.app.state.db.pool)
            .await
            .expect("count")
    };
    assert_eq!(told().await, 1, "the rejection's job told the customer");

    // As if the first run had stopped before its reply was recorded.
    sqlx::query("DELETE FROM message_replies WHERE message_id = 'sim_settled'").execute(&r.app.state.db.pool).await.expect("forget the reply");
    let again = r.app.state.runtime.handle(&inbound).await.expect("handled again");
    assert_eq!((again.route, again.reply.as_deref()), (server::conversation::Route::ToolLane, None), "nothing more to say");
    r.exchange(&[], 0).await;
    assert_eq!(told().await, 1, "told once");
    let steps: Vec<(String, String, String)> = sqlx::query_as("SELECT step, decision, reason_code FROM trace_steps WHERE trace_id = $1 ORDER BY seq")
        .bind(again.trace_id.expect("trace"))
        .fetch_all(&r.app.state.db.pool)
        .await
        .expect("steps");
    assert!(steps.iter().any(|(s, d, c)| s == "ApprovalRequested" && d == "settled" && c == "APPROVAL_ALREADY_SETTLED"), "{steps:?}");
    assert!(steps.iter().any(|(s, _, c)| s == "tool_lane" && c == "TOOL_LANE_QUIET"), "{steps:?}");
    let outcome: String = sqlx::query_scalar("SELECT outcome FROM traces WHERE id = $1").bind(again.trace_id.expect("trace")).fetch_one(&r.app.state.db.pool).await.expect("outcome");
    assert_eq!(outcome, "deferred", "handled, its answer left to the jobs under way");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("count");
    assert_eq!(rows, 1, "never asked again");

    // Expired while the message waited to be handled again (a long outage): the message is told
    // nothing more, and the expiry's job tells the customer it expired, once. (Its request is
    // not taken for one a newer message replaced, of which nobody would be told.)
    let later = server::channel::Inbound { message_id: "sim_expired".into(), text: "Please refund my order 4821 after all".into(), correlation_id: "corr-expired".into(), ..inbound };
    let first = r.app.state.runtime.handle(&later).await.expect("handled");
    assert_eq!(first.reply.as_deref(), Some(settings.lane.approval_reply.as_str()));
    let now = server::db::now_ms();
    sqlx::query("UPDATE approvals SET expires_at = $1 WHERE state = 'pending'").bind(now - 1).execute(&r.app.state.db.pool).await.expect("age");
    sqlx::query("DELETE FROM message_replies WHERE message_id = 'sim_expired'").execute(&r.app.state.db.pool).await.expect("forget the reply");
    let again = r.app.state.runtime.handle(&later).await.expect("handled again");
    assert_eq!(again.reply, None, "nothing more to say");
    sqlx::query("UPDATE jobs SET scheduled_at = $1 WHERE kind = 'approval.settle' AND state = 'scheduled'").bind(now).execute(&r.app.state.db.pool).await.expect("due");
    r.exchange(&[], 0).await;
    let expired: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM simulator_messages WHERE chat_id = 'sim-settled' AND direction = 'out' AND text = $1")
        .bind(&settings.approvals.requester_expired)
        .fetch_one(&r.app.state.db.pool)
        .await
        .expect("count");
    assert_eq!(expired, 1, "the expiry's job told the customer");
}
both_backends!(approvals_settled_then_again, a_message_handled_again_after_its_request_was_settled_says_nothing_more);

/// A question queued for an owner's number that the owner removed before it went out (a lost
/// phone) is not sent to it: it carries a customer's number and the call's arguments.
async fn a_number_no_longer_an_owners_is_not_asked(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.add_owner().await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, message_id: "wamid.GONE".into(), ..console_requester("corr-gone") };
    r.app.gatehouse.approvals.request(&json_call("6160"), &who, None, None).await.expect("request");
    sqlx::query("DELETE FROM owner_phones").execute(&r.app.state.db.pool).await.expect("number removed");
    r.exchange(&[], 0).await;
    assert!(r.graph.sends().iter().all(|b| b["type"] != "interactive"), "nobody was asked: {:?}", r.graph.sends());
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'approval.ask'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert!(preview.is_some_and(|p| p.contains("no longer an owner's")), "the job says why");
}
both_backends!(approvals_removed_number, a_number_no_longer_an_owners_is_not_asked);

/// The Approvals page says how an approved call's run stands: a run an owner cancelled is not
/// shown running for ever, but with its outcome, `JOB_CANCELLED` (its approver is told, as of any
/// outcome), recorded by the job the cancel queued.
async fn a_cancelled_run_is_not_shown_running(db: TestDb) {
    // The outcome in the deployment's words.
    let r = rig(db, |s| s.approvals.outcome_cancelled = "wurde abgebrochen ({code}).".into()).await;
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let requested = r.app.gatehouse.approvals.request(&json_call("7171"), &console_requester("corr-cancel"), None, None).await.expect("request");
    let id = requested.id.to_string();
    let approved = owner.post_form("/api/decide_approval", &[("id", id.as_str()), ("decision", "approve")]).await;
    assert_eq!(approved.status, axum::http::StatusCode::OK, "{}", approved.body);
    let page = owner.post_form("/api/list_approvals", &[]).await.json();
    assert_eq!(page["decided"][0]["job_state"], "available", "{page}");
    let job = page["decided"][0]["job_id"].as_i64().expect("job").to_string();
    // The approver has a WhatsApp number (as an owner who decided there would): the outcome goes to it.
    r.add_owner().await;
    sqlx::query("UPDATE approvals SET decider_phone = $1").bind(OWNER).execute(&r.app.state.db.pool).await.expect("number");
    let cancelled = owner.post_form("/api/cancel_job", &[("id", job.as_str())]).await;
    assert_eq!(cancelled.status, axum::http::StatusCode::OK, "{}", cancelled.body);
    r.exchange(&[], 0).await;
    let page = owner.post_form("/api/list_approvals", &[]).await.json();
    assert_eq!((page["decided"][0]["job_state"].as_str(), page["decided"][0]["outcome"].as_str()), (None, Some("JOB_CANCELLED")), "the outcome, not the job's state: {page}");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "nothing ran");
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'tool.stopped'").fetch_one(&r.app.state.db.pool).await.expect("the cancel's job");
    assert!(preview.as_deref().is_some_and(|p| p.contains("asked in the console")), "{preview:?}");
    let told: Vec<String> = r.graph.sends().into_iter().filter(|b| b["to"] == OWNER).filter_map(|b| b["text"]["body"].as_str().map(String::from)).collect();
    assert!(told.iter().any(|m| m.ends_with(": wurde abgebrochen (JOB_CANCELLED).")), "the approver is told, in the deployment's words: {told:?}");

    // The cancel ended the approval: an owner's retry of its job does not make the call, and
    // the outcome stays the one its approver was told.
    let retried = owner.post_form("/api/retry_job", &[("id", job.as_str())]).await;
    assert_eq!(retried.status, axum::http::StatusCode::OK, "{}", retried.body);
    r.exchange(&[], 0).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "nothing ran after the retry either");
    let (state, code): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_code FROM jobs WHERE id = $1").bind(job.parse::<i64>().expect("id")).fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!((state.as_str(), code.as_deref()), ("discarded", Some("APPROVAL_NOT_GRANTED")));
    let page = owner.post_form("/api/list_approvals", &[]).await.json();
    assert_eq!(page["decided"][0]["outcome"].as_str(), Some("JOB_CANCELLED"), "{page}");
}
both_backends!(approvals_cancelled_run, a_cancelled_run_is_not_shown_running);

/// The owners' WhatsApp prompt shows the call with secrets, personal data and what the tool's
/// redact hooks mask replaced; the console, behind the owner login, shows the exact call an
/// owner approves, personal data included, secrets still replaced; the stored call (what an
/// approval binds and runs) keeps them exactly, and the trace only their hash.
async fn owners_see_the_call_without_secrets_or_personal_data(db: TestDb) {
    let mask = "\n[[hook]]\nname = \"mask-orders\"\npoint = \"before_tool_call\"\nkind = \"redact\"\ntools = [\"refund_order\"]\npattern = '7\\d(\\d\\d)'\nreplacement = \"7**$1\"\n";
    let r = crate::lane_e2e::rig_with(db, &format!("{TOOLS}{mask}"), "", |s| s.approvals.requester_customer = "Kunde +{number}".into()).await;
    r.add_owner().await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, ..console_requester("corr-pii") };
    let args = json!({ "order_id": "7001", "email": "ana@example.com", "card_token": "tok_live_5f2a" });
    let call = server::tools::ToolCall { name: "refund_order".into(), args: args.clone() };
    let requested = r.app.gatehouse.approvals.request(&call, &who, None, None).await.expect("request");
    r.exchange(&[], 1).await;
    let asked = r.graph.sends().into_iter().find(|b| b["type"] == "interactive").expect("the owner was asked");
    let shown = asked["interactive"]["body"]["text"].as_str().unwrap_or_default().to_string();
    assert!(shown.contains("7**01") && shown.contains("[PII]") && shown.contains("[REDACTED]"), "{shown}");
    assert!(shown.contains(&format!("Approval #{}: Kunde +{}", requested.id, CUSTOMER.trim_start_matches('+'))), "the requester in the deployment's words: {shown}");
    assert!(!shown.contains("ana@example.com") && !shown.contains("tok_live_5f2a") && !shown.contains("7001"), "{shown}");
    let (stored, display): (String, String) = sqlx::query_as("SELECT args, display FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&r.app.state.db.pool).await.expect("row");
    assert_eq!(serde_json::from_str::<Value>(&stored).expect("json"), args, "the exact call is kept to run");
    assert!(!display.contains("ana@example.com") && !display.contains("tok_live_5f2a"), "{display}");
    let details: Vec<String> = sqlx::query_scalar("SELECT detail FROM trace_steps WHERE trace_id = $1").bind(requested.trace_id.expect("trace")).fetch_all(&r.app.state.db.pool).await.expect("steps");
    assert!(details.iter().all(|d| !d.contains("ana@example.com") && !d.contains("tok_live_5f2a")), "{details:?}");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let page = owner.post_form("/api/list_approvals", &[]).await.json();
    let console = page["pending"].as_array().and_then(|p| p.iter().find(|a| a["id"] == requested.id)).map(|a| a["args"].to_string()).expect("listed");
    assert!(console.contains("ana@example.com") && console.contains("7001"), "the address the decision is about: {console}");
    assert!(!console.contains("tok_live_5f2a") && console.contains("[REDACTED]"), "{console}");

    // An argument that reads like a placeholder is shown as it is, never filled in.
    let braces = server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": "{expires}{reason}" }) };
    r.app.gatehouse.approvals.request(&braces, &server::approvals::Requester { correlation_id: "corr-braces".into(), ..who.clone() }, None, None).await.expect("request");
    r.exchange(&[], 2).await;
    let asked = r.graph.sends().into_iter().rfind(|b| b["type"] == "interactive").expect("the owner was asked");
    let shown = asked["interactive"]["body"]["text"].as_str().unwrap_or_default().to_string();
    assert!(shown.contains(r#""order_id":"{expires}{reason}""#), "{shown}");

    // A character that does not show is written as its escape, on WhatsApp and in the console:
    // no part of the call reads reversed or hides; the stored call, which runs, keeps it.
    let args = json!({ "order_id": "A\u{202E}BC\u{200F}D\u{E0041}" });
    let unseen = server::tools::ToolCall { name: "refund_order".into(), args: args.clone() };
    let requested = r.app.gatehouse.approvals.request(&unseen, &server::approvals::Requester { correlation_id: "corr-unseen".into(), ..who.clone() }, None, None).await.expect("request");
    r.exchange(&[], 3).await;
    let asked = r.graph.sends().into_iter().rfind(|b| b["type"] == "interactive").expect("the owner was asked");
    let shown = asked["interactive"]["body"]["text"].as_str().unwrap_or_default().to_string();
    let escaped = r#""order_id":"A\u202eBC\u200fD\udb40\udc41""#;
    assert!(shown.contains(escaped) && !shown.contains('\u{202E}'), "{shown}");
    let page = owner.post_form("/api/list_approvals", &[]).await.json();
    let console = page["pending"].as_array().and_then(|p| p.iter().find(|a| a["id"] == requested.id)).and_then(|a| a["args"].as_str().map(String::from)).expect("listed");
    assert!(console.contains(escaped) && !console.contains('\u{202E}'), "{console}");
    let stored: String = sqlx::query_scalar("SELECT args FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&r.app.state.db.pool).await.expect("row");
    assert_eq!(serde_json::from_str::<Value>(&stored).expect("json"), args, "the exact call is kept to run");
}
both_backends!(approvals_redacted_display, owners_see_the_call_without_secrets_or_personal_data);

/// The owner's WhatsApp prompt for `args` under a template of `{args}` and 990 more
/// characters: the request's stored display and the body sent.
async fn prompt_for_long_arguments(db: TestDb, args: Value) -> (String, String) {
    let rest = "R".repeat(990);
    let template = format!("{{args}}{rest}");
    let r = rig(db, move |s| {
        s.approvals.owner_prompt = template;
        s.approvals.args_cut = "…(+{more})".into();
    })
    .await;
    r.add_owner().await;
    let who = server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, ..console_requester("corr-long") };
    let call = server::tools::ToolCall { name: "refund_order".into(), args };
    let requested = r.app.gatehouse.approvals.request(&call, &who, None, None).await.expect("request");
    r.exchange(&[], 1).await;
    let display: String = sqlx::query_scalar("SELECT display FROM approvals WHERE id = $1").bind(requested.id).fetch_one(&r.app.state.db.pool).await.expect("row");
    let asked = r.graph.sends().into_iter().find(|b| b["type"] == "interactive").expect("the owner was asked");
    let shown = asked["interactive"]["body"]["text"].as_str().unwrap_or_default().to_string();
    assert!(shown.ends_with(&rest), "the rest of the prompt stays whole: {shown}");
    (display, shown)
}

/// Arguments too long for WhatsApp's 1,024-character body are cut, saying how much is left out
/// (`approvals.args_cut`); the rest of the prompt stays whole, so the owner never reads a call
/// that looks whole and is not.
async fn arguments_too_long_for_the_prompt_are_cut_saying_so(db: TestDb) {
    let (display, shown) = prompt_for_long_arguments(db, json!({ "order_id": "7002", "email": "ana@example.com", "card_token": "tok_live_5f2a" })).await;
    assert_eq!(shown.chars().count(), 1024, "{shown}");
    let kept = 1024 - 990 - "…(+NN)".chars().count();
    let expected = format!("{}…(+{}){}", display.chars().take(kept).collect::<String>(), display.chars().count() - kept, "R".repeat(990));
    assert_eq!(shown, expected);
}
both_backends!(approvals_long_arguments_cut, arguments_too_long_for_the_prompt_are_cut_saying_so);

/// A cut that would fall inside an escape of a character that does not show (`\u202e`) falls
/// before it: `\u2` would read as a different value.
async fn a_cut_never_splits_an_escape(db: TestDb) {
    let (display, shown) = prompt_for_long_arguments(db, json!({ "order_id": "\u{202E}".repeat(10) })).await;
    assert_eq!(display, format!(r#"{{"order_id":"{}"}}"#, r"\u202e".repeat(10)));
    // 28 characters would fit; the third escape would be cut after `\u2`.
    let kept = r#"{"order_id":"\u202e\u202e"#;
    assert_eq!(shown, format!("{kept}…(+{}){}", display.chars().count() - kept.chars().count(), "R".repeat(990)));
}
both_backends!(approvals_cut_whole_escapes, a_cut_never_splits_an_escape);

/// The Approvals page's decision answers each refusal with its own status and code, not a
/// server error: a request another owner decided first (409), one that is not there (404), and
/// an id that is not a number, which fails before the server function runs (400).
async fn a_refused_decision_is_a_client_error(db: TestDb) {
    use axum::http::StatusCode;
    let r = rig(db, |_| {}).await;
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let call = server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": "7002" }) };
    let requested = r.app.gatehouse.approvals.request(&call, &console_requester("corr-twice"), None, None).await.expect("request");
    let id = requested.id.to_string();
    let decide = [("id", id.as_str()), ("decision", "reject"), ("reason", "not now")];
    let first = owner.post_form("/api/decide_approval", &decide).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let twice = owner.post_form("/api/decide_approval", &decide).await;
    assert_eq!((twice.status, twice.json()["code"].as_str()), (StatusCode::CONFLICT, Some("APPROVAL_ALREADY_DECIDED")), "{}", twice.body);
    let missing = owner.post_form("/api/decide_approval", &[("id", "999999"), ("decision", "approve")]).await;
    assert_eq!((missing.status, missing.json()["code"].as_str()), (StatusCode::NOT_FOUND, Some("APPROVAL_NOT_FOUND")), "{}", missing.body);
    let garbled = owner.post_form("/api/decide_approval", &[("id", "abc"), ("decision", "approve")]).await;
    assert_eq!((garbled.status, garbled.json()["code"].as_str()), (StatusCode::BAD_REQUEST, Some("REQUEST_FAILED")), "{}", garbled.body);
    // The public login function too: a post without every field is the client's mistake.
    let mut visitor = r.app.client();
    let partial = visitor.post_form("/api/login", &[("login", "ada"), ("password", "x")]).await;
    assert_eq!(partial.status, StatusCode::BAD_REQUEST, "{}", partial.body);
}
both_backends!(approvals_refused_decision_status, a_refused_decision_is_a_client_error);

/// `/reject ID reason` and `/approve ID` as text from an owner's number decide like the
/// buttons: the rejection keeps its reason and tells the customer; the approval runs the call.
async fn owners_decide_with_text_commands(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    r.add_owner().await;
    let settings = r.app.state.config.settings.approvals.clone();
    r.exchange(&[("wamid.T1", "Please refund my order 4821")], 2).await;
    let first: i64 = sqlx::query_scalar("SELECT MAX(id) FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("id");
    let reject = text_message(OWNER, "wamid.T2", &format!("/reject {first} The order was a gift"));
    r.press(vec![reject], 4).await;
    let (state, note, by): (String, Option<String>, Option<String>) =
        sqlx::query_as("SELECT state, decision_note, decided_by FROM approvals WHERE id = $1").bind(first).fetch_one(&r.app.state.db.pool).await.expect("row");
    assert_eq!((state.as_str(), note.as_deref(), by.as_deref()), ("rejected", Some("The order was a gift"), Some("Olga Owner")));
    let texts = r.graph.texts();
    assert!(texts.contains(&settings.requester_rejected), "the customer is told: {texts:?}");
    assert!(texts.iter().any(|t| t.starts_with(&format!("Rejected #{first}"))), "{texts:?}");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "a rejected call never runs");
    // trace_text is off: the owner's reason is kept with the approval, not in any trace (the
    // owner's command step names the command; the request's trace says how long the reason was).
    let traced: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM trace_steps WHERE detail LIKE '%was a gift%'").fetch_one(&r.app.state.db.pool).await.expect("steps");
    assert_eq!(traced, 0, "the reason's words are in no trace step");
    let named: String = sqlx::query_scalar("SELECT s.detail FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = 'wamid.T2' AND s.step = 'slash'")
        .fetch_one(&r.app.state.db.pool)
        .await
        .expect("slash step");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&named).expect("json"), json!({ "command": "reject" }));

    r.exchange(&[("wamid.T3", "Please refund my order 4821 after all")], 6).await;
    let second: i64 = sqlx::query_scalar("SELECT MAX(id) FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("id");
    assert_ne!(first, second);
    r.press(vec![text_message(OWNER, "wamid.T4", &format!("/approve {second}"))], 9).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["refunds/4821".to_string()], "the approved call ran once");
}
both_backends!(approvals_text_commands, owners_decide_with_text_commands);

/// A console owner who types another owner's number into the simulator decides as themself,
/// through the simulator: the approval names the console owner and the simulator, its outcome
/// is for the console owner's own number, and nothing about it goes to the phone whose number
/// was typed.
async fn a_decision_typed_into_the_simulator_is_the_console_owners(db: TestDb) {
    let r = rig(db, |s| s.lane.customer_max_risk = server::config::lane::RiskCeiling::High).await;
    let mut console = r.app.with_owner("ada", "correct horse battery").await;
    r.add_owner().await;
    r.exchange(&[("wamid.S1", "Please refund my order 4821")], 2).await;
    let id: i64 = sqlx::query_scalar("SELECT MAX(id) FROM approvals").fetch_one(&r.app.state.db.pool).await.expect("id");
    let ada: i64 = sqlx::query_scalar("SELECT id FROM owners WHERE login = 'ada'").fetch_one(&r.app.state.db.pool).await.expect("ada");
    let to_typed = || r.graph.sends().into_iter().filter(|b| b["to"] == OWNER).count();
    let before = to_typed();
    let sent = console.post_form("/api/simulate_message", &[("from", &format!("+{OWNER}")), ("text", &format!("/reject {id} only a test")), ("chat_id", "")]).await;
    assert_eq!(sent.status, axum::http::StatusCode::OK, "{}", sent.body);
    r.exchange(&[], 0).await;
    let row: (String, Option<String>, Option<i64>, Option<String>, Option<String>) =
        sqlx::query_as("SELECT state, decided_by, decider_owner_id, decided_via, decider_phone FROM approvals WHERE id = $1").bind(id).fetch_one(&r.app.state.db.pool).await.expect("row");
    // The outcome of a decision goes to the deciding owner's own first number, as from the
    // Approvals page: the console owner's, not the typed one.
    assert_eq!(row, ("rejected".to_string(), Some("Test Owner".to_string()), Some(ada), Some("simulator".to_string()), Some("15550001111".to_string())));
    assert_eq!(to_typed(), before, "nothing about the decision went to the typed number: {:?}", r.graph.texts());
    assert!(r.graph.texts().contains(&r.app.state.config.settings.approvals.requester_rejected), "the customer who asked is told, as for any rejection");
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "a rejected call never runs");
}
both_backends!(approvals_simulator_decider, a_decision_typed_into_the_simulator_is_the_console_owners);

/// The same call asked for again after its approval ran out: the old one is settled as expired,
/// with that step in its trace, and a new one is asked.
async fn a_request_after_expiry_settles_the_old_one_in_its_trace(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let call = server::tools::ToolCall { name: "refund_order".into(), args: json!({ "order_id": "7100" }) };
    let approvals = r.app.gatehouse.approvals.clone();
    let first = approvals.request(&call, &console_requester("corr-exp-1"), None, None).await.expect("request");
    sqlx::query("UPDATE approvals SET expires_at = 1 WHERE id = $1").bind(first.id).execute(&r.app.state.db.pool).await.expect("age it");
    let second = approvals.request(&call, &console_requester("corr-exp-2"), None, None).await.expect("again");
    assert!(!second.reused && second.id != first.id, "a new request");
    let state: String = sqlx::query_scalar("SELECT state FROM approvals WHERE id = $1").bind(first.id).fetch_one(&r.app.state.db.pool).await.expect("state");
    assert_eq!(state, "expired");
    let trace_id = first.trace_id.expect("the first request's trace");
    let steps: Vec<(String, String)> = sqlx::query_as("SELECT step, reason_code FROM trace_steps WHERE trace_id = $1 ORDER BY seq").bind(trace_id).fetch_all(&r.app.state.db.pool).await.expect("steps");
    assert!(steps.iter().any(|(s, c)| s == "ApprovalExpired" && c == "APPROVAL_EXPIRED"), "{steps:?}");
}
both_backends!(approvals_expired_on_request, a_request_after_expiry_settles_the_old_one_in_its_trace);

/// A customer asking again for a call whose request ran out is told about the new request only:
/// the old one's expiry job does not then say "not approved in time", after the new request's
/// reply, as if about it.
async fn a_request_replaced_on_expiry_is_not_announced_as_expired(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.add_owner().await;
    let who = |message: &str| server::approvals::Requester { channel: "whatsapp".into(), chat_id: CUSTOMER.into(), sender: CUSTOMER.into(), actor: server::domain::Role::Customer, message_id: message.into(), ..console_requester("corr-replaced") };
    let approvals = r.app.gatehouse.approvals.clone();
    let first = approvals.request(&json_call("7200"), &who("wamid.OLD"), None, None).await.expect("request");
    sqlx::query("UPDATE approvals SET expires_at = 1 WHERE id = $1").bind(first.id).execute(&r.app.state.db.pool).await.expect("age it");
    sqlx::query("UPDATE jobs SET scheduled_at = 1 WHERE kind = 'approval.settle'").execute(&r.app.state.db.pool).await.expect("its expiry job is due");
    let second = approvals.request(&json_call("7200"), &who("wamid.NEW"), None, None).await.expect("again");
    assert_ne!(second.id, first.id);
    r.exchange(&[], 0).await;
    let expired = &r.app.state.config.settings.approvals.requester_expired;
    assert!(!r.graph.texts().contains(expired), "{:?}", r.graph.texts());
    let (state, via): (String, Option<String>) = sqlx::query_as("SELECT state, decided_via FROM approvals WHERE id = $1").bind(first.id).fetch_one(&r.app.state.db.pool).await.expect("row");
    assert_eq!((state.as_str(), via.as_deref()), ("expired", Some("superseded")));
}
both_backends!(approvals_replaced_on_expiry, a_request_replaced_on_expiry_is_not_announced_as_expired);

fn console_requester(correlation: &str) -> server::approvals::Requester {
    server::approvals::Requester {
        actor: server::domain::Role::Owner,
        channel: server::approvals::CONSOLE.into(),
        chat_kind: server::domain::ChatKind::Direct,
        chat_id: "console".into(),
        sender: "owner:1".into(),
        message_id: format!("console-{correlation}"),
        request: "refund".into(),
        correlation_id: correlation.into(),
    }
}

// ---- real processes: `gatehouse serve` killed with SIGKILL, decisions from `gatehouse approvals`

/// A payment-style API that deduplicates refunds by `Idempotency-Key`: a key it has seen gets
/// the stored answer and refunds nothing again. When `hang_next` is set, the next refund is
/// applied and then never answered (its caller is killed meanwhile).
#[derive(Clone, Default)]
struct KeyedShop {
    attempts: Arc<Mutex<Vec<(String, String)>>>,
    applied: Arc<Mutex<BTreeMap<String, String>>>,
    hang_next: Arc<AtomicBool>,
}

async fn keyed_shop() -> (SocketAddr, KeyedShop) {
    let shop = KeyedShop::default();
    let app = Router::new()
        .route(
            "/api/refunds/{id}",
            axum::routing::post(|State(shop): State<KeyedShop>, axum::extract::Path(id): axum::extract::Path<String>, headers: HeaderMap| async move {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                shop.attempts.lock().expect("lock").push((id.clone(), key.clone()));
                let first = shop.applied.lock().expect("lock").insert(key, id.clone()).is_none();
                if first && shop.hang_next.swap(false, Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                Json(json!({ "id": id, "refunded": true }))
            }),
        )
        .with_state(shop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (addr, shop)
}

async fn request(gh: &Gatehouse, order: &str) -> i64 {
    let out = gh.run(&["tools", "call", "refund_order", "--args", &json!({ "order_id": order }).to_string(), "--as", "owner"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let printed: Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    assert_eq!(printed["approval"]["state"], "pending", "{printed}");
    printed["approval"]["id"].as_i64().expect("id")
}

/// The commands decide by the console's rules (exit 0 only for the call that decided; the
/// stable code otherwise), and nothing is lost or done twice when the server is killed between
/// the request and the decision, and again in the middle of the approved call: the restarted
/// server rescues the call and sends it with the same idempotency key, so the shop refunds once.
async fn approvals_survive_kill_nine_and_run_once(db: TestDb) {
    let (addr, shop) = keyed_shop().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cli = Gatehouse::new(dir.path(), &db, TOOLS, &connectors(addr), &[]);
    let log = dir.path().join("serve.log");
    let logs = || std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    let out = cli.run(&["migrate"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let pool = db.connect().await;
    let mut server = cli.serve(&log).await;

    // Between request and decision.
    let id = request(&cli, "4821").await;
    let again = cli.run(&["tools", "call", "refund_order", "--args", r#"{"order_id":"4821"}"#, "--as", "owner"]).await;
    let again: Value = serde_json::from_str(again.stdout.trim()).expect("JSON");
    assert_eq!((again["approval"]["id"].as_i64(), again["approval"]["reused"].as_bool()), (Some(id), Some(true)), "the same call while pending reuses the request");
    kill_nine(&mut server).await;
    let mut server = cli.serve(&log).await;
    let listed = cli.run(&["approvals", "list", "--json"]).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let rows: Vec<Value> = listed.stdout.lines().map(|l| serde_json::from_str(l).expect("one JSON object a line")).collect();
    let row = rows.iter().find(|r| r["id"] == id).expect("the request survived the crash");
    for field in ["id", "state", "tool", "risk", "requested_at"] {
        assert!(!row[field].is_null(), "{field} in {row}");
    }
    assert_eq!((row["state"].as_str(), row["tool"].as_str(), row["risk"].as_str()), (Some("pending"), Some("refund_order"), Some("high")));
    assert!(shop.attempts.lock().expect("lock").is_empty(), "nothing ran without a decision");

    // Codes for what cannot be decided.
    let missing = cli.run(&["approvals", "approve", "999999"]).await;
    assert!(missing.code != 0 && missing.stderr.contains("APPROVAL_NOT_FOUND"), "{} {}", missing.code, missing.stderr);

    // In the middle of the approved call: the shop applies the refund but never answers, and
    // the server dies.
    shop.hang_next.store(true, Ordering::SeqCst);
    let approved = cli.run(&["approvals", "approve", &id.to_string()]).await;
    assert_eq!(approved.code, 0, "{}{}", approved.stdout, approved.stderr);
    assert!(approved.stdout.contains(&format!("approval #{id} approved")), "{}", approved.stdout);
    wait_for("the call to reach the shop", Duration::from_secs(30), async || !shop.attempts.lock().expect("lock").is_empty()).await;
    kill_nine(&mut server).await;
    let twice = cli.run(&["approvals", "approve", &id.to_string()]).await;
    assert!(twice.code != 0 && twice.stderr.contains("APPROVAL_ALREADY_DECIDED"), "{} {}", twice.code, twice.stderr);
    let mut server = cli.serve(&log).await;
    let pool_ref = &pool;
    wait_for("the rescued call to finish", Duration::from_secs(60), async || {
        sqlx::query_scalar::<_, Option<String>>("SELECT outcome_code FROM approvals WHERE id = $1").bind(id).fetch_one(&pool_ref.pool).await.ok().flatten().is_some()
    })
    .await;
    let outcome: Option<String> = sqlx::query_scalar("SELECT outcome_code FROM approvals WHERE id = $1").bind(id).fetch_one(&pool.pool).await.expect("outcome");
    assert_eq!(outcome.as_deref(), Some("OK"), "{}", logs());
    let attempts = shop.attempts.lock().expect("lock").clone();
    assert_eq!(attempts.len(), 2, "the killed run and the rescued one: {attempts:?}");
    assert_eq!(attempts[0], attempts[1], "the same call with the same idempotency key");
    assert_eq!(shop.applied.lock().expect("lock").len(), 1, "refunded once");
    let (jobs, state): (i64, String) = sqlx::query_as("SELECT COUNT(*), MAX(state) FROM jobs WHERE kind = 'tool.call'").fetch_one(&pool.pool).await.expect("jobs");
    assert_eq!((jobs, state.as_str()), (1, "completed"), "one job for the approval");

    // A rejection, once; a decision after expiry.
    let rejected = request(&cli, "9000").await;
    let out = cli.run(&["approvals", "reject", &rejected.to_string(), "--reason", "not this one"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli.run(&["approvals", "reject", &rejected.to_string()]).await;
    assert!(out.code != 0 && out.stderr.contains("APPROVAL_ALREADY_DECIDED") && out.stderr.contains("by cli"), "{}", out.stderr);
    let expired = request(&cli, "9001").await;
    sqlx::query("UPDATE approvals SET expires_at = 1 WHERE id = $1").bind(expired).execute(&pool.pool).await.expect("age it");
    let out = cli.run(&["approvals", "approve", &expired.to_string()]).await;
    assert!(out.code != 0 && out.stderr.contains("APPROVAL_EXPIRED"), "{}", out.stderr);
    let listed = cli.run(&["approvals", "list", "--state", "rejected", "--json"]).await;
    let rows: Vec<Value> = listed.stdout.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(rows.len(), 1, "{}", listed.stdout);
    assert_eq!(rows[0]["id"], rejected);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(shop.applied.lock().expect("lock").len(), 1, "neither the rejected nor the expired call ran");
    kill_nine(&mut server).await;
    pool.close().await;
}
both_backends!(approvals_kill_nine, approvals_survive_kill_nine_and_run_once);
