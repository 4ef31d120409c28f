//! The job store and worker on both backends.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use server::{
    db::{
        self, Db,
        jobs::{self as store, FailOutcome, Finished, JobFilter, JobState, NewJob},
    },
    jobs::{JobContext, JobError, JobHandler, JobHook, JobOutput, JobQueue, Registry, Worker, WorkerSettings},
};
use tokio::sync::watch;

use crate::{both_backends, support::TestDb};

fn job(kind: &str) -> NewJob {
    NewJob { kind: kind.into(), queue: "default".into(), max_attempts: 3, correlation_id: "corr-1".into(), args: serde_json::json!({}), ..Default::default() }
}

async fn fresh(db: &TestDb) -> Db {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    pool
}

async fn enqueue_commits_with_the_callers_transaction(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let mut tx = pool.begin_write().await.expect("begin");
    let rolled_back = queue.enqueue_in(&mut tx, &job("noop")).await.expect("enqueue").job.id;
    tx.rollback().await.expect("rollback");
    let mut conn = pool.pool.acquire().await.expect("conn");
    assert!(store::get(&mut conn, rolled_back).await.expect("get").is_none(), "rolled back with the caller");
    drop(conn);

    let mut tx = pool.begin_write().await.expect("begin");
    let kept = queue.enqueue_in(&mut tx, &NewJob { chat_id: Some("chat-1".into()), tool_name: Some("web_fetch".into()), ..job("noop") }).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let got = store::get(&mut conn, kept.job.id).await.expect("get").expect("present");
    assert_eq!(got.state, JobState::Available);
    assert_eq!(got.correlation_id, "corr-1");
    let events = store::events(&mut conn, got.id).await.expect("events");
    assert_eq!(events.iter().map(|e| e.state).collect::<Vec<_>>(), vec![JobState::Available]);
}
both_backends!(jobs_enqueue_in_transaction, enqueue_commits_with_the_callers_transaction);

async fn dedupe_while_unfinished(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let keyed = NewJob { dedupe_key: Some("msg-1:web_fetch".into()), ..job("noop") };
    let first = queue.enqueue(&keyed).await.expect("first");
    assert!(!first.deduplicated);
    let second = queue.enqueue(&keyed).await.expect("second");
    assert!(second.deduplicated, "same key while unfinished");
    assert_eq!(second.job.id, first.job.id);

    // Concurrent enqueues of one key create one job.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let q = queue.clone();
            let j = NewJob { dedupe_key: Some("race".into()), ..job("noop") };
            tokio::spawn(async move { q.enqueue(&j).await.expect("enqueue") })
        })
        .collect();
    let mut ids = Vec::new();
    for r in racers {
        ids.push(r.await.expect("join").job.id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let now = db::now_ms();
    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 10, now, now + 60_000).await.expect("claim");
    let done: Vec<Finished> = claimed.iter().map(|j| Finished { id: j.id, attempt: j.attempt, preview: Some("ok".into()) }).collect();
    store::complete(&mut conn, &done, "w1", now).await.expect("complete");
    drop(conn);
    let third = queue.enqueue(&keyed).await.expect("third");
    assert!(!third.deduplicated, "a finished job frees its key");
    let mut conn = pool.pool.acquire().await.expect("conn");
    assert_eq!(store::find_by_dedupe(&mut conn, "msg-1:web_fetch").await.expect("find").map(|j| j.id), Some(third.job.id));
}
both_backends!(jobs_dedupe, dedupe_while_unfinished);

/// One `complete` call finishes a batch with one statement: each run gets its own preview and
/// one `completed` event; a run whose attempt is stale, or whose job another worker holds, is
/// left as it is and not reported.
async fn complete_a_batch_of_runs(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    for _ in 0..4 {
        queue.enqueue(&job("noop")).await.expect("enqueue");
    }
    let mut conn = pool.pool.acquire().await.expect("conn");
    let now = db::now_ms();
    let mine = store::claim(&mut conn, pool.backend, "default", "w1", 3, now, now + 60_000).await.expect("claim");
    let theirs = store::claim(&mut conn, pool.backend, "default", "w2", 1, now, now + 60_000).await.expect("claim");
    assert_eq!((mine.len(), theirs.len()), (3, 1));
    let mut done: Vec<Finished> = mine.iter().map(|j| Finished { id: j.id, attempt: j.attempt, preview: Some(format!("result of {}", j.id)) }).collect();
    done[1].attempt += 1; // a stale run: that lease token is not the job's
    done[2].preview = None;
    done.push(Finished { id: theirs[0].id, attempt: theirs[0].attempt, preview: Some("not mine".into()) });
    // Two runs of one job in one batch (a stalled run and its rerun): only the run holding the
    // lease completes it, and only that run is reported.
    done.push(Finished { id: mine[0].id, attempt: mine[0].attempt + 1, preview: Some("the other run".into()) });
    let mut completed = store::complete(&mut conn, &done, "w1", now + 5).await.expect("complete");
    completed.sort_unstable();
    assert_eq!(completed, vec![(mine[0].id, mine[0].attempt), (mine[2].id, mine[2].attempt)]);
    let first = store::get(&mut conn, mine[0].id).await.expect("get").expect("row");
    assert_eq!((first.state, first.result_preview.as_deref(), first.completed_at, first.lease_owner.as_deref()), (JobState::Completed, Some(format!("result of {}", mine[0].id).as_str()), Some(now + 5), None));
    let third = store::get(&mut conn, mine[2].id).await.expect("get").expect("row");
    assert_eq!((third.state, third.result_preview), (JobState::Completed, None));
    assert_eq!(store::get(&mut conn, mine[1].id).await.expect("get").expect("row").state, JobState::Running, "a stale attempt completes nothing");
    assert_eq!(store::get(&mut conn, theirs[0].id).await.expect("get").expect("row").state, JobState::Running, "another worker's job is left alone");
    for (id, states) in [(mine[0].id, vec![JobState::Available, JobState::Running, JobState::Completed]), (mine[1].id, vec![JobState::Available, JobState::Running])] {
        let events = store::events(&mut conn, id).await.expect("events");
        assert_eq!(events.iter().map(|e| e.state).collect::<Vec<_>>(), states, "job {id}");
    }
}
both_backends!(jobs_complete_batch, complete_a_batch_of_runs);

