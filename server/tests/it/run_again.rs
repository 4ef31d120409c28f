//! An owner runs a failed tool call again from the Jobs page: a new job of the same call for the
//! same message, whose answer reaches the person; a failure again is told only to a person who
//! heard nothing of the first job; a call run again already, still stopping, or that gave its
//! result, is refused with its code; the first job, run again, never makes its call itself.

use axum::http::StatusCode;

use server::db::jobs::NewJob;

use crate::{
    both_backends,
    lane_e2e::{CUSTOMER, Rig, order_lookup, rig},
    support::{Client, TestDb},
};

const ANSWER: &str = "Your order has shipped with Parcel Co: https://track.example/42";

async fn run_again(owner: &mut Client, job: i64) -> crate::support::Resp {
    owner.post_form("/api/run_job_again", &[("id", job.to_string().as_str())]).await
}

async fn detail(owner: &mut Client, job: i64) -> serde_json::Value {
    owner.post_form("/api/get_job", &[("id", job.to_string().as_str())]).await.json()
}

async fn an_owner_runs_a_failed_call_again(db: TestDb) {
    let r = rig(db, |s| s.jobs.default_max_attempts = 1).await;
    let pool = &r.app.state.db.pool;
    *r.shop.order_failures.lock().expect("lock") = 1;
    r.exchange(&[("wamid.AGAIN", "Where is my order 4821?")], 1).await;
    let told_first = r.graph.texts();
    assert_eq!(told_first.len(), 1, "the failure is told: {told_first:?}");
    assert_ne!(told_first[0], ANSWER);
    let first: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("the call's job");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let page = detail(&mut owner, first).await;
    assert_eq!((page["summary"]["state"].as_str(), page["can_run_again"].as_bool()), (Some("discarded"), Some(true)), "{page}");
    assert!(page["run_again_warning"].is_null(), "a read has no outcome to doubt: {page}");

    // Run again while the shop still fails: a new job, the same one for a second click before
    // it runs; its failure is not told to the person again.
    *r.shop.order_failures.lock().expect("lock") = 1;
    let res = run_again(&mut owner, first).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let second = res.json().as_i64().expect("the new job's id");
    assert_ne!(second, first);
    let twice = run_again(&mut owner, first).await;
    assert_eq!((twice.status, twice.json().as_i64()), (StatusCode::OK, Some(second)), "{}", twice.body);
    r.exchange(&[], 1).await;
    assert_eq!(r.graph.texts(), told_first, "the failure again is not told");
    let (state, message): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_message FROM jobs WHERE id = $1").bind(second).fetch_one(pool).await.expect("job");
    assert_eq!(state, "discarded");
    assert!(message.as_deref().is_some_and(|m| m.contains("was not told")), "{message:?}");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 2, "the call was made again");

    // The first job ran again already: refused, naming the job that did; that one runs again.
    let refused = run_again(&mut owner, first).await;
    assert_eq!((refused.status, refused.json()["code"].as_str()), (StatusCode::CONFLICT, Some("RUN_AGAIN_DONE")), "{}", refused.body);
    assert!(refused.body.contains(&format!("job #{second}")), "{}", refused.body);
    let page = detail(&mut owner, first).await;
    assert_eq!((page["can_run_again"].as_bool(), page["ran_again_as"].as_i64()), (Some(false), Some(second)), "{page}");
    let page = detail(&mut owner, second).await;
    assert_eq!((page["can_run_again"].as_bool(), page["again_of"].as_i64()), (Some(true), Some(first)), "{page}");

    // Run again once more, with the shop back: the person gets the answer, once.
    let res = run_again(&mut owner, second).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let third = res.json().as_i64().expect("the new job's id");
    r.exchange(&[], 2).await;
    let mut told = told_first.clone();
    told.push(ANSWER.to_string());
    assert_eq!(r.graph.texts(), told);
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1").bind(third).fetch_one(pool).await.expect("job");
    assert_eq!(state, "completed");
    let answered = run_again(&mut owner, third).await;
    assert_eq!((answered.status, answered.json()["code"].as_str()), (StatusCode::CONFLICT, Some("RUN_AGAIN_ANSWERED")), "{}", answered.body);

    // Each run is the same request's: its message and correlation id; each run again is in the
    // message's trace, with the answer's delivery, and in the owners' audit.
    let (messages, requests): (i64, i64) = sqlx::query_as("SELECT COUNT(DISTINCT message_id), COUNT(DISTINCT correlation_id) FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("jobs");
    assert_eq!((messages, requests), (1, 1));
    let steps = r.steps("wamid.AGAIN").await;
    assert_eq!(steps.iter().filter(|(s, d, _)| s == "AgentToolRunAgain" && d == "owner").count(), 2, "{steps:?}");
    assert!(steps.iter().any(|(s, d, c)| s == "AgentToolExecutionSucceeded" && d == "later" && c == "OK"), "{steps:?}");
    assert!(steps.iter().any(|(s, d, _)| s == "later_delivery" && d == "sent"), "{steps:?}");
    let audited: Vec<String> = sqlx::query_scalar("SELECT detail FROM owner_audit WHERE event = 'job_run_again' ORDER BY id").fetch_all(pool).await.expect("audit");
    assert_eq!(audited.len(), 2, "{audited:?}");
    assert!(audited[0].contains(&format!("\"new_job_id\":{second}")), "{audited:?}");
}
both_backends!(run_again_failed_call, an_owner_runs_a_failed_call_again);

