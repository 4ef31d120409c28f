//! The durable job queue's SQL. Claims are leases, never transactions held open while a job
//! runs: PostgreSQL claims with `FOR UPDATE SKIP LOCKED`, SQLite with one `UPDATE ... RETURNING`
//! (its single writer makes that atomic). Every state change also writes a `job_events` row.

use sqlx::AnyConnection;

use super::{Backend, DbError, placeholders, value_rows};

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

const MAX_ERROR_CHARS: usize = 2000;
const MAX_PREVIEW_CHARS: usize = 4000;
/// Rows changed per maintenance statement, so a backlog after downtime stays within bind limits.
const MAINTENANCE_BATCH: i64 = 500;

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
    let mut q = sqlx::query(&sql).bind(at).bind(state.as_str()).bind(code);
    for id in ids {
        q = q.bind(*id);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

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
    let sql = format!(
        "INSERT INTO jobs (kind, queue, state, priority, dedupe_key, chat_id, sender_id, message_id, original_text, tool_name, \
         args, attempt, max_attempts, created_at, updated_at, scheduled_at, expires_at, correlation_id) VALUES {} \
         ON CONFLICT DO NOTHING RETURNING {COLUMNS}",
        value_rows(jobs.len(), 18)
    );
    let mut q = sqlx::query_as(&sql);
    for job in jobs {
        let (state, scheduled_at) = initial_state(job, now);
        q = q
            .bind(job.kind.clone())
            .bind(if job.queue.is_empty() { "default".to_string() } else { job.queue.clone() })
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

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<JobRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM jobs WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
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
    // Each filter that is set adds its condition, with its value bound in the same order.
    let texts = [
        ("state =", filter.state.map(JobState::as_str)),
        ("kind =", filter.kind.as_deref()),
        ("tool_name =", filter.tool_name.as_deref()),
        ("chat_id =", filter.chat_id.as_deref()),
    ];
    let numbers = [("created_at >=", filter.created_from), ("created_at <", filter.created_to), ("id <", filter.before_id)];
    let texts: Vec<_> = texts.into_iter().filter_map(|(condition, v)| Some((condition, v?))).collect();
    let numbers: Vec<_> = numbers.into_iter().filter_map(|(condition, v)| Some((condition, v?))).collect();
    let mut sql = format!("SELECT {COLUMNS} FROM jobs WHERE 1 = 1");
    for (i, condition) in texts.iter().map(|(c, _)| c).chain(numbers.iter().map(|(c, _)| c)).enumerate() {
        sql += &format!(" AND {condition} ${}", i + 1);
    }
    sql += &format!(" ORDER BY id DESC LIMIT ${}", texts.len() + numbers.len() + 1);
    let mut q = sqlx::query_as(&sql);
    for (_, v) in texts {
        q = q.bind(v);
    }
    for (_, v) in numbers {
        q = q.bind(v);
    }
    Ok(q.bind(limit).fetch_all(&mut *conn).await?)
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

pub async fn events(conn: &mut AnyConnection, job_id: i64) -> Result<Vec<JobEvent>, DbError> {
    let found: Vec<(i64, String, i64, Option<String>, Option<String>)> =
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

/// Leases up to `limit` due jobs of `queue` to `owner` until `lease_until`, counting an attempt.
/// The attempt number is the lease token: a stale run's result cannot finish a newer run.
/// Run it in a write transaction so the claim and its events commit together.
pub async fn claim(
    conn: &mut AnyConnection,
    backend: Backend,
    queue: &str,
    owner: &str,
    limit: i64,
    now: i64,
    lease_until: i64,
) -> Result<Vec<JobRow>, DbError> {
    let due = format!(
        "SELECT id FROM jobs WHERE state IN {DUE_STATES} AND queue = $4 AND scheduled_at <= $1 \
         AND (expires_at IS NULL OR expires_at > $1) ORDER BY priority DESC, scheduled_at, id LIMIT $5"
    );
    let set = "state = 'running', attempt = attempt + 1, started_at = $1, updated_at = $1, lease_owner = $2, lease_expires_at = $3";
    let sql = match backend {
        // The locking subquery must run once: in `WHERE id IN (...)` PostgreSQL may re-run it
        // and lock more rows than LIMIT.
        Backend::Postgres => {
            let returning = COLUMNS.split(", ").map(|c| format!("jobs.{c}")).collect::<Vec<_>>().join(", ");
            format!("WITH picked AS ({due} FOR UPDATE SKIP LOCKED) UPDATE jobs SET {set} FROM picked WHERE jobs.id = picked.id RETURNING {returning}")
        }
        // SQLite has one writer at a time, so one UPDATE is atomic.
        Backend::Sqlite => format!("UPDATE jobs SET {set} WHERE id IN ({due}) RETURNING {COLUMNS}"),
    };
    let claimed: Vec<JobRow> = sqlx::query_as(&sql).bind(now).bind(owner).bind(lease_until).bind(queue).bind(limit).fetch_all(&mut *conn).await?;
    let ids: Vec<i64> = claimed.iter().map(|j| j.id).collect();
    events_for(conn, &ids, now, JobState::Running, None).await?;
    Ok(claimed)
}

/// Extends the lease of jobs this owner still holds. Returns the ids it still holds; the others
/// were cancelled or rescued, and their runs should stop.
pub async fn heartbeat(conn: &mut AnyConnection, ids: &[i64], owner: &str, lease_until: i64) -> Result<Vec<i64>, DbError> {
    let mut held = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let sql = format!(
            "UPDATE jobs SET lease_expires_at = $1 WHERE state = 'running' AND lease_owner = $2 AND id IN ({}) RETURNING id",
            placeholders(3, chunk.len())
        );
        let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(lease_until).bind(owner);
        for id in chunk {
            q = q.bind(*id);
        }
        held.extend(q.fetch_all(&mut *conn).await?);
    }
    Ok(held)
}

/// A finished run: the job, the attempt it ran as (the lease token), and its result preview.
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: i64,
    pub attempt: i64,
    pub preview: Option<String>,
}

/// Marks jobs this owner holds as completed. Returns the ids that were completed (a job whose
/// lease was rescued meanwhile belongs to someone else and is left alone).
pub async fn complete(conn: &mut AnyConnection, done: &[Finished], owner: &str, now: i64) -> Result<Vec<i64>, DbError> {
    let mut completed = Vec::with_capacity(done.len());
    for Finished { id, attempt, preview } in done {
        let n = sqlx::query(
            "UPDATE jobs SET state = 'completed', completed_at = $1, updated_at = $1, result_preview = $2, \
             lease_owner = NULL, lease_expires_at = NULL WHERE id = $3 AND state = 'running' AND lease_owner = $4 AND attempt = $5",
        )
        .bind(now)
        .bind(preview.as_deref().map(|p| clean(p, MAX_PREVIEW_CHARS)))
        .bind(*id)
        .bind(owner)
        .bind(*attempt)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if n == 1 {
            completed.push(*id);
        }
    }
    events_for(conn, &completed, now, JobState::Completed, None).await?;
    Ok(completed)
}

/// What happened to a failed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Scheduled again at the given time.
    Retry { at: i64 },
    Discarded,
    /// The lease was lost; nothing changed.
    NotHeld,
}

