//! `[retention]`: the prune removes the records of finished work past their days, in batches of
//! `retention::BATCH`, and keeps everything unfinished, recent or of the current month.

use std::time::Duration;

use server::{
    config::RetentionSettings,
    jobs::echo::Echo,
    retention::{self, Pruned},
};

use tokio::time::Instant;

use crate::{
    both_backends,
    support::{TestApp, TestDb},
    whatsapp::count,
};

const DAY: i64 = 86_400_000;

/// An approval request in `state`, created and (unless pending) settled `age` ago; its asker.
async fn approval(app: &TestApp, key: &str, state: &str, at: i64) -> i64 {
    let decided = (state != "pending").then_some(at);
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO approvals (state, tool, tool_version, args, args_hash, call_key, managed_fields, display, risk, reason_code, reason, \
           actor, channel, chat_kind, chat_id, sender, message_id, request, correlation_id, nonce, created_at, expires_at, decided_at) \
         VALUES ($1, 't', 'v1', '{}', 'h', $2, '[]', '{}', 'high', 'R', 'r', 'customer', 'simulator', 'direct', 'c', 's', $2, 'q', $2, 'n', $3, $4, $5) RETURNING id",
    )
    .bind(state)
    .bind(key)
    .bind(at)
    .bind(at + DAY)
    .bind(decided)
    .fetch_one(&app.state.db.pool)
    .await
    .expect("approval");
    sqlx::query("INSERT INTO approval_askers (channel, message_id, call_key, approval_id) VALUES ('simulator', $1, $1, $2)")
        .bind(key)
        .bind(id)
        .execute(&app.state.db.pool)
        .await
        .expect("asker");
    id
}

async fn exec(app: &TestApp, sql: &str, at: i64) {
    sqlx::query(sql).bind(at).execute(&app.state.db.pool).await.expect(sql);
}

