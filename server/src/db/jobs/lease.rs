//! A run's lease: claiming due jobs, heartbeats, and how a run ends (completed, failed,
//! snoozed). The attempt number is the lease token.

use sqlx::AnyConnection;

use super::{COLUMNS, DUE_STATES, DbError, JobRow, JobState, clean, event, events_for, get};
use crate::db::{Backend, anonymous_on_sqlite, backend_of, lease_end, lease_now, placeholders, value_rows, value_rows_from};

const MAX_ERROR_CHARS: usize = 2000;
const MAX_PREVIEW_CHARS: usize = 4000;

/// Leases up to `limit` due jobs of `queue` to `owner` until `lease_until`, counting an attempt.
/// The attempt number is the lease token: a stale run's result cannot finish a newer run.
/// Run it in a write transaction of its own, so the claim and its events commit together.
///
/// On PostgreSQL that transaction commits without waiting for its WAL flush (`synchronous_commit`
/// off for it alone): the flush (a few ms of fsync here) was half of an idle job's start. The
/// claim is visible to every other worker at once, so no job is claimed twice; what an OS crash
/// can lose is the last fraction of a second of claims, and such a job is back as it was before
/// the claim and runs again, like any job whose run was cut short (handlers run at least once).
/// Whatever commits after it synchronously (the run's completion) flushes it first.
pub async fn claim(
    conn: &mut AnyConnection,
    backend: Backend,
    queue: &str,
    owner: &str,
    limit: i64,
    now: i64,
    lease_until: i64,
) -> Result<Vec<JobRow>, DbError> {
    claim_in_order(conn, backend, Claim { queue, owner, limit, now, lease_until, kinds: None, one_per_chat: &[] }).await
}

/// What a claim takes: see [`claim`]. Only jobs of `kinds` are claimed (a worker's own: one of
/// an older build leaves a newer build's kinds to the workers that know them), or of any kind
/// with `None`. Jobs of the `one_per_chat` kinds are claimed one at a time per chat, in the
/// order they were stored.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub queue: &'a str,
    pub owner: &'a str,
    pub limit: i64,
    pub now: i64,
    pub lease_until: i64,
    pub kinds: Option<&'a [String]>,
    pub one_per_chat: &'a [String],
}

/// [`claim`], keeping a chat's jobs of the `one_per_chat` kinds in order: such a job is not
/// claimed while another of its chat, kind and queue runs (or was cancelled while running and
/// its run has not stopped yet: it keeps its lease until then), or while an earlier one is due
/// (that one is claimed first, in this claim or the next). An earlier job waiting out a retry's
/// backoff does not hold the chat: the backoff may be an hour, and the chat would be silent for
/// it. On PostgreSQL a claim that has not committed yet still shows its jobs as due, so two
/// workers cannot each take one of a chat's jobs.
pub async fn claim_in_order(conn: &mut AnyConnection, backend: Backend, c: Claim<'_>) -> Result<Vec<JobRow>, DbError> {
    if c.kinds.is_some_and(<[String]>::is_empty) {
        return Ok(Vec::new());
    }
    // Bound after the `one_per_chat` kinds.
    let of_kinds = c.kinds.map_or_else(String::new, |kinds| format!(" AND kind IN ({})", placeholders(6 + c.one_per_chat.len(), kinds.len())));
    let in_order = if c.one_per_chat.is_empty() {
        String::new()
    } else {
        format!(
            // The first two conditions on `e` are the index `jobs_chat_in_order`'s own (SQLite
            // uses a partial index only when the query states its conditions).
            " AND NOT (kind IN ({}) AND chat_id IS NOT NULL AND EXISTS (SELECT 1 FROM jobs e WHERE e.chat_id IS NOT NULL \
             AND (e.state IN ('available', 'scheduled', 'retryable', 'running') OR (e.state = 'cancelled' AND e.lease_expires_at IS NOT NULL)) \
             AND e.chat_id = jobs.chat_id AND e.kind = jobs.kind AND e.queue = jobs.queue \
             AND e.id <> jobs.id AND (e.state = 'running' OR (e.state = 'cancelled' AND e.lease_expires_at > {lease_now}) \
             OR (e.state <> 'cancelled' AND e.id < jobs.id AND e.scheduled_at <= $1 AND (e.expires_at IS NULL OR e.expires_at > $1)))))",
            placeholders(6, c.one_per_chat.len()),
            lease_now = lease_now(backend, "$1"),
        )
    };
    let due = format!(
        "SELECT id FROM jobs WHERE state IN {DUE_STATES} AND queue = $4 AND scheduled_at <= $1 \
         AND (expires_at IS NULL OR expires_at > $1){of_kinds}{in_order} ORDER BY priority DESC, scheduled_at, id LIMIT $5"
    );
    let set = format!("state = 'running', attempt = attempt + 1, started_at = $1, updated_at = $1, lease_owner = $2, lease_expires_at = {}", lease_end(backend, "$1", "$3"));
    let sql = match backend {
        // The locking subquery must run once: in `WHERE id IN (...)` PostgreSQL may re-run it
        // and lock more rows than LIMIT.
        // The claim's events are written by the same statement: one round trip.
        Backend::Postgres => {
            let returning = COLUMNS.split(", ").map(|c| format!("jobs.{c}")).collect::<Vec<_>>().join(", ");
            format!(
                "WITH picked AS ({due} FOR UPDATE SKIP LOCKED), \
                 claimed AS (UPDATE jobs SET {set} FROM picked WHERE jobs.id = picked.id RETURNING {returning}), \
                 events AS (INSERT INTO job_events (job_id, at, state, attempt) SELECT id, $1, 'running', attempt FROM claimed), \
                 async_commit AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) \
                 SELECT {COLUMNS} FROM claimed CROSS JOIN async_commit"
            )
        }
        // SQLite has one writer at a time, so one UPDATE is atomic.
        Backend::Sqlite => format!("UPDATE jobs SET {set} WHERE id IN ({due}) RETURNING {COLUMNS}"),
    };
    let mut query = sqlx::query_as(&sql).bind(c.now).bind(c.owner).bind(c.lease_until).bind(c.queue).bind(c.limit);
    for kind in c.one_per_chat.iter().chain(c.kinds.unwrap_or_default()) {
        query = query.bind(kind.as_str());
    }
    let claimed: Vec<JobRow> = query.fetch_all(&mut *conn).await?;
    events_written(claimed.len());
    Ok(claimed)
}

