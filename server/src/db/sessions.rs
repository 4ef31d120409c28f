//! Console sessions, stored as JSON records for tower-sessions, and what the forms of a session
//! last answered, kept for the page each post is sent back to.

use sqlx::AnyConnection;

use super::{DbError, now_ms, sha256_hex};

/// What a session is stored under: the hex SHA-256 of its id, never the id itself (the cookie's
/// value), so reading the table gives no one a session. The id is 128 random bits: a plain
/// digest is enough.
fn key(id: &str) -> String {
    sha256_hex(id)
}

/// Updates an existing session only: a session deleted meanwhile (logout, id cycling) must
/// not be brought back by a request that loaded it earlier.
pub async fn update(conn: &mut AnyConnection, id: &str, data: &str, expires_at: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE sessions SET data = $1, expires_at = $2 WHERE id = $3")
        .bind(data)
        .bind(expires_at)
        .bind(key(id))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Inserts only when the id is free; false on a collision.
pub async fn insert_new(conn: &mut AnyConnection, id: &str, data: &str, expires_at: i64) -> Result<bool, DbError> {
    let done = sqlx::query("INSERT INTO sessions (id, data, expires_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING")
        .bind(key(id))
        .bind(data)
        .bind(expires_at)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The record's JSON, if it exists and has not expired.
pub async fn load(conn: &mut AnyConnection, id: &str) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT data FROM sessions WHERE id = $1 AND expires_at > $2").bind(key(id)).bind(now_ms()).fetch_optional(&mut *conn).await?)
}

/// Deletes a session with the form answers and input kept for it.
pub async fn delete(conn: &mut AnyConnection, id: &str) -> Result<(), DbError> {
    let key = key(id);
    sqlx::query("DELETE FROM sessions WHERE id = $1").bind(&key).execute(&mut *conn).await?;
    sqlx::query("DELETE FROM form_answers WHERE session_id = $1").bind(&key).execute(&mut *conn).await?;
    Ok(())
}

/// Deletes the expired sessions, and the form answers and input no page took in time (what a
/// refused form held stays no longer than [`FORM_ANSWER_TTL_MS`], whether or not another form
/// is posted).
pub async fn delete_expired(conn: &mut AnyConnection) -> Result<u64, DbError> {
    let now = now_ms();
    let done = sqlx::query("DELETE FROM sessions WHERE expires_at <= $1").bind(now).execute(&mut *conn).await?;
    sqlx::query("DELETE FROM form_answers WHERE created_at <= $1").bind(now - FORM_ANSWER_TTL_MS).execute(&mut *conn).await?;
    Ok(done.rows_affected())
}

/// How long a form's answer waits for its page: the browser follows the redirect at once.
pub const FORM_ANSWER_TTL_MS: i64 = 10 * 60 * 1000;

/// Keeps what a plain form post to the server function at `path` answered, for the session's
/// next page (replacing an earlier answer of the same function), and drops answers no page took.
pub async fn keep_form_answer(conn: &mut AnyConnection, session_id: &str, path: &str, answer: &str) -> Result<(), DbError> {
    let now = now_ms();
    sqlx::query("DELETE FROM form_answers WHERE created_at <= $1").bind(now - FORM_ANSWER_TTL_MS).execute(&mut *conn).await?;
    sqlx::query(
        "INSERT INTO form_answers (session_id, path, answer, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (session_id, path) DO UPDATE SET answer = excluded.answer, created_at = excluded.created_at",
    )
    .bind(key(session_id))
    .bind(path)
    .bind(answer)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes (deletes and returns) the kept answer of the server function at `path`, if it is
/// still fresh.
pub async fn take_form_answer(conn: &mut AnyConnection, session_id: &str, path: &str) -> Result<Option<String>, DbError> {
    // Read first: every render of a page with a form asks (for its answer and for kept input),
    // and almost always nothing is kept; a delete would be a write each time (on SQLite one
    // that waits for the write lock).
    let session = key(session_id);
    let kept: Option<i64> = sqlx::query_scalar("SELECT 1 FROM form_answers WHERE session_id = $1 AND path = $2").bind(&session).bind(path).fetch_optional(&mut *conn).await?;
    if kept.is_none() {
        return Ok(None);
    }
    let taken: Option<(String, i64)> = sqlx::query_as("DELETE FROM form_answers WHERE session_id = $1 AND path = $2 RETURNING answer, created_at")
        .bind(&session)
        .bind(path)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(taken.filter(|(_, at)| *at > now_ms() - FORM_ANSWER_TTL_MS).map(|(answer, _)| answer))
}