/// `enqueue_many` gives what `enqueue` one at a time would: results in input order, one job per
/// unfinished key (against stored jobs and within the list), keyless jobs always, an event each.
async fn enqueue_many_matches_one_at_a_time(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let held = queue.enqueue(&NewJob { dedupe_key: Some("held".into()), ..job("noop") }).await.expect("held").job.id;
    let keyed = |key: &str, chat: &str| NewJob { dedupe_key: Some(key.into()), chat_id: Some(chat.into()), ..job("noop") };
    let keyless = |chat: &str| NewJob { chat_id: Some(chat.into()), ..job("noop") };
    let later = db::now_ms() + 3_600_000;
    let list = vec![
        keyless("a"),
        keyed("k1", "b"),
        keyed("held", "c"),
        keyed("k1", "d"),
        keyless("e"),
        NewJob { scheduled_at: Some(later), ..keyed("k2", "f") },
        NewJob { pending: true, ..keyless("g") },
        NewJob {
            sender_id: Some("sender".into()),
            message_id: Some("wamid.1".into()),
            original_text: Some("text with a \0 NUL".into()),
            tool_name: Some("web_fetch".into()),
            args: serde_json::json!({ "url": "https://example.com/\u{e9}" }),
            priority: 5,
            expires_at: Some(later + 1),
            ..keyed("k3", "h")
        },
    ];
    let mut tx = pool.begin_write().await.expect("begin");
    let got = queue.enqueue_many_in(&mut tx, &list).await.expect("enqueue_many");
    tx.commit().await.expect("commit");

    assert_eq!(got.len(), list.len());
    let dedup: Vec<bool> = got.iter().map(|e| e.deduplicated).collect();
    assert_eq!(dedup, vec![false, false, true, true, false, false, false, false]);
    assert_eq!(got[2].job.id, held, "an unfinished stored job keeps its key");
    assert_eq!(got[3].job.id, got[1].job.id, "the first entry with a key wins it");
    let chats: Vec<_> = got.iter().map(|e| e.job.chat_id.clone().unwrap_or_default()).collect();
    // A deduplicated entry gets the job that holds its key, with that job's own fields.
    assert_eq!(chats, vec!["a", "b", "", "b", "e", "f", "g", "h"], "each result belongs to its input");
    let states: Vec<_> = got.iter().map(|e| e.job.state).collect();
    assert_eq!(
        states,
        vec![
            JobState::Available,
            JobState::Available,
            JobState::Available,
            JobState::Available,
            JobState::Available,
            JobState::Scheduled,
            JobState::Pending,
            JobState::Available
        ]
    );

    let mut conn = pool.pool.acquire().await.expect("conn");
    let (jobs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs").fetch_one(&mut *conn).await.expect("count");
    assert_eq!(jobs, 7, "held + six new");
    for e in got.iter().filter(|e| !e.deduplicated) {
        // The returned row is the stored one, column for column.
        assert_eq!(store::get(&mut conn, e.job.id).await.expect("get").as_ref(), Some(&e.job));
        let events = store::events(&mut conn, e.job.id).await.expect("events");
        assert_eq!(events.iter().map(|ev| ev.state).collect::<Vec<_>>(), vec![e.job.state], "job {}", e.job.id);
        assert_eq!((events[0].at, events[0].attempt), (e.job.created_at, 0), "job {}", e.job.id);
    }
    // A deduplicated entry writes no event for the job that holds its key.
    assert_eq!(store::events(&mut conn, held).await.expect("events").len(), 1, "only the held job's own first event");
    // Past one statement's worth of rows.
    drop(conn);
    let many: Vec<NewJob> = (0..600).map(|i| keyed(&format!("bulk-{}", i % 550), "bulk")).collect();
    let mut tx = pool.begin_write().await.expect("begin");
    let got = queue.enqueue_many_in(&mut tx, &many).await.expect("bulk");
    tx.commit().await.expect("commit");
    assert_eq!(got.iter().filter(|e| !e.deduplicated).count(), 550);
    assert!(got.iter().zip(&many).all(|(e, j)| e.job.dedupe_key == j.dedupe_key));
}
both_backends!(jobs_enqueue_many, enqueue_many_matches_one_at_a_time);

async fn lifecycle_claim_heartbeat_fail_retry_discard(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let id = queue.enqueue(&job("noop")).await.expect("enqueue").job.id;
    let mut conn = pool.pool.acquire().await.expect("conn");
    let t0 = db::now_ms();

    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 5, t0, t0 + 1000).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].state, claimed[0].attempt), (JobState::Running, 1));
    assert!(store::claim(&mut conn, pool.backend, "default", "w2", 5, t0, t0 + 1000).await.expect("claim").is_empty(), "leased jobs are not claimed twice");
    assert_eq!(store::heartbeat(&mut conn, &[id], "w1", t0, t0 + 60_000).await.expect("hb"), vec![id]);
    assert!(store::heartbeat(&mut conn, &[id], "w2", t0, t0 + 60_000).await.expect("hb").is_empty(), "only the holder extends");

    // Retryable failure with attempts left: scheduled again.
    let outcome = store::fail(&mut conn, id, 1, "w1", "TOOL_TIMEOUT", "slow", true, t0 + 5000, t0).await.expect("fail");
    assert_eq!(outcome, FailOutcome::Retry { at: t0 + 5000 });
    let j = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!((j.state, j.last_error_code.as_deref()), (JobState::Retryable, Some("TOOL_TIMEOUT")));
    assert!(store::claim(&mut conn, pool.backend, "default", "w1", 5, t0 + 100, t0 + 1000).await.expect("claim").is_empty(), "not due yet");

    // Snooze does not count an attempt.
    let again = store::claim(&mut conn, pool.backend, "default", "w1", 5, t0 + 6000, t0 + 9000).await.expect("claim");
    assert_eq!(again[0].attempt, 2);
    assert!(!store::snooze(&mut conn, id, 1, "w1", t0 + 7000, t0 + 6000, store::Snooze::Waiting { code: "TEST_WAIT" }).await.expect("snooze"), "a stale attempt cannot snooze");
    assert!(store::snooze(&mut conn, id, 2, "w1", t0 + 7000, t0 + 6000, store::Snooze::Waiting { code: "TEST_WAIT" }).await.expect("snooze"));
    let j = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempt), (JobState::Scheduled, 1));

    let again = store::claim(&mut conn, pool.backend, "default", "w1", 5, t0 + 7000, t0 + 9000).await.expect("claim");
    assert_eq!(again[0].attempt, 2);
    assert_eq!(store::fail(&mut conn, id, 2, "w1", "E", "m", true, t0 + 8000, t0 + 7000).await.expect("fail"), FailOutcome::Retry { at: t0 + 8000 });
    let last = store::claim(&mut conn, pool.backend, "default", "w1", 5, t0 + 8000, t0 + 9000).await.expect("claim");
    assert_eq!(last[0].attempt, 3);
    // Out of attempts: discarded even though retryable.
    assert_eq!(store::fail(&mut conn, id, 3, "w1", "E\0\0", "m", true, t0 + 9000, t0 + 8000).await.expect("fail"), FailOutcome::Discarded);
    // A permanent failure is discarded at once.
    let other = queue.enqueue(&job("noop")).await.expect("enqueue").job.id;
    store::claim(&mut conn, pool.backend, "default", "w1", 5, t0 + 9000, t0 + 20_000).await.expect("claim");
    assert_eq!(store::fail(&mut conn, other, 1, "w1", "TOOL_SCHEMA_INVALID", "bad\0 with a NUL", false, 0, t0 + 9000).await.expect("fail"), FailOutcome::Discarded);

    let timeline: Vec<JobState> = store::events(&mut conn, id).await.expect("events").into_iter().map(|e| e.state).collect();
    use JobState::*;
    assert_eq!(timeline, vec![Available, Running, Retryable, Running, Scheduled, Running, Retryable, Running, Discarded]);

    // Owner retry gives a discarded job one more attempt.
    assert!(store::retry_now(&mut conn, id, t0 + 10_000).await.expect("retry"));
    let j = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!((j.state, j.max_attempts), (Available, 4));
}
both_backends!(jobs_lifecycle, lifecycle_claim_heartbeat_fail_retry_discard);

