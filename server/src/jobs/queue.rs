//! Enqueueing, and waking workers: in-process through a `Notify`, across processes through
//! PostgreSQL `LISTEN/NOTIFY` (the `jobs_notify` trigger of migration 0027 notifies for every
//! statement that inserts jobs; PostgreSQL delivers it when the enqueuing transaction commits).

use std::{collections::HashMap, sync::Arc};

use sqlx::{Any, AnyConnection, Transaction};
use tokio::sync::Notify;

use super::JobKind;
use crate::{
    config::JobSettings,
    db::{
        self, Db, DbError,
        jobs::{self as store, Enqueued, NewJob, Waiting},
    },
    telemetry::Telemetry,
};

/// The PostgreSQL channel workers listen on; the payload is the queue's name.
pub const NOTIFY_CHANNEL: &str = "gatehouse_jobs";

/// Every enqueue goes through here, so workers are always woken (in this process after the
/// commit, in others by PostgreSQL's NOTIFY) and a job without its own queue or attempt count
/// gets this deployment's (`[jobs] queue`, `default_max_attempts`).
#[derive(Debug, Clone)]
pub struct JobQueue {
    db: Db,
    wake: Arc<Notify>,
    queue: String,
    max_attempts: i64,
    /// Kinds with their own attempt count ([`JobQueue::attempts_for`]).
    kind_attempts: Arc<HashMap<&'static str, i64>>,
    /// Job runs become spans of their message's trace (off unless `[telemetry]` is set).
    telemetry: Telemetry,
}

impl JobQueue {
    /// A queue with the default settings.
    pub fn new(db: Db) -> Self {
        Self::with_settings(db, &JobSettings::default())
    }

    pub fn with_settings(db: Db, settings: &JobSettings) -> Self {
        Self {
            db,
            wake: Arc::new(Notify::new()),
            queue: settings.queue.clone(),
            max_attempts: i64::from(settings.default_max_attempts.max(1)),
            kind_attempts: Arc::default(),
            telemetry: Telemetry::default(),
        }
    }

    /// The same queue, giving jobs of kind `K` `attempts` runs instead of the default (unless
    /// their producer sets its own).
    pub fn attempts_for<K: JobKind>(mut self, attempts: u32) -> Self {
        Arc::make_mut(&mut self.kind_attempts).insert(K::KIND, i64::from(attempts.max(1)));
        self
    }

    /// How many runs a job of `kind` gets when its producer does not say.
    fn attempts_of(&self, kind: &str) -> i64 {
        self.kind_attempts.get(kind).copied().unwrap_or(self.max_attempts)
    }

    /// The same queue, with job runs exported as spans by `telemetry`.
    pub fn traced(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// Where a job run made outside a worker (the lane's immediate run) reports its span.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// A job of kind `K` with these args, on this deployment's queue with its attempt count and
    /// a fresh correlation id; the caller adds chat, dedupe key and the like.
    pub fn job<K: JobKind>(&self, args: &K) -> NewJob {
        NewJob {
            kind: K::KIND.into(),
            queue: self.queue.clone(),
            args: serde_json::to_value(args).unwrap_or_default(),
            max_attempts: self.attempts_of(K::KIND),
            correlation_id: uuid::Uuid::now_v7().to_string(),
            ..Default::default()
        }
    }

    /// Fills what the producer left to the deployment.
    pub(crate) fn defaults(&self, job: &NewJob) -> NewJob {
        let mut job = job.clone();
        if job.queue.is_empty() {
            job.queue.clone_from(&self.queue);
        }
        if job.max_attempts < 1 {
            job.max_attempts = self.attempts_of(&job.kind);
        }
        job
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Workers in this process wait on this.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Enqueues inside the caller's transaction; finish it with [`JobQueue::commit`], which
    /// wakes this process's workers once the job is visible.
    pub async fn enqueue_in(&self, conn: &mut AnyConnection, job: &NewJob) -> Result<Enqueued, DbError> {
        store::enqueue(conn, &self.defaults(job), db::now_ms()).await
    }

    /// [`JobQueue::enqueue_in`] for many jobs at once, with a few statements instead of several
    /// per job. The result is aligned with `jobs`.
    pub async fn enqueue_many_in(&self, conn: &mut AnyConnection, jobs: &[NewJob]) -> Result<Vec<Enqueued>, DbError> {
        let jobs: Vec<NewJob> = jobs.iter().map(|j| self.defaults(j)).collect();
        store::enqueue_many(conn, &jobs, db::now_ms()).await
    }

    /// Enqueues in its own transaction and wakes workers.
    ///
    /// On PostgreSQL without a transaction block: the insert is one statement that writes the
    /// job and its first event (a transaction of its own), and the statements that may follow
    /// when the dedupe key is taken only read or retry that insert, so `BEGIN` and `COMMIT`
    /// would only add two round trips before the workers are woken.
    pub async fn enqueue(&self, job: &NewJob) -> Result<Enqueued, DbError> {
        if self.db.backend == db::Backend::Postgres {
            let mut conn = self.db.pool.acquire().await?;
            let enqueued = self.enqueue_in(&mut conn, job).await?;
            self.notify();
            return Ok(enqueued);
        }
        let mut tx = self.db.begin_write().await?;
        let enqueued = self.enqueue_in(&mut tx, job).await?;
        self.commit(tx).await?;
        Ok(enqueued)
    }

    /// Enqueues a job that keeps itself going (its dedupe key names the one of the deployment):
    /// when one is queued already, it is given `job`'s attempts if it had fewer (one queued by
    /// an earlier build, with fewer attempts for its kind, would otherwise keep them for ever).
    pub async fn enqueue_periodic(&self, job: &NewJob) -> Result<Enqueued, DbError> {
        let mut enqueued = self.enqueue(job).await?;
        let attempts = self.defaults(job).max_attempts;
        if enqueued.deduplicated && enqueued.job.max_attempts < attempts {
            let mut tx = self.db.begin_write().await?;
            if store::raise_attempts(&mut tx, enqueued.job.id, attempts).await? {
                enqueued.job.max_attempts = attempts;
            }
            tx.commit().await?;
        }
        Ok(enqueued)
    }

    /// Makes the `waiting` jobs due now (see [`store::release_waiting`]), and wakes the
    /// workers. Returns how many. Processes starting together release one after the other: one
    /// that committed a chat's later job while another still held its earlier one would let the
    /// later one be claimed first.
    pub async fn release_waiting(&self, waiting: Waiting<'_>) -> Result<usize, DbError> {
        let mut tx = self.db.begin_write().await?;
        db::lock_until_commit(&mut tx, "gatehouse.jobs_release_waiting").await?;
        let released = store::release_waiting(&mut tx, self.db.backend, waiting, db::now_ms()).await?;
        self.commit(tx).await?;
        Ok(released.len())
    }

    /// Commits a transaction that enqueued jobs, then wakes this process's workers.
    pub async fn commit(&self, tx: Transaction<'static, Any>) -> Result<(), DbError> {
        tx.commit().await?;
        self.notify();
        Ok(())
    }

    /// Wakes this process's workers (other processes are woken by PostgreSQL).
    pub fn notify(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }
}
