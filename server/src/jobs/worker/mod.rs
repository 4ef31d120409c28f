//! The worker: claims due jobs as leases, runs up to `concurrency` at once with a timeout,
//! records outcomes in batches, heartbeats leases (stopping runs whose lease is gone), rescues
//! expired ones, and on shutdown stops claiming, lets running jobs finish within a grace
//! period, then releases their leases.

mod background;
mod lease;
mod record;
mod settings;

use lease::{InFlight, Run, ended};
pub(crate) use lease::Beat;

pub use settings::WorkerSettings;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures_util::FutureExt;
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch},
    task::JoinSet,
};

use super::{JobCode, JobContext, JobError, JobOutput, Registry};
use crate::{
    db::{
        self, Backend, Db, DbError,
        jobs::{self as store, JobRow},
    },
    telemetry::Telemetry,
};

/// One run's outcome, waiting to be recorded. It holds the concurrency permit until then, so a
/// stalled database stops new claims instead of piling up results.
struct Outcome {
    job: JobRow,
    result: Result<JobOutput, JobError>,
    permit: Option<OwnedSemaphorePermit>,
}

/// Claimed jobs, each with the slot (concurrency permit) it runs in. A claim asks for no more
/// jobs than it holds slots, so `None` is only a safeguard: such a job runs all the same.
type Claimed = Vec<(JobRow, Option<OwnedSemaphorePermit>)>;

/// What the recorder needs to claim jobs for the slots its outcomes free, in the transaction
/// that records them (`Worker::record_gathering`), and to hand them to the run loop.
struct Refill {
    permits: Arc<Semaphore>,
    claimed: mpsc::UnboundedSender<Claimed>,
    shutdown: watch::Receiver<bool>,
}

/// Takes every free slot of the worker at once (possibly none), so that two claims cannot
/// count the same free slot.
fn free_slots(permits: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    let n = u32::try_from(permits.available_permits()).unwrap_or(u32::MAX);
    permits.clone().try_acquire_many_owned(n).ok()
}

/// Gives each claimed job one of the permits in `slots`; the ones left over go back.
fn with_slots(jobs: Vec<JobRow>, mut slots: OwnedSemaphorePermit) -> Claimed {
    jobs.into_iter().map(|job| (job, slots.split(1))).collect()
}


#[derive(Debug, Clone)]
pub struct Worker {
    db: Db,
    registry: Arc<Registry>,
    settings: WorkerSettings,
    wake: Arc<Notify>,
    /// Lease owner name: unique per worker instance.
    id: String,
    /// Each run is a span in its message's trace (off unless `[telemetry]` is set).
    telemetry: Telemetry,
}