/// A job that asks to run again keeps its run's preview as the job's, cleaned as a finished
/// job's is: no NUL (PostgreSQL refuses it, and the snooze would be lost) and at most 4,000
/// characters.
async fn a_rescheduled_run_keeps_its_preview(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let id = queue.enqueue(&job("noop")).await.expect("enqueue").job.id;
    let mut conn = pool.pool.acquire().await.expect("conn");
    let t0 = db::now_ms();
    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 5, t0, t0 + 1000).await.expect("claim");
    let preview = format!("swept\0 {}", "x".repeat(5000));
    let rescheduled = store::Snooze::Rescheduled { preview: Some(&preview) };
    assert!(store::snooze(&mut conn, id, claimed[0].attempt, "w1", t0 + 60_000, t0, rescheduled).await.expect("snooze"));
    let j = store::get(&mut conn, id).await.expect("get").expect("job");
    let kept = j.result_preview.expect("the run's preview");
    assert_eq!(j.state, JobState::Scheduled);
    assert!(kept.starts_with("swept x") && !kept.contains('\0') && kept.chars().count() <= 4000, "{} chars", kept.chars().count());
}
both_backends!(jobs_rescheduled_preview, a_rescheduled_run_keeps_its_preview);

async fn cancel_expire_rescue_pending(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let t0 = db::now_ms();
    let cancelled = queue.enqueue(&job("noop")).await.expect("e").job.id;
    let expiring = queue.enqueue(&NewJob { expires_at: Some(t0 + 50), scheduled_at: Some(t0 + 1_000_000), ..job("noop") }).await.expect("e").job.id;
    let pending = queue.enqueue(&NewJob { pending: true, ..job("noop") }).await.expect("e").job.id;
    let rejected = queue.enqueue(&NewJob { pending: true, ..job("noop") }).await.expect("e").job.id;
    let mut conn = pool.pool.acquire().await.expect("conn");
    assert_eq!(store::get(&mut conn, expiring).await.expect("g").map(|j| j.state), Some(JobState::Scheduled));
    assert!(store::cancel(&mut conn, cancelled, "owner cancelled", t0).await.expect("cancel"));
    assert!(!store::cancel(&mut conn, cancelled, "again", t0).await.expect("cancel"), "finished jobs stay finished");

    assert_eq!(store::expire(&mut conn, pool.backend, t0 + 100).await.expect("expire"), vec![expiring]);
    assert_eq!(store::get(&mut conn, expiring).await.expect("g").and_then(|j| j.last_error_code), Some("JOB_EXPIRED".into()));

    // Pending jobs are never claimed until released.
    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 10, t0 + 200, t0 + 300).await.expect("claim");
    assert!(claimed.is_empty(), "{claimed:?}");
    assert!(store::release_pending(&mut conn, pending, true, t0 + 200).await.expect("approve"));
    assert!(store::release_pending(&mut conn, rejected, false, t0 + 200).await.expect("reject"));
    assert_eq!(store::get(&mut conn, rejected).await.expect("g").map(|j| j.state), Some(JobState::Cancelled));
    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 10, t0 + 200, t0 + 3200).await.expect("claim");
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![pending]);

    // The worker died: its lease runs out and the job is rescued for a retry. (On PostgreSQL a
    // lease runs by the server's clock, not by the times given here: so it is waited out.)
    assert_eq!(store::rescue(&mut conn, pool.backend, t0 + 250).await.expect("rescue"), Vec::<i64>::new(), "lease still valid");
    if pool.backend == db::Backend::Postgres {
        tokio::time::sleep(Duration::from_millis(3100)).await;
    }
    assert_eq!(store::rescue(&mut conn, pool.backend, t0 + 3300).await.expect("rescue"), vec![pending]);
    let j = store::get(&mut conn, pending).await.expect("g").expect("job");
    assert_eq!((j.state, j.last_error_code.as_deref(), j.lease_owner), (JobState::Retryable, Some("JOB_LEASE_EXPIRED"), None));
    // The dead worker's late result is ignored.
    assert_eq!(store::complete(&mut conn, &[Finished { id: pending, attempt: 1, preview: None }], "w1", t0 + 500).await.expect("complete"), Vec::<(i64, i64)>::new());

    // An owner's retry of an expired job runs it: its elapsed time to live is lifted.
    assert!(store::retry_now(&mut conn, expiring, t0 + 600).await.expect("retry"));
    assert_eq!(store::expire(&mut conn, pool.backend, t0 + 700).await.expect("expire"), Vec::<i64>::new(), "not expired again");
    let claimed = store::claim(&mut conn, pool.backend, "default", "w1", 10, t0 + 700, t0 + 800).await.expect("claim");
    assert!(claimed.iter().any(|j| j.id == expiring), "{claimed:?}");
}
both_backends!(jobs_cancel_expire_rescue, cancel_expire_rescue_pending);

async fn listing_filters_paging_counts(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    for i in 0..25 {
        let chat = if i % 2 == 0 { "even" } else { "odd" };
        queue.enqueue(&NewJob { chat_id: Some(chat.into()), tool_name: Some(format!("tool{}", i % 3)), ..job("noop") }).await.expect("e");
    }
    let mut conn = pool.pool.acquire().await.expect("conn");
    let page1 = store::list(&mut conn, &JobFilter::default(), 10).await.expect("list");
    assert_eq!(page1.len(), 10);
    assert!(page1.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    let page2 = store::list(&mut conn, &JobFilter { before_id: page1.last().map(|j| j.id), ..Default::default() }, 10).await.expect("list");
    assert_eq!(page2.len(), 10);
    assert!(page2[0].id < page1[9].id);
    let even = store::list(&mut conn, &JobFilter { chat_id: Some("even".into()), ..Default::default() }, 100).await.expect("list");
    assert_eq!(even.len(), 13);
    let tool0_even = store::list(&mut conn, &JobFilter { chat_id: Some("even".into()), tool_name: Some("tool0".into()), ..Default::default() }, 100).await.expect("list");
    assert!(tool0_even.iter().all(|j| j.tool_name.as_deref() == Some("tool0") && j.chat_id.as_deref() == Some("even")));
    assert_eq!(tool0_even.len(), 5);
    let now = db::now_ms();
    store::claim(&mut conn, pool.backend, "default", "w", 4, now, now + 1000).await.expect("claim");
    let counts: HashMap<JobState, i64> = store::counts_by_state(&mut conn).await.expect("counts").into_iter().collect();
    assert_eq!(counts.get(&JobState::Running), Some(&4));
    assert_eq!(counts.get(&JobState::Available), Some(&21));
    let running = store::list(&mut conn, &JobFilter { state: Some(JobState::Running), ..Default::default() }, 100).await.expect("list");
    assert_eq!(running.len(), 4);
    let future = store::list(&mut conn, &JobFilter { created_from: Some(now + 60_000), ..Default::default() }, 100).await.expect("list");
    assert!(future.is_empty());
}
both_backends!(jobs_listing, listing_filters_paging_counts);

/// Counts runs per job id, fails the first `fail_first` attempts of each job, and can sleep.
#[derive(Default)]
struct Probe {
    runs: Mutex<HashMap<i64, usize>>,
    fail_first: usize,
    /// Runs that first find no room to write, before `fail_first` counts.
    full_first: usize,
    sleep: Duration,
}

#[async_trait::async_trait]
impl JobHandler for Probe {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let n = {
            let mut runs = self.runs.lock().expect("lock");
            let n = runs.entry(ctx.job.id).or_default();
            *n += 1;
            *n
        };
        if !self.sleep.is_zero() {
            tokio::time::sleep(self.sleep).await;
        }
        if n <= self.full_first {
            let full = db::DbError::Sql(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull)));
            return Err(JobError::from(full));
        }
        if n <= self.full_first + self.fail_first {
            return Err(JobError::retryable("TOOL_PROVIDER_ERROR", "flaky"));
        }
        Ok(JobOutput { preview: Some(format!("done by {}", ctx.idempotency_key())), snooze: None })
    }
}

