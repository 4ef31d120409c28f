//! Enqueueing: one job or a burst, with dedupe keys honoured across the batch.

use sqlx::{Any, AnyConnection, any::AnyArguments, query::QueryAs};

use super::{DbError, JobRow, JobState, NewJob, find_unfinished_by_dedupe};
use crate::db::{Backend, value_rows};

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
pub(crate) const ENQUEUE_CHUNK: usize = 256;

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
pub(crate) const INSERT_COLUMNS: &str = "kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, tool_name, \
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

/// A job as an enqueue stores it: every column but the id is either a value of `job` or fixed
/// at insert, so the statements return only ids and the rows are made here (a burst of 500 no
/// longer sends back and decodes 26 columns a job).
fn stored_row(job: &NewJob, id: i64, now: i64) -> JobRow {
    let (state, scheduled_at) = initial_state(job, now);
    JobRow {
        id,
        kind: job.kind.clone(),
        queue: queue_of(job).to_string(),
        state,
        priority: job.priority,
        dedupe_key: job.dedupe_key.clone(),
        chat_id: job.chat_id.clone(),
        sender_id: job.sender_id.clone(),
        message_id: job.message_id.clone(),
        original_text: job.original_text.as_deref().map(crate::db::clean_text),
        tool_name: job.tool_name.clone(),
        args: job.args.to_string(),
        attempt: 0,
        max_attempts: job.max_attempts.max(1),
        created_at: now,
        updated_at: now,
        scheduled_at,
        started_at: None,
        completed_at: None,
        expires_at: job.expires_at,
        lease_owner: None,
        lease_expires_at: None,
        last_error_code: None,
        last_error_message: None,
        result_preview: None,
        correlation_id: job.correlation_id.clone(),
    }
}

/// Inserts `jobs` and their first events; a job whose dedupe key is taken is skipped. Returns,
/// aligned with `jobs`, the row of each job inserted.
async fn insert_rows(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<Option<JobRow>>, DbError> {
    let returned = if crate::db::backend_of(conn) == crate::db::Backend::Postgres { insert_rows_postgres(conn, jobs, now).await? } else { insert_rows_sqlite(conn, jobs, now).await? };
    if !returned.is_empty() {
        crate::db::events::ring();
    }
    let ids = inserted_ids(jobs, returned);
    Ok(jobs.iter().zip(ids).map(|(job, id)| id.map(|id| stored_row(job, id, now))).collect())
}

/// Which of `jobs` an insert wrote, from the (id, dedupe key) pairs it returned: every keyless
/// job, and a keyed one when it is the first in `jobs` with its key and that key came back (a
/// later one with the same key conflicted with it). Ids were taken in input order, so the jobs
/// written, in order, have the returned ids in ascending order.
fn inserted_ids(jobs: &[NewJob], mut returned: Vec<(i64, Option<String>)>) -> Vec<Option<i64>> {
    returned.sort_unstable_by_key(|(id, _)| *id);
    let mut won: std::collections::HashSet<String> = returned.iter().filter_map(|(_, key)| key.clone()).collect();
    let mut ids = returned.into_iter().map(|(id, _)| id);
    jobs.iter()
        .map(|job| match &job.dedupe_key {
            Some(key) if !won.remove(key) => None,
            _ => ids.next(),
        })
        .collect()
}

/// [`insert_rows`] on SQLite: one statement; the jobs' first events are written by the
/// `job_events_on_enqueue` trigger (migration 0030) in the same statement.
async fn insert_rows_sqlite(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<(i64, Option<String>)>, DbError> {
    let sql = format!("INSERT INTO jobs ({INSERT_COLUMNS}) VALUES {} ON CONFLICT DO NOTHING RETURNING id, dedupe_key", value_rows(Backend::Sqlite, jobs.len(), SQLITE_COLUMNS));
    let mut q = sqlx::query_as(&sql);
    for job in jobs {
        q = bind_sqlite(q, job, now);
    }
    Ok(q.fetch_all(&mut *conn).await?)
}

/// The values [`bind_sqlite`] binds for a job: one per column of [`INSERT_COLUMNS`].
pub(crate) const SQLITE_COLUMNS: usize = 18;

/// Binds `job`'s values for a SQLite insert into [`INSERT_COLUMNS`], in that order.
pub(crate) fn bind_sqlite<'q, O>(q: QueryAs<'q, Any, O, AnyArguments<'q>>, job: &NewJob, now: i64) -> QueryAs<'q, Any, O, AnyArguments<'q>> {
    let (state, scheduled_at) = initial_state(job, now);
    q.bind(job.kind.clone())
        .bind(queue_of(job).to_string())
        .bind(state.as_str())
        .bind(job.priority)
        .bind(job.dedupe_key.clone())
        .bind(job.chat_id.clone())
        .bind(job.sender_id.clone())
        .bind(job.message_id.clone())
        .bind(job.original_text.as_deref().map(crate::db::clean_text))
        .bind(job.tool_name.clone())
        .bind(job.args.to_string())
        .bind(0_i64)
        .bind(job.max_attempts.max(1))
        .bind(now)
        .bind(now)
        .bind(scheduled_at)
        .bind(job.expires_at)
        .bind(job.correlation_id.clone())
}

/// One job of a PostgreSQL batch, as `json_to_recordset` reads it: a column left out (unset) is
/// NULL, so unset optional columns are not sent at all.
#[derive(serde::Serialize)]
struct PostgresRow<'a> {
    kind: &'a str,
    queue: &'a str,
    state: &'static str,
    priority: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dedupe_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    original_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<&'a str>,
    args: String,
    max_attempts: i64,
    scheduled_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
    correlation_id: &'a str,
}

