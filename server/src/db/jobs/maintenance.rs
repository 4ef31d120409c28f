//! Periodic maintenance: expiring queued jobs past their TTL, rescuing expired leases, and
//! releasing this process's leases on shutdown.

use sqlx::AnyConnection;

use super::{DbError, EXPIRED, JobState, events_for, placeholders, wake_other_processes};
use crate::db::{Backend, lease_now};

/// Rows changed per maintenance statement, so a backlog after downtime stays within bind limits.
const MAINTENANCE_BATCH: i64 = 500;

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
    let set = format!("state = 'cancelled', completed_at = $1, updated_at = $1, last_error_code = '{EXPIRED}', \
               last_error_message = 'still queued when its time to live ran out'");
    let filter = "jobs.state IN ('available', 'scheduled', 'retryable', 'pending') AND jobs.expires_at IS NOT NULL AND jobs.expires_at <= $1";
    let sql = maintenance_update(backend, &set, filter, &["id"]);
    let ids: Vec<i64> = sqlx::query_scalar(&sql).bind(now).bind(MAINTENANCE_BATCH).fetch_all(&mut *conn).await?;
    events_for(conn, &ids, now, JobState::Cancelled, Some(EXPIRED)).await?;
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
    let filter = format!("jobs.state = 'running' AND jobs.lease_expires_at < {}", lease_now(backend, "$1"));
    let sql = maintenance_update(backend, set, &filter, &["id", "state"]);
    let found: Vec<(i64, String)> = sqlx::query_as(&sql).bind(now).bind(MAINTENANCE_BATCH).fetch_all(&mut *conn).await?;
    let (retry, discarded): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, state)| state == "retryable");
    let mut retry: Vec<i64> = retry.into_iter().map(|(id, _)| id).collect();
    let discarded: Vec<i64> = discarded.into_iter().map(|(id, _)| id).collect();
    events_for(conn, &retry, now, JobState::Retryable, Some("JOB_LEASE_EXPIRED")).await?;
    wake_other_processes(conn, &retry).await?;
    events_for(conn, &discarded, now, JobState::Discarded, Some("JOB_LEASE_EXPIRED")).await?;
    retry.extend(discarded);
    Ok(retry)
}

/// Discards the jobs of `queue` due since before `due_before` whose kind is none of `kinds` (the
/// kinds of the worker that runs this), with `code`: no worker of any build running since has
/// claimed them (a kind a newer build removed, or one enqueued by mistake). Returns their ids.
pub async fn discard_unknown_kinds(conn: &mut AnyConnection, backend: Backend, queue: &str, kinds: &[String], code: &str, due_before: i64, now: i64) -> Result<Vec<i64>, DbError> {
    // A worker that claims nothing says nothing of what others take.
    if kinds.is_empty() {
        return Ok(Vec::new());
    }
    let set = format!("state = 'discarded', completed_at = $1, updated_at = $1, last_error_code = ${}, \
               last_error_message = 'no worker took a job of its kind'", 5 + kinds.len());
    let filter = format!(
        "jobs.state IN ('available', 'scheduled', 'retryable') AND jobs.queue = $3 AND jobs.scheduled_at < $4 AND jobs.kind NOT IN ({})",
        placeholders(5, kinds.len())
    );
    let sql = maintenance_update(backend, &set, &filter, &["id"]);
    let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(now).bind(MAINTENANCE_BATCH).bind(queue).bind(due_before);
    for kind in kinds {
        q = q.bind(kind.as_str());
    }
    let ids = q.bind(code).fetch_all(&mut *conn).await?;
    events_for(conn, &ids, now, JobState::Discarded, Some(code)).await?;
    Ok(ids)
}

