//! Whole tool results that were too large to pass inline.

use sqlx::{AnyConnection, Row};

use super::{DbError, now_ms};

pub struct StoredResult<'a> {
    pub id: &'a str,
    pub tool: &'a str,
    pub correlation_id: &'a str,
    pub size_bytes: i64,
    pub truncated: bool,
    pub body: &'a str,
}

pub async fn insert(conn: &mut AnyConnection, r: &StoredResult<'_>) -> Result<(), DbError> {
    sqlx::query("INSERT INTO tool_results (id, tool, correlation_id, created_at, size_bytes, truncated, body) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(r.id)
        .bind(r.tool)
        .bind(r.correlation_id)
        .bind(now_ms())
        .bind(r.size_bytes)
        .bind(i64::from(r.truncated))
        .bind(r.body)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The stored body, if the reference exists.
pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<String>, DbError> {
    let row = sqlx::query("SELECT body FROM tool_results WHERE id = $1").bind(id).fetch_optional(&mut *conn).await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}
