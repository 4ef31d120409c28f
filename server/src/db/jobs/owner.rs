//! What an owner does to a job: cancel it, run it now, release a pending one.

use sqlx::AnyConnection;

use super::{CANCELLED, DONE_AGAIN, DbError, JobState, UNFINISHED, events_for, wake_other_processes};
use crate::db::{backend_of, lease_now};

/// Cancels an unfinished job. A running one is cancelled in the table; its worker's result is
/// then ignored because the lease no longer matches.
pub async fn cancel(conn: &mut AnyConnection, id: i64, reason: &str, now: i64) -> Result<bool, DbError> {
    // A running job keeps its lease fields: its worker sees the lease gone at the next heartbeat
    // and stops it, then lets the lease go (maintenance does once it has run out). Until then
    // its chat's later jobs wait (see `claim_in_order`), and `retry_now` refuses.
    let sql = format!(
        "UPDATE jobs SET state = 'cancelled', completed_at = $1, updated_at = $1, last_error_code = '{CANCELLED}', \
         last_error_message = $2, lease_owner = CASE WHEN state = 'running' THEN lease_owner ELSE NULL END, \
         lease_expires_at = CASE WHEN state = 'running' THEN lease_expires_at ELSE NULL END \
         WHERE id = $3 AND state IN {UNFINISHED}"
    );
    let n = sqlx::query(&sql).bind(now).bind(reason).bind(id).execute(&mut *conn).await?.rows_affected();
    if n == 1 {
        events_for(conn, &[id], now, JobState::Cancelled, Some(CANCELLED)).await?;
    }
    Ok(n == 1)
}

/// Gives an unfinished job `attempts` attempts if it has fewer. False when it has as many, or
/// has finished.
pub async fn raise_attempts(conn: &mut AnyConnection, id: i64, attempts: i64) -> Result<bool, DbError> {
    let sql = format!("UPDATE jobs SET max_attempts = $1 WHERE id = $2 AND max_attempts < $1 AND state IN {UNFINISHED}");
    Ok(sqlx::query(&sql).bind(attempts).bind(id).execute(&mut *conn).await?.rows_affected() == 1)
}

/// Makes a waiting or finished-without-success job run now. A discarded or cancelled job gets
/// one more attempt, and a time to live that ran out is lifted (else the job would never be
/// claimed and the next maintenance would cancel it again). Refused while a cancelled run may
/// still be stopping (its lease has not run out), while another unfinished job holds the same
/// dedupe key, and for a job whose work another job does now ([`done_again`]).
pub async fn retry_now(conn: &mut AnyConnection, id: i64, now: i64) -> Result<bool, DbError> {
    let sql = format!(
        "UPDATE jobs SET state = 'available', scheduled_at = $1, updated_at = $1, completed_at = NULL, \
         lease_owner = NULL, lease_expires_at = NULL, \
         expires_at = CASE WHEN expires_at <= $1 THEN NULL ELSE expires_at END, \
         max_attempts = CASE WHEN attempt >= max_attempts THEN attempt + 1 ELSE max_attempts END \
         WHERE id = $2 AND state IN ('scheduled', 'retryable', 'discarded', 'cancelled') \
         AND (last_error_code IS NULL OR last_error_code <> '{DONE_AGAIN}') \
         AND (lease_expires_at IS NULL OR lease_expires_at < {lease_now}) \
         AND NOT EXISTS (SELECT 1 FROM jobs other WHERE other.dedupe_key = jobs.dedupe_key AND other.id <> jobs.id AND other.state IN {UNFINISHED})",
        lease_now = lease_now(backend_of(conn), "$1")
    );
    let n = match sqlx::query(&sql).bind(now).bind(id).execute(&mut *conn).await {
        Ok(done) => done.rows_affected(),
        // An enqueue of the same dedupe key committed while this waited for its index entry
        // (PostgreSQL): that job is the unfinished one now, so this one is not retried. The
        // statement was the transaction's first; the caller drops it.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => 0,
        Err(e) => return Err(e.into()),
    };
    if n == 1 {
        events_for(conn, &[id], now, JobState::Available, None).await?;
        wake_other_processes(conn, &[id]).await?;
    }
    Ok(n == 1)
}

/// Marks finished job `id` as done again by job `by` ([`DONE_AGAIN`], in its event trail too),
/// in the transaction that enqueued `by`: it is not retried from then on, and its retention
/// starts again, so it is kept as long as the job that does its work. False when it is not
/// finished without success.
pub async fn done_again(conn: &mut AnyConnection, id: i64, by: i64, now: i64) -> Result<bool, DbError> {
    let message = format!("done again by job {by}");
    let row: Option<String> = sqlx::query_scalar(&format!(
        "UPDATE jobs SET last_error_code = '{DONE_AGAIN}', last_error_message = $1, updated_at = $2 \
         WHERE id = $3 AND state IN ('discarded', 'cancelled') RETURNING state"
    ))
    .bind(&message)
    .bind(now)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(state) = row.and_then(|s| JobState::parse(&s)) else { return Ok(false) };
    events_for(conn, &[id], now, state, Some(DONE_AGAIN)).await?;
    Ok(true)
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
