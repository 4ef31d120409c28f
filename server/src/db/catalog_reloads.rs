//! The count of tool catalog reloads, shared by every process of a deployment (see
//! `tools::reloads`).

use sqlx::AnyConnection;

use super::DbError;

/// How many reloads have been announced so far.
pub async fn current(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT generation FROM catalog_reloads WHERE id = 1").fetch_one(conn).await?)
}

/// Counts one more reload and returns the new count; `reloaded_at` records when, for people
/// reading the database (processes compare counts, never these times).
pub async fn announce(conn: &mut AnyConnection, now: i64) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("UPDATE catalog_reloads SET generation = generation + 1, reloaded_at = $1 WHERE id = 1 RETURNING generation")
        .bind(now)
        .fetch_one(conn)
        .await?)
}
