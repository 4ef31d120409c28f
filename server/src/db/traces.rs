//! Traces of processed messages and their steps.

use sqlx::AnyConnection;

use super::{DbError, SetFilters};

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Step {
    pub step: String,
    pub decision: String,
    pub reason_code: String,
    pub duration_us: i64,
    /// A JSON object.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
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

/// A step appended to a finished trace. Once its transaction has committed, hand it to
/// `Telemetry::appended`, which exports it into the trace its message's export began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "exported only when handed to Telemetry::appended once its transaction commits"]
pub struct Appended {
    pub trace_id: i64,
    /// Its place among the trace's steps.
    pub seq: i64,
    /// It failed the trace (`traces::append_failure`).
    pub failed: bool,
}

/// The outcome of a trace whose message is still being handled.
pub const RUNNING: &str = "running";

/// The newest trace of a message with a given outcome (`$1` channel, `$2` message, `$3`
/// outcome), as [`begin`] looks for one left running on every message handled, through
/// `traces_message`.
pub const RUNNING_OF_MESSAGE: &str = "SELECT id FROM traces WHERE channel = $1 AND message_id = $2 AND outcome = $3 ORDER BY id DESC LIMIT 1";

/// Starts a trace for a message, or returns the one an earlier, interrupted attempt left
/// running (a process that died mid-message: its retry continues that trace). An attempt that
/// failed and said so ended its trace as failed, so its retry begins a new one.
/// `sender` is the group member who sent the message (none in a direct chat, whose sender is
/// the chat). Returns its id and how many steps it already has.
pub async fn begin(conn: &mut AnyConnection, t: &TraceRow, sender: Option<&str>) -> Result<(i64, i64), DbError> {
    let earlier: Option<(i64,)> =
        sqlx::query_as(RUNNING_OF_MESSAGE)
            .bind(&t.channel)
            .bind(&t.message_id)
            .bind(RUNNING)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((id,)) = earlier {
        let (steps,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM trace_steps WHERE trace_id = $1").bind(id).fetch_one(&mut *conn).await?;
        return Ok((id, steps));
    }
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO traces (correlation_id, channel, chat_id, message_id, actor, route, outcome, error_code, started_at, duration_us, sender) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
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
    .bind(sender)
    .fetch_one(&mut *conn)
    .await?;
    Ok((id, 0))
}

/// Writes a trace's steps from `first_seq` on and its final actor, route, outcome and duration.
pub async fn finish(conn: &mut AnyConnection, t: &TraceRow, first_seq: i64, steps: &[Step]) -> Result<(), DbError> {
    insert_steps(&mut *conn, t.id, first_seq, steps).await?;
    sqlx::query("UPDATE traces SET actor = $1, route = $2, outcome = $3, error_code = $4, duration_us = $5 WHERE id = $6")
        .bind(&t.actor)
        .bind(&t.route)
        .bind(&t.outcome)
        .bind(&t.error_code)
        .bind(t.duration_us)
        .bind(t.id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Writes `steps` of a running trace from `first_seq` on, or after the last step already
/// stored when that is further (a step appended meanwhile: an owner's decision made while the
/// message still waits, say), so no two steps share a number. Returns the number after them.
pub async fn insert_steps(conn: &mut AnyConnection, trace_id: i64, first_seq: i64, steps: &[Step]) -> Result<i64, DbError> {
    if steps.is_empty() {
        return Ok(first_seq);
    }
    lock_for_steps(&mut *conn, trace_id).await?;
    let (stored,): (i64,) = sqlx::query_as("SELECT COALESCE(MAX(seq), -1) + 1 FROM trace_steps WHERE trace_id = $1").bind(trace_id).fetch_one(&mut *conn).await?;
    let first_seq = first_seq.max(stored);
    let sql = format!("INSERT INTO trace_steps (trace_id, seq, step, decision, reason_code, duration_us, detail) VALUES {}", super::value_rows(super::backend_of(conn), steps.len(), 7));
    let mut q = sqlx::query(&sql);
    for (i, s) in steps.iter().enumerate() {
        q = q.bind(trace_id).bind(first_seq + i as i64).bind(&s.step).bind(&s.decision).bind(&s.reason_code).bind(s.duration_us).bind(&s.detail);
    }
    q.execute(conn).await?;
    super::events::ring();
    Ok(first_seq + steps.len() as i64)
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

/// A trace in the list, with its message's text as its channel keeps it (none for media).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Listed {
    #[sqlx(flatten)]
    pub trace: TraceRow,
    pub text: Option<String>,
}

/// Newest first, each with its message's text (as [`inbound_text`] finds it). Only the filters
/// that are set enter the query, so that each can use its index (`traces_chat`,
/// `traces_outcome`, `traces_started`); a condition such as `($1 = '' OR chat_id = $1)` can use
/// none, and a rare filter then reads the whole table.
pub async fn list(conn: &mut AnyConnection, f: &TraceFilter, limit: i64) -> Result<Vec<Listed>, DbError> {
    let sql = list_sql(f);
    Ok(set_filters(f).bind(sqlx::query_as(&sql)).bind(limit).fetch_all(conn).await?)
}

fn set_filters(f: &TraceFilter) -> SetFilters<'_> {
    fn text(v: &str) -> Option<&str> {
        Some(v).filter(|v| !v.is_empty())
    }
    let number = |v: i64| Some(v).filter(|v| *v > 0);
    SetFilters::new(
        [("chat_id =", text(&f.chat_id)), ("route =", text(&f.route)), ("outcome =", text(&f.outcome)), ("error_code =", text(&f.error_code))],
        [("started_at >=", number(f.since_ms)), ("id <", number(f.before_id))],
    )
}

/// The query [`list`] runs for `f`: its filters' values are `$1`, `$2`, ... in the order of
/// [`TraceFilter`]'s fields, and the limit comes last.
pub fn list_sql(f: &TraceFilter) -> String {
    let (conditions, limit) = set_filters(f).conditions();
    format!(
        "SELECT t.*, {} AS text FROM (SELECT {COLUMNS} FROM traces WHERE 1 = 1{conditions} ORDER BY id DESC LIMIT ${limit}) t ORDER BY t.id DESC",
        text_of("t.message_id")
    )
}

/// Traces after `after_id`, oldest first (the evals scan, which stops at one still running).
pub async fn after(conn: &mut AnyConnection, after_id: i64, limit: i64) -> Result<Vec<TraceRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM traces WHERE id > $1 ORDER BY id LIMIT $2");
    Ok(sqlx::query_as(&sql).bind(after_id).bind(limit).fetch_all(conn).await?)
}

/// SQL for the text of the inbound message whose id is `id` (a column or a parameter), as its
/// channel stored it (WhatsApp or the simulator); NULL when it has none.
fn text_of(id: &str) -> String {
    format!(
        "COALESCE((SELECT w.text FROM whatsapp_inbound w WHERE w.wamid = {id}), \
           (SELECT s.text FROM simulator_messages s WHERE s.message_id = {id} AND s.direction = 'in'))"
    )
}

/// The text of an inbound message as its channel stored it (WhatsApp or the simulator).
pub async fn inbound_text(conn: &mut AnyConnection, message_id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(&format!("SELECT {}", text_of("$1"))).bind(message_id).fetch_one(conn).await?)
}

/// The newest trace of a chat before `before_id` that was not an owner command or a duplicate,
/// nor of message `message_id` itself (an owner's `/wrong` marks the answer before it; a `/wrong`
/// handled again after its first run failed would otherwise mark that run's trace).
pub async fn previous_in_chat(conn: &mut AnyConnection, channel: &str, chat_id: &str, message_id: &str, before_id: i64) -> Result<Option<i64>, DbError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT id FROM traces WHERE channel = $1 AND chat_id = $2 AND message_id <> $3 AND id < $4 AND route NOT IN ('owner_command', 'duplicate') ORDER BY id DESC LIMIT 1",
    )
    .bind(channel)
    .bind(chat_id)
    .bind(message_id)
    .bind(before_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(id,)| id))
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<(TraceRow, Vec<Step>)>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM traces WHERE id = $1");
    let Some(trace) = sqlx::query_as(&sql).bind(id).fetch_optional(&mut *conn).await? else { return Ok(None) };
    let steps: Vec<Step> = sqlx::query_as("SELECT step, decision, reason_code, duration_us, detail FROM trace_steps WHERE trace_id = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Some((trace, steps)))
}

