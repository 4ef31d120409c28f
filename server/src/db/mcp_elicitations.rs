//! Elicitations of MCP servers forwarded to the owners: a pending request, one answer (a
//! compare-and-set on the pending state), and the waiting call taking that answer once.

use sqlx::AnyConnection;

use super::{DbError, now_ms};

/// The states of an elicitation, as stored. Only `Pending` changes, and only once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum State {
    Pending,
    Accepted,
    Declined,
    Cancelled,
    /// Nobody answered in time (or the waiting call ended first): the server got "cancel".
    Expired,
}

super::stored_name!(State, "elicitation state");

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ElicitationRow {
    pub id: i64,
    pub server_id: String,
    pub message: String,
    pub schema: String,
    #[sqlx(try_from = "String")]
    pub state: State,
    pub content: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub answered_at: Option<i64>,
    pub answered_by: Option<i64>,
    pub delivered_at: Option<i64>,
}

impl ElicitationRow {
    /// Still waiting for an owner at `now`.
    pub fn open(&self, now: i64) -> bool {
        self.state == State::Pending && self.expires_at > now
    }
}

const COLUMNS: &str = "id, server_id, message, schema, state, content, created_at, expires_at, answered_at, answered_by, delivered_at";

/// How far back the forms a server asked for count against its `max_open`, whatever became of
/// them: a server that asks, withdraws and asks again (each form a notice to every owner)
/// gets `max_open` a minute at most.
const FLOOD_WINDOW_MS: i64 = 60_000;

/// Stores a new pending request unless the server already has `max_open` waiting, or asked for
/// `max_open` within the last minute; returns its id, or `None` when it has. Run it in a write
/// transaction: on PostgreSQL the count and the insert hold the server's lock until it ends
/// (SQLite's write transactions run one at a time).
pub async fn insert(conn: &mut AnyConnection, server: &str, message: &str, schema: &str, expires_at: i64, max_open: i64) -> Result<Option<i64>, DbError> {
    super::lock_until_commit(conn, &format!("gatehouse.mcp_elicitations:{server}")).await?;
    let now = now_ms();
    let open: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mcp_elicitations WHERE server_id = $1 AND ((state = $2 AND expires_at > $3) OR created_at > $4)")
        .bind(server)
        .bind(State::Pending.as_str())
        .bind(now)
        .bind(now.saturating_sub(FLOOD_WINDOW_MS))
        .fetch_one(&mut *conn)
        .await?;
    if open >= max_open {
        return Ok(None);
    }
    Ok(Some(
        sqlx::query_scalar("INSERT INTO mcp_elicitations (server_id, message, schema, state, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id")
            .bind(server)
            .bind(message)
            .bind(schema)
            .bind(State::Pending.as_str())
            .bind(now)
            .bind(expires_at)
            .fetch_one(&mut *conn)
            .await?,
    ))
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<ElicitationRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM mcp_elicitations WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

/// Requests still waiting for an owner, oldest first.
pub async fn open(conn: &mut AnyConnection, limit: i64) -> Result<Vec<ElicitationRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM mcp_elicitations WHERE state = $1 AND expires_at > $2 ORDER BY id LIMIT $3"))
        .bind(State::Pending.as_str())
        .bind(now_ms())
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?)
}

/// An owner's answer: only a pending request that has not expired takes it. Returns whether it
/// did (false: answered by someone else first, expired, or unknown).
pub async fn answer(conn: &mut AnyConnection, id: i64, new_state: State, content: Option<&str>, owner_id: Option<i64>) -> Result<bool, DbError> {
    let now = now_ms();
    let done = sqlx::query("UPDATE mcp_elicitations SET state = $2, content = $3, answered_at = $4, answered_by = $5 WHERE id = $1 AND state = $6 AND expires_at > $4")
        .bind(id)
        .bind(new_state.as_str())
        .bind(content)
        .bind(now)
        .bind(owner_id)
        .bind(State::Pending.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The waiting call gives up (its time ran out, or the server withdrew the request): a request
/// still pending becomes expired. Returns whether it was still pending.
pub async fn expire(conn: &mut AnyConnection, id: i64) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE mcp_elicitations SET state = $2, answered_at = $3 WHERE id = $1 AND state = $4")
        .bind(id)
        .bind(State::Expired.as_str())
        .bind(now_ms())
        .bind(State::Pending.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The waiting call takes the answer: true only the first time, so an answer reaches the
/// server once even if two waiters looked at the same row.
pub async fn take(conn: &mut AnyConnection, id: i64) -> Result<bool, DbError> {
    let done =
        sqlx::query("UPDATE mcp_elicitations SET delivered_at = $2 WHERE id = $1 AND state <> $3 AND delivered_at IS NULL").bind(id).bind(now_ms()).bind(State::Pending.as_str()).execute(&mut *conn).await?;
    Ok(done.rows_affected() == 1)
}
