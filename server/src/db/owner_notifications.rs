//! Notices for owners raised by `notify_owner` tool hooks.

use sqlx::AnyConnection;

use super::DbError;

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Notification {
    pub at: i64,
    pub hook: String,
    pub tool: String,
    pub reason_code: String,
    /// Written by Gatehouse from the hook and the outcome; never the call's arguments.
    pub message: String,
    pub correlation_id: String,
}

pub async fn insert(conn: &mut AnyConnection, n: &Notification) -> Result<(), DbError> {
    sqlx::query("INSERT INTO owner_notifications (at, hook, tool, reason_code, message, correlation_id) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(n.at)
        .bind(&n.hook)
        .bind(&n.tool)
        .bind(&n.reason_code)
        .bind(super::clean_text(&n.message))
        .bind(&n.correlation_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether a notice with this code and these exact words was raised before.
pub async fn exists(conn: &mut AnyConnection, reason_code: &str, message: &str) -> Result<bool, DbError> {
    let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM owner_notifications WHERE reason_code = $1 AND message = $2 LIMIT 1").bind(reason_code).bind(message).fetch_optional(conn).await?;
    Ok(found.is_some())
}

/// When the latest notice with `reason_code` was raised.
pub async fn latest_at(conn: &mut AnyConnection, reason_code: &str) -> Result<Option<i64>, DbError> {
    Ok(sqlx::query_scalar("SELECT MAX(at) FROM owner_notifications WHERE reason_code = $1").bind(reason_code).fetch_one(conn).await?)
}

/// The newest `limit` notices, newest first.
pub async fn recent(conn: &mut AnyConnection, limit: i64) -> Result<Vec<Notification>, DbError> {
    Ok(sqlx::query_as("SELECT at, hook, tool, reason_code, message, correlation_id FROM owner_notifications ORDER BY id DESC LIMIT $1")
        .bind(limit)
        .fetch_all(conn)
        .await?)
}
