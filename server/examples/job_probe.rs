//! A worker process for crash and scale-out tests: it runs `probe` jobs against a database and
//! records, per job, every execution and (once, through the job's idempotency key) its effect.
//!
//! Usage: job_probe DATABASE_URL [SLEEP_MS] [LEASE_MS] [CONCURRENCY]
//! Stops on SIGTERM/SIGINT; tests also kill it with SIGKILL.

use std::{sync::Arc, time::Duration};

use server::{
    config::DatabaseSettings,
    db::Db,
    jobs::{JobContext, JobError, JobHandler, JobOutput, JobQueue, Registry, Worker, WorkerSettings},
};

struct Probe {
    db: Db,
    sleep: Duration,
    pid: i64,
}

#[async_trait::async_trait]
impl JobHandler for Probe {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let err = |e: sqlx::Error| JobError::retryable("PROBE_DB", e.to_string());
        sqlx::query("INSERT INTO probe_runs (job_id, pid) VALUES ($1, $2)").bind(ctx.job.id).bind(self.pid).execute(&self.db.pool).await.map_err(err)?;
        tokio::time::sleep(self.sleep).await;
        // The effect happens once per idempotency key, however often the job runs.
        sqlx::query("INSERT INTO probe_effects (idempotency_key, pid) VALUES ($1, $2) ON CONFLICT (idempotency_key) DO NOTHING")
            .bind(ctx.idempotency_key())
            .bind(self.pid)
            .execute(&self.db.pool)
            .await
            .map_err(err)?;
        Ok(JobOutput::default())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or_else(|| anyhow::anyhow!("usage: job_probe DATABASE_URL [SLEEP_MS] [LEASE_MS] [CONCURRENCY]"))?;
    let num = |v: Option<String>, d: u64| v.and_then(|s| s.parse().ok()).unwrap_or(d);
    let sleep = Duration::from_millis(num(args.next(), 20));
    let lease = Duration::from_millis(num(args.next(), 2000));
    let concurrency = num(args.next(), 16) as usize;

    let db = Db::connect(&DatabaseSettings { url, max_connections: 24, ..Default::default() }).await?;
    db.migrate().await?;
    let mut registry = Registry::new();
    registry.register("probe", Arc::new(Probe { db: db.clone(), sleep, pid: i64::from(std::process::id()) }));
    let settings = WorkerSettings {
        concurrency,
        lease,
        poll_interval: Duration::from_millis(100),
        maintenance_interval: Duration::from_millis(250),
        job_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let queue = JobQueue::new(db.clone());
    println!("ready");
    let shutdown = server::web::serve::shutdown_watch();
    Worker::new(db.clone(), registry, settings, queue.waker()).run(shutdown).await;
    Ok(())
}