/// A run again an owner cancels says nothing to the person: they were never told it would follow.
async fn a_cancelled_run_again_says_nothing(db: TestDb) {
    let r = rig(db, |s| s.jobs.default_max_attempts = 1).await;
    let pool = &r.app.state.db.pool;
    *r.shop.order_failures.lock().expect("lock") = 1;
    r.exchange(&[("wamid.AGAIN", "Where is my order 4821?")], 1).await;
    let told_first = r.graph.texts();
    let first: i64 = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tool.call'").fetch_one(pool).await.expect("the call's job");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let second = run_again(&mut owner, first).await.json().as_i64().expect("the new job's id");
    let cancelled = owner.post_form("/api/cancel_job", &[("id", second.to_string().as_str())]).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    r.exchange(&[], 1).await;
    let preview: Option<String> = sqlx::query_scalar("SELECT result_preview FROM jobs WHERE kind = 'tool.stopped'").fetch_one(pool).await.expect("the cancel's job");
    assert!(preview.as_deref().is_some_and(|p| p.contains("whose end the person heard")), "{preview:?}");
    assert_eq!(r.graph.texts(), told_first, "nothing more said");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "the cancelled run again made no call");
}
both_backends!(run_again_cancelled, a_cancelled_run_again_says_nothing);

/// Stores an order lookup for `message` as a job that waits an hour (it is not run unless a
/// test makes it due), as the lane would have: the job's id.
async fn stored_call(r: &Rig, message: &str) -> i64 {
    let call = order_lookup(&r.app.state.tools.catalog().get("order_status").expect("tool").version, message);
    let queue = &r.app.gatehouse.jobs;
    let new = NewJob {
        chat_id: Some(CUSTOMER.into()),
        sender_id: Some(CUSTOMER.into()),
        message_id: Some(message.into()),
        tool_name: Some("order_status".into()),
        scheduled_at: Some(server::db::now_ms() + 3_600_000),
        ..queue.job(&call)
    };
    queue.enqueue(&new).await.expect("enqueue").job.id
}

/// A call an owner cancelled before it ran: its run again waits until the person was told it
/// stopped, then answers; the first job is not retried after, and a run of it (a rescue, a
/// retry that came first) makes no call and says nothing.
async fn a_job_run_again_never_makes_its_call_itself(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let pool = &r.app.state.db.pool;
    let stopped = r.app.state.config.settings.lane.cancelled_reply.clone();
    let first = stored_call(&r, "wamid.STOPPED_FIRST").await;
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let cancelled = owner.post_form("/api/cancel_job", &[("id", first.to_string().as_str())]).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    let early = run_again(&mut owner, first).await;
    assert_eq!((early.status, early.json()["code"].as_str()), (StatusCode::CONFLICT, Some("RUN_AGAIN_STOPPING")), "{}", early.body);
    r.exchange(&[], 1).await;
    assert_eq!(r.graph.texts(), vec![stopped.clone()], "told it stopped");

    let res = run_again(&mut owner, first).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    r.exchange(&[], 2).await;
    assert_eq!(r.graph.texts(), vec![stopped.clone(), ANSWER.to_string()]);

    let retried = owner.post_form("/api/retry_job", &[("id", first.to_string().as_str())]).await;
    assert_eq!((retried.status, retried.json()["code"].as_str()), (StatusCode::CONFLICT, Some("RUN_AGAIN_DONE")), "{}", retried.body);
    let page = detail(&mut owner, first).await;
    assert_eq!((page["can_retry"].as_bool(), page["can_run_again"].as_bool()), (Some(false), Some(false)), "{page}");
    // Nor by the queue itself, asked directly.
    let mut tx = r.app.state.db.begin_write().await.expect("tx");
    assert!(!server::db::jobs::retry_now(&mut tx, first, server::db::now_ms()).await.expect("retry"), "a job done again is not retried");
    drop(tx);
    // Due again all the same (a retry that came before the run again, say).
    sqlx::query("UPDATE jobs SET state = 'available', scheduled_at = 0, completed_at = NULL WHERE id = $1").bind(first).execute(pool).await.expect("due");
    r.exchange(&[], 2).await;
    let (state, code): (String, Option<String>) = sqlx::query_as("SELECT state, last_error_code FROM jobs WHERE id = $1").bind(first).fetch_one(pool).await.expect("job");
    assert_eq!((state.as_str(), code.as_deref()), ("discarded", Some("JOB_RUN_AGAIN")));
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "the call was made once, by the run again");
    let timeline: Vec<Option<String>> = sqlx::query_scalar("SELECT error_code FROM job_events WHERE job_id = $1 ORDER BY id").bind(first).fetch_all(pool).await.expect("events");
    assert!(timeline.iter().any(|c| c.as_deref() == Some("JOB_RUN_AGAIN")), "the first job's timeline says so: {timeline:?}");
    assert_eq!(r.graph.texts(), vec![stopped, ANSWER.to_string()], "nothing more said");
}
both_backends!(run_again_first_job_done, a_job_run_again_never_makes_its_call_itself);