impl Worker {
    pub fn new(db: Db, registry: Registry, settings: WorkerSettings, wake: Arc<Notify>) -> Self {
        let id = format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple());
        Self { db, registry: Arc::new(registry), settings, wake, id, telemetry: Telemetry::default() }
    }

    /// Exports each run as a span of its message's trace.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs until `shutdown` turns true, then drains within the grace period.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let settings = self.settings.clone();
        let permits = Arc::new(Semaphore::new(settings.concurrency.max(1)));
        let in_flight: InFlight = Arc::default();
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Outcome>();
        // The recorder claims for the slots its outcomes free, in the same transaction; this loop
        // starts what it claimed.
        let (claimed_tx, mut claimed_rx) = mpsc::unbounded_channel::<Claimed>();
        let refill = Refill { permits: permits.clone(), claimed: claimed_tx, shutdown: shutdown.clone() };
        let recorder = tokio::spawn(self.clone().record_outcomes(done_rx, in_flight.clone(), refill));
        let heartbeat = tokio::spawn(self.clone().heartbeat(in_flight.clone()));
        let maintainer = tokio::spawn(self.clone().maintain());
        let listener = tokio::spawn(self.clone().listen());
        let mut tasks = JoinSet::new();
        // The waits after failed claims; none while claims succeed.
        let mut db_backoff: Option<ExponentialBackoff> = None;
        tracing::info!(worker = %self.id, queue = %settings.queue, concurrency = settings.concurrency, "job worker started");

        loop {
            if *shutdown.borrow() {
                break;
            }
            while tasks.try_join_next().is_some() {}
            while let Ok(jobs) = claimed_rx.try_recv() {
                self.start_all(jobs, &mut tasks, &in_flight, &done_tx);
            }
            if recorder.is_finished() {
                tracing::error!(worker = %self.id, "the outcome recorder stopped; no more claims");
                break;
            }
            let mut full_batch = false;
            if permits.available_permits() > 0 {
                let claimed = tokio::select! {
                    claimed = self.claim(&permits) => claimed,
                    _ = shutdown.changed() => break,
                };
                match claimed {
                    Ok((jobs, limit)) => {
                        db_backoff = None;
                        full_batch = limit > 0 && jobs.len() >= limit;
                        self.start_all(jobs, &mut tasks, &in_flight, &done_tx);
                    }
                    Err(e) => {
                        self.db.storage().failed(&e);
                        let wait = db_backoff.get_or_insert_with(claim_delays).next().unwrap_or(CLAIM_BACKOFF_MAX);
                        tracing::warn!(worker = %self.id, error = %e, retry_in_ms = wait.as_millis() as u64, "claiming jobs failed; backing off");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = shutdown.changed() => {}
                        }
                        continue;
                    }
                }
            }
            if full_batch && permits.available_permits() > 0 {
                continue; // more may be waiting
            }
            let wake = self.wake.clone();
            let permits_wait = permits.clone();
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(settings.poll_interval) => {}
                // A slot freed up after a full batch: look again at once.
                Ok(p) = permits_wait.acquire_owned(), if full_batch => drop(p),
                Some(jobs) = claimed_rx.recv() => self.start_all(jobs, &mut tasks, &in_flight, &done_tx),
                _ = shutdown.changed() => {}
            }
        }

        // One deadline for finishing running jobs and recording their outcomes.
        let deadline = tokio::time::Instant::now() + settings.shutdown_grace;
        tracing::info!(worker = %self.id, running = tasks.len(), "job worker stopping: no new claims");
        let drained = tokio::time::timeout_at(deadline, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(worker = %self.id, still_running = tasks.len(), "jobs did not finish within the grace period");
            tasks.abort_all();
        }
        drop(done_tx);
        let recorder_abort = recorder.abort_handle();
        if tokio::time::timeout_at(deadline, recorder).await.is_err() {
            recorder_abort.abort();
            tracing::warn!(worker = %self.id, "job outcomes could not be recorded before stopping; those jobs will run again");
        }
        heartbeat.abort();
        maintainer.abort();
        listener.abort();
        match self.db.pool.acquire().await {
            Ok(mut conn) => match store::release_leases(&mut conn, &self.id, db::now_ms()).await {
                Ok(ids) if !ids.is_empty() => tracing::info!(worker = %self.id, released = ids.len(), "leases released"),
                Ok(_) => {}
                Err(e) => tracing::warn!(worker = %self.id, error = %e, "could not release leases; the rescuer will"),
            },
            Err(e) => tracing::warn!(worker = %self.id, error = %e, "could not release leases; the rescuer will"),
        }
        tracing::info!(worker = %self.id, "job worker stopped");
    }

    /// Starts a run for each claimed job. Never drops one: a job without a slot (a claim that
    /// overshot) runs all the same.
    fn start_all(&self, jobs: Claimed, tasks: &mut JoinSet<()>, in_flight: &InFlight, done: &mpsc::UnboundedSender<Outcome>) {
        for (job, permit) in jobs {
            let (id, attempt) = (job.id, job.attempt);
            // A job this worker claims again was rescued from a run of its own that stopped
            // renewing its lease (a stall). The new run starts once that one has ended (within
            // its own budget), so the two never overlap; the earlier run is not stopped midway,
            // where it could leave a send at Meta with no result recorded.
            let stalled = in_flight.lock().ok().and_then(|mut map| map.remove(&id)).map(|stale| {
                tracing::warn!(worker = %self.id, job.id = id, attempt = stale.attempt, "the job was rescued and claimed again; its new run waits for the earlier one to end");
                stale.handle
            });
            // The claim set its lease just before: counted from now, less the margin.
            let held_until = Instant::now() + self.settings.lease;
            let me = self.clone();
            let done = done.clone();
            let handle = tasks.spawn(async move {
                if let Some(run) = stalled {
                    ended(&run).await;
                }
                let result = me.execute(&job).await;
                let _ = done.send(Outcome { job, result, permit });
            });
            if let Ok(mut map) = in_flight.lock() {
                map.insert(id, Run { attempt, handle, held_until });
            }
        }
    }

    /// Claims as many due jobs as this worker has free slots once its write transaction has
    /// begun, and returns them with that number. On SQLite the transaction waits its turn for
    /// the one writer connection; slots freed while it waited (runs whose outcomes were recorded
    /// meanwhile) are filled by this claim too, instead of by one small claim each.
    ///
    /// On PostgreSQL the claim is one statement (it writes its events and turns off the wait for
    /// the log flush itself), which is a transaction of its own: it runs on a pooled connection
    /// without `BEGIN` and `COMMIT`, two round trips fewer between an enqueue and its start.
    async fn claim(&self, permits: &Arc<Semaphore>) -> Result<(Claimed, usize), DbError> {
        let claimed = if self.db.backend == Backend::Postgres {
            let mut conn = self.db.pool.acquire().await?;
            self.claim_free_slots(&mut conn, permits).await?
        } else {
            let mut tx = self.db.begin_write().await?;
            let claimed = self.claim_free_slots(&mut tx, permits).await?;
            tx.commit().await?;
            claimed
        };
        let Some((jobs, slots, now)) = claimed else {
            return Ok((Vec::new(), 0));
        };
        let limit = slots.num_permits();
        self.count_claimed(&jobs, now);
        Ok((with_slots(jobs, slots), limit))
    }

    /// Takes every free slot and claims as many jobs on `conn`: the jobs, the slots and the
    /// claim's time, or `None` when no slot is free.
    async fn claim_free_slots(&self, conn: &mut sqlx::AnyConnection, permits: &Arc<Semaphore>) -> Result<Option<(Vec<JobRow>, OwnedSemaphorePermit, i64)>, DbError> {
        let Some(slots) = free_slots(permits).filter(|s| s.num_permits() > 0) else {
            return Ok(None);
        };
        let now = db::now_ms();
        let jobs = self.claim_in(conn, slots.num_permits(), now).await?;
        Ok(Some((jobs, slots, now)))
    }

    /// Claims up to `limit` due jobs in the caller's write transaction.
    async fn claim_in(&self, conn: &mut sqlx::AnyConnection, limit: usize, now: i64) -> Result<Vec<JobRow>, DbError> {
        let lease_until = now + db::duration_ms(self.settings.lease);
        let claim = store::Claim {
            queue: &self.settings.queue,
            owner: &self.id,
            limit: limit as i64,
            now,
            lease_until,
            kinds: Some(self.registry.kinds()),
            one_per_chat: self.registry.one_at_a_time_per_chat(),
        };
        store::claim_in_order(conn, self.db.backend, claim).await
    }

    /// Metrics of committed claims.
    fn count_claimed(&self, jobs: &[JobRow], now: i64) {
        if jobs.is_empty() {
            return;
        }
        metrics::counter!("jobs_claimed_total", "queue" => self.settings.queue.clone()).increment(jobs.len() as u64);
        for job in jobs {
            let waited = (now - job.scheduled_at).max(0) as f64 / 1000.0;
            metrics::histogram!("job_wait_duration_seconds", "kind" => job.kind.clone()).record(waited);
        }
    }

    async fn execute(&self, job: &JobRow) -> Result<JobOutput, JobError> {
        let Some(handler) = self.registry.handler(&job.kind) else {
            return Err(JobError::permanent(JobCode::KindUnknown.as_str(), format!("no handler for job kind {:?}", job.kind)));
        };
        let budget = self.registry.budget(&job.kind).unwrap_or(self.settings.job_timeout);
        let deadline = tokio::time::Instant::now() + budget;
        let ctx = JobContext { job: job.clone(), deadline };
        let started = Instant::now();
        let started_ms = db::now_ms();
        let run = std::panic::AssertUnwindSafe(self.telemetry.in_job(job, handler.run(&ctx))).catch_unwind();
        let result = match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(JobError::retryable(JobCode::Panicked.as_str(), "the handler panicked")),
            Err(_) => Err(JobError::retryable(JobCode::Timeout.as_str(), format!("no result within {budget:?}"))),
        };
        metrics::histogram!("job_run_duration_seconds", "kind" => job.kind.clone()).record(started.elapsed().as_secs_f64());
        self.telemetry.job_ran(job, started_ms, result.as_ref().err().map(|e| e.code.as_str()));
        result
    }

}

/// The longest wait between claims that fail (the database is down or locked).
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The waits between claims that fail: doubling from 100 ms to [`CLAIM_BACKOFF_MAX`]; a claim
/// that succeeds starts them over.
fn claim_delays() -> ExponentialBackoff {
    ExponentialBuilder::default().with_min_delay(Duration::from_millis(100)).with_max_delay(CLAIM_BACKOFF_MAX).without_max_times().build()
}

fn hostname() -> String {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "gatehouse".into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn failed_claims_wait_longer_each_time_up_to_five_seconds() {
        let waits: Vec<u128> = super::claim_delays().take(8).map(|d: Duration| d.as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
