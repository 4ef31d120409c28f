//! Conversation memory: chat turns and per-chat summaries.

use sqlx::AnyConnection;

use super::DbError;

pub mod role {
    pub const USER: &str = "user";
    pub const ASSISTANT: &str = "assistant";
}

/// Where an assistant's turn came from, when not from normal chat's own model (`None`).
pub mod origin {
    /// The tool lane's reply to a message, or a later message a job sent (a tool's summarised
    /// answer, the note that it will follow, what an owner decided): made from tool results, so
    /// a model reads it again as data, never as instructions.
    pub const TOOL_LANE: &str = "tool_lane";
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Turn {
    pub id: i64,
    pub role: String,
    pub text: String,
    pub message_id: String,
    pub at: i64,
    pub tokens: i64,
    /// A group member's turn: the label the model reads for its writer.
    pub sender_label: Option<String>,
    /// See [`origin`].
    pub origin: Option<String>,
}

const TURN_COLUMNS: &str = "id, role, text, message_id, at, tokens, sender_label, origin";

#[derive(Debug, Clone, PartialEq)]
pub struct NewTurn<'a> {
    pub chat_id: &'a str,
    pub channel: &'a str,
    pub role: &'a str,
    pub text: &'a str,
    pub message_id: &'a str,
    pub at: i64,
    pub tokens: i64,
    /// In a group chat, the member who wrote a person's turn, and their label.
    pub sender: Option<&'a str>,
    pub sender_label: Option<&'a str>,
    /// See [`origin`].
    pub origin: Option<&'a str>,
}

/// Roughly four ASCII characters make a token, and any other character (an accent, a Chinese,
/// Thai or Arabic letter, an emoji) one at least; a few more per message for its framing. Counted
/// as four to a token, a chat in another script would pass its budget several times over.
pub fn estimate_tokens(text: &str) -> i64 {
    let (ascii, other) = text.chars().fold((0usize, 0usize), |(a, o), c| if c.is_ascii() { (a + 1, o) } else { (a, o + 1) });
    i64::try_from(ascii / 4 + other).unwrap_or(i64::MAX).saturating_add(4)
}

/// The id of a turn that is a later message to a chat: job `job_id`'s (a tool call's answer
/// sent after the reply to its message, what the person was told of an owner's decision or of a
/// call an owner stopped), kept in the chat's memory when it went out.
pub fn later_message_id(job_id: i64) -> String {
    format!("job:{job_id}")
}

/// Inserts a turn once: a second insert for the same message and role changes nothing.
/// Returns whether it was new.
pub async fn insert_turn(conn: &mut AnyConnection, t: &NewTurn<'_>) -> Result<bool, DbError> {
    let done = sqlx::query(
        "INSERT INTO chat_turns (chat_id, channel, role, text, message_id, at, tokens, sender, sender_label, origin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (message_id, role) DO NOTHING",
    )
    .bind(t.chat_id)
    .bind(t.channel)
    .bind(t.role)
    .bind(super::clean_text(t.text))
    .bind(t.message_id)
    .bind(t.at)
    .bind(t.tokens)
    .bind(t.sender)
    .bind(t.sender_label.map(super::clean_text))
    .bind(t.origin)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Inserts an assistant's turn, or replaces the text of the one its message has: a message
/// handled again whose reply came out otherwise (planned again, or past its deadline this
/// time) is remembered as it was last answered.
pub async fn upsert_answer(conn: &mut AnyConnection, t: &NewTurn<'_>) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO chat_turns (chat_id, channel, role, text, message_id, at, tokens, sender, sender_label, origin) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL, $8) \
         ON CONFLICT (message_id, role) DO UPDATE SET text = excluded.text, tokens = excluded.tokens, origin = excluded.origin",
    )
    .bind(t.chat_id)
    .bind(t.channel)
    .bind(role::ASSISTANT)
    .bind(super::clean_text(t.text))
    .bind(t.message_id)
    .bind(t.at)
    .bind(t.tokens)
    .bind(t.origin)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes the person's turn of `message_id`, stored by an earlier run of the message that
/// stopped before answering: stored again, it takes its place after what came meanwhile.
pub async fn forget_unanswered_turn(conn: &mut AnyConnection, chat_id: &str, message_id: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM chat_turns WHERE chat_id = $1 AND message_id = $2 AND role = $3").bind(chat_id).bind(message_id).bind(role::USER).execute(conn).await?;
    Ok(())
}

/// The chat's turns after `after_id`, oldest first.
pub async fn turns_after(conn: &mut AnyConnection, chat_id: &str, after_id: i64) -> Result<Vec<Turn>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {TURN_COLUMNS} FROM chat_turns WHERE chat_id = $1 AND id > $2 ORDER BY id"))
        .bind(chat_id)
        .bind(after_id)
        .fetch_all(conn)
        .await?)
}