#[derive(serde::Deserialize)]
struct NeedsNumber {
    #[expect(dead_code, reason = "only its decoding matters")]
    n: i64,
}

struct Typed;

#[async_trait::async_trait]
impl JobHandler for Typed {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        ctx.args::<NeedsNumber>()?;
        Ok(JobOutput::default())
    }
}

#[derive(Default)]
struct Counting {
    ok: AtomicUsize,
    failed_final: AtomicUsize,
}

#[async_trait::async_trait]
impl JobHook for Counting {
    async fn on_success(&self, _job: &db::jobs::JobRow) {
        self.ok.fetch_add(1, Ordering::SeqCst);
    }
    async fn on_failure(&self, _job: &db::jobs::JobRow, _error: &JobError, final_failure: bool) {
        if final_failure {
            self.failed_final.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub(crate) fn fast_settings() -> WorkerSettings {
    WorkerSettings {
        concurrency: 8,
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(5),
        job_timeout: Duration::from_millis(500),
        shutdown_grace: Duration::from_secs(2),
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(50),
        maintenance_interval: Duration::from_millis(200),
        ..Default::default()
    }
}

async fn wait_until_finished(pool: &Db, total: usize, within: Duration) -> HashMap<JobState, i64> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut conn = pool.pool.acquire().await.expect("conn");
        let counts: HashMap<JobState, i64> = store::counts_by_state(&mut conn).await.expect("counts").into_iter().collect();
        let finished: i64 = counts.iter().filter(|(s, _)| s.is_finished()).map(|(_, n)| n).sum();
        if finished as usize >= total || tokio::time::Instant::now() > deadline {
            return counts;
        }
        drop(conn);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A kind whose jobs run one at a time per chat, like a person's messages.
#[derive(serde::Serialize, serde::Deserialize)]
struct InTurn {
    n: u32,
}

impl server::jobs::JobKind for InTurn {
    const KIND: &'static str = "test.in_turn";
    const ONE_AT_A_TIME_PER_CHAT: bool = true;
}

/// Records, per chat, the order of its runs and how many ran at once.
#[derive(Default)]
struct Turns {
    running: Mutex<HashMap<String, usize>>,
    most_in_a_chat: AtomicUsize,
    most_at_once: AtomicUsize,
    order: Mutex<Vec<(String, u32)>>,
}

#[async_trait::async_trait]
impl server::jobs::Handler<InTurn> for Turns {
    async fn run(&self, args: InTurn, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let chat = ctx.job.chat_id.clone().unwrap_or_default();
        {
            let mut running = self.running.lock().expect("lock");
            let here = running.entry(chat.clone()).or_default();
            *here += 1;
            self.most_in_a_chat.fetch_max(*here, Ordering::SeqCst);
            self.most_at_once.fetch_max(running.values().sum(), Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        *self.running.lock().expect("lock").get_mut(&chat).expect("counted") -= 1;
        self.order.lock().expect("lock").push((chat, args.n));
        Ok(JobOutput::default())
    }
}

/// A chat's jobs of such a kind run one at a time and in the order they were stored, while
/// other chats' run beside them, on one worker of many slots as on two workers.
async fn a_chats_jobs_run_one_at_a_time_in_order(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let turns = Arc::new(Turns::default());
    let mut jobs = Vec::new();
    for n in 0..5 {
        for chat in ["chat-a", "chat-b", "chat-c"] {
            jobs.push(NewJob { chat_id: Some(chat.into()), ..queue.job(&InTurn { n }) });
        }
    }
    // An older unfinished job of chat-a in a queue no worker here serves holds nothing back.
    queue.enqueue(&NewJob { queue: "elsewhere".into(), chat_id: Some("chat-a".into()), ..queue.job(&InTurn { n: 99 }) }).await.expect("elsewhere");
    let mut tx = pool.begin_write().await.expect("begin");
    queue.enqueue_many_in(&mut tx, &jobs).await.expect("enqueue");
    queue.commit(tx).await.expect("commit");
    let (stop, stopped) = watch::channel(false);
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut registry = Registry::new();
        registry.handle::<InTurn>(turns.clone());
        workers.push(tokio::spawn(Worker::new(pool.clone(), registry, fast_settings(), queue.waker()).run(stopped.clone())));
    }
    let counts = wait_until_finished(&pool, jobs.len(), Duration::from_secs(30)).await;
    stop.send(true).expect("stop");
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(counts.get(&JobState::Completed).copied(), Some(jobs.len() as i64), "{counts:?}");
    assert_eq!(turns.most_in_a_chat.load(Ordering::SeqCst), 1, "one at a time in a chat");
    assert!(turns.most_at_once.load(Ordering::SeqCst) > 1, "chats run beside each other");
    let order = turns.order.lock().expect("lock").clone();
    for chat in ["chat-a", "chat-b", "chat-c"] {
        let ns: Vec<u32> = order.iter().filter(|(c, _)| c == chat).map(|(_, n)| *n).collect();
        assert_eq!(ns, vec![0, 1, 2, 3, 4], "{chat} in order: {order:?}");
    }
}
both_backends!(jobs_one_at_a_time_per_chat, a_chats_jobs_run_one_at_a_time_in_order);

/// A kind run one at a time per chat whose first job runs until it is stopped.
#[derive(serde::Serialize, serde::Deserialize)]
struct Held {
    n: u32,
}

impl server::jobs::JobKind for Held {
    const KIND: &'static str = "test.held";
    const ONE_AT_A_TIME_PER_CHAT: bool = true;
}

/// When the first job's run ended (stopped, or on its own after `first_runs`) and when the
/// second's began.
#[derive(Default)]
struct HeldRuns {
    first_runs: Option<Duration>,
    first_started: AtomicUsize,
    first_ended: Mutex<Option<std::time::Instant>>,
    second_started: Mutex<Option<std::time::Instant>>,
}

#[async_trait::async_trait]
impl server::jobs::Handler<Held> for HeldRuns {
    async fn run(&self, args: Held, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        struct Ends<'a>(&'a Mutex<Option<std::time::Instant>>);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                *self.0.lock().expect("lock") = Some(std::time::Instant::now());
            }
        }
        if args.n == 0 {
            let _ends = Ends(&self.first_ended);
            self.first_started.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.first_runs.unwrap_or(Duration::from_secs(20))).await;
        } else {
            *self.second_started.lock().expect("lock") = Some(std::time::Instant::now());
        }
        Ok(JobOutput::default())
    }
}

/// An owner cancels a chat's running job: the chat's next job starts once the cancelled run
/// has stopped, never beside it (it used to start at once, while the cancelled run went on until
/// its worker's next heartbeat), and soon after, not once the lease has run out: whether its
/// worker stopped the run at a heartbeat, or the run ended on its own before one.
async fn a_cancelled_run_holds_its_chat_until_it_stops(db: TestDb) {
    let stopped = cancel_a_running_job(&db, None, Duration::from_secs(3)).await;
    assert!(stopped < Duration::from_secs(3), "let go when the run was stopped, not when the lease ran out: {stopped:?}");
    let ended = cancel_a_running_job(&db, Some(Duration::from_millis(300)), Duration::from_secs(6)).await;
    assert!(ended < Duration::from_secs(2), "let go when the run ended on its own, before any heartbeat: {ended:?}");
}

