//! Tool-call audit rows, written in batches.

use sqlx::AnyConnection;

use super::{DbError, value_rows};

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct AuditRow {
    pub at: i64,
    pub tool: String,
    pub version: Option<String>,
    pub actor: String,
    pub chat_id: Option<String>,
    pub chat_type: String,
    pub decision: String,
    pub reason_code: String,
    pub latency_us: i64,
    pub attempts: i64,
    pub correlation_id: String,
    /// Arguments with secret and configured private fields redacted.
    pub args: String,
    /// The trace of the message the call was made for (none from the console or the CLI).
    pub trace_id: Option<i64>,
}

const COLUMNS: &str = "at, tool, version, actor, chat_id, chat_type, decision, reason_code, latency_us, attempts, correlation_id, args, trace_id";

/// Inserts rows with multi-row statements (bounded so binds stay within limits).
pub async fn insert_many(conn: &mut AnyConnection, rows: &[AuditRow]) -> Result<(), DbError> {
    for chunk in rows.chunks(200) {
        let sql = format!("INSERT INTO tool_audit ({COLUMNS}) VALUES {}", value_rows(super::backend_of(conn), chunk.len(), 13));
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q
                .bind(r.at)
                .bind(&r.tool)
                .bind(&r.version)
                .bind(&r.actor)
                .bind(&r.chat_id)
                .bind(&r.chat_type)
                .bind(&r.decision)
                .bind(&r.reason_code)
                .bind(r.latency_us)
                .bind(r.attempts)
                .bind(&r.correlation_id)
                .bind(&r.args)
                .bind(r.trace_id);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Newest first: of one tool (through `tool_audit_tool_at`), or of all.
pub async fn recent(conn: &mut AnyConnection, tool: Option<&str>, limit: i64) -> Result<Vec<AuditRow>, DbError> {
    let Some(tool) = tool else {
        return Ok(sqlx::query_as(&recent_sql(false)).bind(limit).fetch_all(&mut *conn).await?);
    };
    Ok(sqlx::query_as(&recent_sql(true)).bind(tool).bind(limit).fetch_all(&mut *conn).await?)
}

/// The query [`recent`] runs: of one tool (`$1`; the limit is `$2`), or of all (the limit `$1`).
pub fn recent_sql(of_one_tool: bool) -> String {
    if of_one_tool {
        format!("SELECT {COLUMNS} FROM tool_audit WHERE tool = $1 ORDER BY id DESC LIMIT $2")
    } else {
        format!("SELECT {COLUMNS} FROM tool_audit ORDER BY id DESC LIMIT $1")
    }
}

/// The tool calls made while a message was handled, in order.
pub async fn of_trace(conn: &mut AnyConnection, trace_id: i64) -> Result<Vec<AuditRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM tool_audit WHERE trace_id = $1 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(trace_id).fetch_all(&mut *conn).await?)
}

/// Removes the audit rows of one correlation id (a benchmark's own calls); returns how many.
pub async fn delete_correlation(conn: &mut AnyConnection, correlation_id: &str) -> Result<u64, DbError> {
    Ok(sqlx::query("DELETE FROM tool_audit WHERE correlation_id = $1").bind(correlation_id).execute(conn).await?.rows_affected())
}
