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
    /// Tool calls by how they ended: `OK` or the checkpoint's code (a denial, a failure).
    ToolCallsByOutcome,
    /// Replies by delivery (`delivered`, `sent`, `read`), failures by their code, by when the
    /// message they answer came in.
    RepliesByDelivery,
    /// The average wait of started jobs, from due to started, in milliseconds.
    JobWaitMs,
}

/// The first series name of a failed reply in [`Measure::RepliesByDelivery`]: `failed CODE`.
pub const FAILED_PREFIX: &str = "failed ";

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
            Self::ToolCallsByOutcome => {
                "SELECT CAST(at / $2 AS BIGINT) AS bucket, reason_code AS series, CAST(COUNT(*) AS BIGINT) AS value \
                 FROM tool_audit WHERE at >= $1 GROUP BY 1, 2"
            }
            Self::RepliesByDelivery => {
                "SELECT CAST(t.started_at / $2 AS BIGINT) AS bucket, \
                   CASE WHEN s.decision = 'failed' THEN 'failed ' || s.reason_code ELSE s.decision END AS series, \
                   CAST(COUNT(*) AS BIGINT) AS value \
                 FROM traces t JOIN trace_steps s ON s.trace_id = t.id \
                 WHERE t.started_at >= $1 AND s.step IN ('delivery', 'later_delivery', 'delivery_status') GROUP BY 1, 2"
            }
            Self::JobWaitMs => {
                "SELECT CAST(started_at / $2 AS BIGINT) AS bucket, 'average wait' AS series, \
                   CAST(AVG(CASE WHEN started_at > scheduled_at THEN started_at - scheduled_at ELSE 0 END) AS BIGINT) AS value \
                 FROM jobs WHERE started_at IS NOT NULL AND started_at >= $1 GROUP BY 1, 2"
            }
        }
    }
}

/// `measure` per `bucket_ms` from `since_ms` on.
pub async fn grouped(conn: &mut AnyConnection, measure: Measure, since_ms: i64, bucket_ms: i64) -> Result<Vec<Group>, DbError> {
    Ok(sqlx::query_as(measure.sql()).bind(since_ms).bind(bucket_ms).fetch_all(conn).await?)
}

/// Approvals waiting for an owner by age: under 5 minutes, under an hour, under a day, older
/// (bucket 0 to 3).
pub async fn approvals_waiting_by_age(
    conn: &mut AnyConnection,
    now_ms: i64,
) -> Result<Vec<(i64, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST(CASE WHEN $1 - created_at < 300000 THEN 0 WHEN $1 - created_at < 3600000 THEN 1 \
           WHEN $1 - created_at < 86400000 THEN 2 ELSE 3 END AS BIGINT) AS bucket, CAST(COUNT(*) AS BIGINT) AS n \
         FROM approvals WHERE state = 'pending' GROUP BY 1",
    )
    .bind(now_ms)
    .fetch_all(conn)
    .await?)
}

/// MCP servers by health (`connected`, `degraded`, `down`).
pub async fn mcp_servers_by_health(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT health, CAST(COUNT(*) AS BIGINT) FROM mcp_servers GROUP BY health ORDER BY health",
    )
    .fetch_all(conn)
    .await?)
}

/// What waits for an owner's decision: the dashboard's first section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, sqlx::FromRow)]
pub struct Waiting {
    /// Tool calls waiting for approval, and when the oldest was asked.
    pub approvals: i64,
    pub oldest_approval_at: Option<i64>,
    /// New or changed MCP tools in quarantine that their server still lists.
    pub mcp_tools: i64,
    /// MCP servers' forms (elicitations) not yet answered or expired.
    pub mcp_forms: i64,
    /// Repair proposals not yet applied or rejected.
    pub repairs: i64,
}

pub async fn waiting(conn: &mut AnyConnection, now_ms: i64) -> Result<Waiting, DbError> {
    Ok(sqlx::query_as(
        "SELECT CAST((SELECT COUNT(*) FROM approvals WHERE state = 'pending') AS BIGINT) AS approvals, \
           (SELECT MIN(created_at) FROM approvals WHERE state = 'pending') AS oldest_approval_at, \
           CAST((SELECT COUNT(*) FROM mcp_tools WHERE state = 'pending' AND present = 1) AS BIGINT) AS mcp_tools, \
           CAST((SELECT COUNT(*) FROM mcp_elicitations WHERE state = 'pending' AND expires_at > $1) AS BIGINT) AS mcp_forms, \
           CAST((SELECT COUNT(*) FROM repairs WHERE state = 'proposed') AS BIGINT) AS repairs",
    )
    .bind(now_ms)
    .fetch_one(conn)
    .await?)
}
