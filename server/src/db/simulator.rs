//! Messages of simulated chats, and the chat list of the Conversations page (simulated and
//! WhatsApp chats).

use sqlx::AnyConnection;

use super::DbError;

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ChatMessage {
    /// `in` (to the bot) or `out` (from the bot).
    pub direction: String,
    pub sender: String,
    pub text: String,
    pub message_id: String,
    /// received, queued, sent, delivered, read or failed.
    pub state: String,
    pub error_code: Option<String>,
    pub trace_id: Option<i64>,
    pub at: i64,
}

#[derive(Clone, Copy)]
pub struct NewSimMessage<'a> {
    pub chat_id: &'a str,
    pub direction: &'a str,
    pub sender: &'a str,
    pub text: &'a str,
    pub message_id: &'a str,
    pub state: &'a str,
    pub trace_id: Option<i64>,
    pub at: i64,
    /// In a group chat (else a direct one).
    pub group: bool,
}

/// Inserts a message unless one with its `message_id` is stored; returns whether it was new.
pub async fn insert_once(conn: &mut AnyConnection, m: &NewSimMessage<'_>) -> Result<bool, DbError> {
    Ok(insert_with(conn, m, "ON CONFLICT (message_id) DO NOTHING").await? == 1)
}

/// Whether a message with `message_id` is stored.
pub async fn has_message(conn: &mut AnyConnection, message_id: &str) -> Result<bool, DbError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM simulator_messages WHERE message_id = $1").bind(message_id).fetch_one(conn).await?;
    Ok(n > 0)
}

pub async fn insert(conn: &mut AnyConnection, m: &NewSimMessage<'_>) -> Result<(), DbError> {
    insert_with(conn, m, "").await.map(|_| ())
}

/// Inserts `m`, the statement ending with `on_conflict`; returns the rows inserted.
/// The text is cleaned first (a NUL, which PostgreSQL refuses, is removed), as every other
/// stored message text is.
async fn insert_with(conn: &mut AnyConnection, m: &NewSimMessage<'_>, on_conflict: &str) -> Result<u64, DbError> {
    let sql = format!(
        "INSERT INTO simulator_messages (chat_id, direction, sender, text, message_id, state, trace_id, at, is_group) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) {on_conflict}"
    );
    let done = sqlx::query(&sql)
        .bind(m.chat_id)
        .bind(m.direction)
        .bind(m.sender)
        .bind(super::clean_text(m.text))
        .bind(m.message_id)
        .bind(m.state)
        .bind(m.trace_id)
        .bind(m.at)
        .bind(i64::from(m.group))
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ChatSummary {
    pub channel: String,
    pub chat_id: String,
    /// A WhatsApp customer's latest profile name (not a group's: its senders differ).
    pub name: Option<String>,
    pub messages: i64,
    pub last_at: i64,
}

/// Every chat, simulated and WhatsApp, most recent first (from `chats`, which triggers keep as
/// messages are stored, through `chats_last`), each WhatsApp customer's with their name.
pub async fn chats(conn: &mut AnyConnection, limit: i64) -> Result<Vec<ChatSummary>, DbError> {
    Ok(sqlx::query_as(CHATS).bind(limit).fetch_all(conn).await?)
}

/// The query [`chats`] runs (`$1` how many).
pub const CHATS: &str = "SELECT channel, chat_id, name, messages, last_at FROM chats ORDER BY last_at DESC LIMIT $1";

/// Whether a chat is a group, as its latest incoming message says (false when it has none).
pub async fn is_group(conn: &mut AnyConnection, channel: &str, chat_id: &str) -> Result<bool, DbError> {
    let sql = if channel == "simulator" {
        "SELECT is_group FROM simulator_messages WHERE chat_id = $1 AND direction = 'in' ORDER BY id DESC LIMIT 1"
    } else {
        "SELECT is_group FROM whatsapp_inbound WHERE chat_id = $1 ORDER BY id DESC LIMIT 1"
    };
    let group: Option<i64> = sqlx::query_scalar(sql).bind(chat_id).fetch_optional(conn).await?;
    Ok(group.is_some_and(|g| g != 0))
}

/// A WhatsApp chat's newest messages both ways (`$1` the chat, `$2` how many), newest first, with
/// each incoming one's newest trace. Each side's newest `$2` are taken first (by their chat
/// indexes), and only those look up their trace (by `traces_message`): not every message the
/// chat ever had.
pub const WHATSAPP_CHAT_MESSAGES: &str = "SELECT m.direction, m.sender, m.text, m.message_id, m.state, m.error_code, \
       CASE WHEN m.direction = 'in' THEN (SELECT MAX(t.id) FROM traces t WHERE t.message_id = m.message_id) END AS trace_id, m.at FROM ( \
     SELECT * FROM (SELECT 'in' AS direction, i.sender AS sender, COALESCE(i.text, '[' || i.msg_type || ']') AS text, i.wamid AS message_id, \
            'received' AS state, NULL AS error_code, i.received_at AS at FROM whatsapp_inbound i WHERE i.chat_id = $1 ORDER BY i.id DESC LIMIT $2) AS i \
     UNION ALL \
     SELECT * FROM (SELECT 'out' AS direction, 'bot' AS sender, o.body AS text, o.idempotency_key AS message_id, o.state AS state, \
            o.error_code AS error_code, o.created_at AS at FROM whatsapp_outbound o WHERE o.recipient = $1 ORDER BY o.id DESC LIMIT $2) AS o \
   ) AS m ORDER BY m.at DESC LIMIT $2";

/// One chat's messages, oldest first, with delivery states and trace links.
pub async fn messages(conn: &mut AnyConnection, channel: &str, chat_id: &str, limit: i64) -> Result<Vec<ChatMessage>, DbError> {
    let sql = if channel == "simulator" {
        "SELECT direction, sender, text, message_id, state, NULL AS error_code, trace_id, at FROM simulator_messages WHERE chat_id = $1 ORDER BY id DESC LIMIT $2"
    } else {
        WHATSAPP_CHAT_MESSAGES
    };
    let mut out: Vec<ChatMessage> = sqlx::query_as(sql).bind(chat_id).bind(limit).fetch_all(conn).await?;
    out.reverse();
    Ok(out)
}
