//! The durable job queue's SQL. Claims are leases, never transactions held open while a job
//! runs: PostgreSQL claims with `FOR UPDATE SKIP LOCKED`, SQLite with one `UPDATE ... RETURNING`
//! (its single writer makes that atomic). Every state change also writes a `job_events` row.

mod enqueue;
mod lease;
mod maintenance;
mod owner;

use sqlx::AnyConnection;

pub use self::{
    enqueue::{Enqueued, enqueue, enqueue_many},
    lease::{Claim, FailOutcome, Finished, Snooze, claim, claim_in_order, claim_one, complete, fail, heartbeat, release_cancelled, snooze},
    maintenance::{Waiting, delete_queue, discard_unknown_kinds, expire, release_cancelled_leases, release_leases, release_waiting, rescue},
    owner::{cancel, done_again, raise_attempts, release_pending, retry_now},
};
pub(crate) use self::enqueue::{ENQUEUE_CHUNK, INSERT_COLUMNS, SQLITE_COLUMNS, bind_sqlite, postgres_batch, postgres_enqueue_ctes};
use super::{DbError, SetFilters, placeholders};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, strum::IntoStaticStr, strum::EnumString, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum JobState {
    Available,
    Scheduled,
    Running,
    Retryable,
    Completed,
    Cancelled,
    Discarded,
    /// Waiting for an owner: approval releases it to available, rejection cancels it.
    Pending,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        Self::Available,
        Self::Scheduled,
        Self::Running,
        Self::Retryable,
        Self::Completed,
        Self::Cancelled,
        Self::Discarded,
        Self::Pending,
    ];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }

    pub fn is_finished(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled | Self::Discarded)
    }
}

/// SQL list of the states a job can be claimed from.
const DUE_STATES: &str = "('available', 'scheduled', 'retryable')";
/// SQL list of unfinished states (a dedupe key is unique among these).
const UNFINISHED: &str = "('available', 'scheduled', 'running', 'retryable', 'pending')";
/// The states a job never leaves by itself, as the condition of the `jobs_finished` index
/// (migration 0051) writes them: a query that filters by one of them repeats this condition to
/// the letter, since SQLite uses a partial index only for a query whose WHERE holds its own.
pub(super) const FINISHED: &str = "('completed', 'cancelled', 'discarded')";
/// The error code of a job cancelled unrun because its time to live ran out.
pub const EXPIRED: &str = "JOB_EXPIRED";
/// The error code of a job an owner cancelled.
pub const CANCELLED: &str = "JOB_CANCELLED";
/// The error code of a finished job whose work an owner had done again by another job (a tool
/// call run again): it is not retried, and a run of it does nothing.
pub const DONE_AGAIN: &str = "JOB_RUN_AGAIN";

/// A job to enqueue.
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    pub kind: String,
    pub queue: String,
    pub priority: i64,
    pub dedupe_key: Option<String>,
    pub chat_id: Option<String>,
    pub sender_id: Option<String>,
    pub message_id: Option<String>,
    /// Bounded by the caller's policy; stored as given.
    pub original_text: Option<String>,
    pub tool_name: Option<String>,
    pub args: serde_json::Value,
    pub max_attempts: i64,
    /// Run no earlier than this (unix ms); `None` means now.
    pub scheduled_at: Option<i64>,
    /// Cancel if still queued at this time (unix ms).
    pub expires_at: Option<i64>,
    /// Start in `pending`, waiting for an owner.
    pub pending: bool,
    pub correlation_id: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub queue: String,
    #[sqlx(try_from = "String")]
    pub state: JobState,
    pub priority: i64,
    pub dedupe_key: Option<String>,
    pub chat_id: Option<String>,
    pub sender_id: Option<String>,
    pub message_id: Option<String>,
    pub original_text: Option<String>,
    pub tool_name: Option<String>,
    pub args: String,
    pub attempt: i64,
    pub max_attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub scheduled_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub last_error_code: Option<String>,
    pub last_error_message: Option<String>,
    pub result_preview: Option<String>,
    pub correlation_id: String,
}

