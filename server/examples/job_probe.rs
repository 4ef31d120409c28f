//! A worker process for crash and scale-out tests: it runs `probe` jobs against a database and
//! records, per job, every execution and (once, through the job's idempotency key) its effect.
//!
//! Usage: job_probe DATABASE_URL [SLEEP_MS] [LEASE_MS] [CONCURRENCY]
//! With `PROBE_GRAPH_URL` set it also runs `probe_send` jobs: each sends its `text` argument as a
//! WhatsApp reply through the real sender and delivery ledger to that (fake) Graph API.
//! Stops on SIGTERM/SIGINT; tests also kill it with SIGKILL.

use std::{sync::Arc, time::Duration};

use server::{
    channel::whatsapp::{Recipient, WhatsAppSender, graph::GraphClient, sender::SendError},
    config::{DatabaseSettings, WhatsAppSettings},
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

/// Sends a job's text through the ledger, as the `whatsapp.inbound` job does with a reply.
struct ProbeSend {
    sender: WhatsAppSender,
}

#[async_trait::async_trait]
impl JobHandler for ProbeSend {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let text = ctx.job.args.clone();
        let text: serde_json::Value = serde_json::from_str(&text).map_err(|e| JobError::permanent("PROBE_ARGS", e.to_string()))?;
        let to = Recipient { id: "16505551234".into(), group: false };
        match self.sender.send_text(ctx.job.id, &to, text["text"].as_str().unwrap_or_default(), None).await {
            Ok(_) => Ok(JobOutput::default()),
            Err(SendError::Retry { code, message }) => Err(JobError::retryable(&code, message)),
            Err(SendError::Permanent { code, message }) => Err(JobError::permanent(&code, message)),
            Err(SendError::Db(e)) => Err(JobError::retryable("PROBE_DB", e.to_string())),
        }
    }
}

fn probe_sender(db: &Db, graph_url: String) -> anyhow::Result<WhatsAppSender> {
    let settings = WhatsAppSettings {
        graph_base_url: graph_url,
        phone_number_id: "106540352242922".into(),
        // Tests hold a send at their fake Graph API while another run starts.
        request_timeout: Duration::from_secs(120),
        send_attempts: 1,
        pair_burst: 100,
        pair_interval: Duration::from_millis(1),
        global_rate_per_second: 1000,
        ..Default::default()
    };
    let graph = GraphClient::new(&settings, Some("probe-access-token".to_string().into()))?;
    Ok(WhatsAppSender::new(db.clone(), graph, settings))
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
    if let Ok(graph_url) = std::env::var("PROBE_GRAPH_URL") {
        registry.register("probe_send", Arc::new(ProbeSend { sender: probe_sender(&db, graph_url)? }));
    }
    let settings = WorkerSettings {
        concurrency,
        lease,
        poll_interval: Duration::from_millis(100),
        maintenance_interval: Duration::from_millis(250),
        job_timeout: Duration::from_secs(30),
        retry_base: Duration::from_millis(200),
        retry_max: Duration::from_secs(1),
        ..Default::default()
    };
    let queue = JobQueue::new(db.clone());
    println!("ready");
    let shutdown = server::web::serve::shutdown_watch();
    Worker::new(db.clone(), registry, settings, queue.waker()).run(shutdown).await;
    Ok(())
}
