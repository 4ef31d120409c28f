//! Removing the records of finished work that `[retention]` no longer keeps (the
//! `retention.prune` job). Each function removes at most `batch` rows (with what belongs to
//! them) in the caller's transaction and returns how many it removed, so that the writer is
//! never held for long.

use sqlx::AnyConnection;

use super::{DbError, jobs::FINISHED, placeholders};

/// Deletes the rows of `table` whose id is one of `ids` and that still match `still` (what
/// made them due, checked again in the delete), returning the ids deleted.
async fn delete_ids(conn: &mut AnyConnection, table: &str, still: &str, before: i64, ids: &[i64]) -> Result<Vec<i64>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!("DELETE FROM {table} WHERE id IN ({}) AND {still} RETURNING id", placeholders(2, ids.len()));
    let mut q = sqlx::query_scalar(&sql).bind(before);
    for id in ids {
        q = q.bind(*id);
    }
    Ok(q.fetch_all(conn).await?)
}

/// Deletes the rows of `table` whose `column` is one of `ids`: what belonged to rows just
/// deleted (where a foreign key's cascade did not already).
async fn delete_belonging(conn: &mut AnyConnection, table: &str, column: &str, ids: &[i64]) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let sql = format!("DELETE FROM {table} WHERE {column} IN ({})", placeholders(1, ids.len()));
    let mut q = sqlx::query(&sql);
    for id in ids {
        q = q.bind(*id);
    }
    q.execute(conn).await?;
    Ok(())
}

/// Up to `batch` finished jobs that ended before `before`, with their events. They are taken as
/// `jobs_state_updated` lists them (each state's oldest first), not sorted by id: a sort would
/// read every due job for each batch, which after an upgrade or a long pause is most of them.
pub async fn finished_jobs(conn: &mut AnyConnection, before: i64, batch: i64) -> Result<u64, DbError> {
    let still = format!("state IN {FINISHED} AND updated_at < $1");
    let due: Vec<i64> = sqlx::query_scalar(&finished_due_sql()).bind(before).bind(batch).fetch_all(&mut *conn).await?;
    // Checked again as they are deleted: a job run again from the console meanwhile is kept.
    let deleted = delete_ids(conn, "jobs", &still, before, &due).await?;
    // PostgreSQL's job events have no foreign key (migration 0028); a tool call's kept answer
    // and its start mark have none either.
    delete_belonging(conn, "job_events", "job_id", &deleted).await?;
    delete_belonging(conn, "tool_answers", "job_id", &deleted).await?;
    delete_belonging(conn, "tool_call_starts", "job_id", &deleted).await?;
    Ok(deleted.len() as u64)
}

/// The query that picks a batch of finished jobs to remove (`$1` the time they ended before,
/// `$2` the batch).
pub fn finished_due_sql() -> String {
    format!("SELECT id FROM jobs WHERE state IN {FINISHED} AND updated_at < $1 LIMIT $2")
}

/// Up to `batch` events from before `before` of jobs still unfinished (the periodic ones, which
/// never finish and gain events every turn; a finished job's trail goes with the job). Only the
/// events before the first one from `before` on are read (the table has no index on `at`, and
/// ids follow time), so a run does not read the whole table.
pub async fn old_job_events(conn: &mut AnyConnection, before: i64, batch: i64) -> Result<u64, DbError> {
    let sql = format!(
        "DELETE FROM job_events WHERE id IN ( \
           SELECT e.id FROM job_events e JOIN jobs j ON j.id = e.job_id \
           WHERE e.id < COALESCE((SELECT f.id FROM job_events f WHERE f.at >= $1 ORDER BY f.id LIMIT 1), {}) \
             AND e.at < $1 AND j.state NOT IN {FINISHED} \
           ORDER BY e.id LIMIT $2)",
        i64::MAX
    );
    Ok(sqlx::query(&sql).bind(before).bind(batch).execute(conn).await?.rows_affected())
}

/// Up to `batch` approval requests settled before `before`, with the messages that asked.
pub async fn decided_approvals(conn: &mut AnyConnection, before: i64, batch: i64) -> Result<u64, DbError> {
    let still = "state <> 'pending' AND COALESCE(decided_at, expires_at) < $1";
    let due: Vec<i64> = sqlx::query_scalar(&format!("SELECT id FROM approvals WHERE {still} ORDER BY id LIMIT $2")).bind(before).bind(batch).fetch_all(&mut *conn).await?;
    let deleted = delete_ids(conn, "approvals", still, before, &due).await?;
    delete_belonging(conn, "approval_askers", "approval_id", &deleted).await?;
    Ok(deleted.len() as u64)
}

/// Up to `batch` owner notices raised before `before`.
pub async fn notices(conn: &mut AnyConnection, before: i64, batch: i64) -> Result<u64, DbError> {
    oldest(conn, "owner_notifications", before, batch).await
}

/// Up to `batch` rows of `table` (a log with an `at` column) from before `before`, oldest first.
async fn oldest(conn: &mut AnyConnection, table: &str, before: i64, batch: i64) -> Result<u64, DbError> {
    let sql = format!("DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE at < $1 ORDER BY id LIMIT $2)");
    Ok(sqlx::query(&sql).bind(before).bind(batch).execute(conn).await?.rows_affected())
}

/// The budget warnings raised before `before` (the caller keeps the current month's: they
/// stop a period's warning from being given twice). Few rows: at most a handful a period.
pub async fn budget_warnings(conn: &mut AnyConnection, before: i64) -> Result<u64, DbError> {
    Ok(sqlx::query("DELETE FROM budget_warnings WHERE at < $1").bind(before).execute(conn).await?.rows_affected())
}

/// Up to `batch` recorded model calls made before `before`.
pub async fn model_calls(conn: &mut AnyConnection, before: i64, batch: i64) -> Result<u64, DbError> {
    oldest(conn, "llm_calls", before, batch).await
}