/// On PostgreSQL, takes the trace's row lock for the rest of the caller's transaction before
/// its next step number is read: two transactions adding steps to one trace at once (a reply's
/// delivery and a later answer, say) would otherwise both read the same `MAX(seq)` under READ
/// COMMITTED. The second reads after the first commits. SQLite has one writer at a time.
async fn lock_for_steps(conn: &mut AnyConnection, trace_id: i64) -> Result<(), DbError> {
    if super::backend_of(conn) == super::Backend::Postgres {
        sqlx::query("SELECT id FROM traces WHERE id = $1 FOR UPDATE").bind(trace_id).fetch_optional(&mut *conn).await?;
    }
    Ok(())
}

/// Appends a step to a stored trace (the channel adds delivery once the reply is sent) and
/// returns its place in the trace. Call it in a transaction (see [`lock_for_steps`]).
pub async fn append_step(conn: &mut AnyConnection, trace_id: i64, s: &Step) -> Result<i64, DbError> {
    lock_for_steps(&mut *conn, trace_id).await?;
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO trace_steps (trace_id, seq, step, decision, reason_code, duration_us, detail) \
         SELECT $1, COALESCE(MAX(seq), -1) + 1, $2, $3, $4, $5, $6 FROM trace_steps WHERE trace_id = $1 RETURNING seq",
    )
    .bind(trace_id)
    .bind(&s.step)
    .bind(&s.decision)
    .bind(&s.reason_code)
    .bind(s.duration_us)
    .bind(&s.detail)
    .fetch_one(conn)
    .await?;
    super::events::ring();
    Ok(seq)
}