/// Records a failure. A retryable error with attempts left goes back to `retryable` at
/// `retry_at`; anything else is discarded.
#[expect(clippy::too_many_arguments, reason = "one statement's parameters; a struct would only rename them")]
pub async fn fail(
    conn: &mut AnyConnection,
    id: i64,
    attempt: i64,
    owner: &str,
    code: &str,
    message: &str,
    retryable: bool,
    retry_at: i64,
    now: i64,
) -> Result<FailOutcome, DbError> {
    let row: Option<(String, i64)> = sqlx::query_as(
        "UPDATE jobs SET \
           state = CASE WHEN $1 = 1 AND attempt < max_attempts THEN 'retryable' ELSE 'discarded' END, \
           scheduled_at = CASE WHEN $1 = 1 AND attempt < max_attempts THEN $2 ELSE scheduled_at END, \
           completed_at = CASE WHEN $1 = 1 AND attempt < max_attempts THEN NULL ELSE $3 END, \
           updated_at = $3, last_error_code = $4, last_error_message = $5, lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = $6 AND state = 'running' AND lease_owner = $7 AND attempt = $8 RETURNING state, attempt",
    )
    .bind(i64::from(retryable))
    .bind(retry_at)
    .bind(now)
    .bind(clean(code, 100))
    .bind(clean(message, MAX_ERROR_CHARS))
    .bind(id)
    .bind(owner)
    .bind(attempt)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((state, attempt)) = row else { return Ok(FailOutcome::NotHeld) };
    let state = JobState::parse(&state).unwrap_or(JobState::Discarded);
    event(conn, id, now, state, attempt, Some(&clean(code, 100)), Some(&clean(message, MAX_ERROR_CHARS))).await?;
    Ok(if state == JobState::Retryable { FailOutcome::Retry { at: retry_at } } else { FailOutcome::Discarded })
}