/// [`insert_rows`] on PostgreSQL in one round trip with one bind: the batch goes as a JSON array
/// ([`postgres_batch`]), and the jobs' first events are written by the same statement
/// ([`postgres_enqueue_ctes`]; the `jobs_notify` trigger wakes the listeners).
async fn insert_rows_postgres(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<(i64, Option<String>)>, DbError> {
    let sql = format!("WITH {} SELECT id, dedupe_key FROM ins", postgres_enqueue_ctes("$1", "$2", "TRUE"));
    Ok(sqlx::query_as(&sql).bind(postgres_batch(jobs, now)?).bind(now).fetch_all(&mut *conn).await?)
}

/// `jobs` as the PostgreSQL enqueue binds them: one JSON array that `json_to_recordset` unpacks.
pub(crate) fn postgres_batch(jobs: &[NewJob], now: i64) -> Result<String, DbError> {
    let batch: Vec<PostgresRow> = jobs
        .iter()
        .map(|job| {
            let (state, scheduled_at) = initial_state(job, now);
            PostgresRow {
                kind: &job.kind,
                queue: queue_of(job),
                state: state.as_str(),
                priority: job.priority,
                dedupe_key: job.dedupe_key.as_deref(),
                chat_id: job.chat_id.as_deref(),
                sender_id: job.sender_id.as_deref(),
                message_id: job.message_id.as_deref(),
                original_text: job.original_text.as_deref().map(crate::db::clean_text),
                tool_name: job.tool_name.as_deref(),
                args: job.args.to_string(),
                max_attempts: job.max_attempts.max(1),
                scheduled_at,
                expires_at: job.expires_at,
                correlation_id: &job.correlation_id,
            }
        })
        .collect();
    serde_json::to_string(&batch).map_err(|e| DbError::Sql(sqlx::Error::Encode(Box::new(e))))
}

/// The common table expressions of a PostgreSQL enqueue, for a statement that may write other
/// rows first: `ins` inserts the jobs of the [`postgres_batch`] bound at `batch` whose row `x`
/// passes the condition `only`, in input order (so ids follow it), skipping any whose dedupe key
/// is taken, and returns (id, dedupe_key, state); `events` writes their first events, at `now`.
pub(crate) fn postgres_enqueue_ctes(batch: &str, now: &str, only: &str) -> String {
    format!(
        "ins AS ( \
           INSERT INTO jobs ({INSERT_COLUMNS}) \
           SELECT kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, tool_name, \
             args, 0, max_attempts, {now}, {now}, scheduled_at, expires_at, correlation_id \
           FROM ROWS FROM (json_to_recordset({batch}::json) AS (kind TEXT, queue TEXT, state TEXT, priority BIGINT, \
             dedupe_key TEXT, chat_id TEXT, sender_id TEXT, message_id TEXT, original_text TEXT, tool_name TEXT, args TEXT, \
             max_attempts BIGINT, scheduled_at BIGINT, expires_at BIGINT, correlation_id TEXT)) WITH ORDINALITY AS x \
           WHERE {only} \
           ORDER BY x.ordinality \
           ON CONFLICT DO NOTHING RETURNING id, dedupe_key, state), \
         events AS (INSERT INTO job_events (job_id, at, state, attempt) SELECT id, {now}, state, 0 FROM ins)"
    )
}

async fn enqueue_chunk(conn: &mut AnyConnection, jobs: &[NewJob], now: i64) -> Result<Vec<Enqueued>, DbError> {
    let inserted = insert_rows(conn, jobs, now).await?;
    let mut out = Vec::with_capacity(jobs.len());
    for (job, row) in jobs.iter().zip(inserted) {
        out.push(match row {
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
        if let Some(Some(row)) = insert_rows(conn, std::slice::from_ref(job), now).await?.pop() {
            return Ok(Enqueued { job: row, deduplicated: false });
        }
    }
    Err(DbError::Sql(sqlx::Error::RowNotFound))
}