const COLUMNS: &str = "id, kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, \
    tool_name, args, attempt, max_attempts, created_at, updated_at, scheduled_at, started_at, completed_at, expires_at, \
    lease_owner, lease_expires_at, last_error_code, last_error_message, result_preview, correlation_id";

impl TryFrom<String> for JobState {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        super::parse_stored(s, "job state")
    }
}

/// Text stored from handlers: no NUL (PostgreSQL rejects it in TEXT) and bounded in length.
fn clean(text: &str, max_chars: usize) -> String {
    text.chars().filter(|c| *c != '\0').take(max_chars).collect()
}

async fn event(conn: &mut AnyConnection, job_id: i64, at: i64, state: JobState, attempt: i64, code: Option<&str>, message: Option<&str>) -> Result<(), DbError> {
    sqlx::query("INSERT INTO job_events (job_id, at, state, attempt, error_code, message) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(job_id)
        .bind(at)
        .bind(state.as_str())
        .bind(attempt)
        .bind(code)
        .bind(message)
        .execute(&mut *conn)
        .await?;
    super::events::ring();
    Ok(())
}

/// Records the same state for many jobs in one statement.
async fn events_for(conn: &mut AnyConnection, ids: &[i64], at: i64, state: JobState, code: Option<&str>) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO job_events (job_id, at, state, attempt, error_code) SELECT id, $1, $2, attempt, $3 FROM jobs WHERE id IN ({})",
        placeholders(4, ids.len())
    );
    let sql = crate::db::anonymous_on_sqlite(crate::db::backend_of(conn), sql);
    let mut q = sqlx::query(&sql).bind(at).bind(state.as_str()).bind(code);
    for id in ids {
        q = q.bind(*id);
    }
    q.execute(&mut *conn).await?;
    super::events::ring();
    Ok(())
}

/// Jobs an UPDATE made runnable again (an owner's retry, a rescue, a shutdown's release) wake
/// the workers of other processes, as an insert's trigger does (`gatehouse_jobs`, the queue's
/// name as payload), when the transaction commits. PostgreSQL only: SQLite has one process.
async fn wake_other_processes(conn: &mut AnyConnection, ids: &[i64]) -> Result<(), DbError> {
    if ids.is_empty() || crate::db::backend_of(conn) != crate::db::Backend::Postgres {
        return Ok(());
    }
    let sql = format!("SELECT pg_notify('gatehouse_jobs', queue) FROM (SELECT DISTINCT queue FROM jobs WHERE id IN ({})) AS queues", placeholders(1, ids.len()));
    let mut q = sqlx::query(&sql);
    for id in ids {
        q = q.bind(*id);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<JobRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM jobs WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

/// [`get`], with the row locked until the transaction ends on PostgreSQL (SQLite's write
/// transactions hold the whole database already): an owner's action that decides by the job's
/// state is not overtaken by another's.
pub async fn get_for_update(conn: &mut AnyConnection, id: i64) -> Result<Option<JobRow>, DbError> {
    let lock = if crate::db::backend_of(conn) == crate::db::Backend::Postgres { " FOR UPDATE" } else { "" };
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM jobs WHERE id = $1{lock}")).bind(id).fetch_optional(&mut *conn).await?)
}

/// A job dropped without being done (discarded, or cancelled unrun when its time to live ran
/// out), or cancelled by an owner: what a kind's follow-up is made from
/// (`jobs::Registry::when_dropped`, `when_cancelled`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub id: i64,
    pub kind: String,
    /// The attempt it was dropped at: an owner's retry runs it again at a later one.
    pub attempt: i64,
    pub correlation_id: String,
    /// Its chat, which its follow-up is listed under.
    pub chat_id: Option<String>,
}

impl From<&JobRow> for Dropped {
    fn from(job: &JobRow) -> Self {
        Self { id: job.id, kind: job.kind.clone(), attempt: job.attempt, correlation_id: job.correlation_id.clone(), chat_id: job.chat_id.clone() }
    }
}

/// Those of the jobs `ids` that are dropped (see [`Dropped`]), by id: what a maintenance pass
/// that rescued or expired them dropped, read in its transaction.
pub async fn dropped_among(conn: &mut AnyConnection, ids: &[i64]) -> Result<Vec<Dropped>, DbError> {
    type Row = (i64, String, i64, String, Option<String>, String, Option<String>);
    let rows: Vec<Row> = super::rows_with_ids(conn, "SELECT id, kind, attempt, correlation_id, chat_id, state, last_error_code FROM jobs", "id", ids).await?;
    Ok(rows
        .into_iter()
        .filter(|(.., state, code)| state == "discarded" || (state == "cancelled" && code.as_deref() == Some(EXPIRED)))
        .map(|(id, kind, attempt, correlation_id, chat_id, ..)| Dropped { id, kind, attempt, correlation_id, chat_id })
        .collect())
}

/// The states of the jobs `ids` (those that exist), by id.
pub async fn states(conn: &mut AnyConnection, ids: &[i64]) -> Result<Vec<(i64, String)>, DbError> {
    super::rows_with_ids(conn, "SELECT id, state FROM jobs", "id", ids).await
}

async fn find_unfinished_by_dedupe(conn: &mut AnyConnection, key: &str) -> Result<Option<JobRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE dedupe_key = $1 AND state IN {UNFINISHED} ORDER BY id DESC LIMIT 1");
    Ok(sqlx::query_as(&sql).bind(key).fetch_optional(&mut *conn).await?)
}

