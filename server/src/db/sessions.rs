//! Console sessions, stored as JSON records for tower-sessions.

use sqlx::AnyConnection;

use super::{DbError, now_ms};

/// Updates an existing session only: a session deleted meanwhile (logout, id cycling) must
/// not be brought back by a request that loaded it earlier.
pub async fn update(conn: &mut AnyConnection, id: &str, data: &str, expires_at: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE sessions SET data = $1, expires_at = $2 WHERE id = $3")
        .bind(data)
        .bind(expires_at)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Inserts only when the id is free; false on a collision.
pub async fn insert_new(conn: &mut AnyConnection, id: &str, data: &str, expires_at: i64) -> Result<bool, DbError> {
    let done = sqlx::query("INSERT INTO sessions (id, data, expires_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING")
        .bind(id)
        .bind(data)
        .bind(expires_at)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The record's JSON, if it exists and has not expired.
pub async fn load(conn: &mut AnyConnection, id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT data FROM sessions WHERE id = $1 AND expires_at > $2").bind(id).bind(now_ms()).fetch_optional(&mut *conn).await?)
}

pub async fn delete(conn: &mut AnyConnection, id: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM sessions WHERE id = $1").bind(id).execute(&mut *conn).await?;
    Ok(())
}

pub async fn delete_expired(conn: &mut AnyConnection) -> Result<u64, DbError> {
    let done = sqlx::query("DELETE FROM sessions WHERE expires_at <= $1").bind(now_ms()).execute(&mut *conn).await?;
    Ok(done.rows_affected())
}
