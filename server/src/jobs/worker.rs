//! The worker: claims due jobs as leases, runs up to `concurrency` at once with a timeout,
//! records outcomes in batches, heartbeats leases, rescues expired ones, and on shutdown stops
//! claiming, lets running jobs finish within a grace period, then releases their leases.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures_util::FutureExt;
use tokio::{
    sync::{Notify, Semaphore, mpsc, watch},
    task::JoinSet,
};

use super::{JobContext, JobError, JobOutput, Registry, code, queue::NOTIFY_CHANNEL, retry};
use crate::db::{
    self, Backend, Db, DbError,
    jobs::{self as store, JobRow},
};

#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub queue: String,
    /// Jobs run at once by this worker.
    pub concurrency: usize,
    /// Poll even without a notification this often.
    pub poll_interval: Duration,
    /// A claimed job belongs to this worker until the lease runs out; heartbeats extend it.
    pub lease: Duration,
    pub job_timeout: Duration,
    pub shutdown_grace: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// How often expired leases are rescued and stale jobs expired.
    pub maintenance_interval: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            queue: "default".into(),
            concurrency: 8,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            job_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(3600),
            maintenance_interval: Duration::from_secs(5),
        }
    }
}

/// One job's outcome, waiting to be recorded.
struct Outcome {
    job: JobRow,
    result: Result<JobOutput, JobError>,
}

#[derive(Debug, Clone)]
pub struct Worker {
    db: Db,
    registry: Arc<Registry>,
    settings: WorkerSettings,
    wake: Arc<Notify>,
    /// Lease owner name: unique per worker instance.
    id: String,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    pub fn new(db: Db, registry: Registry, settings: WorkerSettings, wake: Arc<Notify>) -> Self {
        let id = format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple());
        Self { db, registry: Arc::new(registry), settings, wake, id }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs until `shutdown` turns true, then drains within the grace period.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let settings = self.settings.clone();
        let permits = Arc::new(Semaphore::new(settings.concurrency.max(1)));
        let in_flight: Arc<Mutex<HashSet<i64>>> = Arc::default();
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Outcome>();
        let recorder = tokio::spawn(self.clone().record_outcomes(done_rx));
        let heartbeat = tokio::spawn(self.clone().heartbeat(in_flight.clone()));
        let maintainer = tokio::spawn(self.clone().maintain());
        let listener = tokio::spawn(self.clone().listen());
        let mut tasks = JoinSet::new();
        let mut db_backoff = Duration::from_millis(100);
        tracing::info!(worker = %self.id, queue = %settings.queue, concurrency = settings.concurrency, "job worker started");