/// The most recent job with this dedupe key, finished or not.
pub async fn find_by_dedupe(conn: &mut AnyConnection, key: &str) -> Result<Option<JobRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE dedupe_key = $1 ORDER BY id DESC LIMIT 1");
    Ok(sqlx::query_as(&sql).bind(key).fetch_optional(&mut *conn).await?)
}

/// The most recent job of `kind` for chat `chat_id` with this dedupe key, finished or not
/// (only unfinished jobs' keys are indexed: the chat's jobs of the kind are read instead).
pub async fn find_by_dedupe_in_chat(conn: &mut AnyConnection, chat_id: &str, kind: &str, key: &str) -> Result<Option<JobRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE chat_id = $1 AND kind = $2 AND dedupe_key = $3 ORDER BY id DESC LIMIT 1");
    Ok(sqlx::query_as(&sql).bind(chat_id).bind(kind).bind(key).fetch_optional(&mut *conn).await?)
}

/// Chat `chat_id`'s jobs of `kind`, finished or not, oldest first. For a kind a chat has few
/// of (a follow-up's): it reads the chat's jobs.
pub async fn in_chat(conn: &mut AnyConnection, chat_id: &str, kind: &str) -> Result<Vec<JobRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE chat_id = $1 AND kind = $2 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(chat_id).bind(kind).fetch_all(&mut *conn).await?)
}

/// How many of chat `chat_id`'s jobs of `kind` older than job `id` are unfinished.
pub async fn unfinished_before(conn: &mut AnyConnection, chat_id: &str, kind: &str, id: i64) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE chat_id = $1 AND kind = $2 AND id < $3 AND state IN ('available', 'scheduled', 'retryable', 'running')")
        .bind(chat_id)
        .bind(kind)
        .bind(id)
        .fetch_one(&mut *conn)
        .await?)
}

/// Chat `chat_id`'s jobs of `kind` for its message `message_id`, oldest first.
pub async fn for_message(conn: &mut AnyConnection, chat_id: &str, kind: &str, message_id: &str) -> Result<Vec<JobRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE chat_id = $1 AND kind = $2 AND message_id = $3 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(chat_id).bind(kind).bind(message_id).fetch_all(&mut *conn).await?)
}

