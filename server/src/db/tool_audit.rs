//! Tool-call audit rows, written in batches.

use sqlx::{AnyConnection, Row};

use super::DbError;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
}

/// Inserts rows with multi-row statements (bounded so binds stay within limits).
pub async fn insert_many(conn: &mut AnyConnection, rows: &[AuditRow]) -> Result<(), DbError> {
    for chunk in rows.chunks(200) {
        let mut sql = String::from(
            "INSERT INTO tool_audit (at, tool, version, actor, chat_id, chat_type, decision, reason_code, latency_us, attempts, correlation_id, args) VALUES ",
        );
        for (i, _) in chunk.iter().enumerate() {
            let b = i * 12;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            sql.push_str(&(1..=12).map(|k| format!("${}", b + k)).collect::<Vec<_>>().join(", "));
            sql.push(')');
        }
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
                .bind(&r.args);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Newest first.
pub async fn recent(conn: &mut AnyConnection, tool: Option<&str>, limit: i64) -> Result<Vec<AuditRow>, DbError> {
    let sql = "SELECT at, tool, version, actor, chat_id, chat_type, decision, reason_code, latency_us, attempts, correlation_id, args \
               FROM tool_audit WHERE ($1 = '' OR tool = $1) ORDER BY id DESC LIMIT $2";
    let rows = sqlx::query(sql).bind(tool.unwrap_or_default()).bind(limit).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| {
            Ok(AuditRow {
                at: r.try_get(0)?,
                tool: r.try_get(1)?,
                version: r.try_get(2)?,
                actor: r.try_get(3)?,
                chat_id: r.try_get(4)?,
                chat_type: r.try_get(5)?,
                decision: r.try_get(6)?,
                reason_code: r.try_get(7)?,
                latency_us: r.try_get(8)?,
                attempts: r.try_get(9)?,
                correlation_id: r.try_get(10)?,
                args: r.try_get(11)?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}
