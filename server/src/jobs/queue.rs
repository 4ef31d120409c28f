//! Enqueueing, and waking workers: in-process through a `Notify`, across processes through
//! PostgreSQL `LISTEN/NOTIFY` (delivered when the enqueuing transaction commits).

use std::sync::Arc;

use sqlx::AnyConnection;
use tokio::sync::Notify;

use crate::db::{
    self, Backend, Db, DbError,
    jobs::{self as store, Enqueued, NewJob},
};

/// The PostgreSQL channel workers listen on.
pub const NOTIFY_CHANNEL: &str = "gatehouse_jobs";

#[derive(Debug, Clone)]
pub struct JobQueue {
    db: Db,
    wake: Arc<Notify>,
}

impl JobQueue {
    pub fn new(db: Db) -> Self {
        Self { db, wake: Arc::new(Notify::new()) }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Workers in this process wait on this.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Enqueues inside the caller's transaction. Call [`JobQueue::notify`] after committing.
    pub async fn enqueue_in(&self, conn: &mut AnyConnection, job: &NewJob) -> Result<Enqueued, DbError> {
        let enqueued = store::enqueue(conn, job, db::now_ms()).await?;
        if !enqueued.deduplicated && self.db.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(&enqueued.job.queue).execute(&mut *conn).await?;
        }
        Ok(enqueued)
    }

    /// [`JobQueue::enqueue_in`] for many jobs at once, with a few statements instead of several
    /// per job. The result is aligned with `jobs`.
    pub async fn enqueue_many_in(&self, conn: &mut AnyConnection, jobs: &[NewJob]) -> Result<Vec<Enqueued>, DbError> {
        let enqueued = store::enqueue_many(conn, jobs, db::now_ms()).await?;
        if self.db.backend == Backend::Postgres {
            let mut queues: Vec<&str> = enqueued.iter().filter(|e| !e.deduplicated).map(|e| e.job.queue.as_str()).collect();
            queues.sort_unstable();
            queues.dedup();
            for queue in queues {
                sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(queue).execute(&mut *conn).await?;
            }
        }
        Ok(enqueued)
    }

    /// Enqueues in its own transaction and wakes workers.
    pub async fn enqueue(&self, job: &NewJob) -> Result<Enqueued, DbError> {
        let mut tx = self.db.begin_write().await?;
        let enqueued = self.enqueue_in(&mut tx, job).await?;
        tx.commit().await?;
        self.notify();
        Ok(enqueued)
    }

    /// Wakes this process's workers (other processes are woken by PostgreSQL).
    pub fn notify(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }
}
