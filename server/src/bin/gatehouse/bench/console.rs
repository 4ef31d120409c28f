//! `gatehouse bench console`: how the reads the console pages and message handling make grow
//! with the data they read. Fills a new database with `--messages` handled messages (each with
//! its reply, trace, steps and finished job, in chats of twenty, with every tenth in one busy
//! chat and every hundredth failed), times each read, then fills it to ten times as many and
//! times them again. A flat line (ratio about 1) is the goal for every read but the job counts,
//! which count every job the retention keeps. Each read is timed `--rounds` times; a read that
//! takes longer than [`BUDGET`] in all is timed fewer times (at least twice).

use std::time::Instant;

use server::{
    config::DatabaseSettings,
    db::{
        self, Db,
        jobs::{JobFilter, JobState},
        traces::{TraceFilter, TraceRow},
    },
};

#[derive(Debug, clap::Args)]
pub struct ConsoleBench {
    /// Database URL (sqlite://... or postgres://...) of a new database; the schema is migrated
    /// first.
    #[arg(long)]
    pub database: String,
    /// Handled messages at the first size; the second is ten times as many.
    #[arg(long, default_value_t = 20_000)]
    pub messages: i64,
    /// Times each read is timed at each size (the median is printed).
    #[arg(long, default_value_t = 30)]
    pub rounds: usize,
}

/// The chat every tenth message is in, which grows with the data.
const BUSY_CHAT: &str = "bench-busy";

/// Rows for messages `from..=to`: `$1` and `$2` bound to them, `$3` to the time of the first.
fn fill_statements() -> Vec<String> {
    let numbers = "WITH RECURSIVE n(i) AS (SELECT CAST($1 AS BIGINT) UNION ALL SELECT i + 1 FROM n WHERE i < $2)";
    let chat = format!("CASE WHEN i % 10 = 0 THEN '{BUSY_CHAT}' ELSE 'bench-' || (i / 20) END");
    vec![
        format!(
            "{numbers} INSERT INTO whatsapp_inbound (wamid, phone_number_id, chat_id, sender, is_group, msg_type, text, raw_truncated, sent_at, received_at, processed_at, outcome) \
             SELECT 'wamid.bench.' || i, 'bench', {chat}, {chat}, 0, 'text', 'message ' || i, 0, $3 + i, $3 + i, $3 + i, 'answered' FROM n"
        ),
        format!(
            "{numbers} INSERT INTO whatsapp_outbound (idempotency_key, job_id, part, recipient, is_group, kind, body, wamid, state, state_rank, created_at, updated_at) \
             SELECT 'bench-reply-' || i, i, 0, {chat}, 0, 'text', 'reply ' || i, 'wamid.bench.out.' || i, 'delivered', 2, $3 + i + 1, $3 + i + 1 FROM n"
        ),
        format!(
            "{numbers} INSERT INTO traces (correlation_id, channel, chat_id, message_id, actor, route, outcome, error_code, started_at, duration_us) \
             SELECT 'bench-' || i, 'whatsapp', {chat}, 'wamid.bench.' || i, 'customer', 'normal_chat', \
                    CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'ok' END, CASE WHEN i % 100 = 0 THEN 'BENCH_FAILED' END, $3 + i, 1000 FROM n"
        ),
        format!(
            "{numbers} INSERT INTO trace_steps (trace_id, seq, step, decision, reason_code, duration_us, detail) \
             SELECT t.id, s.seq, 'bench', 'ok', 'BENCH', 10, '{{}}' FROM traces t JOIN (SELECT 0 AS seq UNION ALL SELECT 1) s ON 1 = 1 \
             WHERE t.correlation_id IN (SELECT 'bench-' || i FROM n)"
        ),
        format!(
            "{numbers} INSERT INTO jobs (kind, queue, state, dedupe_key, chat_id, message_id, args, attempt, max_attempts, created_at, updated_at, scheduled_at, started_at, completed_at, correlation_id) \
             SELECT 'whatsapp.inbound', 'default', 'completed', 'whatsapp.inbound:wamid.bench.' || i, {chat}, 'wamid.bench.' || i, '{{}}', 1, 5, $3 + i, $3 + i + 1, $3 + i, $3 + i, $3 + i + 1, 'bench-' || i FROM n"
        ),
    ]
}