async fn the_prune_removes_finished_work_past_its_days(db: TestDb) {
    let app = TestApp::new(db).await;
    let settings = RetentionSettings::default();
    let now = server::db::now_ms();
    let (old_job, recent_job, month_old) = (now - 31 * DAY, now - 29 * DAY, now - 91 * DAY);

    // An unfinished job that runs again and again, since long ago: its events past the days go,
    // the job stays. Its events are the oldest, as they would be.
    let queue = &app.gatehouse.jobs;
    let unfinished = queue.enqueue(&queue.job(&Echo { message: "waiting".into(), fail_with: None })).await.expect("enqueue").job.id;
    sqlx::query("UPDATE jobs SET state = 'scheduled', updated_at = $1 WHERE id = $2").bind(old_job).bind(unfinished).execute(&app.state.db.pool).await.expect("old");
    sqlx::query("UPDATE job_events SET at = $1 WHERE job_id = $2").bind(old_job).bind(unfinished).execute(&app.state.db.pool).await.expect("old events");
    let its_events = count(&app, &format!("SELECT COUNT(*) FROM job_events WHERE job_id = {unfinished}")).await;
    assert!(its_events > 0);

    // More finished jobs than one batch, past 30 days; each has its event trail.
    let many: Vec<_> = (0..retention::BATCH + 7).map(|i| queue.job(&Echo { message: format!("m{i}"), fail_with: None })).collect();
    let mut tx = app.state.db.begin_write().await.expect("begin");
    let ids: Vec<i64> = queue.enqueue_many_in(&mut tx, &many).await.expect("enqueue").iter().map(|e| e.job.id).collect();
    tx.commit().await.expect("commit");
    let states = ["completed", "cancelled", "discarded"];
    for (i, id) in ids.iter().enumerate() {
        sqlx::query("UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3").bind(states[i % 3]).bind(old_job).bind(id).execute(&app.state.db.pool).await.expect("finish");
    }
    // Kept: a finished job within its 30 days.
    let recent = queue.enqueue(&queue.job(&Echo { message: "recent".into(), fail_with: None })).await.expect("enqueue").job.id;
    sqlx::query("UPDATE jobs SET state = 'completed', updated_at = $1 WHERE id = $2").bind(recent_job).bind(recent).execute(&app.state.db.pool).await.expect("recent");
    let events_before = count(&app, "SELECT COUNT(*) FROM job_events").await;
    assert!(events_before > ids.len() as i64, "every job has its events");
    // A removed tool call's kept answer goes with it; a kept job keeps its answer.
    for job in [ids[0], recent] {
        sqlx::query("INSERT INTO tool_answers (job_id, answer, used_model, at) VALUES ($1, 'a', 0, 0)").bind(job).execute(&app.state.db.pool).await.expect("answer");
    }

    // Approvals: one settled 91 days ago goes; a pending one as old, and one settled lately, stay.
    let gone = approval(&app, "old-approved", "approved", month_old).await;
    approval(&app, "old-pending", "pending", month_old).await;
    approval(&app, "lately-rejected", "rejected", now - DAY).await;

    // Notices, budget warnings (one of a period that ended, one of today) and model calls.
    for at in [month_old, now - DAY] {
        exec(&app, "INSERT INTO owner_notifications (at, hook, tool, reason_code, message, correlation_id) VALUES ($1, 'budget', '', 'BUDGET_WARNING', 'm', 'c')", at).await;
        exec(&app, "INSERT INTO llm_calls (at, provider, model, purpose, correlation_id, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, latency_ms, outcome, attempts) \
                    VALUES ($1, 'anthropic', 'm', 'chat', 'c', 1, 1, 0, 0, 1, 'ok', 1)", at - 310 * DAY).await;
    }
    let today = server::budget::periods_at(now)[0].1.clone();
    exec(&app, "INSERT INTO budget_warnings (period, percent, at, spent_micro_usd, budget_micro_usd) VALUES ('day:2020-01-01', 50, $1, 1, 2)", month_old).await;
    sqlx::query("INSERT INTO budget_warnings (period, percent, at, spent_micro_usd, budget_micro_usd) VALUES ($1, 50, $2, 1, 2)").bind(&today).bind(now).execute(&app.state.db.pool).await.expect("warning");

    // Out of time after the first batch: it stops there, and says there is more.
    let first = retention::prune(&app.state.db, &settings, now, Instant::now()).await.expect("prune");
    assert_eq!(first, Pruned { finished_jobs: retention::BATCH as u64, more: true, ..Pruned::default() }, "{}", first.summary());
    assert!(first.summary().ends_with("more to remove in the next turn"), "{}", first.summary());
    let pruned = retention::prune(&app.state.db, &settings, now, Instant::now() + Duration::from_secs(60)).await.expect("prune");
    let rest = Pruned { finished_jobs: 7, old_job_events: its_events as u64, decided_approvals: 1, notices: 1, budget_warnings: 1, model_calls: 1, more: false };
    assert_eq!(pruned, rest, "{}", pruned.summary());
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'system.echo' ORDER BY id").fetch_all(&app.state.db.pool).await.expect("jobs");
    assert_eq!(left, [unfinished, recent], "unfinished and recent jobs are kept");
    assert!(count(&app, &format!("SELECT COUNT(*) FROM job_events WHERE job_id = {recent}")).await > 0, "a kept job keeps its trail");
    let orphans = count(&app, "SELECT COUNT(*) FROM job_events e WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id)").await;
    assert_eq!(orphans, 0, "a removed job's events go with it");
    let answers: Vec<i64> = sqlx::query_scalar("SELECT job_id FROM tool_answers").fetch_all(&app.state.db.pool).await.expect("answers");
    assert_eq!(answers, [recent], "a removed job's kept answer goes with it");
    assert_eq!(count(&app, &format!("SELECT COUNT(*) FROM approvals WHERE id = {gone}")).await, 0);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM approvals").await, 2, "pending and lately settled requests stay");
    assert_eq!(count(&app, &format!("SELECT COUNT(*) FROM approval_askers WHERE approval_id = {gone}")).await, 0);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM approval_askers").await, 2);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM owner_notifications").await, 1);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM llm_calls").await, 1);
    let warnings: Vec<String> = sqlx::query_scalar("SELECT period FROM budget_warnings").fetch_all(&app.state.db.pool).await.expect("warnings");
    assert_eq!(warnings, [today], "the current period's warning keeps it from being given twice");

    // Nothing left to remove; and 0 days keeps a kind for ever.
    let later = || Instant::now() + Duration::from_secs(60);
    assert_eq!(retention::prune(&app.state.db, &settings, now, later()).await.expect("again"), Pruned::default());
    let forever = RetentionSettings { finished_jobs_days: 0, decided_approvals_days: 0, notices_days: 0, model_calls_days: 0, ..settings };
    assert_eq!(retention::prune(&app.state.db, &forever, now + 10_000 * DAY, later()).await.expect("for ever"), Pruned::default());
}
both_backends!(retention_prune, the_prune_removes_finished_work_past_its_days);