/// Reschedules a running job without counting the attempt.
pub async fn snooze(conn: &mut AnyConnection, id: i64, attempt: i64, owner: &str, until: i64, now: i64) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET state = 'scheduled', scheduled_at = $1, updated_at = $2, attempt = attempt - 1, \
         lease_owner = NULL, lease_expires_at = NULL WHERE id = $3 AND state = 'running' AND lease_owner = $4 AND attempt = $5",
    )
    .bind(until)
    .bind(now)
    .bind(id)
    .bind(owner)
    .bind(attempt)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n == 1 {
        let attempt = get(conn, id).await?.map_or(0, |j| j.attempt);
        event(conn, id, now, JobState::Scheduled, attempt, None, Some("snoozed")).await?;
    }
    Ok(n == 1)
}

/// Cancels an unfinished job. A running one is cancelled in the table; its worker's result is
/// then ignored because the lease no longer matches.
pub async fn cancel(conn: &mut AnyConnection, id: i64, reason: &str, now: i64) -> Result<bool, DbError> {
    // A running job keeps its lease fields: its worker sees the lease gone at the next heartbeat
    // and stops it, and `retry_now` waits until that lease has run out.
    let sql = format!(
        "UPDATE jobs SET state = 'cancelled', completed_at = $1, updated_at = $1, last_error_code = 'JOB_CANCELLED', \
         last_error_message = $2, lease_owner = CASE WHEN state = 'running' THEN lease_owner ELSE NULL END, \
         lease_expires_at = CASE WHEN state = 'running' THEN lease_expires_at ELSE NULL END \
         WHERE id = $3 AND state IN {UNFINISHED}"
    );
    let n = sqlx::query(&sql).bind(now).bind(reason).bind(id).execute(&mut *conn).await?.rows_affected();
    if n == 1 {
        events_for(conn, &[id], now, JobState::Cancelled, Some("JOB_CANCELLED")).await?;
    }
    Ok(n == 1)
}

/// Makes a waiting or finished-without-success job run now. A discarded or cancelled job gets
/// one more attempt. Refused while a cancelled run may still be stopping (its lease has not run
/// out) and while another unfinished job holds the same dedupe key.
pub async fn retry_now(conn: &mut AnyConnection, id: i64, now: i64) -> Result<bool, DbError> {
    let sql = format!(
        "UPDATE jobs SET state = 'available', scheduled_at = $1, updated_at = $1, completed_at = NULL, \
         lease_owner = NULL, lease_expires_at = NULL, \
         max_attempts = CASE WHEN attempt >= max_attempts THEN attempt + 1 ELSE max_attempts END \
         WHERE id = $2 AND state IN ('scheduled', 'retryable', 'discarded', 'cancelled') \
         AND (lease_expires_at IS NULL OR lease_expires_at < $1) \
         AND NOT EXISTS (SELECT 1 FROM jobs other WHERE other.dedupe_key = jobs.dedupe_key AND other.id <> jobs.id AND other.state IN {UNFINISHED})"
    );
    let n = sqlx::query(&sql).bind(now).bind(id).execute(&mut *conn).await?.rows_affected();
    if n == 1 {
        events_for(conn, &[id], now, JobState::Available, None).await?;
    }
    Ok(n == 1)
}