/// Appends `step` to a finished trace and marks the whole trace failed with the step's reason
/// code: a reply the runtime gave that WhatsApp then refused or could not deliver, so the
/// Traces page's outcome and error-code filters find it.
pub async fn append_failure(conn: &mut AnyConnection, trace_id: i64, step: &Step) -> Result<i64, DbError> {
    let seq = append_step(&mut *conn, trace_id, step).await?;
    sqlx::query("UPDATE traces SET outcome = 'failed', error_code = $1 WHERE id = $2").bind(&step.reason_code).bind(trace_id).execute(conn).await?;
    Ok(seq)
}

/// Whether a later message about trace `trace_id`'s message went out on WhatsApp (a tool's
/// answer, an owner's decision: the `later_delivery` steps the channel's outbox appends).
pub async fn later_delivery_sent(conn: &mut AnyConnection, trace_id: i64) -> Result<bool, DbError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM trace_steps WHERE trace_id = $1 AND step = 'later_delivery' AND decision = 'sent'").bind(trace_id).fetch_one(conn).await?;
    Ok(n > 0)
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

/// How many messages of one chat (with `sender`, of that group member only) began a trace
/// since `since_ms` (the rate limits), leaving out those whose trace ended on one of the
/// `uncounted` routes and the `owner` actor's (an owner in a group does not use up its
/// customers' limit).
pub async fn count_for_chat(conn: &mut AnyConnection, channel: &str, chat_id: &str, sender: Option<&str>, since_ms: i64, uncounted: &[&str], owner: &str) -> Result<i64, DbError> {
    let first = if sender.is_some() { 6 } else { 5 };
    let skip = if uncounted.is_empty() { String::new() } else { format!(" AND route NOT IN ({})", (first..first + uncounted.len()).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")) };
    let member = if sender.is_some() { " AND sender = $5" } else { "" };
    let sql = format!("SELECT COUNT(*) FROM traces WHERE chat_id = $1 AND channel = $2 AND started_at >= $3 AND actor <> $4{member}{skip}");
    let mut query = sqlx::query_scalar(&sql).bind(chat_id).bind(channel).bind(since_ms).bind(owner);
    if let Some(sender) = sender {
        query = query.bind(sender);
    }
    for route in uncounted {
        query = query.bind(*route);
    }
    let n: i64 = query.fetch_one(&mut *conn).await?;
    Ok(n)
}