/// Runs a chat's two jobs, cancels the first while it runs (for `first_runs`, or until it is
/// stopped) and returns how long after the cancel the second began, which it checks was after
/// the first had ended.
async fn cancel_a_running_job(db: &TestDb, first_runs: Option<Duration>, lease: Duration) -> Duration {
    let pool = fresh(db).await;
    let queue = JobQueue::new(pool.clone());
    let runs = Arc::new(HeldRuns { first_runs, ..HeldRuns::default() });
    let mut tx = pool.begin_write().await.expect("begin");
    let jobs: Vec<NewJob> = (0..2).map(|n| NewJob { chat_id: Some("chat-held".into()), ..queue.job(&Held { n }) }).collect();
    let first = queue.enqueue_many_in(&mut tx, &jobs).await.expect("enqueue")[0].job.id;
    queue.commit(tx).await.expect("commit");
    let mut registry = Registry::new();
    registry.handle::<Held>(runs.clone());
    let settings = WorkerSettings { lease, maintenance_interval: Duration::from_millis(100), job_timeout: Duration::from_secs(30), ..fast_settings() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, queue.waker()).run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runs.first_started.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the first job never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cancelled_at = std::time::Instant::now();
    {
        let mut conn = pool.pool.acquire().await.expect("conn");
        assert!(store::cancel(&mut conn, first, "owner cancelled", db::now_ms()).await.expect("cancel"));
    }
    let second = loop {
        if let Some(at) = *runs.second_started.lock().expect("lock") {
            break at;
        }
        assert!(std::time::Instant::now() < deadline, "the chat's next job never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let ended = *runs.first_ended.lock().expect("lock");
    assert!(ended.is_some_and(|ended| ended <= second), "the next job started while the cancelled run went on (it stopped at {ended:?}, the next began at {second:?})");
    stop.send(true).expect("stop");
    worker.await.expect("worker");
    second - cancelled_at
}
both_backends!(jobs_cancelled_run_holds_its_chat, a_cancelled_run_holds_its_chat_until_it_stops);

async fn worker_runs_retries_discards_and_hooks(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let flaky = Arc::new(Probe { fail_first: 2, ..Default::default() });
    let slow = Arc::new(Probe { sleep: Duration::from_secs(5), ..Default::default() });
    let hook = Arc::new(Counting::default());
    let mut registry = Registry::new();
    registry.register("flaky", flaky.clone()).register("slow", slow.clone()).register("typed", Arc::new(Typed)).hook(hook.clone());
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, fast_settings(), queue.waker()).run(stopped));

    let retried = queue.enqueue(&job("flaky")).await.expect("e").job.id;
    let unknown = queue.enqueue(&job("no.such.kind")).await.expect("e").job.id;
    let bad_args = queue.enqueue(&NewJob { args: serde_json::json!({"n": "not a number"}), ..job("typed") }).await.expect("e").job.id;
    let timed_out = queue.enqueue(&NewJob { max_attempts: 1, ..job("slow") }).await.expect("e").job.id;
    let counts = wait_until_finished(&pool, 3, Duration::from_secs(20)).await;
    stop.send(true).expect("stop");
    worker.await.expect("worker");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let r = store::get(&mut conn, retried).await.expect("g").expect("job");
    assert_eq!((r.state, r.attempt), (JobState::Completed, 3), "{counts:?}");
    assert_eq!(r.result_preview.as_deref(), Some(format!("done by job:{retried}").as_str()));
    let u = store::get(&mut conn, unknown).await.expect("g").expect("job");
    assert_eq!((u.state, u.attempt, u.last_error_code), (JobState::Available, 0, None), "a kind this worker does not handle is left to one that does");
    let b = store::get(&mut conn, bad_args).await.expect("g").expect("job");
    assert_eq!((b.state, b.attempt, b.last_error_code.as_deref()), (JobState::Discarded, 1, Some("JOB_ARGS_INVALID")));
    let t = store::get(&mut conn, timed_out).await.expect("g").expect("job");
    assert_eq!((t.state, t.last_error_code.as_deref()), (JobState::Discarded, Some("JOB_TIMEOUT")));
    assert_eq!(hook.ok.load(Ordering::SeqCst), 1);
    assert_eq!(hook.failed_final.load(Ordering::SeqCst), 2);
}
both_backends!(worker_outcomes, worker_runs_retries_discards_and_hooks);

/// Two builds share a database (a rolling upgrade, or an older `gatehouse worker` left
/// running): the older worker leaves a kind only the newer build has for the newer one's
/// workers, which run it on its first attempt. Before, the older worker claimed it and
/// discarded it as an unknown kind, and nothing told anyone.
async fn a_kind_a_worker_does_not_handle_waits_for_one_that_does(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let mut older = Registry::new();
    older.register("flaky", Arc::new(Probe::default()));
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), older, fast_settings(), queue.waker()).run(stopped));
    let before = queue.enqueue(&job("flaky")).await.expect("e").job.id;
    let newer_kind = queue.enqueue(&job("newer.kind")).await.expect("e").job.id;
    // Due for two days and taken by no worker of any build: a kind a newer build removed.
    let gone = queue.enqueue(&NewJob { scheduled_at: Some(db::now_ms() - 2 * 86_400_000), ..job("removed.kind") }).await.expect("e").job.id;
    let after = queue.enqueue(&job("flaky")).await.expect("e").job.id;
    wait_until_finished(&pool, 3, Duration::from_secs(20)).await;
    // Polled several times more (each poll interval and each wake-up).
    tokio::time::sleep(fast_settings().poll_interval * 5).await;
    queue.notify();
    tokio::time::sleep(fast_settings().poll_interval * 2).await;
    let mut conn = pool.pool.acquire().await.expect("conn");
    for id in [before, after] {
        assert_eq!(store::get(&mut conn, id).await.expect("g").expect("job").state, JobState::Completed);
    }
    let waiting = store::get(&mut conn, newer_kind).await.expect("g").expect("job");
    assert_eq!((waiting.state, waiting.attempt), (JobState::Available, 0), "left alone by the older worker");
    let discarded = store::get(&mut conn, gone).await.expect("g").expect("job");
    assert_eq!((discarded.state, discarded.attempt, discarded.last_error_code.as_deref()), (JobState::Discarded, 0, Some("JOB_KIND_UNKNOWN")), "discarded after a day unclaimed");
    drop(conn);

    let mut newer = Registry::new();
    let runs = Arc::new(Probe::default());
    newer.register("newer.kind", runs.clone());
    let (stop_newer, stopped) = watch::channel(false);
    let newer_worker = tokio::spawn(Worker::new(pool.clone(), newer, fast_settings(), queue.waker()).run(stopped));
    wait_until_finished(&pool, 4, Duration::from_secs(20)).await;
    let mut conn = pool.pool.acquire().await.expect("conn");
    let done = store::get(&mut conn, newer_kind).await.expect("g").expect("job");
    assert_eq!((done.state, done.attempt), (JobState::Completed, 1));
    assert_eq!(runs.runs.lock().expect("lock").get(&newer_kind), Some(&1));
    for (stop, worker) in [(stop, worker), (stop_newer, newer_worker)] {
        stop.send(true).expect("stop");
        worker.await.expect("worker");
    }
}
both_backends!(worker_kinds_of_its_own, a_kind_a_worker_does_not_handle_waits_for_one_that_does);

