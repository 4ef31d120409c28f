//! Whole tool results that were too large to pass inline.

use sqlx::AnyConnection;

use super::{DbError, now_ms};

pub struct StoredResult<'a> {
    pub id: &'a str,
    pub tool: &'a str,
    pub correlation_id: &'a str,
    pub size_bytes: i64,
    pub truncated: bool,
    pub body: &'a str,
    /// The chat whose call made it; `read_result` reads it back only there.
    pub chat_id: Option<&'a str>,
}

pub async fn insert(conn: &mut AnyConnection, r: &StoredResult<'_>) -> Result<(), DbError> {
    sqlx::query("INSERT INTO tool_results (id, tool, correlation_id, created_at, size_bytes, truncated, body, chat_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
        .bind(r.id)
        .bind(r.tool)
        .bind(r.correlation_id)
        .bind(now_ms())
        .bind(r.size_bytes)
        .bind(i64::from(r.truncated))
        .bind(r.body)
        .bind(r.chat_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The stored body, if the reference exists.
pub async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT body FROM tool_results WHERE id = $1").bind(id).fetch_optional(&mut *conn).await?)
}

/// The stored body, if the reference exists and belongs to `chat_id`.
pub async fn get_for_chat(conn: &mut AnyConnection, id: &str, chat_id: &str) -> Result<Option<String>, DbError> {
    let sql = "SELECT body FROM tool_results WHERE id = $1 AND chat_id = $2";
    Ok(sqlx::query_scalar(sql).bind(id).bind(chat_id).fetch_optional(&mut *conn).await?)
}

/// Deletes the results stored before `before_ms`; how many.
pub async fn delete_before(conn: &mut AnyConnection, before_ms: i64) -> Result<u64, DbError> {
    Ok(sqlx::query("DELETE FROM tool_results WHERE created_at < $1").bind(before_ms).execute(&mut *conn).await?.rows_affected())
}

/// How many results are stored.
pub async fn count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tool_results").fetch_one(&mut *conn).await?)
}