        loop {
            if *shutdown.borrow() {
                break;
            }
            while tasks.try_join_next().is_some() {}
            let free = permits.available_permits();
            let mut claimed_any = false;
            if free > 0 {
                match self.claim(free).await {
                    Ok(jobs) => {
                        db_backoff = Duration::from_millis(100);
                        claimed_any = jobs.len() == free;
                        for job in jobs {
                            let Ok(permit) = permits.clone().try_acquire_owned() else { break };
                            in_flight.lock().map(|mut s| s.insert(job.id)).ok();
                            let me = self.clone();
                            let done = done_tx.clone();
                            let in_flight = in_flight.clone();
                            tasks.spawn(async move {
                                let id = job.id;
                                let result = me.execute(&job).await;
                                let _ = done.send(Outcome { job, result });
                                in_flight.lock().map(|mut s| s.remove(&id)).ok();
                                drop(permit);
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(worker = %self.id, error = %e, retry_in_ms = db_backoff.as_millis() as u64, "claiming jobs failed; backing off");
                        tokio::select! {
                            _ = tokio::time::sleep(db_backoff) => {}
                            _ = shutdown.changed() => {}
                        }
                        db_backoff = (db_backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            if claimed_any {
                // A full batch: there may be more waiting; claim again once a slot frees up.
                if permits.available_permits() == 0 {
                    tokio::select! {
                        _ = tasks.join_next() => {}
                        _ = shutdown.changed() => {}
                    }
                }
                continue;
            }
            let wake = self.wake.clone();
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(settings.poll_interval) => {}
                _ = tasks.join_next(), if permits.available_permits() == 0 => {}
                _ = shutdown.changed() => {}
            }
        }

        tracing::info!(worker = %self.id, running = tasks.len(), "job worker stopping: no new claims");
        let drained = tokio::time::timeout(settings.shutdown_grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(worker = %self.id, still_running = tasks.len(), "jobs did not finish within the grace period");
            tasks.abort_all();
        }
        drop(done_tx);
        let _ = recorder.await;
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

    async fn claim(&self, n: usize) -> Result<Vec<JobRow>, DbError> {
        let now = db::now_ms();
        let mut conn = self.db.pool.acquire().await?;
        let jobs = store::claim(&mut conn, self.db.backend, &self.settings.queue, &self.id, n as i64, now, now + ms(self.settings.lease)).await?;
        if !jobs.is_empty() {
            metrics::counter!("jobs_claimed_total", "queue" => self.settings.queue.clone()).increment(jobs.len() as u64);
            for job in &jobs {
                let waited = (now - job.scheduled_at).max(0) as f64 / 1000.0;
                metrics::histogram!("job_wait_duration_seconds", "kind" => job.kind.clone()).record(waited);
            }
        }
        Ok(jobs)
    }

    async fn execute(&self, job: &JobRow) -> Result<JobOutput, JobError> {
        let Some(handler) = self.registry.handler(&job.kind) else {
            return Err(JobError::permanent(code::KIND_UNKNOWN, format!("no handler for job kind {:?}", job.kind)));
        };
        let ctx = JobContext { job: job.clone() };
        let started = Instant::now();
        let run = std::panic::AssertUnwindSafe(handler.run(&ctx)).catch_unwind();
        let result = match tokio::time::timeout(self.settings.job_timeout, run).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(JobError::retryable(code::PANICKED, "the handler panicked")),
            Err(_) => Err(JobError::retryable(code::TIMEOUT, format!("no result within {:?}", self.settings.job_timeout))),
        };
        metrics::histogram!("job_run_duration_seconds", "kind" => job.kind.clone()).record(started.elapsed().as_secs_f64());
        result
    }

    /// Records outcomes in batches: whatever has arrived is written in one transaction.
    async fn record_outcomes(self, mut rx: mpsc::UnboundedReceiver<Outcome>) {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, 512).await > 0 {
            let mut delay = Duration::from_millis(50);
            loop {
                match self.record(&batch).await {
                    Ok(()) => break,
                    Err(e) => {
                        // Keep the outcomes and try again: the jobs stay leased (and heartbeated)
                        // meanwhile; if this process dies they are rescued and run again.
                        tracing::warn!(worker = %self.id, error = %e, pending = batch.len(), "recording job outcomes failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            for outcome in batch.drain(..) {
                self.run_hooks(outcome).await;
            }
        }
    }

    async fn record(&self, batch: &[Outcome]) -> Result<(), DbError> {
        let now = db::now_ms();
        let mut tx = self.db.begin_write().await?;
        let done: Vec<(i64, Option<String>)> = batch
            .iter()
            .filter_map(|o| match &o.result {
                Ok(out) if out.snooze.is_none() => Some((o.job.id, out.preview.clone())),
                _ => None,
            })
            .collect();
        store::complete(&mut tx, &done, &self.id, now).await?;
        for o in batch {
            match &o.result {
                Ok(JobOutput { snooze: Some(after), .. }) => {
                    store::snooze(&mut tx, o.job.id, &self.id, now + ms(*after), now).await?;
                }
                Ok(_) => {}
                Err(err) => {
                    let at = now + ms(retry::backoff(o.job.attempt, self.settings.retry_base, self.settings.retry_max));
                    store::fail(&mut tx, o.job.id, &self.id, &err.code, &err.message, err.retryable, at, now).await?;
                }
            }
        }
        tx.commit().await?;
        let queue = self.settings.queue.clone();
        metrics::counter!("jobs_completed_total", "queue" => queue.clone()).increment(done.len() as u64);
        metrics::counter!("jobs_failed_total", "queue" => queue).increment(batch.iter().filter(|o| o.result.is_err()).count() as u64);
        Ok(())
    }

    async fn run_hooks(&self, outcome: Outcome) {
        let hooks = self.registry.hooks();
        if hooks.is_empty() {
            return;
        }
        match &outcome.result {
            Ok(out) if out.snooze.is_none() => {
                for h in hooks {
                    h.on_success(&outcome.job).await;
                }
            }
            Ok(_) => {}
            Err(err) => {
                let final_failure = !err.retryable || outcome.job.attempt >= outcome.job.max_attempts;
                if final_failure {
                    tracing::warn!(job.id = outcome.job.id, kind = %outcome.job.kind, code = %err.code, "job discarded");
                }
                for h in hooks {
                    h.on_failure(&outcome.job, err, final_failure).await;
                }
            }
        }
    }

    async fn heartbeat(self, in_flight: Arc<Mutex<HashSet<i64>>>) {
        let every = (self.settings.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let ids: Vec<i64> = in_flight.lock().map(|s| s.iter().copied().collect()).unwrap_or_default();
            if ids.is_empty() {
                continue;
            }
            let until = db::now_ms() + ms(self.settings.lease);
            let result = async {
                let mut conn = self.db.pool.acquire().await?;
                store::heartbeat(&mut conn, &ids, &self.id, until).await
            }
            .await;
            if let Err(e) = result {
                tracing::warn!(worker = %self.id, error = %e, "lease heartbeat failed");
            }
        }
    }

    async fn maintain(self) {
        loop {
            let result = async {
                let mut conn = self.db.pool.acquire().await?;
                let now = db::now_ms();
                let rescued = store::rescue(&mut conn, now).await?;
                let expired = store::expire(&mut conn, now).await?;
                Ok::<_, DbError>((rescued, expired))
            }
            .await;
            match result {
                Ok((rescued, expired)) => {
                    if !rescued.is_empty() {
                        tracing::warn!(worker = %self.id, count = rescued.len(), "rescued jobs whose lease expired");
                        self.wake.notify_one();
                    }
                    if !expired.is_empty() {
                        tracing::info!(worker = %self.id, count = expired.len(), "expired jobs past their time to live");
                    }
                }
                Err(e) => tracing::warn!(worker = %self.id, error = %e, "job maintenance failed"),
            }
            tokio::time::sleep(self.settings.maintenance_interval).await;
        }
    }

    /// On PostgreSQL, wakes this worker when another process enqueues.
    async fn listen(self) {
        if self.db.backend != Backend::Postgres {
            return;
        }
        let Some(url) = self.db.postgres_url() else { return };
        loop {
            match sqlx::postgres::PgListener::connect(&url).await {
                Ok(mut listener) => {
                    if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
                        tracing::warn!(error = %e, "LISTEN failed");
                    } else {
                        while let Ok(n) = listener.recv().await {
                            if n.payload() == self.settings.queue {
                                self.wake.notify_one();
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot connect for LISTEN; polling only"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "gatehouse".into())
}