/// A run that finds the disk full waits for room without using up an attempt: a job with two
/// attempts whose first four runs meet a full disk and whose next one fails on its own still
/// completes, on its second attempt. Each wait is in the job's events with its code.
async fn a_full_disk_uses_up_no_attempt(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let probe = Arc::new(Probe { full_first: 4, fail_first: 1, ..Default::default() });
    let hook = Arc::new(Counting::default());
    let mut registry = Registry::new();
    registry.register("probe", probe.clone()).hook(hook.clone());
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, fast_settings(), queue.waker()).run(stopped));
    let id = queue.enqueue(&NewJob { max_attempts: 2, ..job("probe") }).await.expect("e").job.id;
    let counts = wait_until_finished(&pool, 1, Duration::from_secs(20)).await;
    stop.send(true).expect("stop");
    worker.await.expect("worker");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let j = store::get(&mut conn, id).await.expect("g").expect("job");
    assert_eq!((j.state, j.attempt), (JobState::Completed, 2), "{counts:?}");
    assert_eq!(probe.runs.lock().expect("lock").get(&id), Some(&6));
    let events = store::events(&mut conn, id).await.expect("events");
    let waits = events.iter().filter(|e| e.error_code.as_deref() == Some("STORAGE_FULL") && e.message.as_deref() == Some("snoozed")).count();
    assert_eq!(waits, 4, "{events:?}");
    assert_eq!((hook.ok.load(Ordering::SeqCst), hook.failed_final.load(Ordering::SeqCst)), (1, 0));
}
both_backends!(worker_storage_full, a_full_disk_uses_up_no_attempt);

/// A job that reschedules itself (a periodic scan) and fails now and then between its
/// successes is never discarded for failures spread over its life: a run that did its work and
/// asked to run again gives the earlier failures' attempts back. (With two attempts it was
/// discarded at its second failure, however many successes came between.)
async fn a_periodic_job_survives_failures_between_its_runs(db: TestDb) {
    struct Periodic(AtomicUsize);
    #[async_trait::async_trait]
    impl JobHandler for Periodic {
        async fn run(&self, _ctx: &JobContext) -> Result<JobOutput, JobError> {
            match self.0.fetch_add(1, Ordering::SeqCst) % 2 {
                0 => Err(JobError::retryable("DATABASE_ERROR", "a passing failure")),
                _ => Ok(JobOutput { preview: None, snooze: Some(Duration::from_millis(10)) }),
            }
        }
    }
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let periodic = Arc::new(Periodic(AtomicUsize::new(0)));
    let mut registry = Registry::new();
    registry.register("periodic", periodic.clone());
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, fast_settings(), queue.waker()).run(stopped));
    let id = queue.enqueue(&NewJob { max_attempts: 2, ..job("periodic") }).await.expect("e").job.id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while periodic.0.load(Ordering::SeqCst) < 7 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(true).expect("stop");
    worker.await.expect("worker");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let j = store::get(&mut conn, id).await.expect("g").expect("job");
    assert!(periodic.0.load(Ordering::SeqCst) >= 7 && !j.state.is_finished(), "ran {} times; {j:?}", periodic.0.load(Ordering::SeqCst));
}
both_backends!(worker_periodic_failures, a_periodic_job_survives_failures_between_its_runs);

/// A run the lane starts at once (`jobs::inline`) ends as a worker's run would: a snooze the
/// handler asks for and a full disk use no attempt, a failure is retried after the configured
/// backoff, a success completes, and an outcome whose lease is gone changes nothing.
async fn an_inline_run_ends_as_a_worker_run(db: TestDb) {
    use server::jobs::inline;
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let settings = server::config::JobSettings { retry_base: Duration::from_secs(3600), retry_max: Duration::from_secs(7200), ..Default::default() };
    let hour = 3_600_000;
    let ends: [(&str, Result<JobOutput, JobError>); 4] = [
        ("snoozed", Ok(JobOutput { preview: None, snooze: Some(Duration::from_secs(3600)) })),
        ("full", Err(JobError::retryable("STORAGE_FULL", "no room"))),
        ("failed", Err(JobError::retryable("TOOL_TIMEOUT", "slow"))),
        ("done", Ok(JobOutput { preview: Some("fine".into()), snooze: None })),
    ];
    for (name, result) in ends {
        let id = queue.enqueue(&job(name)).await.expect("enqueue").job.id;
        let claimed = inline::claim(&pool, id, &settings).await.expect("claim").expect("claimed");
        assert_eq!(claimed.job.attempt, 1, "{name}");
        let before = db::now_ms();
        inline::finish(&pool, &claimed, &result).await.expect("finish");
        let mut conn = pool.pool.acquire().await.expect("conn");
        let j = store::get(&mut conn, id).await.expect("get").expect("job");
        let wait = j.scheduled_at - before;
        match name {
            "snoozed" => assert!(j.state == JobState::Scheduled && j.attempt == 0 && wait >= hour - 1000, "{name}: {j:?}"),
            "full" => assert!(j.state == JobState::Scheduled && j.attempt == 0 && wait >= 59_000, "{name}: {j:?}"),
            "failed" => assert!(j.state == JobState::Retryable && j.attempt == 1 && wait >= hour * 8 / 10, "{name}: {j:?}"),
            _ => assert_eq!((j.state, j.attempt), (JobState::Completed, 1), "{name}"),
        }
        // Finishing again with the lease gone changes nothing.
        inline::finish(&pool, &claimed, &Err(JobError::permanent("LATE", "too late"))).await.expect("finish again");
        let again = store::get(&mut conn, id).await.expect("get").expect("job");
        assert_eq!((again.state, again.attempt, again.scheduled_at), (j.state, j.attempt, j.scheduled_at), "{name}");
    }
}
both_backends!(jobs_inline_outcomes, an_inline_run_ends_as_a_worker_run);

async fn several_workers_never_double_claim(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let probe = Arc::new(Probe::default());
    let total = 1500;
    let mut tx = pool.begin_write().await.expect("begin");
    for _ in 0..total {
        queue.enqueue_in(&mut tx, &job("probe")).await.expect("e");
    }
    tx.commit().await.expect("commit");
    let (stop, stopped) = watch::channel(false);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let mut registry = Registry::new();
            registry.register("probe", probe.clone());
            tokio::spawn(Worker::new(pool.clone(), registry, fast_settings(), queue.waker()).run(stopped.clone()))
        })
        .collect();
    queue.notify();
    let counts = wait_until_finished(&pool, total, Duration::from_secs(60)).await;
    stop.send(true).expect("stop");
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(counts.get(&JobState::Completed).copied(), Some(total as i64), "{counts:?}");
    {
        let runs = probe.runs.lock().expect("lock");
        assert_eq!(runs.len(), total);
        assert!(runs.values().all(|n| *n == 1), "a job ran twice");
    }
    // No claim leaked: every job ran on its first attempt and none needed rescuing.
    let mut conn = pool.pool.acquire().await.expect("conn");
    let (max_attempt,): (i64,) = sqlx::query_as("SELECT MAX(attempt) FROM jobs").fetch_one(&mut *conn).await.expect("max");
    assert_eq!(max_attempt, 1);
    let (rescued,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM job_events WHERE error_code = 'JOB_LEASE_EXPIRED'").fetch_one(&mut *conn).await.expect("count");
    assert_eq!(rescued, 0);
}
both_backends!(workers_no_double_claims, several_workers_never_double_claim);

