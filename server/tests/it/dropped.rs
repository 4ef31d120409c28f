//! A job dropped without being done (discarded after a permanent failure or its last attempt,
//! discarded when its lease ran out on its last attempt, or expired unrun) is followed by the
//! job its kind names, in the same transaction, once, with its correlation id. An owner's
//! cancel is no drop: it queues the kind's cancel follow-up instead. A kind with no follow-up
//! queues nothing.

use std::{collections::BTreeSet, sync::Mutex, time::Duration};

use serde::{Deserialize, Serialize};
use server::{
    db::{
        self,
        jobs::{self as store, JobState, NewJob},
    },
    jobs::{Followed, Handler, JobContext, JobError, JobKind, JobOutput, JobQueue, Registry, Worker, WorkerSettings, echo},
};
use tokio::sync::watch;

use crate::{both_backends, jobs::fast_settings, support::TestDb};

#[derive(Serialize, Deserialize)]
struct Fails {
    retryable: bool,
}

impl JobKind for Fails {
    const KIND: &'static str = "test.fails";
}

struct FailsHandler;

#[async_trait::async_trait]
impl Handler<Fails> for FailsHandler {
    async fn run(&self, args: Fails, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        Err(if args.retryable { JobError::retryable("TEST_DOWN", "the far side is down") } else { JobError::permanent("TEST_BROKEN", "this cannot work") })
    }
}

#[derive(Serialize, Deserialize)]
struct Noted(Followed);

impl JobKind for Noted {
    const KIND: &'static str = "test.followed";
}

impl From<Followed> for Noted {
    fn from(followed: Followed) -> Self {
        Self(followed)
    }
}

#[derive(Serialize, Deserialize)]
struct Stopped(Followed);

impl JobKind for Stopped {
    const KIND: &'static str = "test.stopped";
}

impl From<Followed> for Stopped {
    fn from(followed: Followed) -> Self {
        Self(followed)
    }
}

#[async_trait::async_trait]
impl Handler<Stopped> for Told {
    async fn run(&self, Stopped(args): Stopped, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        self.1.lock().expect("lock").push(args.job_id);
        Ok(JobOutput::default())
    }
}

/// The jobs followed after a drop, and after an owner's cancel.
#[derive(Default)]
struct Told(Mutex<Vec<i64>>, Mutex<Vec<i64>>);

#[async_trait::async_trait]
impl Handler<Noted> for Told {
    async fn run(&self, Noted(args): Noted, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        self.0.lock().expect("lock").push(args.job_id);
        Ok(JobOutput::default())
    }
}

async fn a_dropped_job_is_followed_once(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let queue = JobQueue::new(pool.clone());
    let told = std::sync::Arc::new(Told::default());
    let mut registry = Registry::new();
    registry.handle::<Fails>(std::sync::Arc::new(FailsHandler)).handle::<Noted>(told.clone()).handle::<echo::Echo>(std::sync::Arc::new(echo::EchoHandler));
    registry.when_dropped::<Fails, Noted>(&queue).when_cancelled::<Fails, Stopped>(&queue).handle::<Stopped>(told.clone());

    let later = db::now_ms() + 3_600_000;
    let fails = |retryable: bool, attempts: i64, corr: &str| NewJob { max_attempts: attempts, correlation_id: corr.into(), ..queue.job(&Fails { retryable }) };
    let permanent = queue.enqueue(&fails(false, 3, "corr-permanent")).await.expect("enqueue").job.id;
    let retried = queue.enqueue(&fails(true, 2, "corr-retried")).await.expect("enqueue").job.id;
    let expired = queue.enqueue(&NewJob { scheduled_at: Some(later), expires_at: Some(db::now_ms() - 1), ..fails(false, 3, "corr-expired") }).await.expect("enqueue").job.id;
    let cancelled = queue.enqueue(&NewJob { scheduled_at: Some(later), ..fails(false, 3, "corr-cancelled") }).await.expect("enqueue").job.id;
    let echo_failed = queue.enqueue(&queue.job(&echo::Echo { message: String::new(), fail_with: Some("no".into()) })).await.expect("enqueue").job.id;
    // A run on its last attempt whose worker died: the rescue discards it.
    let rescued = queue.enqueue(&NewJob { scheduled_at: Some(later), ..fails(false, 1, "corr-rescued") }).await.expect("enqueue").job.id;
    sqlx::query("UPDATE jobs SET state = 'running', attempt = 1, lease_owner = 'a-dead-worker', lease_expires_at = 0 WHERE id = $1").bind(rescued).execute(&pool.pool).await.expect("running");
    let by = server::jobs::actions::ByOwner { owner_id: 1, ip: "127.0.0.1" };
    assert!(server::jobs::actions::apply(&queue, registry.follow_ups(), server::jobs::actions::JobAction::Cancel, cancelled, by).await.expect("cancel"));

    let settings = WorkerSettings { maintenance_interval: Duration::from_millis(100), ..fast_settings() };
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, queue.waker()).run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let expected: BTreeSet<i64> = [permanent, retried, expired, rescued].into();
    while told.0.lock().expect("lock").iter().copied().collect::<BTreeSet<i64>>() != expected || told.1.lock().expect("lock").is_empty() {
        assert!(std::time::Instant::now() < deadline, "followed so far: {:?}, expected {expected:?}", told.0.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Whatever else would come has had its chance.
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.send(true).expect("stop");
    worker.await.expect("worker");

    assert_eq!(told.0.lock().expect("lock").len(), 4, "one follow-up per dropped job: {:?}", told.0.lock().expect("lock"));
    assert_eq!(*told.1.lock().expect("lock"), vec![cancelled], "the owner's cancel is followed by its own kind");
    let mut conn = pool.pool.acquire().await.expect("conn");
    for (id, corr) in [(permanent, "corr-permanent"), (retried, "corr-retried"), (expired, "corr-expired"), (rescued, "corr-rescued")] {
        let job = store::get(&mut conn, id).await.expect("get").expect("job");
        assert!(matches!(job.state, JobState::Discarded | JobState::Cancelled), "{job:?}");
        let follow = store::find_by_dedupe(&mut conn, &format!("test.followed:{id}:{}", job.attempt)).await.expect("find").expect("a follow-up");
        assert_eq!((follow.correlation_id.as_str(), follow.state), (corr, JobState::Completed), "{follow:?}");
        // Queued with the drop, not before it.
        assert!(follow.created_at >= job.completed_at.expect("finished"), "{follow:?} before {job:?}");
    }
    let retried_job = store::get(&mut conn, retried).await.expect("get").expect("job");
    assert_eq!((retried_job.state, retried_job.attempt), (JobState::Discarded, 2), "a retryable failure is dropped on its last attempt only");
    let followed_kinds: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'test.followed'").fetch_one(&mut *conn).await.expect("count");
    assert_eq!(followed_kinds, 4, "no drop's follow-up for the cancelled job ({cancelled}) or the kind with no follow-up ({echo_failed})");
    let stopped = store::find_by_dedupe(&mut conn, &format!("test.stopped:{cancelled}:0")).await.expect("find").expect("the cancel's follow-up");
    assert_eq!(stopped.correlation_id, "corr-cancelled");
    let echo_state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1").bind(echo_failed).fetch_one(&mut *conn).await.expect("echo");
    assert_eq!(echo_state, "discarded");
}
both_backends!(jobs_dropped_followed, a_dropped_job_is_followed_once);