/// Lets go the leases of cancelled jobs whose runs' leases have run out (their worker stopped
/// before it could, or the run was the lane's): their chats go on.
pub async fn release_cancelled_leases(conn: &mut AnyConnection, backend: Backend, now: i64) -> Result<u64, DbError> {
    // SQLite, without statistics, would rather walk every cancelled job by `jobs_state_updated`.
    let table = if backend == Backend::Sqlite { "jobs INDEXED BY jobs_cancelled_lease" } else { "jobs" };
    let sql = format!("UPDATE {table} SET lease_owner = NULL, lease_expires_at = NULL WHERE state = 'cancelled' AND lease_expires_at IS NOT NULL AND lease_expires_at < {}", lease_now(backend, "$1"));
    let done = sqlx::query(&sql)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// Jobs that wait on something an operator puts right, which a process's start may have done.
#[derive(Debug, Clone, Copy)]
pub enum Waiting<'a> {
    /// Their last run was snoozed with one of these codes (no room on the disk, a refused
    /// access token, a blocked account).
    Codes(&'a [&'a str]),
    /// Jobs of `kind` whose handler rescheduled them with a preview starting with `prefix` (a
    /// WhatsApp message waiting for a send setting). Matched with `LIKE`: `prefix` holds no `%`
    /// or `_`.
    Previewed { kind: &'a str, prefix: &'a str },
}

/// Makes the `waiting` jobs due now, instead of at the end of their wait. Returns their ids. A
/// process calls it as it starts, which is how an operator puts a fix in place. Only the wait
/// is shortened: nothing runs that would not have run a little later, and a chat's jobs are
/// still claimed in order.
pub async fn release_waiting(conn: &mut AnyConnection, backend: Backend, waiting: Waiting<'_>, now: i64) -> Result<Vec<i64>, DbError> {
    // The code of the job's last snooze (or none, for one its handler rescheduled).
    let latest = "(SELECT e.error_code FROM job_events e WHERE e.job_id = jobs.id ORDER BY e.id DESC LIMIT 1)";
    let (condition, binds): (String, Vec<String>) = match waiting {
        Waiting::Codes([]) => return Ok(Vec::new()),
        Waiting::Codes(codes) => (format!("{latest} IN ({})", placeholders(3, codes.len())), codes.iter().map(|c| c.to_string()).collect()),
        // A preview outlives the wait that wrote it (a snooze for a code keeps it): only a job
        // whose last run was rescheduled by its handler waits on what the preview says.
        Waiting::Previewed { kind, prefix } => {
            debug_assert!(!prefix.contains(['%', '_']), "a LIKE pattern's prefix: {prefix}");
            (format!("jobs.kind = $3 AND jobs.result_preview LIKE $4 AND {latest} IS NULL"), vec![kind.into(), format!("{prefix}%")])
        }
    };
    let filter = format!("jobs.state = 'scheduled' AND jobs.scheduled_at > $1 AND {condition}");
    let sql = maintenance_update(backend, "scheduled_at = $1, updated_at = $1", &filter, &["id"]);
    let mut released = Vec::new();
    loop {
        let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(now).bind(MAINTENANCE_BATCH);
        for value in &binds {
            q = q.bind(value.as_str());
        }
        let ids = q.fetch_all(&mut *conn).await?;
        if ids.is_empty() {
            break;
        }
        wake_other_processes(conn, &ids).await?;
        released.extend(ids);
    }
    Ok(released)
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
    wake_other_processes(conn, &ids).await?;
    // Jobs cancelled while this owner ran them: their runs have ended with the worker.
    sqlx::query("UPDATE jobs SET lease_owner = NULL, lease_expires_at = NULL WHERE state = 'cancelled' AND lease_owner = $1").bind(owner).execute(&mut *conn).await?;
    Ok(ids)
}

/// Removes every job of `queue` with its events (a benchmark's own queue).
pub async fn delete_queue(conn: &mut AnyConnection, queue: &str) -> Result<u64, DbError> {
    sqlx::query("DELETE FROM job_events WHERE job_id IN (SELECT id FROM jobs WHERE queue = $1)").bind(queue).execute(&mut *conn).await?;
    Ok(sqlx::query("DELETE FROM jobs WHERE queue = $1").bind(queue).execute(conn).await?.rows_affected())
}