async fn graceful_shutdown_releases_unfinished_leases(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let mut registry = Registry::new();
    registry.register("slow", Arc::new(Probe { sleep: Duration::from_secs(30), ..Default::default() }));
    let settings = WorkerSettings { job_timeout: Duration::from_secs(60), shutdown_grace: Duration::from_millis(300), ..fast_settings() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, queue.waker()).run(stopped));
    let id = queue.enqueue(&job("slow")).await.expect("e").job.id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = pool.pool.acquire().await.expect("conn");
        if store::get(&mut conn, id).await.expect("g").is_some_and(|j| j.state == JobState::Running) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(5), worker).await.expect("stops within the grace period").expect("worker");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let j = store::get(&mut conn, id).await.expect("g").expect("job");
    assert_eq!((j.state, j.attempt, j.lease_owner), (JobState::Available, 0, None), "released without counting the attempt");
}
both_backends!(worker_graceful_shutdown, graceful_shutdown_releases_unfinished_leases);

async fn console_job_actions_are_audited_and_live_stream_needs_a_session(db: TestDb) {
    let app = crate::support::TestApp::new(db).await;
    let mut anonymous = app.client();
    let stream = anonymous.get("/api/events").await;
    assert_eq!(stream.status, axum::http::StatusCode::UNAUTHORIZED, "the live stream is owner-only");

    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let queued = app.state.jobs.enqueue(&NewJob { scheduled_at: Some(db::now_ms() + 3_600_000), ..job("system.echo") }).await.expect("enqueue");
    let id = queued.job.id.to_string();
    let res = owner.post_form("/api/cancel_job", &[("id", id.as_str())]).await;
    assert_eq!(res.status, axum::http::StatusCode::OK, "{}", res.body);
    let again = owner.post_form("/api/cancel_job", &[("id", id.as_str())]).await;
    assert_eq!(again.status, axum::http::StatusCode::CONFLICT, "a cancelled job cannot be cancelled again");
    for action in ["/api/cancel_job", "/api/retry_job"] {
        let missing = owner.post_form(action, &[("id", "987654321")]).await;
        assert_eq!((missing.status, missing.json()["code"].as_str()), (axum::http::StatusCode::NOT_FOUND, Some("NOT_FOUND")), "{action}: no such job");
    }
    let retried = owner.post_form("/api/retry_job", &[("id", id.as_str())]).await;
    assert_eq!(retried.status, axum::http::StatusCode::OK, "{}", retried.body);

    let detail = owner.post_form("/api/get_job", &[("id", id.as_str())]).await.json();
    assert_eq!(detail["summary"]["state"], "available");
    let page = owner.post_form("/api/list_jobs", &[("state", "available"), ("tool", ""), ("chat", ""), ("since_minutes", "0"), ("before", "0")]).await.json();
    assert_eq!(page["jobs"][0]["id"], queued.job.id);

    let rows = sqlx::query("SELECT event, detail FROM owner_audit WHERE event IN ('job_cancel', 'job_retry') ORDER BY id").fetch_all(&app.state.db.pool).await.expect("audit");
    let events: Vec<(String, String)> = rows.iter().map(|r| (sqlx::Row::get(r, 0), sqlx::Row::get(r, 1))).collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, "job_cancel");
    assert!(events[0].1.contains(&format!("\"job_id\":{id}")), "{events:?}");
    assert_eq!(events[1].0, "job_retry");

    let metrics = app.client_from("127.0.0.1:40000").get("/metrics").await.body;
    assert!(metrics.contains("jobs{state=\"available\"} 1"), "{metrics}");
}
both_backends!(jobs_console_actions, console_job_actions_are_audited_and_live_stream_needs_a_session);

/// A list whose filter is refused still shows the filter form, so the owner can change it.
async fn a_refused_filter_leaves_the_form_to_change_it(db: TestDb) {
    let app = crate::support::TestApp::new(db).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let page = owner.get("/jobs?state=bogus").await;
    assert!(page.body.contains("INVALID_INPUT") || page.body.contains("not a job state"), "the error is shown: {}", page.body);
    assert!(page.body.contains("data-testid=\"job-filters\""), "the form is there: {}", page.body);
    let traces = owner.get("/traces?since_minutes=x").await;
    assert!(traces.body.contains("data-testid=\"trace-filters\""), "{}", traces.body);
}
both_backends!(jobs_refused_filter_form, a_refused_filter_leaves_the_form_to_change_it);

/// Every statement that inserts jobs notifies the workers' channel with their queue when it
/// commits, whoever wrote it (here the store itself, not `JobQueue`); a rolled-back one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inserted_jobs_notify_their_queue_on_commit() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = fresh(&db).await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.expect("listener");
    listener.listen(server::jobs::queue::NOTIFY_CHANNEL).await.expect("listen");

    let mut tx = pool.begin_write().await.expect("begin");
    store::enqueue_many(&mut tx, &[NewJob { queue: "rolled-back".into(), ..job("noop") }], db::now_ms()).await.expect("enqueue");
    tx.rollback().await.expect("rollback");
    let mut tx = pool.begin_write().await.expect("begin");
    let batch: Vec<NewJob> = (0..3).map(|_| NewJob { queue: "committed".into(), ..job("noop") }).collect();
    store::enqueue_many(&mut tx, &batch, db::now_ms()).await.expect("enqueue");
    tx.commit().await.expect("commit");

    let first = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.expect("a notification").expect("recv");
    assert_eq!(first.payload(), "committed", "the rolled-back insert sent nothing, the committed one its queue");
}

/// A job enqueued by another process wakes an idle worker at once through LISTEN/NOTIFY, long
/// before its poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notify_wakes_workers_in_other_processes() {
    let Some(db) = TestDb::postgres().await else { return };
    let worker = IdleWorker::start(&fresh(&db).await).await;
    let other_process = JobQueue::new(db.connect().await);
    let id = other_process.enqueue(&job("probe")).await.expect("enqueue").job.id;
    worker.runs_soon(id, "the idle worker was not woken").await;
}