/// Filters for listing; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub kind: Option<String>,
    pub tool_name: Option<String>,
    pub chat_id: Option<String>,
    pub created_from: Option<i64>,
    pub created_to: Option<i64>,
    /// Keyset paging: only jobs with a smaller id (newest first).
    pub before_id: Option<i64>,
}

/// Newest first, at most `limit`.
pub async fn list(conn: &mut AnyConnection, filter: &JobFilter, limit: i64) -> Result<Vec<JobRow>, DbError> {
    let sql = list_sql(filter);
    Ok(set_filters(filter).bind(sqlx::query_as(&sql)).bind(limit).fetch_all(&mut *conn).await?)
}

fn set_filters(filter: &JobFilter) -> SetFilters<'_> {
    SetFilters::new(
        [
            ("state =", filter.state.map(JobState::as_str)),
            ("kind =", filter.kind.as_deref()),
            ("tool_name =", filter.tool_name.as_deref()),
            ("chat_id =", filter.chat_id.as_deref()),
        ],
        [("created_at >=", filter.created_from), ("created_at <", filter.created_to), ("id <", filter.before_id)],
    )
}

/// The query [`list`] runs for `filter`: each filter that is set adds its condition, its value
/// bound as `$1`, `$2`, ... in the order of [`JobFilter`]'s fields; the limit comes last.
pub fn list_sql(filter: &JobFilter) -> String {
    let (conditions, limit) = set_filters(filter).conditions();
    // A finished state's jobs come newest first through `jobs_finished`, not all of them sorted;
    // a chat's or a tool's come through their own index (with the condition, SQLite would walk
    // every finished job instead).
    let narrower = filter.chat_id.is_some() || filter.tool_name.is_some();
    let finished = if filter.state.is_some_and(JobState::is_finished) && !narrower { format!(" AND state IN {FINISHED}") } else { String::new() };
    format!("SELECT {COLUMNS} FROM jobs WHERE 1 = 1{finished}{conditions} ORDER BY id DESC LIMIT ${limit}")
}

/// Number of jobs in each state (states with none are absent).
pub async fn counts_by_state(conn: &mut AnyConnection) -> Result<Vec<(JobState, i64)>, DbError> {
    let found: Vec<(String, i64)> = sqlx::query_as("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetch_all(&mut *conn).await?;
    Ok(found.into_iter().filter_map(|(state, n)| Some((JobState::parse(&state)?, n))).collect())
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct JobEvent {
    pub at: i64,
    pub state: JobState,
    pub attempt: i64,
    pub error_code: Option<String>,
    pub message: Option<String>,
}

/// A `job_events` row: at, state, attempt, error code, message.
type EventRow = (i64, String, i64, Option<String>, Option<String>);

/// Whether an owner ever cancelled job `job_id` (its event trail says so, written in the
/// cancel's own transaction), whatever its state now. Not an expiry or a rejection.
pub async fn was_cancelled(conn: &mut AnyConnection, job_id: i64) -> Result<bool, DbError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM job_events WHERE job_id = $1 AND state = 'cancelled' AND error_code = $2").bind(job_id).bind(CANCELLED).fetch_one(conn).await?;
    Ok(n > 0)
}

pub async fn events(conn: &mut AnyConnection, job_id: i64) -> Result<Vec<JobEvent>, DbError> {
    let found: Vec<EventRow> =
        sqlx::query_as("SELECT at, state, attempt, error_code, message FROM job_events WHERE job_id = $1 ORDER BY id")
            .bind(job_id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(found
        .into_iter()
        .map(|(at, state, attempt, error_code, message)| JobEvent {
            at,
            state: JobState::parse(&state).unwrap_or(JobState::Discarded),
            attempt,
            error_code,
            message,
        })
        .collect())
}