/// Releases a pending job: approved to available, rejected to cancelled.
pub async fn release_pending(conn: &mut AnyConnection, id: i64, approved: bool, now: i64) -> Result<bool, DbError> {
    let (state, code) = if approved { (JobState::Available, None) } else { (JobState::Cancelled, Some("JOB_REJECTED")) };
    let n = sqlx::query(
        "UPDATE jobs SET state = $1, scheduled_at = CASE WHEN scheduled_at > $2 THEN scheduled_at ELSE $2 END, \
         updated_at = $2, last_error_code = $3, \
         completed_at = CASE WHEN $1 = 'cancelled' THEN $2 ELSE NULL END WHERE id = $4 AND state = 'pending'",
    )
    .bind(state.as_str())
    .bind(now)
    .bind(code)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n == 1 {
        events_for(conn, &[id], now, state, code).await?;
    }
    Ok(n == 1)
}

/// Rows a maintenance statement may change: at most `MAINTENANCE_BATCH` ids matching `filter`.
///
/// Under PostgreSQL's READ COMMITTED, `UPDATE ... WHERE id IN (SELECT ...)` chooses its rows from
/// the statement's snapshot: an update that waited for another transaction's lock on a row then
/// applies to the row as that transaction left it, even if it no longer matches (a job completed
/// or claimed meanwhile). So the ids are picked with `FOR UPDATE SKIP LOCKED` (a row being
/// changed right now is left for the next round) and the outer UPDATE repeats `filter`, which
/// PostgreSQL re-checks against the newest row version. SQLite has one writer at a time.
/// `filter` qualifies its columns with `jobs.`, which reads the same in the pick and the UPDATE.
fn maintenance_update(backend: Backend, set: &str, filter: &str, returning: &[&str]) -> String {
    let pick = format!("SELECT id FROM jobs WHERE {filter} ORDER BY id LIMIT $2");
    match backend {
        Backend::Postgres => {
            let returning = returning.iter().map(|c| format!("jobs.{c}")).collect::<Vec<_>>().join(", ");
            format!("WITH picked AS ({pick} FOR UPDATE SKIP LOCKED) UPDATE jobs SET {set} FROM picked WHERE jobs.id = picked.id AND {filter} RETURNING {returning}")
        }
        Backend::Sqlite => format!("UPDATE jobs SET {set} WHERE id IN ({pick}) AND {filter} RETURNING {}", returning.join(", ")),
    }
}

/// Cancels queued jobs whose TTL passed. Returns their ids. A job claimed meanwhile is left
/// alone: it is no longer queued.
pub async fn expire(conn: &mut AnyConnection, backend: Backend, now: i64) -> Result<Vec<i64>, DbError> {
    let set = "state = 'cancelled', completed_at = $1, updated_at = $1, last_error_code = 'JOB_EXPIRED', \
               last_error_message = 'still queued when its time to live ran out'";
    let filter = "jobs.state IN ('available', 'scheduled', 'retryable', 'pending') AND jobs.expires_at IS NOT NULL AND jobs.expires_at <= $1";
    let sql = maintenance_update(backend, set, filter, &["id"]);
    let ids: Vec<i64> = sqlx::query_scalar(&sql).bind(now).bind(MAINTENANCE_BATCH).fetch_all(&mut *conn).await?;
    events_for(conn, &ids, now, JobState::Cancelled, Some("JOB_EXPIRED")).await?;
    Ok(ids)
}