/// After a claim or a completion moved `jobs` jobs: that statement wrote their events itself (on
/// PostgreSQL a data-modifying CTE, on SQLite the triggers of migration 0029), so the events
/// reader is only rung.
fn events_written(jobs: usize) {
    if jobs > 0 {
        crate::db::events::ring();
    }
}

/// Extends the lease of jobs this owner still holds to `lease_until`, reckoned from `now` (on
/// PostgreSQL the same length from the server's clock, see [`lease_now`]). Returns the ids it
/// still holds; the others were cancelled or rescued, and their runs should stop.
pub async fn heartbeat(conn: &mut AnyConnection, ids: &[i64], owner: &str, now: i64, lease_until: i64) -> Result<Vec<i64>, DbError> {
    let backend = backend_of(conn);
    let mut held = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        // `now` binds last: SQLite's statement does not name it, and its placeholders stay in order.
        let sql = format!(
            "UPDATE jobs SET lease_expires_at = {} WHERE state = 'running' AND lease_owner = $2 AND id IN ({}) RETURNING id",
            lease_end(backend, &format!("${}", 3 + chunk.len()), "$1"),
            placeholders(3, chunk.len())
        );
        let sql = anonymous_on_sqlite(backend, sql);
        let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(lease_until).bind(owner);
        for id in chunk {
            q = q.bind(*id);
        }
        q = q.bind(now);
        held.extend(q.fetch_all(&mut *conn).await?);
    }
    Ok(held)
}

/// A job cancelled while it ran: its run (of `attempt`) has stopped, so the lease it kept
/// (holding its chat, see [`claim_in_order`]) is let go. False when it was let go already, or is
/// another's or another run's (one that ended after the job was rescued and claimed again).
pub async fn release_cancelled(conn: &mut AnyConnection, id: i64, attempt: i64, owner: &str) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE jobs SET lease_owner = NULL, lease_expires_at = NULL WHERE id = $1 AND state = 'cancelled' AND lease_owner = $2 AND attempt = $3")
        .bind(id)
        .bind(owner)
        .bind(attempt)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A finished run: the job, the attempt it ran as (the lease token), and its result preview.
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: i64,
    pub attempt: i64,
    pub preview: Option<String>,
}

/// Rows per completing statement: 3 binds each.
const COMPLETE_CHUNK: usize = 500;

