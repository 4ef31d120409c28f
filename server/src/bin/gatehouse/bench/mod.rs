//! `gatehouse bench jobs`: throughput and latency of the job queue on a given database, and its
//! ceiling: the same jobs claimed and completed by plain batched SQL in the same run.

pub mod console;
pub mod detector;
pub mod mcp;
mod serve;
pub mod webhook;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use server::{
    config::DatabaseSettings,
    db::{self, Db, jobs::NewJob},
    jobs::{JobContext, JobError, JobHandler, JobOutput, JobQueue, Registry, Worker, WorkerSettings},
};

#[derive(Debug, clap::Args)]
pub struct JobsBench {
    /// Database URL (sqlite://... or postgres://...); the schema is migrated first.
    #[arg(long)]
    pub database: String,
    /// No-op jobs to enqueue and run.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Worker instances in this process.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Jobs each worker runs at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Jobs enqueued one at a time on an idle queue to measure enqueue-to-start latency.
    #[arg(long, default_value_t = 300)]
    pub latency_samples: usize,
}

const KIND: &str = "bench.noop";

/// Does nothing; in the latency phase it records when it started.
struct Noop {
    started: Mutex<Vec<Option<Instant>>>,
    runs: AtomicUsize,
}

#[async_trait::async_trait]
impl JobHandler for Noop {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Ok(serde_json::Value::Number(n)) = serde_json::from_str::<serde_json::Value>(&ctx.job.args).map(|v| v["sample"].clone()) {
            let now = Instant::now();
            if let (Some(i), Ok(mut started)) = (n.as_u64(), self.started.lock())
                && let Some(slot) = started.get_mut(i as usize)
            {
                *slot = Some(now);
            }
        }
        Ok(JobOutput::default())
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Counts the outcomes the worker recorded (hooks run after the commit), and wakes the bench
/// when the last one is in: no query competes with the queue for the database or the cores.
struct Finished {
    count: AtomicUsize,
    target: usize,
    all_in: tokio::sync::Notify,
}

impl Finished {
    fn one(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 >= self.target {
            self.all_in.notify_one();
        }
    }
}

#[async_trait::async_trait]
impl server::jobs::JobHook for Finished {
    async fn on_success(&self, _job: &server::db::jobs::JobRow) {
        self.one();
    }
    async fn on_failure(&self, _job: &server::db::jobs::JobRow, _error: &JobError, final_failure: bool) {
        if final_failure {
            self.one();
        }
    }
}

/// Claims `batch` available jobs of `queue` with one UPDATE and completes them with another,
/// until none is left: the least a queue can do per job. Returns how many it completed.
async fn plain_claim_complete(db: Db, queue: String, batch: usize) -> anyhow::Result<usize> {
    // The queue's own order and due states, so the ceiling reads the same index (jobs_due).
    let pick = "SELECT id FROM jobs WHERE state IN ('available', 'scheduled', 'retryable') AND queue = $2 ORDER BY priority DESC, scheduled_at, id LIMIT $3";
    let claim = match db.backend {
        db::Backend::Postgres => format!("WITH picked AS ({pick} FOR UPDATE SKIP LOCKED) UPDATE jobs SET state = 'running', started_at = $1 FROM picked WHERE jobs.id = picked.id RETURNING jobs.id"),
        db::Backend::Sqlite => format!("UPDATE jobs SET state = 'running', started_at = $1 WHERE id IN ({pick}) RETURNING id"),
    };
    let mut done = 0;
    loop {
        let now = db::now_ms();
        let ids: Vec<i64> = sqlx::query_scalar(&claim).bind(now).bind(&queue).bind(i64::try_from(batch).unwrap_or(64)).fetch_all(&db.pool).await?;
        if ids.is_empty() {
            return Ok(done);
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        sqlx::query(&format!("UPDATE jobs SET state = 'completed', completed_at = $1 WHERE id IN ({list})")).bind(now).execute(&db.pool).await?;
        done += ids.len();
    }
}

pub async fn jobs(args: &JobsBench) -> anyhow::Result<()> {
    let settings = DatabaseSettings {
        url: args.database.clone(),
        max_connections: u32::try_from(args.workers * 3 + 4).unwrap_or(16),
        ..Default::default()
    };
    let db = Db::connect(&settings).await?;
    db.migrate().await?;
    let queue_name = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let queue = JobQueue::new(db.clone());
    let new_job = |args: serde_json::Value| NewJob {
        kind: KIND.into(),
        queue: queue_name.clone(),
        max_attempts: 3,
        args,
        correlation_id: "bench".into(),
        ..Default::default()
    };

    // 1. Enqueue throughput: batches of 500 through the queue's batch API, one transaction
    // each (as graphile-worker's addJobs takes them).
    let t = Instant::now();
    for chunk in (0..args.jobs).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<NewJob> = chunk.iter().map(|_| new_job(serde_json::json!({}))).collect();
        let mut tx = db.begin_write().await?;
        queue.enqueue_many_in(&mut tx, &batch).await?;
        tx.commit().await?;
    }
    let enqueue_secs = t.elapsed().as_secs_f64();

    // 2. Completion throughput with the queue full.
    let noop = Arc::new(Noop { started: Mutex::new(vec![None; args.latency_samples]), runs: AtomicUsize::new(0) });
    let (stop, stopped) = watch::channel(false);
    let worker_settings = WorkerSettings {
        queue: queue_name.clone(),
        concurrency: args.concurrency.max(1),
        poll_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let finished = Arc::new(Finished { count: AtomicUsize::new(0), target: args.jobs, all_in: tokio::sync::Notify::new() });
    let t = Instant::now();
    let workers: Vec<_> = (0..args.workers.max(1))
        .map(|_| {
            let mut registry = Registry::new();
            registry.register(KIND, noop.clone());
            registry.hook(finished.clone());
            tokio::spawn(Worker::new(db.clone(), registry, worker_settings.clone(), queue.waker()).run(stopped.clone()))
        })
        .collect();
    queue.notify();
    let all_in = tokio::time::timeout(Duration::from_secs(600), async {
        while finished.count.load(Ordering::Acquire) < args.jobs {
            finished.all_in.notified().await;
        }
    });
    anyhow::ensure!(all_in.await.is_ok(), "jobs did not finish within 10 minutes");
    let complete_secs = t.elapsed().as_secs_f64();

    // 3. Enqueue-to-start latency on the idle queue, one job at a time.
    let mut enqueued_at = Vec::with_capacity(args.latency_samples);
    for i in 0..args.latency_samples {
        let t0 = Instant::now();
        queue.enqueue(&new_job(serde_json::json!({ "sample": i }))).await?;
        enqueued_at.push(t0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while noop.started.lock().map(|s| s[i].is_none()).unwrap_or(false) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = noop.started.lock().map(|s| s.clone()).unwrap_or_default();
    let mut latencies: Vec<f64> =
        enqueued_at.iter().zip(started.iter()).filter_map(|(t0, s)| s.map(|s| s.duration_since(*t0).as_secs_f64() * 1000.0)).collect();
    latencies.sort_by(f64::total_cmp);

    let _ = stop.send(true);
    for w in workers {
        let _ = w.await;
    }
    let mut conn = db.pool.acquire().await?;
    db::jobs::delete_queue(&mut conn, &queue_name).await?;
    drop(conn);

    // 4. The ceiling: the same number of the same jobs, enqueued the same way, claimed and
    // completed by plain batched SQL with no queue logic (no leases, attempts, events or
    // handler), by as many tasks as the workers, `concurrency` jobs a batch.
    let ceiling_queue = format!("{queue_name}-ceiling");
    for chunk in (0..args.jobs).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<NewJob> = chunk.iter().map(|_| NewJob { queue: ceiling_queue.clone(), ..new_job(serde_json::json!({})) }).collect();
        let mut tx = db.begin_write().await?;
        queue.enqueue_many_in(&mut tx, &batch).await?;
        tx.commit().await?;
    }
    let t = Instant::now();
    let claimers: Vec<_> = (0..args.workers.max(1)).map(|_| tokio::spawn(plain_claim_complete(db.clone(), ceiling_queue.clone(), args.concurrency.max(1)))).collect();
    let mut ceiling_done = 0usize;
    for c in claimers {
        ceiling_done += c.await??;
    }
    let ceiling_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(ceiling_done == args.jobs, "the ceiling completed {ceiling_done} of {} jobs", args.jobs);
    let mut conn = db.pool.acquire().await?;
    db::jobs::delete_queue(&mut conn, &ceiling_queue).await?;
    drop(conn);
    db.close().await;

    let n = args.jobs as f64;
    println!("backend            {}", db.backend.as_str());
    println!("jobs               {} (workers {}, concurrency {} each)", args.jobs, args.workers, args.concurrency);
    println!("enqueue/s          {:.0} (batches of 500, one transaction each)", n / enqueue_secs);
    println!("completed/s        {:.0} (queue full at start)", n / complete_secs);
    println!(
        "ceiling            {:.0} completed/s by plain batched SQL (claim {} with one UPDATE, complete them with one UPDATE; no leases, events or handler); the queue is {:.2}x of it",
        n / ceiling_secs,
        args.concurrency.max(1),
        ceiling_secs / complete_secs
    );
    println!(
        "enqueue-to-start   p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  ({} samples, idle queue)",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
        latencies.len()
    );
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct CheckpointBench {
    /// Database URL for the audit rows (sqlite://... or postgres://...).
    #[arg(long)]
    pub database: String,
    /// Calls to make.
    #[arg(long, default_value_t = 20_000)]
    pub calls: usize,
}

struct NoopTool;

#[async_trait::async_trait]
impl server::tools::ToolExecutor for NoopTool {
    async fn call(&self, _tool: &server::tools::ToolDef, _args: &serde_json::Value) -> Result<serde_json::Value, server::tools::ToolError> {
        Ok(serde_json::json!({ "ok": true }))
    }
}

const NOOP_TOOL: &str = r#"
[[tool]]
name = "noop"
title = "No-op"
description = "Does nothing; measures the checkpoint itself."
provider = "builtin"
handler = "bench.noop"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["q"], properties = { q = { type = "string", maxLength = 200 } } }
output_schema = { type = "object", properties = { ok = { type = "boolean" } } }
"#;

/// `gatehouse bench checkpoint`: the checkpoint's own cost on a no-op tool (validation, policy,
/// breaker, output check) per call, and calls/s including the batched audit writes.
pub async fn checkpoint(args: &CheckpointBench) -> anyhow::Result<()> {
    use server::{
        config::SecretSource,
        domain::{ChatKind, Role},
        tools::{CallContext, Catalog, Checkpoint, ToolCall, checkpoint::AuditWriter},
    };
    let db = Db::connect(&DatabaseSettings { url: args.database.clone(), ..Default::default() }).await?;
    db.migrate().await?;
    let dir = std::env::temp_dir().join(format!("gatehouse-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("tools.toml");
    std::fs::write(&path, NOOP_TOOL)?;
    let catalog = Catalog::load(&path, &|_| false).map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let mut cp = Checkpoint::new(db.clone(), Arc::new(catalog), AuditWriter::spawn(db.clone(), JobQueue::new(db.clone())), SecretSource::empty());
    cp.register_builtin("bench.noop", Arc::new(NoopTool));
    let ctx = CallContext { actor: Role::Customer, chat_type: ChatKind::Direct, chat_id: Some("bench".into()), sender_id: None, correlation_id: "bench".into(), approved: None, trace_id: None };

    let mut per_call = Vec::with_capacity(args.calls);
    let t = Instant::now();
    for i in 0..args.calls {
        let c = ToolCall { name: "noop".into(), args: serde_json::json!({ "q": format!("query {i}") }) };
        let t0 = Instant::now();
        cp.execute(c, &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        per_call.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    cp.audit().flush().await;
    let total = t.elapsed().as_secs_f64();
    per_call.sort_by(f64::total_cmp);
    let mut conn = db.pool.acquire().await?;
    let audited = db::tool_audit::delete_correlation(&mut conn, "bench").await?;
    drop(conn);
    println!("backend                  {}", db.backend.as_str());
    println!("calls                    {} ({} audit rows written)", args.calls, audited);
    println!(
        "checkpoint per call      p50 {:.1} µs  p95 {:.1} µs  p99 {:.1} µs  (before the audit write)",
        percentile(&per_call, 0.50),
        percentile(&per_call, 0.95),
        percentile(&per_call, 0.99)
    );
    println!("calls/s with audit       {:.0} (until every audit row was committed)", args.calls as f64 / total);
    db.close().await;
    Ok(())
}
