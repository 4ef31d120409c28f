//! Running one job now, in this process, instead of waiting for a worker: the tool lane runs a
//! call it just stored while the person waits for a reply. The job is claimed as a lease like
//! any worker's claim, so no worker runs it meanwhile, and if this process dies the lease runs
//! out and a worker rescues and reruns it. Its outcome is recorded as a worker records one.

use std::time::Duration;

use super::{JobError, JobOutput, retry};
use crate::db::{
    self, Db, DbError,
    jobs::{self as store, Finished, JobRow},
};

/// A job this process holds.
#[derive(Debug)]
pub struct Claimed {
    pub job: JobRow,
    owner: String,
}

/// Claims job `id` for `lease`; `None` when a worker has it already (or it is not due).
pub async fn claim(db: &Db, id: i64, lease: Duration) -> Result<Option<Claimed>, DbError> {
    let owner = format!("inline-{}", uuid::Uuid::new_v4().simple());
    let now = db::now_ms();
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let mut tx = db.begin_write().await?;
    let job = store::claim_one(&mut tx, id, &owner, now, now.saturating_add(lease_ms)).await?;
    tx.commit().await?;
    Ok(job.map(|job| Claimed { job, owner }))
}

/// Records how the run ended: completed, retried with backoff, or discarded. A lease lost
/// meanwhile (rescued after a stall) leaves the job to its new holder.
pub async fn finish(db: &Db, claimed: &Claimed, result: &Result<JobOutput, JobError>) -> Result<(), DbError> {
    let now = db::now_ms();
    let job = &claimed.job;
    let mut tx = db.begin_write().await?;
    match result {
        Ok(out) => {
            store::complete(&mut tx, &[Finished { id: job.id, attempt: job.attempt, preview: out.preview.clone() }], &claimed.owner, now).await?;
        }
        // As the worker records it: a wait on the deployment uses no attempt.
        Err(e) if !e.uses_attempt() => {
            let at = now.saturating_add(db::duration_ms(retry::deployment_wait(crate::config::JobSettings::default().retry_max)));
            store::snooze(&mut tx, job.id, job.attempt, &claimed.owner, at, now, Some(&e.code)).await?;
        }
        Err(e) => {
            let defaults = crate::config::JobSettings::default();
            let at = now.saturating_add(db::duration_ms(retry::backoff(job.attempt, defaults.retry_base, defaults.retry_max)));
            store::fail(&mut tx, job.id, job.attempt, &claimed.owner, &e.code, &e.message, e.retryable, at, now).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Extends the lease while the run lasts, as a worker's heartbeat does, so a long call is not
/// rescued from under a live process. Abort the task when the run ends.
pub fn keep_alive(db: Db, claimed: &Claimed, lease: Duration) -> tokio::task::JoinHandle<()> {
    let (id, owner) = (claimed.job.id, claimed.owner.clone());
    tokio::spawn(async move {
        let every = (lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let until = db::now_ms().saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
            let renewed = async {
                let mut conn = db.pool.acquire().await?;
                store::heartbeat(&mut conn, &[id], &owner, until).await
            }
            .await;
            if !matches!(renewed, Ok(ref held) if held.contains(&id)) {
                return;
            }
        }
    })
}
