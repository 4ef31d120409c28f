//! Model calls with their tokens, cost and outcome. No message text and no keys are stored.

use sqlx::AnyConnection;

use super::DbError;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct LlmCallRow {
    pub at: i64,
    pub provider: String,
    /// The configured model that was asked.
    pub model: String,
    pub purpose: String,
    pub correlation_id: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    /// `None` when the model has no price in `[models]`.
    pub cost_micro_usd: Option<i64>,
    pub latency_ms: i64,
    /// `ok` or an `LLM_*` error code.
    pub outcome: String,
    pub stop_reason: Option<String>,
    pub http_status: Option<i64>,
    pub attempts: i64,
    /// The provider's request id, for support requests.
    pub request_id: Option<String>,
}

const COLUMNS: &str = "at, provider, model, purpose, correlation_id, input_tokens, output_tokens, cache_read_tokens, \
                       cache_write_tokens, cost_micro_usd, latency_ms, outcome, stop_reason, http_status, attempts, request_id";

/// Records one call; its row id.
pub async fn insert(conn: &mut AnyConnection, r: &LlmCallRow) -> Result<i64, DbError> {
    let sql = format!("INSERT INTO llm_calls ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) RETURNING id");
    Ok(sqlx::query_scalar(&sql)
        .bind(r.at)
        .bind(&r.provider)
        .bind(&r.model)
        .bind(&r.purpose)
        .bind(&r.correlation_id)
        .bind(r.input_tokens)
        .bind(r.output_tokens)
        .bind(r.cache_read_tokens)
        .bind(r.cache_write_tokens)
        .bind(r.cost_micro_usd)
        .bind(r.latency_ms)
        .bind(&r.outcome)
        .bind(&r.stop_reason)
        .bind(r.http_status)
        .bind(r.attempts)
        .bind(&r.request_id)
        .fetch_one(&mut *conn)
        .await?)
}

/// The calls made for one correlation id (one processed message), oldest first.
pub async fn for_correlation(conn: &mut AnyConnection, correlation_id: &str) -> Result<Vec<LlmCallRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM llm_calls WHERE correlation_id = $1 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(correlation_id).fetch_all(&mut *conn).await?)
}

/// The newest calls first.
pub async fn recent(conn: &mut AnyConnection, limit: i64) -> Result<Vec<LlmCallRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM llm_calls ORDER BY id DESC LIMIT $1");
    Ok(sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?)
}

/// Total cost in micro-dollars and number of calls since `since_ms` (unpriced calls count as 0).
pub async fn cost_since(conn: &mut AnyConnection, since_ms: i64) -> Result<(i64, i64), DbError> {
    Ok(sqlx::query_as("SELECT CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT), COUNT(*) FROM llm_calls WHERE at >= $1")
        .bind(since_ms)
        .fetch_one(&mut *conn)
        .await?)
}
