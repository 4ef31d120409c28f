//! Enqueueing: one job or a burst, with dedupe keys honoured across the batch.

use sqlx::AnyConnection;

use super::{COLUMNS, DbError, JobRow, JobState, NewJob, find_unfinished_by_dedupe};
use crate::db::value_rows;

/// The outcome of an enqueue.
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub job: JobRow,
    /// True when an unfinished job with the same dedupe key already existed and is returned.
    pub deduplicated: bool,
}

/// Inserts a job. Run it in the caller's transaction so the state change that causes the job
/// and the job itself commit together.
pub async fn enqueue(conn: &mut AnyConnection, job: &NewJob, now: i64) -> Result<Enqueued, DbError> {
    enqueue_many(conn, std::slice::from_ref(job), now).await?.pop().ok_or(DbError::Sql(sqlx::Error::RowNotFound))
}

/// Rows per multi-row `INSERT` in [`enqueue_many`]: 18 binds each stays far inside SQLite's
/// 32,766 and PostgreSQL's 65,535 bind limits.
const ENQUEUE_CHUNK: usize = 256;

/// Inserts many jobs with one `INSERT` and one event `INSERT` per chunk instead of four
/// statements each: the webhook's group commit enqueues a burst this way. Same outcome as
/// calling [`enqueue`] for each in order: the result is aligned with `jobs`, and a job whose
/// dedupe key is taken by an unfinished job (an earlier one in `jobs` included) gets that job
/// back with `deduplicated` set.
pub async fn enqueue_many(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<Enqueued>, DbError> {
    let mut out = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(ENQUEUE_CHUNK) {
        out.extend(enqueue_chunk(conn, chunk, now).await?);
    }
    Ok(out)
}

/// The columns an enqueue writes, in the order both backends' statements give them.
const INSERT_COLUMNS: &str = "kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, tool_name, \
    args, attempt, max_attempts, created_at, updated_at, scheduled_at, expires_at, correlation_id";

/// The queue a job goes to: its own, or `default`.
fn queue_of(job: &NewJob) -> &str {
    if job.queue.is_empty() { "default" } else { &job.queue }
}

fn initial_state(job: &NewJob, now: i64) -> (JobState, i64) {
    let scheduled_at = job.scheduled_at.unwrap_or(now);
    let state = if job.pending {
        JobState::Pending
    } else if scheduled_at > now {
        JobState::Scheduled
    } else {
        JobState::Available
    };
    (state, scheduled_at)
}

/// Inserts `jobs` and their first events; a job whose dedupe key is taken is skipped. Returns the
/// inserted rows in id order (input order).
async fn insert_rows(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<JobRow>, DbError> {
    let inserted = if crate::db::backend_of(conn) == crate::db::Backend::Postgres { insert_rows_postgres(conn, jobs, now).await? } else { insert_rows_sqlite(conn, jobs, now).await? };
    if !inserted.is_empty() {
        crate::db::events::ring();
    }
    Ok(inserted)
}

async fn insert_rows_sqlite(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<JobRow>, DbError> {
    let sql = format!(
        "INSERT INTO jobs ({INSERT_COLUMNS}) VALUES {} ON CONFLICT DO NOTHING RETURNING {COLUMNS}",
        value_rows(jobs.len(), 18)
    );
    let mut q = sqlx::query_as(&sql);
    for job in jobs {
        let (state, scheduled_at) = initial_state(job, now);
        q = q
            .bind(job.kind.clone())
            .bind(queue_of(job).to_string())
            .bind(state.as_str())
            .bind(job.priority)
            .bind(job.dedupe_key.clone())
            .bind(job.chat_id.clone())
            .bind(job.sender_id.clone())
            .bind(job.message_id.clone())
            .bind(job.original_text.clone())
            .bind(job.tool_name.clone())
            .bind(job.args.to_string())
            .bind(0_i64)
            .bind(job.max_attempts.max(1))
            .bind(now)
            .bind(now)
            .bind(scheduled_at)
            .bind(job.expires_at)
            .bind(job.correlation_id.clone());
    }
    let mut inserted: Vec<JobRow> = q.fetch_all(&mut *conn).await?;
    inserted.sort_by_key(|j| j.id);
    if !inserted.is_empty() {
        let sql = format!("INSERT INTO job_events (job_id, at, state, attempt) VALUES {}", value_rows(inserted.len(), 4));
        let mut q = sqlx::query(&sql);
        for j in &inserted {
            q = q.bind(j.id).bind(now).bind(j.state.as_str()).bind(0_i64);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(inserted)
}

/// [`insert_rows`] on PostgreSQL in one round trip with one bind: the batch goes as a JSON array
/// that `json_to_recordset` unpacks (in input order, so ids follow it), and the jobs' first
/// events are written by the same statement.
async fn insert_rows_postgres(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<JobRow>, DbError> {
    let batch: Vec<serde_json::Value> = jobs
        .iter()
        .map(|job| {
            let (state, scheduled_at) = initial_state(job, now);
            serde_json::json!({
                "kind": job.kind,
                "queue": queue_of(job),
                "state": state.as_str(),
                "priority": job.priority,
                "dedupe_key": job.dedupe_key,
                "chat_id": job.chat_id,
                "sender_id": job.sender_id,
                "message_id": job.message_id,
                "original_text": job.original_text.as_deref().map(crate::db::clean_text),
                "tool_name": job.tool_name,
                "args": job.args.to_string(),
                "max_attempts": job.max_attempts.max(1),
                "scheduled_at": scheduled_at,
                "expires_at": job.expires_at,
                "correlation_id": job.correlation_id,
            })
        })
        .collect();
    let sql = format!(
        "WITH ins AS ( \
           INSERT INTO jobs ({INSERT_COLUMNS}) \
           SELECT kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, tool_name, \
             args, 0, max_attempts, $2, $2, scheduled_at, expires_at, correlation_id \
           FROM ROWS FROM (json_to_recordset($1::json) AS (kind TEXT, queue TEXT, state TEXT, priority BIGINT, \
             dedupe_key TEXT, chat_id TEXT, sender_id TEXT, message_id TEXT, original_text TEXT, tool_name TEXT, args TEXT, \
             max_attempts BIGINT, scheduled_at BIGINT, expires_at BIGINT, correlation_id TEXT)) WITH ORDINALITY AS x \
           ORDER BY x.ordinality \
           ON CONFLICT DO NOTHING RETURNING {COLUMNS}), \
         events AS (INSERT INTO job_events (job_id, at, state, attempt) SELECT id, $2, state, 0 FROM ins) \
         SELECT {COLUMNS} FROM ins ORDER BY id"
    );
    Ok(sqlx::query_as(&sql).bind(serde_json::Value::Array(batch).to_string()).bind(now).fetch_all(&mut *conn).await?)
}

async fn enqueue_chunk(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<Enqueued>, DbError> {
    let inserted = insert_rows(conn, jobs, now).await?;
    // Match rows to inputs: a keyed job by its key (the first input with that key won it);
    // keyless jobs cannot conflict, and their rows were numbered in input order.
    let mut by_key: std::collections::HashMap<String, JobRow> = std::collections::HashMap::new();
    let mut keyless = std::collections::VecDeque::new();
    for j in inserted {
        match j.dedupe_key.clone() {
            Some(key) => {
                by_key.insert(key, j);
            }
            None => keyless.push_back(j),
        }
    }
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let won = match &job.dedupe_key {
            Some(key) => by_key.remove(key),
            None => keyless.pop_front(),
        };
        out.push(match won {
            Some(row) => Enqueued { job: row, deduplicated: false },
            // Taken before this chunk or by an earlier input in it.
            None => taken(conn, job, now).await?,
        });
    }
    Ok(out)
}

/// A job whose dedupe key was taken: the unfinished job holding it, or, if that one finished in
/// between and freed the key, this job inserted after all (a few tries).
async fn taken(conn: &mut AnyConnection, job: &NewJob, now: i64) -> Result<Enqueued, DbError> {
    let key = job.dedupe_key.as_deref().unwrap_or_default();
    for _ in 0..3 {
        if let Some(existing) = find_unfinished_by_dedupe(conn, key).await? {
            return Ok(Enqueued { job: existing, deduplicated: true });
        }
        if let Some(row) = insert_rows(conn, std::slice::from_ref(job), now).await?.pop() {
            return Ok(Enqueued { job: row, deduplicated: false });
        }
    }
    Err(DbError::Sql(sqlx::Error::RowNotFound))
}