/// The prune is one job for the deployment, whoever schedules it, and comes back every
/// `retention.every`; "0s" schedules nothing.
async fn the_prune_runs_as_one_periodic_job(db: TestDb) {
    let app = TestApp::with(db, |s| s.retention.every = std::time::Duration::from_secs(3600)).await;
    app.gatehouse.retention.schedule().await.expect("schedule");
    app.gatehouse.retention.schedule().await.expect("schedule again");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'retention.prune'").await, 1, "one prune job, whoever schedules it");
    // Only `serve` queues it, at start: out of attempts after a bad patch of the database, it
    // would stop for good and the tables it prunes grow without end.
    let attempts = count(&app, "SELECT max_attempts FROM jobs WHERE kind = 'retention.prune'").await;
    assert!(attempts >= i64::from(u32::MAX), "a periodic job does not run out of attempts: {attempts}");
    // One queued by an earlier build, with the five attempts it had then, gets them at the next
    // start's schedule, which otherwise leaves the queued job as it is.
    sqlx::query("UPDATE jobs SET max_attempts = 5 WHERE kind = 'retention.prune'").execute(&app.state.db.pool).await.expect("an earlier build's job");
    app.gatehouse.retention.schedule().await.expect("schedule at start");
    assert_eq!(count(&app, "SELECT max_attempts FROM jobs WHERE kind = 'retention.prune'").await, attempts, "raised");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(app.gatehouse.worker().run(stopped));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'retention.prune' AND state = 'scheduled'").await == 0 {
        assert!(std::time::Instant::now() < deadline, "the prune did not run");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
    let (attempt, scheduled_at, preview): (i64, i64, Option<String>) =
        sqlx::query_as("SELECT attempt, scheduled_at, result_preview FROM jobs WHERE kind = 'retention.prune'").fetch_one(&app.state.db.pool).await.expect("job");
    assert!(attempt <= 1, "a turn is not a failed attempt: {attempt}");
    assert!(scheduled_at > server::db::now_ms() + 3_000_000, "the next turn is an hour on");
    assert_eq!(preview.as_deref(), Some(Pruned::default().summary().as_str()), "what it removed is the job's preview");

    sqlx::query("DELETE FROM jobs WHERE kind = 'retention.prune'").execute(&app.state.db.pool).await.expect("delete");
    let mut off = app.state.config.settings.clone();
    off.retention.every = std::time::Duration::ZERO;
    let retention = retention::Retention::new(app.state.db.clone(), app.gatehouse.jobs.clone(), std::sync::Arc::new(off));
    retention.schedule().await.expect("schedule");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'retention.prune'").await, 0, "\"0s\" schedules nothing");
}
both_backends!(retention_job, the_prune_runs_as_one_periodic_job);