/// Marks jobs this owner holds as completed, one statement per chunk of runs (and on PostgreSQL
/// their events in the same statement). Returns the runs that completed their jobs, as (id,
/// attempt): a job whose lease was rescued meanwhile belongs to someone else and is left alone,
/// and of two runs of one job (a stale one and its rerun) only the current attempt counts.
pub async fn complete(conn: &mut AnyConnection, done: &[Finished], owner: &str, now: i64) -> Result<Vec<(i64, i64)>, DbError> {
    let backend = backend_of(conn);
    let mut completed = Vec::with_capacity(done.len());
    for chunk in done.chunks(COMPLETE_CHUNK) {
        // The runs as a table; an UPDATE ... FROM it sets each its own preview, and only where
        // this owner still holds that attempt's lease.
        let sql = match backend {
            Backend::Postgres => format!(
                "WITH run(run_id, run_attempt, run_preview) AS (VALUES {}), \
                 done AS (UPDATE jobs SET state = 'completed', completed_at = $1, updated_at = $1, result_preview = run_preview, \
                   lease_owner = NULL, lease_expires_at = NULL FROM run \
                   WHERE jobs.id = run_id AND jobs.attempt = run_attempt AND jobs.state = 'running' AND jobs.lease_owner = $2 \
                   RETURNING jobs.id, jobs.attempt), \
                 events AS (INSERT INTO job_events (job_id, at, state, attempt) SELECT id, $1, 'completed', attempt FROM done) \
                 SELECT id, attempt FROM done",
                value_rows_from(3, chunk.len(), 3)
            ),
            // Every placeholder once and in the order of the text (`?`, see `db::value_rows`):
            // the time and the owner come last, as a one-row table.
            Backend::Sqlite => format!(
                "WITH run(run_id, run_attempt, run_preview) AS (VALUES {}), by(by_now, by_owner) AS (VALUES (?, ?)) \
                 UPDATE jobs SET state = 'completed', completed_at = by_now, updated_at = by_now, result_preview = run_preview, \
                   lease_owner = NULL, lease_expires_at = NULL FROM run, by \
                 WHERE jobs.id = run_id AND jobs.attempt = run_attempt AND jobs.state = 'running' AND jobs.lease_owner = by_owner \
                 RETURNING id, attempt",
                value_rows(Backend::Sqlite, chunk.len(), 3)
            ),
        };
        let mut q = sqlx::query_as::<_, (i64, i64)>(&sql);
        if backend == Backend::Postgres {
            q = q.bind(now).bind(owner);
        }
        for Finished { id, attempt, preview } in chunk {
            q = q.bind(*id).bind(*attempt).bind(preview.as_deref().map(|p| clean(p, MAX_PREVIEW_CHARS)));
        }
        if backend == Backend::Sqlite {
            q = q.bind(now).bind(owner);
        }
        let ids = q.fetch_all(&mut *conn).await?;
        events_written(ids.len());
        completed.extend(ids);
    }
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

/// Why a running job is put back to run later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snooze<'a> {
    /// Its handler did its work and asked to run again (a periodic job): the attempts earlier
    /// failures used are given back, so a job that reschedules itself is never discarded for
    /// failures spread over its whole life. Its `preview` of the run, if any, is the job's
    /// preview until the next run.
    Rescheduled { preview: Option<&'a str> },
    /// It waits on the deployment (a full disk, `code`): this run's attempt is not counted, and
    /// earlier failures still are.
    Waiting { code: &'a str },
}

/// Reschedules a running job without counting the attempt.
pub async fn snooze(conn: &mut AnyConnection, id: i64, attempt: i64, owner: &str, until: i64, now: i64, why: Snooze<'_>) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE jobs SET state = 'scheduled', scheduled_at = $1, updated_at = $2, attempt = CASE WHEN $6 = 1 THEN 0 ELSE attempt - 1 END, \
         result_preview = COALESCE($7, result_preview), lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = $3 AND state = 'running' AND lease_owner = $4 AND attempt = $5",
    )
    .bind(until)
    .bind(now)
    .bind(id)
    .bind(owner)
    .bind(attempt)
    .bind(i64::from(matches!(why, Snooze::Rescheduled { .. })))
    .bind(match why {
        Snooze::Rescheduled { preview } => preview.map(|p| clean(p, MAX_PREVIEW_CHARS)),
        Snooze::Waiting { .. } => None,
    })
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if n == 1 {
        let attempt = get(conn, id).await?.map_or(0, |j| j.attempt);
        let code = match why {
            Snooze::Rescheduled { .. } => None,
            Snooze::Waiting { code } => Some(code),
        };
        event(conn, id, now, JobState::Scheduled, attempt, code, Some("snoozed")).await?;
    }
    Ok(n == 1)
}

/// Claims one job by id for `owner`, even before its scheduled time: the caller runs it itself
/// instead of waiting for a worker (the tool lane schedules a call a little later and runs it
/// at once; a worker takes it only if the lane did not). `None` when a worker got it first.
/// Run it in a write transaction.
pub async fn claim_one(conn: &mut AnyConnection, id: i64, owner: &str, now: i64, lease_until: i64) -> Result<Option<JobRow>, DbError> {
    let sql = format!(
        "UPDATE jobs SET state = 'running', attempt = attempt + 1, started_at = $1, updated_at = $1, lease_owner = $2, lease_expires_at = {} \
         WHERE id = $4 AND state IN {DUE_STATES} RETURNING {COLUMNS}",
        lease_end(backend_of(conn), "$1", "$3")
    );
    let row = sqlx::query_as::<_, JobRow>(&sql).bind(now).bind(owner).bind(lease_until).bind(id).fetch_optional(&mut *conn).await?;
    let Some(job) = row else { return Ok(None) };
    match backend_of(conn) {
        Backend::Postgres => events_for(conn, &[job.id], now, JobState::Running, None).await?,
        // Written by the claim's trigger (migration 0029).
        Backend::Sqlite => events_written(1),
    }
    Ok(Some(job))
}
