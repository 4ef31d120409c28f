//! Running one job now, in this process, instead of waiting for a worker: the tool lane runs a
//! call it just stored while the person waits for a reply. The job is claimed as a lease like
//! any worker's claim, so no worker runs it meanwhile, and if this process dies the lease runs
//! out and a worker rescues and reruns it. Its outcome is recorded as a worker records one.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{
    JobError, JobOutput,
    outcome::{self, RetryTimes},
};
use crate::{
    config::JobSettings,
    db::{
        self, Db, DbError,
        jobs::{self as store, JobRow},
    },
};

/// A job this process holds, with the queue's settings it was claimed under.
#[derive(Debug)]
pub struct Claimed {
    pub job: JobRow,
    owner: String,
    lease: Duration,
    retry: RetryTimes,
}

/// How the lease owner of a run the lane makes while the person waits begins. A worker's is its
/// host's name and a UUID, and no host name holds a colon.
const LANE_RUN: &str = "lane:";

/// Whether a job's lease owner is a run the lane made at once ([`claim`]), not a worker's.
pub fn is_lane_run(lease_owner: &str) -> bool {
    lease_owner.starts_with(LANE_RUN)
}

/// Claims job `id` for the configured lease; `None` when a worker has it already (or it is not
/// due).
pub async fn claim(db: &Db, id: i64, settings: &JobSettings) -> Result<Option<Claimed>, DbError> {
    let owner = format!("{LANE_RUN}{}", uuid::Uuid::new_v4().simple());
    let now = db::now_ms();
    let mut tx = db.begin_write().await?;
    let job = store::claim_one(&mut tx, id, &owner, now, now.saturating_add(db::duration_ms(settings.lease))).await?;
    tx.commit().await?;
    Ok(job.map(|job| Claimed { job, owner, lease: settings.lease, retry: RetryTimes { base: settings.retry_base, max: settings.retry_max } }))
}

/// Records how the run ended, as a worker records it ([`outcome::write`]): completed, snoozed,
/// retried after the configured backoff, or discarded. A lease lost meanwhile (rescued after a
/// stall) leaves the job to its new holder.
pub async fn finish(db: &Db, claimed: &Claimed, result: &Result<JobOutput, JobError>) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    outcome::write(&mut tx, &claimed.job, &claimed.owner, result, claimed.retry, db::now_ms()).await?;
    tx.commit().await?;
    Ok(())
}

/// Extends the lease while the run lasts, as a worker's heartbeat does, so a long call is not
/// rescued from under a live process. A renewal that fails (the database busy a moment) is tried
/// again at the next beat, as a worker's is. When the lease is found gone (an owner cancelled
/// the job, or it was rescued after a stall and may run elsewhere), or is about to run out with
/// no renewal (the database out of reach: it may then be rescued and run elsewhere), the returned
/// receiver resolves: the run must stop. The heartbeat stops when the returned [`Heartbeat`] is
/// dropped, also when the run's task ends in a panic: a lease renewed for ever would keep the
/// job "running" and never rescued.
pub fn keep_alive(db: Db, claimed: &Claimed) -> (Heartbeat, oneshot::Receiver<()>) {
    let (id, owner, lease) = (claimed.job.id, claimed.owner.clone(), claimed.lease);
    let (lost, lease_lost) = oneshot::channel();
    let task = tokio::spawn(async move {
        let beat_timing = super::worker::Beat::of(lease);
        let mut held_until = std::time::Instant::now() + lease;
        loop {
            tokio::time::sleep(beat_timing.every).await;
            let beat = std::time::Instant::now();
            let now = db::now_ms();
            let until = now.saturating_add(db::duration_ms(lease));
            // A beat that hangs counts as failed once the next is due (see the worker's).
            let renewed = tokio::time::timeout(beat_timing.timeout, async {
                let mut conn = db.pool.acquire().await?;
                store::heartbeat(&mut conn, &[id], &owner, now, until).await
            })
            .await
            .map_err(|_| format!("no answer within {:?}", beat_timing.timeout))
            .and_then(|beat| beat.map_err(|e| e.to_string()));
            match renewed {
                Ok(held) if held.contains(&id) => held_until = beat + lease,
                Ok(_) => {
                    tracing::info!(job.id = id, "lease lost (cancelled or rescued); the run at once is stopped");
                    let _ = lost.send(());
                    return;
                }
                Err(error) if beat_timing.stop_unrenewed(held_until) => {
                    tracing::warn!(job.id = id, error = %error, "the lease could not be renewed before it ran out; the run at once is stopped");
                    let _ = lost.send(());
                    return;
                }
                Err(error) => tracing::warn!(job.id = id, error = %error, "lease heartbeat failed; tried again at the next beat"),
            }
        }
    });
    (Heartbeat(task), lease_lost)
}

/// A run's lease heartbeat ([`keep_alive`]); it stops when this is dropped.
#[derive(Debug)]
pub struct Heartbeat(tokio::task::JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}
