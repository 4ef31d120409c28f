//! Counts behind the dashboard's charts, grouped by the database into a few rows each.

use sqlx::AnyConnection;

use super::DbError;

/// One group: a time bucket (its index: ms / bucket length), a series and its value.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Group {
    pub bucket: i64,
    pub series: String,
    pub value: i64,
}

/// Messages (traces) per `bucket_ms` by route, from `since_ms` on.
pub async fn messages_by_route(conn: &mut AnyConnection, since_ms: i64, bucket_ms: i64) -> Result<Vec<Group>, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST(started_at / $2 AS BIGINT) AS bucket, route AS series, CAST(COUNT(*) AS BIGINT) AS value \
         FROM traces WHERE started_at >= $1 GROUP BY 1, 2",
    )
    .bind(since_ms)
    .bind(bucket_ms)
    .fetch_all(conn)
    .await?)
}

/// Tool calls per `bucket_ms` by the checkpoint's decision (allow, deny, needs_approval).
pub async fn tool_calls_by_decision(conn: &mut AnyConnection, since_ms: i64, bucket_ms: i64) -> Result<Vec<Group>, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST(at / $2 AS BIGINT) AS bucket, decision AS series, CAST(COUNT(*) AS BIGINT) AS value \
         FROM tool_audit WHERE at >= $1 GROUP BY 1, 2",
    )
    .bind(since_ms)
    .bind(bucket_ms)
    .fetch_all(conn)
    .await?)
}

/// Model cost in micro-dollars per `bucket_ms` by purpose (chat, planner, summarizer, ...).
pub async fn model_cost_by_purpose(conn: &mut AnyConnection, since_ms: i64, bucket_ms: i64) -> Result<Vec<Group>, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST(at / $2 AS BIGINT) AS bucket, purpose AS series, CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS value \
         FROM llm_calls WHERE at >= $1 GROUP BY 1, 2",
    )
    .bind(since_ms)
    .bind(bucket_ms)
    .fetch_all(conn)
    .await?)
}
