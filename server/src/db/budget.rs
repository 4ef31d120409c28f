//! Model spend per period and the budget warnings already given.

use sqlx::AnyConnection;

use super::DbError;

/// What one read of the spend saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Spent {
    /// Micro-dollars spent on the calls read (calls without a price count nothing).
    pub micro_usd: i64,
    /// The highest call id among them (0 when none): on SQLite every call with a higher id
    /// was written after the read; on PostgreSQL ids are taken before their commit, so a
    /// lower id can still become visible later.
    pub through_id: i64,
}

/// The spend on model calls from `since_ms` on, as one snapshot with the newest id it holds.
pub async fn spent_since(conn: &mut AnyConnection, since_ms: i64) -> Result<Spent, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS micro_usd, CAST(COALESCE(MAX(id), 0) AS BIGINT) AS through_id \
         FROM llm_calls WHERE at >= $1",
    )
    .bind(since_ms)
    .fetch_one(conn)
    .await?)
}

/// Claims the warning at `percent` of `period`: true for the one caller that records it first.
pub async fn claim_warning(conn: &mut AnyConnection, period: &str, percent: u32, at: i64, spent: i64, budget: i64) -> Result<bool, DbError> {
    let done = sqlx::query(
        "INSERT INTO budget_warnings (period, percent, at, spent_micro_usd, budget_micro_usd) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT DO NOTHING",
    )
    .bind(period)
    .bind(i64::from(percent))
    .bind(at)
    .bind(spent)
    .bind(budget)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The shares of `period`'s budget already warned about, ascending.
pub async fn warned(conn: &mut AnyConnection, period: &str) -> Result<Vec<u32>, DbError> {
    let rows: Vec<i64> = sqlx::query_scalar("SELECT CAST(percent AS BIGINT) FROM budget_warnings WHERE period = $1 ORDER BY percent")
        .bind(period)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().filter_map(|p| u32::try_from(p).ok()).collect())
}