/// Frees running jobs whose lease expired (their worker died or hung): back to `retryable`
/// when attempts remain, else `discarded`. Returns their ids. A job its worker completed, or
/// another worker claimed again, while this ran is left alone (see [`maintenance_update`]).
pub async fn rescue(conn: &mut AnyConnection, backend: Backend, now: i64) -> Result<Vec<i64>, DbError> {
    let set = "state = CASE WHEN attempt < max_attempts THEN 'retryable' ELSE 'discarded' END, \
               completed_at = CASE WHEN attempt < max_attempts THEN NULL ELSE $1 END, \
               scheduled_at = $1, updated_at = $1, last_error_code = 'JOB_LEASE_EXPIRED', \
               last_error_message = 'the worker holding this job stopped answering', lease_owner = NULL, lease_expires_at = NULL";
    let filter = "jobs.state = 'running' AND jobs.lease_expires_at < $1";
    let sql = maintenance_update(backend, set, filter, &["id", "state"]);
    let found: Vec<(i64, String)> = sqlx::query_as(&sql).bind(now).bind(MAINTENANCE_BATCH).fetch_all(&mut *conn).await?;
    let (retry, discarded): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, state)| state == "retryable");
    let mut retry: Vec<i64> = retry.into_iter().map(|(id, _)| id).collect();
    let discarded: Vec<i64> = discarded.into_iter().map(|(id, _)| id).collect();
    events_for(conn, &retry, now, JobState::Retryable, Some("JOB_LEASE_EXPIRED")).await?;
    events_for(conn, &discarded, now, JobState::Discarded, Some("JOB_LEASE_EXPIRED")).await?;
    retry.extend(discarded);
    Ok(retry)
}

/// On graceful shutdown: jobs this owner still holds go back to `available` without counting
/// the interrupted attempt.
pub async fn release_leases(conn: &mut AnyConnection, owner: &str, now: i64) -> Result<Vec<i64>, DbError> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "UPDATE jobs SET state = 'available', attempt = attempt - 1, scheduled_at = $1, updated_at = $1, \
         lease_owner = NULL, lease_expires_at = NULL WHERE state = 'running' AND lease_owner = $2 RETURNING id",
    )
    .bind(now)
    .bind(owner)
    .fetch_all(&mut *conn)
    .await?;
    events_for(conn, &ids, now, JobState::Available, Some("JOB_RELEASED")).await?;
    Ok(ids)
}

/// Removes every job of `queue` with its events (a benchmark's own queue).
pub async fn delete_queue(conn: &mut AnyConnection, queue: &str) -> Result<u64, DbError> {
    sqlx::query("DELETE FROM job_events WHERE job_id IN (SELECT id FROM jobs WHERE queue = $1)").bind(queue).execute(&mut *conn).await?;
    Ok(sqlx::query("DELETE FROM jobs WHERE queue = $1").bind(queue).execute(conn).await?.rows_affected())
}

/// Claims one job by id for `owner`, even before its scheduled time: the caller runs it itself
/// instead of waiting for a worker (the tool lane schedules a call a little later and runs it
/// at once; a worker takes it only if the lane did not). `None` when a worker got it first.
/// Run it in a write transaction.
pub async fn claim_one(conn: &mut AnyConnection, id: i64, owner: &str, now: i64, lease_until: i64) -> Result<Option<JobRow>, DbError> {
    let sql = format!(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, started_at = $1, updated_at = $1, lease_owner = $2, lease_expires_at = $3 \
         WHERE id = $4 AND state IN {DUE_STATES} RETURNING {COLUMNS}"
    );
    let row = sqlx::query_as::<_, JobRow>(&sql).bind(now).bind(owner).bind(lease_until).bind(id).fetch_optional(&mut *conn).await?;
    let Some(job) = row else { return Ok(None) };
    events_for(conn, &[job.id], now, JobState::Running, None).await?;
    Ok(Some(job))
}
