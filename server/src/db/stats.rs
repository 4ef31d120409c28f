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

/// What a chart counts, by time bucket and series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Messages (traces) by route.
    MessagesByRoute,
    /// Tool calls by the checkpoint's decision (allow, deny, needs_approval).
    ToolCallsByDecision,
    /// Model cost in micro-dollars by purpose (chat, planner, summarizer, ...).
    ModelCostByPurpose,
}

impl Measure {
    /// `$1`: from when (ms), `$2`: the bucket length (ms).
    fn sql(self) -> &'static str {
        match self {
            Self::MessagesByRoute => {
                "SELECT CAST(started_at / $2 AS BIGINT) AS bucket, route AS series, CAST(COUNT(*) AS BIGINT) AS value \
                 FROM traces WHERE started_at >= $1 GROUP BY 1, 2"
            }
            Self::ToolCallsByDecision => {
                "SELECT CAST(at / $2 AS BIGINT) AS bucket, decision AS series, CAST(COUNT(*) AS BIGINT) AS value \
                 FROM tool_audit WHERE at >= $1 GROUP BY 1, 2"
            }
            Self::ModelCostByPurpose => {
                "SELECT CAST(at / $2 AS BIGINT) AS bucket, purpose AS series, CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS value \
                 FROM llm_calls WHERE at >= $1 GROUP BY 1, 2"
            }
        }
    }
}

/// `measure` per `bucket_ms` from `since_ms` on.
pub async fn grouped(conn: &mut AnyConnection, measure: Measure, since_ms: i64, bucket_ms: i64) -> Result<Vec<Group>, DbError> {
    Ok(sqlx::query_as(measure.sql()).bind(since_ms).bind(bucket_ms).fetch_all(conn).await?)
}