/// The chat's last `n` turns before `before` (unix ms), oldest first.
pub async fn last_turns(conn: &mut AnyConnection, chat_id: &str, before: i64, n: i64) -> Result<Vec<Turn>, DbError> {
    let mut turns: Vec<Turn> = sqlx::query_as(&format!("SELECT {TURN_COLUMNS} FROM chat_turns WHERE chat_id = $1 AND at < $2 ORDER BY id DESC LIMIT $3"))
        .bind(chat_id)
        .bind(before)
        .bind(n)
        .fetch_all(conn)
        .await?;
    turns.reverse();
    Ok(turns)
}

/// The labels a group chat's members have had, each sender with each of their labels, in
/// order of their first turn under it.
pub async fn members(conn: &mut AnyConnection, chat_id: &str) -> Result<Vec<(String, String)>, DbError> {
    let sql = "SELECT sender, sender_label FROM chat_turns WHERE chat_id = $1 AND sender IS NOT NULL AND sender_label IS NOT NULL \
               GROUP BY sender, sender_label ORDER BY MIN(id)";
    Ok(sqlx::query_as(sql).bind(chat_id).fetch_all(conn).await?)
}

/// The text of a turn holding `message_id` (a quoted message), if Gatehouse has it.
/// The text of message `message_id` in chat `chat_id` only: a quoted id from another chat (a
/// forged context id) finds nothing.
pub async fn text_of(conn: &mut AnyConnection, chat_id: &str, message_id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT text FROM chat_turns WHERE chat_id = $1 AND message_id = $2 ORDER BY id LIMIT 1")
        .bind(chat_id)
        .bind(message_id)
        .fetch_optional(conn)
        .await?)
}

/// The assistant's stored answer to message `message_id` in chat `chat_id`: an earlier run of
/// this message that stored it but did not get to record the reply.
pub async fn answer_to(conn: &mut AnyConnection, chat_id: &str, message_id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT text FROM chat_turns WHERE chat_id = $1 AND message_id = $2 AND role = $3")
        .bind(chat_id)
        .bind(message_id)
        .bind(role::ASSISTANT)
        .fetch_optional(conn)
        .await?)
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Summary {
    #[sqlx(rename = "summary")]
    pub text: String,
    pub covers_through: i64,
}

pub async fn summary(conn: &mut AnyConnection, chat_id: &str) -> Result<Option<Summary>, DbError> {
    Ok(sqlx::query_as("SELECT summary, covers_through FROM chat_memory WHERE chat_id = $1").bind(chat_id).fetch_optional(conn).await?)
}

/// Saves the chat's summary in place of the one it was made from (`from`: its `covers_through`,
/// 0 when there was none). Another message of the chat may have compacted meanwhile: then its
/// summary stays (it is as new or newer) and this returns false.
pub async fn save_summary(conn: &mut AnyConnection, chat_id: &str, s: &Summary, from: i64, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query(
        "INSERT INTO chat_memory (chat_id, summary, covers_through, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (chat_id) DO UPDATE SET summary = excluded.summary, covers_through = excluded.covers_through, updated_at = excluded.updated_at \
         WHERE chat_memory.covers_through = $5",
    )
    .bind(chat_id)
    .bind(&s.text)
    .bind(s.covers_through)
    .bind(now)
    .bind(from)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The runtime's earlier answer to a message.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EarlierReply {
    pub route: String,
    pub reply: Option<String>,
    pub trace_id: i64,
}

pub async fn earlier_reply(conn: &mut AnyConnection, message_id: &str) -> Result<Option<EarlierReply>, DbError> {
    let sql = "SELECT route, reply, trace_id FROM message_replies WHERE message_id = $1";
    Ok(sqlx::query_as(sql).bind(message_id).fetch_optional(conn).await?)
}

/// Records the answer once; a second record for the same message changes nothing and is
/// false.
pub async fn record_reply(conn: &mut AnyConnection, message_id: &str, route: &str, reply: Option<&str>, trace_id: i64, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query("INSERT INTO message_replies (message_id, route, reply, trace_id, at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (message_id) DO NOTHING")
        .bind(message_id)
        .bind(route)
        .bind(reply.map(super::clean_text))
        .bind(trace_id)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
