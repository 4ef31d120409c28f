//! What the live view reads: trace steps and job events after a position, in id order, with the
//! trace or job they belong to; and the MCP servers' health. The rows are the durable record;
//! `events` turns them into typed events.
//!
//! Writers of these rows ring [`doorbell`] (in-process, never blocking) and, on PostgreSQL, a
//! statement trigger (migration 0023) sends `NOTIFY gatehouse_events` when the writing
//! transaction commits, which wakes every other process.

use std::sync::LazyLock;

use sqlx::{AnyConnection, any::AnyRow};
use tokio::sync::watch;

use super::DbError;

/// The PostgreSQL channel the triggers of migration 0023 notify and ephemeral events use.
pub const NOTIFY_CHANNEL: &str = "gatehouse_events";

static BELL: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);

/// Rung by every writer of trace steps and job events in this process: a wake-up hint for the
/// readers of this module (possibly before the writer commits; see `events::tail`). Costs an
/// atomic increment and never waits.
pub fn ring() {
    BELL.send_modify(|n| *n = n.wrapping_add(1));
}

/// A receiver that sees every later [`ring`].
pub fn doorbell() -> watch::Receiver<u64> {
    BELL.subscribe()
}

/// A trace step with its trace's chat.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StepRow {
    pub id: i64,
    pub trace_id: i64,
    pub seq: i64,
    pub step: String,
    pub decision: String,
    pub reason_code: String,
    pub channel: String,
    pub chat_id: String,
}

/// A job state change with its job's kind, tool and chat.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct JobEventRow {
    pub id: i64,
    pub job_id: i64,
    pub state: String,
    pub attempt: i64,
    pub error_code: Option<String>,
    pub kind: String,
    pub tool_name: Option<String>,
    pub chat_id: Option<String>,
}

/// Trace steps joined to their traces (`s`, `t`), to be narrowed by id.
const STEPS: &str = "SELECT s.id, s.trace_id, s.seq, s.step, s.decision, s.reason_code, t.channel, t.chat_id \
     FROM trace_steps s JOIN traces t ON t.id = s.trace_id";

/// Job events joined to their jobs (`e`, `j`), to be narrowed by id.
const JOB_EVENTS: &str = "SELECT e.id, e.job_id, e.state, e.attempt, e.error_code, j.kind, j.tool_name, j.chat_id \
     FROM job_events e JOIN jobs j ON j.id = e.job_id";

/// Trace steps with an id above `after`, oldest first, at most `limit`.
pub async fn steps_after(conn: &mut AnyConnection, after: i64, limit: i64) -> Result<Vec<StepRow>, DbError> {
    rows_after(conn, STEPS, "s.id", after, limit).await
}

/// Job events with an id above `after`, oldest first, at most `limit`.
pub async fn job_events_after(conn: &mut AnyConnection, after: i64, limit: i64) -> Result<Vec<JobEventRow>, DbError> {
    rows_after(conn, JOB_EVENTS, "e.id", after, limit).await
}

/// Trace steps with these ids (ones committed after later ids were read), in id order.
pub async fn steps_with_ids(conn: &mut AnyConnection, ids: &[i64]) -> Result<Vec<StepRow>, DbError> {
    super::rows_with_ids(conn, STEPS, "s.id", ids).await
}

/// Job events with these ids, in id order.
pub async fn job_events_with_ids(conn: &mut AnyConnection, ids: &[i64]) -> Result<Vec<JobEventRow>, DbError> {
    super::rows_with_ids(conn, JOB_EVENTS, "e.id", ids).await
}

async fn rows_after<T>(conn: &mut AnyConnection, select: &str, id: &str, after: i64, limit: i64) -> Result<Vec<T>, DbError>
where
    T: for<'r> sqlx::FromRow<'r, AnyRow> + Send + Unpin,
{
    let sql = format!("{select} WHERE {id} > $1 ORDER BY {id} LIMIT $2");
    Ok(sqlx::query_as(&sql).bind(after).bind(limit).fetch_all(conn).await?)
}

/// Tells the other processes of a PostgreSQL deployment of an event none of them stores
/// (`payload`, JSON), on [`NOTIFY_CHANNEL`].
pub async fn notify(pool: &sqlx::AnyPool, payload: &str) -> Result<(), DbError> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(payload).execute(pool).await?;
    Ok(())
}

/// The newest trace step and job event ids (0 when there are none).
pub async fn newest(conn: &mut AnyConnection) -> Result<(i64, i64), DbError> {
    let (steps, jobs): (i64, i64) =
        sqlx::query_as("SELECT CAST(COALESCE((SELECT MAX(id) FROM trace_steps), 0) AS BIGINT), CAST(COALESCE((SELECT MAX(id) FROM job_events), 0) AS BIGINT)")
            .fetch_one(conn)
            .await?;
    Ok((steps, jobs))
}

/// Each MCP server's id and health, by id.
pub async fn mcp_health(conn: &mut AnyConnection) -> Result<Vec<(String, String)>, DbError> {
    Ok(sqlx::query_as("SELECT id, health FROM mcp_servers ORDER BY id").fetch_all(conn).await?)
}