/// A worker that polls every two minutes, gone idle and listening: what runs soon was woken.
struct IdleWorker {
    probe: Arc<Probe>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl IdleWorker {
    async fn start(pool: &Db) -> Self {
        let probe = Arc::new(Probe::default());
        let mut registry = Registry::new();
        registry.register("probe", probe.clone());
        let settings = WorkerSettings { poll_interval: Duration::from_secs(120), ..fast_settings() };
        let (stop, stopped) = watch::channel(false);
        // The worker's in-process waker is its own; the other process shares nothing with it.
        let task = tokio::spawn(Worker::new(pool.clone(), registry, settings, Arc::new(tokio::sync::Notify::new())).run(stopped));
        tokio::time::sleep(Duration::from_millis(500)).await; // let the worker go idle and LISTEN
        Self { probe, stop, task }
    }

    /// Waits (at most ten seconds) for job `id` to run, then stops the worker.
    async fn runs_soon(self, id: i64, why: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.probe.runs.lock().expect("lock").contains_key(&id) {
            assert!(tokio::time::Instant::now() < deadline, "{why}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.stop.send(true).expect("stop");
        self.task.await.expect("worker");
    }
}

/// An owner's retry made in another process (the console beside a `gatehouse worker`) wakes the
/// idle worker at once too, as an enqueue does: the retry is an UPDATE, which the insert's
/// trigger does not see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_retry_wakes_workers_in_other_processes() {
    let Some(db) = TestDb::postgres().await else { return };
    let worker_pool = fresh(&db).await;
    let other_process = JobQueue::new(db.connect().await);
    let id = other_process.enqueue(&NewJob { max_attempts: 1, ..job("probe") }).await.expect("enqueue").job.id;
    {
        let mut conn = worker_pool.pool.acquire().await.expect("conn");
        assert!(store::cancel(&mut conn, id, "not yet", db::now_ms()).await.expect("cancel"));
    }
    let worker = IdleWorker::start(&worker_pool).await;
    let retried = server::jobs::actions::apply(&other_process, &server::jobs::FollowUps::default(), server::jobs::actions::JobAction::Retry, id, server::jobs::actions::ByOwner { owner_id: 1, ip: "127.0.0.1" }).await;
    assert!(retried.expect("retry"), "the cancelled job is retried");
    worker.runs_soon(id, "the idle worker was not woken by the retry").await;
}

/// An owner's retry racing an enqueue of the same dedupe key: the enqueue's job holds the key,
/// and the retry is refused (nothing changed) instead of failing on the unique index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_retry_racing_an_enqueue_of_its_key_is_refused() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let keyed = NewJob { dedupe_key: Some("race-retry".into()), max_attempts: 1, ..job("noop") };
    let id = queue.enqueue(&keyed).await.expect("enqueue").job.id;
    {
        let mut conn = pool.pool.acquire().await.expect("conn");
        assert!(store::cancel(&mut conn, id, "stopped", db::now_ms()).await.expect("cancel"));
    }
    // The new job of that key is stored but not committed yet when the retry runs.
    let mut tx = pool.begin_write().await.expect("begin");
    let newer = queue.enqueue_in(&mut tx, &keyed).await.expect("enqueue").job.id;
    let retry = {
        let queue = queue.clone();
        tokio::spawn(async move { server::jobs::actions::apply(&queue, &server::jobs::FollowUps::default(), server::jobs::actions::JobAction::Retry, id, server::jobs::actions::ByOwner { owner_id: 1, ip: "127.0.0.1" }).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.expect("commit");
    let retried = retry.await.expect("join");
    assert!(!retried.expect("refused, not an error"), "the newer job holds the key");
    let mut conn = pool.pool.acquire().await.expect("conn");
    assert_eq!(store::get(&mut conn, id).await.expect("get").expect("job").state, JobState::Cancelled);
    assert_eq!(store::find_by_dedupe(&mut conn, "race-retry").await.expect("find").map(|j| j.id), Some(newer));
}

async fn heartbeats_keep_long_jobs_and_cancel_stops_a_run(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    // The lease is far shorter than the job: only heartbeats (every third of a lease) keep it.
    // A heartbeat may come late by up to two thirds of a lease before the rescuer takes the job;
    // the lease is long enough that a loaded CI machine (every test at once) stays inside that.
    let lease = Duration::from_millis(1200);
    let long = Arc::new(Probe { sleep: lease * 5 / 2, ..Default::default() });
    let mut registry = Registry::new();
    registry.register("long", long.clone());
    let settings = WorkerSettings { lease, job_timeout: Duration::from_secs(20), maintenance_interval: Duration::from_millis(100), ..fast_settings() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, queue.waker()).run(stopped));
    let kept = queue.enqueue(&job("long")).await.expect("e").job.id;
    let cancelled = queue.enqueue(&job("long")).await.expect("e").job.id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while long.runs.lock().expect("lock").len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "jobs never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut conn = pool.pool.acquire().await.expect("conn");
    assert!(store::cancel(&mut conn, cancelled, "owner cancelled", db::now_ms()).await.expect("cancel"));
    assert!(!store::retry_now(&mut conn, cancelled, db::now_ms()).await.expect("retry"), "not while the cancelled run may still be stopping");
    drop(conn);
    wait_until_finished(&pool, 2, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.send(true).expect("stop");
    worker.await.expect("worker");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let k = store::get(&mut conn, kept).await.expect("g").expect("job");
    assert_eq!((k.state, k.attempt), (JobState::Completed, 1), "heartbeats kept the lease: no rescue, no second attempt");
    let c = store::get(&mut conn, cancelled).await.expect("g").expect("job");
    assert_eq!(c.state, JobState::Cancelled, "the stopped run did not complete the cancelled job");
    assert_eq!(long.runs.lock().expect("lock").values().sum::<usize>(), 2, "each ran once");
    assert!(store::retry_now(&mut conn, cancelled, db::now_ms() + db::duration_ms(lease)).await.expect("retry"), "once its lease ran out, it can be retried");
}
both_backends!(worker_heartbeat_and_cancel, heartbeats_keep_long_jobs_and_cancel_stops_a_run);

/// Counts the runs of its kind going on at once (a run its worker stops counts out when dropped).
#[derive(Default)]
struct Overlap {
    started: AtomicUsize,
    active: Arc<AtomicUsize>,
    most: AtomicUsize,
}

struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl JobHandler for Overlap {
    async fn run(&self, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        let _active = Active(self.active.clone());
        self.most.fetch_max(now, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        // Long enough that the rescue and the claim again land while the first run goes on,
        // on a loaded machine too.
        tokio::time::sleep(Duration::from_secs(4)).await;
        Ok(JobOutput::default())
    }
}

/// A run that stops renewing its lease (a stall) is rescued by its own worker's maintenance
/// and claimed again by that same worker: the rerun waits for the stalled run to end, so the
/// job never runs twice at once, and the rerun completes it.
async fn a_job_claimed_again_by_its_worker_waits_for_the_stalled_run(db: TestDb) {
    let pool = fresh(&db).await;
    let queue = JobQueue::new(pool.clone());
    let overlap = Arc::new(Overlap::default());
    let mut registry = Registry::new();
    registry.register("overlap", overlap.clone());
    // Heartbeats every 10 s: none falls inside this test, so the lease ends only as below.
    let settings = WorkerSettings { lease: Duration::from_secs(30), job_timeout: Duration::from_secs(20), maintenance_interval: Duration::from_millis(100), ..fast_settings() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, queue.waker()).run(stopped));
    let id = queue.enqueue(&job("overlap")).await.expect("enqueue").job.id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while overlap.started.load(Ordering::SeqCst) < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The run's lease runs out as if its heartbeats had stalled.
    sqlx::query("UPDATE jobs SET lease_expires_at = 1 WHERE id = $1").bind(id).execute(&pool.pool).await.expect("expire the lease");
    while overlap.started.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the rescued job was never claimed again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until_finished(&pool, 1, Duration::from_secs(20)).await;
    stop.send(true).expect("stop");
    worker.await.expect("worker");
    assert_eq!(overlap.most.load(Ordering::SeqCst), 1, "the stalled run went on beside its rerun");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let j = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!((j.state, j.attempt), (JobState::Completed, 2));
}
both_backends!(worker_reclaim_waits_for_stalled_run, a_job_claimed_again_by_its_worker_waits_for_the_stalled_run);