/// A call whose job ended without the person hearing anything (its lease ran out on its last
/// attempt, after the call was marked as made): the owner is warned its outcome is unknown, and
/// a run again that fails tells the person.
async fn a_person_who_heard_nothing_is_told_the_run_agains_failure(db: TestDb) {
    let r = rig(db, |s| s.jobs.default_max_attempts = 1).await;
    let pool = &r.app.state.db.pool;
    let first = stored_call(&r, "wamid.LOST").await;
    sqlx::query("UPDATE jobs SET state = 'discarded', completed_at = 1, last_error_code = 'JOB_LEASE_EXPIRED' WHERE id = $1").bind(first).execute(pool).await.expect("lost");
    sqlx::query("INSERT INTO tool_call_starts (job_id, at) VALUES ($1, 1)").bind(first).execute(pool).await.expect("marked as made");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let page = detail(&mut owner, first).await;
    assert_eq!(page["can_run_again"].as_bool(), Some(true), "{page}");
    assert!(page["run_again_warning"].as_str().is_some_and(|w| w.contains("TOOL_OUTCOME_UNKNOWN")), "{page}");

    *r.shop.order_failures.lock().expect("lock") = 1;
    let res = run_again(&mut owner, first).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    r.exchange(&[], 1).await;
    let told = r.graph.texts();
    assert_eq!(told.len(), 1, "the failure is told: {told:?}");
    assert_ne!(told[0], ANSWER);
}
both_backends!(run_again_told_when_unheard, a_person_who_heard_nothing_is_told_the_run_agains_failure);

/// A slow call's failure its job sent the person itself; runs again of it, each failing, tell
/// them nothing more, down a chain of runs again.
async fn a_failure_the_job_sent_is_not_told_again_down_the_chain(db: TestDb) {
    let r = rig(db, |s| s.jobs.default_max_attempts = 1).await;
    let pool = &r.app.state.db.pool;
    let first = stored_call(&r, "wamid.SENT_FAILURE").await;
    *r.shop.order_failures.lock().expect("lock") = 3;
    sqlx::query("UPDATE jobs SET scheduled_at = 0 WHERE id = $1").bind(first).execute(pool).await.expect("due");
    r.exchange(&[], 1).await;
    let told = r.graph.texts();
    assert_eq!(told.len(), 1, "the job sent the failure: {told:?}");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let mut last = first;
    for _ in 0..2 {
        let res = run_again(&mut owner, last).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        last = res.json().as_i64().expect("the new job's id");
        r.exchange(&[], 1).await;
        let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1").bind(last).fetch_one(pool).await.expect("job");
        assert_eq!(state, "discarded");
    }
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 3, "each run made the call");
    assert_eq!(r.graph.texts(), told, "told once");
}
both_backends!(run_again_chain_silent, a_failure_the_job_sent_is_not_told_again_down_the_chain);

/// A call cancelled while it runs is not run again until its run has stopped (its lease).
async fn a_call_still_stopping_is_not_run_again(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let pool = &r.app.state.db.pool;
    let first = stored_call(&r, "wamid.STOPPING").await;
    sqlx::query("UPDATE jobs SET state = 'cancelled', last_error_code = 'JOB_CANCELLED', lease_owner = 'another-worker', lease_expires_at = $1 WHERE id = $2")
        .bind(server::db::now_ms() + 60_000)
        .bind(first)
        .execute(pool)
        .await
        .expect("cancelled while running");
    let mut owner = r.app.with_owner("ada", "correct horse battery").await;
    let res = run_again(&mut owner, first).await;
    assert_eq!((res.status, res.json()["code"].as_str()), (StatusCode::CONFLICT, Some("RUN_AGAIN_STOPPING")), "{}", res.body);
    assert_eq!(detail(&mut owner, first).await["can_run_again"].as_bool(), Some(false));
    // Stopped: it lets its lease go.
    sqlx::query("UPDATE jobs SET lease_owner = NULL, lease_expires_at = NULL WHERE id = $1").bind(first).execute(pool).await.expect("stopped");
    let res = run_again(&mut owner, first).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
}
both_backends!(run_again_waits_for_stopping, a_call_still_stopping_is_not_run_again);
