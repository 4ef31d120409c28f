//! Running one job now, in this process, instead of waiting for a worker: the tool lane runs a
//! call it just stored while the person waits for a reply. The job is claimed as a lease like
//! any worker's claim, so no worker runs it meanwhile, and if this process dies the lease runs
//! out and a worker rescues and reruns it. Its outcome is recorded as a worker records one.

use std::time::Duration;

use super::{JobError, JobOutput, retry};
use crate::{
    config::JobSettings,
    db::{
        self, Db, DbError,
        jobs::{self as store, Finished, JobRow},
    },
};

/// A job this process holds, with the queue's settings it was claimed under.
#[derive(Debug)]
pub struct Claimed {
    pub job: JobRow,
    owner: String,
    lease: Duration,
    retry_base: Duration,
    retry_max: Duration,
}

/// Claims job `id` for the configured lease; `None` when a worker has it already (or it is not
/// due).
pub async fn claim(db: &Db, id: i64, settings: &JobSettings) -> Result<Option<Claimed>, DbError> {
    let owner = format!("inline-{}", uuid::Uuid::new_v4().simple());
    let now = db::now_ms();
    let mut tx = db.begin_write().await?;
    let job = store::claim_one(&mut tx, id, &owner, now, now.saturating_add(db::duration_ms(settings.lease))).await?;
    tx.commit().await?;
    Ok(job.map(|job| Claimed { job, owner, lease: settings.lease, retry_base: settings.retry_base, retry_max: settings.retry_max }))
}

/// Records how the run ended: completed, retried after the configured backoff, or discarded. A
/// lease lost meanwhile (rescued after a stall) leaves the job to its new holder.
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
            let at = now.saturating_add(db::duration_ms(retry::deployment_wait(claimed.retry_max)));
            store::snooze(&mut tx, job.id, job.attempt, &claimed.owner, at, now, Some(&e.code)).await?;
        }
        Err(e) => {
            let at = now.saturating_add(db::duration_ms(retry::backoff(job.attempt, claimed.retry_base, claimed.retry_max)));
            store::fail(&mut tx, job.id, job.attempt, &claimed.owner, &e.code, &e.message, e.retryable, at, now).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Extends the lease while the run lasts, as a worker's heartbeat does, so a long call is not
/// rescued from under a live process. Abort the task when the run ends.
pub fn keep_alive(db: Db, claimed: &Claimed) -> tokio::task::JoinHandle<()> {
    let (id, owner, lease) = (claimed.job.id, claimed.owner.clone(), claimed.lease);
    tokio::spawn(async move {
        let every = (lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let until = db::now_ms().saturating_add(db::duration_ms(lease));
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
