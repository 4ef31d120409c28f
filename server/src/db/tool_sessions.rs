//! Tool sessions (`tool_sessions`, `tool_session_steps`): a request that ran a chain of tool
//! calls, and each of its steps with how it ended.

use sqlx::AnyConnection;

use super::DbError;

pub struct NewSession<'a> {
    pub channel: &'a str,
    pub chat_id: &'a str,
    pub message_id: &'a str,
    pub correlation_id: &'a str,
    pub trace_id: Option<i64>,
    pub now: i64,
}

pub async fn start(conn: &mut AnyConnection, s: &NewSession<'_>) -> Result<i64, DbError> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO tool_sessions (channel, chat_id, message_id, correlation_id, trace_id, status, step_count, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, 'running', 0, $6, $6) RETURNING id",
    )
    .bind(s.channel)
    .bind(s.chat_id)
    .bind(s.message_id)
    .bind(s.correlation_id)
    .bind(s.trace_id)
    .bind(s.now)
    .fetch_one(&mut *conn)
    .await?;
    Ok(id)
}

/// Records step `index` (from 1) of session `id`; `depends_on` is the step whose result it was
/// planned from.
pub async fn step(conn: &mut AnyConnection, id: i64, index: i64, tool: &str, status: &str, reason_code: &str, now: i64) -> Result<(), DbError> {
    let depends_on = (index > 1).then_some(index - 1);
    sqlx::query("INSERT INTO tool_session_steps (session_id, step_index, tool, status, reason_code, depends_on, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(id)
        .bind(index)
        .bind(tool)
        .bind(status)
        .bind(reason_code)
        .bind(depends_on)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE tool_sessions SET step_count = $2, updated_at = $3 WHERE id = $1").bind(id).bind(index).bind(now).execute(&mut *conn).await?;
    Ok(())
}

pub async fn finish(conn: &mut AnyConnection, id: i64, status: &str, now: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE tool_sessions SET status = $2, updated_at = $3 WHERE id = $1").bind(id).bind(status).bind(now).execute(&mut *conn).await?;
    Ok(())
}
