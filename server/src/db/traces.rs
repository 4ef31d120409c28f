//! Traces of processed messages and their steps.

use sqlx::{AnyConnection, Row};

use super::DbError;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Step {
    pub step: String,
    pub decision: String,
    pub reason_code: String,
    pub duration_us: i64,
    /// A JSON object.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceRow {
    pub id: i64,
    pub correlation_id: String,
    pub channel: String,
    pub chat_id: String,
    pub message_id: String,
    pub actor: String,
    pub route: String,
    pub outcome: String,
    pub error_code: Option<String>,
    pub started_at: i64,
    pub duration_us: i64,
}

/// Writes a trace with its steps; returns its id.
pub async fn insert(conn: &mut AnyConnection, t: &TraceRow, steps: &[Step]) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO traces (correlation_id, channel, chat_id, message_id, actor, route, outcome, error_code, started_at, duration_us) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(&t.correlation_id)
    .bind(&t.channel)
    .bind(&t.chat_id)
    .bind(&t.message_id)
    .bind(&t.actor)
    .bind(&t.route)
    .bind(&t.outcome)
    .bind(&t.error_code)
    .bind(t.started_at)
    .bind(t.duration_us)
    .fetch_one(&mut *conn)
    .await?;
    let id: i64 = row.try_get(0)?;
    for (seq, s) in steps.iter().enumerate() {
        sqlx::query("INSERT INTO trace_steps (trace_id, seq, step, decision, reason_code, duration_us, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(id)
            .bind(seq as i64)
            .bind(&s.step)
            .bind(&s.decision)
            .bind(&s.reason_code)
            .bind(s.duration_us)
            .bind(&s.detail)
            .execute(&mut *conn)
            .await?;
    }
    Ok(id)
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<TraceRow, sqlx::Error> {
    Ok(TraceRow {
        id: r.try_get(0)?,
        correlation_id: r.try_get(1)?,
        channel: r.try_get(2)?,
        chat_id: r.try_get(3)?,
        message_id: r.try_get(4)?,
        actor: r.try_get(5)?,
        route: r.try_get(6)?,
        outcome: r.try_get(7)?,
        error_code: r.try_get(8)?,
        started_at: r.try_get(9)?,
        duration_us: r.try_get(10)?,
    })
}

const COLUMNS: &str = "id, correlation_id, channel, chat_id, message_id, actor, route, outcome, error_code, started_at, duration_us";

/// Filters of the trace list; empty strings and zero mean "any".
#[derive(Debug, Clone, Default)]
pub struct TraceFilter {
    pub chat_id: String,
    pub route: String,
    pub outcome: String,
    pub error_code: String,
    pub since_ms: i64,
    pub before_id: i64,
}

/// Newest first.
pub async fn list(conn: &mut AnyConnection, f: &TraceFilter, limit: i64) -> Result<Vec<TraceRow>, DbError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM traces WHERE ($1 = '' OR chat_id = $1) AND ($2 = '' OR route = $2) AND ($3 = '' OR outcome = $3) \
         AND ($4 = '' OR error_code = $4) AND started_at >= $5 AND ($6 = 0 OR id < $6) ORDER BY id DESC LIMIT $7"
    );
    let rows = sqlx::query(&sql)
        .bind(&f.chat_id)
        .bind(&f.route)
        .bind(&f.outcome)
        .bind(&f.error_code)
        .bind(f.since_ms)
        .bind(f.before_id)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    rows.iter().map(row_of).collect::<Result<_, _>>().map_err(DbError::from)
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<(TraceRow, Vec<Step>)>, DbError> {
    let Some(row) = sqlx::query(&format!("SELECT {COLUMNS} FROM traces WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await? else { return Ok(None) };
    let trace = row_of(&row)?;
    let steps = sqlx::query("SELECT step, decision, reason_code, duration_us, detail FROM trace_steps WHERE trace_id = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| Ok(Step { step: r.try_get(0)?, decision: r.try_get(1)?, reason_code: r.try_get(2)?, duration_us: r.try_get(3)?, detail: r.try_get(4)? }))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some((trace, steps)))
}

/// Appends a step to a stored trace (the channel adds delivery once the reply is sent).
pub async fn append_step(conn: &mut AnyConnection, trace_id: i64, s: &Step) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO trace_steps (trace_id, seq, step, decision, reason_code, duration_us, detail) \
         SELECT $1, COALESCE(MAX(seq), -1) + 1, $2, $3, $4, $5, $6 FROM trace_steps WHERE trace_id = $1",
    )
    .bind(trace_id)
    .bind(&s.step)
    .bind(&s.decision)
    .bind(&s.reason_code)
    .bind(s.duration_us)
    .bind(&s.detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// Appends `step` to a finished trace and marks the whole trace failed with the step's reason
/// code: a reply the runtime gave that WhatsApp then refused or could not deliver, so the
/// Traces page's outcome and error-code filters find it.
pub async fn append_failure(conn: &mut AnyConnection, trace_id: i64, step: &Step) -> Result<(), DbError> {
    append_step(&mut *conn, trace_id, step).await?;
    sqlx::query("UPDATE traces SET outcome = 'failed', error_code = $1 WHERE id = $2").bind(&step.reason_code).bind(trace_id).execute(conn).await?;
    Ok(())
}

/// The trace of the message whose reply went out as `outbound_wamid` (through the delivery
/// ledger's job), if the runtime traced it.
pub async fn trace_of_outbound(conn: &mut AnyConnection, outbound_wamid: &str) -> Result<Option<i64>, DbError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT r.trace_id FROM whatsapp_outbound o JOIN jobs j ON j.id = o.job_id JOIN message_replies r ON r.message_id = j.message_id \
         WHERE o.wamid = $1",
    )
    .bind(outbound_wamid)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(id,)| id))
}
