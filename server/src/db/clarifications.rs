//! The tool lane's clarifying questions (`lane_clarifications`): one row per question (per
//! message that asked it), read back and marked answered when the person asked answers,
//! swept when expired.

use sqlx::AnyConnection;

use super::DbError;

const COLUMNS: &str = "id, channel, chat_id, requester, turns, tools, asked_by, answered_by, trace_id, created_at, expires_at";

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClarificationRow {
    pub id: i64,
    pub channel: String,
    pub chat_id: String,
    /// The person asked (their sender id).
    pub requester: String,
    /// JSON array of `{who, text}`, oldest first: the request, each question and each answer.
    pub turns: String,
    /// JSON array of the names of the tools the question was about.
    pub tools: String,
    /// The message whose handling asked.
    pub asked_by: String,
    /// The message that answered; none while the question is open.
    pub answered_by: Option<String>,
    pub trace_id: Option<i64>,
    pub created_at: i64,
    pub expires_at: i64,
}

/// Stores the question `row` holds (its id and `answered_by` are ignored): the one its message
/// asked, replacing what an earlier run of that message asked. Its id.
pub async fn ask(conn: &mut AnyConnection, row: &ClarificationRow) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "INSERT INTO lane_clarifications (channel, chat_id, requester, turns, tools, asked_by, answered_by, trace_id, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9) \
         ON CONFLICT (channel, asked_by) DO UPDATE SET turns = excluded.turns, tools = excluded.tools, \
         trace_id = excluded.trace_id, created_at = excluded.created_at, expires_at = excluded.expires_at RETURNING id",
    )
    .bind(&row.channel)
    .bind(&row.chat_id)
    .bind(&row.requester)
    .bind(&row.turns)
    .bind(&row.tools)
    .bind(&row.asked_by)
    .bind(row.trace_id)
    .bind(row.created_at)
    .bind(row.expires_at)
    .fetch_one(&mut *conn)
    .await?)
}

/// The question `message_id` answers, if any: the one it answered already (the message is
/// handled again), else the person's newest live question in the chat that another message
/// asked and nobody answered.
pub async fn answered_by(conn: &mut AnyConnection, channel: &str, chat_id: &str, requester: &str, message_id: &str, now: i64) -> Result<Option<ClarificationRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM lane_clarifications WHERE channel = $1 AND chat_id = $2 AND requester = $3 AND expires_at > $4 \
         AND (answered_by = $5 OR (answered_by IS NULL AND asked_by <> $5)) \
         ORDER BY CASE WHEN answered_by = $5 THEN 0 ELSE 1 END, id DESC LIMIT 1"
    ))
    .bind(channel)
    .bind(chat_id)
    .bind(requester)
    .bind(now)
    .bind(message_id)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Withdraws the open question an earlier run of `message_id` asked: the message is handled
/// again, and asks again if it still needs to. A question that run asked may never have been
/// sent.
pub async fn withdraw(conn: &mut AnyConnection, channel: &str, message_id: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM lane_clarifications WHERE channel = $1 AND asked_by = $2 AND answered_by IS NULL").bind(channel).bind(message_id).execute(&mut *conn).await?;
    Ok(())
}

/// Whether the person has a question that may concern `message_id`: a live one, or one that
/// message asked or answered (a cheap read before [`answered_by`]'s write transaction).
pub async fn any_for(conn: &mut AnyConnection, channel: &str, chat_id: &str, requester: &str, message_id: &str, now: i64) -> Result<bool, DbError> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM lane_clarifications WHERE channel = $1 AND chat_id = $2 AND requester = $3 \
         AND (expires_at > $4 OR asked_by = $5 OR answered_by = $5)",
    )
    .bind(channel)
    .bind(chat_id)
    .bind(requester)
    .bind(now)
    .bind(message_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(n > 0)
}

/// Marks question `id` answered by `message_id`, unless another message answered it first.
/// Whether it is this message's.
pub async fn take(conn: &mut AnyConnection, id: i64, message_id: &str) -> Result<bool, DbError> {
    let updated = sqlx::query("UPDATE lane_clarifications SET answered_by = $2 WHERE id = $1 AND (answered_by IS NULL OR answered_by = $2)")
        .bind(id)
        .bind(message_id)
        .execute(&mut *conn)
        .await?;
    Ok(updated.rows_affected() == 1)
}

/// One question by id, answered or expired or not (an eval case made from a trace takes the
/// question its message answered).
pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<ClarificationRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM lane_clarifications WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

/// How many questions are stored.
pub async fn count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM lane_clarifications").fetch_one(&mut *conn).await?)
}

/// Deletes the questions that expired before `before`; how many.
pub async fn sweep(conn: &mut AnyConnection, before: i64) -> Result<u64, DbError> {
    Ok(sqlx::query("DELETE FROM lane_clarifications WHERE expires_at <= $1").bind(before).execute(&mut *conn).await?.rows_affected())
}
