//! The tool context store (`tool_contexts`): a chat's recent summarised tool results, read back
//! for follow-ups. Bounded per chat on every write; expired rows are swept by a periodic job.

use sqlx::AnyConnection;

use super::DbError;

const COLUMNS: &str = "id, channel, chat_id, requester, tool, args, summary, preview, sources, citations, entities, source_key, trace_id, created_at, expires_at";

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ContextRow {
    pub id: i64,
    pub channel: String,
    pub chat_id: String,
    /// The sender whose message made the call (`None` for a context kept before it was
    /// recorded): in a group, only they are offered it again.
    pub requester: Option<String>,
    pub tool: String,
    /// Canonical JSON, without managed or secret fields.
    pub args: String,
    pub summary: String,
    pub preview: String,
    /// JSON array of links.
    pub sources: String,
    /// JSON array of `{title, url}`: the listed items that have both.
    pub citations: String,
    /// JSON array of names, titles and links, in result order.
    pub entities: String,
    pub source_key: String,
    pub trace_id: Option<i64>,
    pub created_at: i64,
    pub expires_at: i64,
}

/// Stores `row` (its id is ignored) unless a row with its `source_key` exists, then keeps only
/// the chat's `keep` newest rows. The new row's id, or `None` when it was there already.
pub async fn insert(conn: &mut AnyConnection, row: &ContextRow, keep: i64) -> Result<Option<i64>, DbError> {
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO tool_contexts (channel, chat_id, tool, args, summary, preview, sources, citations, entities, source_key, trace_id, created_at, expires_at, requester) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (source_key) DO NOTHING RETURNING id",
    )
    .bind(&row.channel)
    .bind(&row.chat_id)
    .bind(&row.tool)
    .bind(&row.args)
    .bind(&row.summary)
    .bind(&row.preview)
    .bind(&row.sources)
    .bind(&row.citations)
    .bind(&row.entities)
    .bind(&row.source_key)
    .bind(row.trace_id)
    .bind(row.created_at)
    .bind(row.expires_at)
    .bind(&row.requester)
    .fetch_optional(&mut *conn)
    .await?;
    sqlx::query(
        "DELETE FROM tool_contexts WHERE channel = $1 AND chat_id = $2 AND id NOT IN \
         (SELECT id FROM tool_contexts WHERE channel = $1 AND chat_id = $2 ORDER BY id DESC LIMIT $3)",
    )
    .bind(&row.channel)
    .bind(&row.chat_id)
    .bind(keep)
    .execute(&mut *conn)
    .await?;
    Ok(inserted)
}

/// The chat's contexts that have not expired at `now`, newest first; with `requester`, only
/// those that sender's messages made.
pub async fn recent(conn: &mut AnyConnection, channel: &str, chat_id: &str, requester: Option<&str>, now: i64, limit: i64) -> Result<Vec<ContextRow>, DbError> {
    let only = if requester.is_some() { " AND requester = $5" } else { "" };
    let sql = format!("SELECT {COLUMNS} FROM tool_contexts WHERE channel = $1 AND chat_id = $2 AND expires_at > $3{only} ORDER BY id DESC LIMIT $4");
    let query = sqlx::query_as(&sql).bind(channel).bind(chat_id).bind(now).bind(limit);
    Ok(match requester {
        Some(sender) => query.bind(sender),
        None => query,
    }
    .fetch_all(&mut *conn)
    .await?)
}

/// One context by id, expired or not (an eval case made from a trace takes the contexts the
/// detector saw).
pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<ContextRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM tool_contexts WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Whether the chat has a context that expired (and is not swept yet); with `requester`, one
/// that sender's messages made.
pub async fn has_expired(conn: &mut AnyConnection, channel: &str, chat_id: &str, requester: Option<&str>, now: i64) -> Result<bool, DbError> {
    let only = if requester.is_some() { " AND requester = $4" } else { "" };
    let sql = format!("SELECT COUNT(*) FROM tool_contexts WHERE channel = $1 AND chat_id = $2 AND expires_at <= $3{only}");
    let query = sqlx::query_scalar(&sql).bind(channel).bind(chat_id).bind(now);
    let n: i64 = match requester {
        Some(sender) => query.bind(sender),
        None => query,
    }
    .fetch_one(&mut *conn)
    .await?;
    Ok(n > 0)
}

/// How many contexts are stored.
pub async fn count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tool_contexts").fetch_one(&mut *conn).await?)
}

/// Deletes the contexts expired more than `grace_ms` before `now`; how many. The grace keeps an
/// expired context long enough to say that it expired.
pub async fn sweep(conn: &mut AnyConnection, now: i64, grace_ms: i64) -> Result<u64, DbError> {
    Ok(sqlx::query("DELETE FROM tool_contexts WHERE expires_at <= $1").bind(now.saturating_sub(grace_ms)).execute(&mut *conn).await?.rows_affected())
}