async fn fill(db: &Db, from: i64, to: i64, start: i64) -> anyhow::Result<()> {
    // In slices, so that no statement holds more than this many rows of a table.
    const SLICE: i64 = 50_000;
    for statement in fill_statements() {
        let mut first = from;
        while first <= to {
            let last = (first + SLICE - 1).min(to);
            let mut conn = db.acquire_write().await?;
            sqlx::query(&statement).bind(first).bind(last).bind(start).execute(&mut *conn).await?;
            first = last + 1;
        }
    }
    Ok(())
}

/// The reads timed, by name.
const READS: [&str; 7] = [
    "a message's trace begun (every message handled)",
    "Conversations page",
    "the busy chat's page",
    "Traces page, failed only",
    "Traces page, one chat",
    "Jobs page, completed",
    "Jobs page, counts by state",
];

async fn read_once(db: &Db, read: usize, n: i64) -> anyhow::Result<()> {
    let mut conn = db.pool.acquire().await?;
    match read {
        0 => {
            let mut tx = db.begin_write().await?;
            let wamid = format!("wamid.bench.{}", n / 2);
            let row = TraceRow {
                correlation_id: "bench".into(),
                channel: "whatsapp".into(),
                chat_id: "bench-1".into(),
                message_id: wamid,
                actor: "customer".into(),
                route: "normal_chat".into(),
                outcome: db::traces::RUNNING.into(),
                error_code: None,
                started_at: db::now_ms(),
                duration_us: 0,
                id: 0,
            };
            db::traces::begin(&mut tx, &row, None).await?;
            tx.rollback().await?;
        }
        1 => {
            db::simulator::chats(&mut conn, 200).await?;
        }
        2 => {
            db::simulator::messages(&mut conn, "whatsapp", BUSY_CHAT, 200).await?;
        }
        3 => {
            db::traces::list(&mut conn, &TraceFilter { outcome: "failed".into(), ..TraceFilter::default() }, 51).await?;
        }
        4 => {
            db::traces::list(&mut conn, &TraceFilter { chat_id: BUSY_CHAT.into(), ..TraceFilter::default() }, 51).await?;
        }
        5 => {
            db::jobs::list(&mut conn, &JobFilter { state: Some(JobState::Completed), ..JobFilter::default() }, 51).await?;
        }
        _ => {
            db::jobs::counts_by_state(&mut conn).await?;
        }
    }
    Ok(())
}

/// How long the timing of one read may take at one size, past its first two rounds.
const BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// The median time of each read, in ms.
async fn time_reads(db: &Db, rounds: usize, n: i64) -> anyhow::Result<Vec<f64>> {
    let mut medians = Vec::with_capacity(READS.len());
    for read in 0..READS.len() {
        read_once(db, read, n).await?;
        let mut times = Vec::with_capacity(rounds);
        let began = Instant::now();
        for round in 0..rounds {
            if round >= 2 && began.elapsed() > BUDGET {
                break;
            }
            let start = Instant::now();
            read_once(db, read, n).await?;
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        medians.push(super::percentile(&times, 0.5));
    }
    Ok(medians)
}

pub async fn run(args: &ConsoleBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.messages >= 100, "--messages must be at least 100");
    let db = Db::connect(&DatabaseSettings { url: args.database.clone(), ..Default::default() }).await?;
    db.migrate().await?;
    let start = db::now_ms() - 30 * 24 * 3600 * 1000;
    let sizes = [args.messages, args.messages * 10];
    let mut figures = Vec::new();
    let mut filled = 0;
    for size in sizes {
        let began = Instant::now();
        fill(&db, filled + 1, size, start).await?;
        if db.backend == db::Backend::Postgres {
            // What autovacuum does after a table has grown by a tenth; the server never runs
            // ANALYZE on SQLite, so neither does this.
            sqlx::query("ANALYZE").execute(&db.pool).await?;
        }
        filled = size;
        let fill_s = began.elapsed().as_secs_f64();
        figures.push(time_reads(&db, args.rounds, size).await?);
        println!("filled to {size} messages ({fill_s:.1} s)");
    }
    println!("{:<50} {:>12} {:>12} {:>8}", "read (median ms)", sizes[0], sizes[1], "ratio");
    for (i, name) in READS.iter().enumerate() {
        let (small, large) = (figures[0][i], figures[1][i]);
        println!("{name:<50} {small:>12.3} {large:>12.3} {:>7.2}x", large / small);
    }
    db.close().await;
    Ok(())
}
