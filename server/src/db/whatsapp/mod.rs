//! The WhatsApp channel's SQL: inbound messages (unique on wamid), the delivery ledger of
//! outbound messages, and once-per-period notices.

mod inbound;
mod outbound;

use sqlx::AnyConnection;

pub use self::{inbound::*, outbound::*};
use super::DbError;

/// Since when Meta refuses the access token whose SHA-256 is `token`, as a process whose send it
/// refused recorded it (`None` for a refusal of another token).
pub async fn token_rejected_since(conn: &mut AnyConnection, token: &str) -> Result<Option<i64>, DbError> {
    let since: Option<Option<i64>> =
        sqlx::query_scalar("SELECT rejected_since FROM whatsapp_token WHERE id = 1 AND token_sha256 = $1").bind(token).fetch_optional(&mut *conn).await?;
    Ok(since.flatten())
}

/// Whether a refusal of any token is recorded (a cheap read before [`token_accepted`]).
pub async fn token_refusal_recorded(conn: &mut AnyConnection) -> Result<bool, DbError> {
    let since: Option<Option<i64>> = sqlx::query_scalar("SELECT rejected_since FROM whatsapp_token WHERE id = 1").fetch_optional(&mut *conn).await?;
    Ok(since.flatten().is_some())
}

/// Records that Meta refused the access token whose SHA-256 is `token` at `now`, unless it
/// already refused that one earlier; true when this recorded it.
pub async fn token_rejected(conn: &mut AnyConnection, token: &str, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE whatsapp_token SET rejected_since = $1, token_sha256 = $2 WHERE id = 1 AND (rejected_since IS NULL OR token_sha256 <> $2)")
        .bind(now)
        .bind(token)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Records that Meta takes the access token; true when a refusal had been recorded.
pub async fn token_accepted(conn: &mut AnyConnection) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE whatsapp_token SET rejected_since = NULL, token_sha256 = NULL WHERE id = 1 AND rejected_since IS NOT NULL").execute(&mut *conn).await?;
    Ok(done.rows_affected() > 0)
}

/// Claims the notice `kind` for `chat_id`: true when it was last sent before `not_since` (or
/// never). Run it in the transaction that records the message's reply, so a retried message
/// finds its reply recorded and does not claim again.
pub async fn claim_notice(conn: &mut AnyConnection, chat_id: &str, kind: &str, not_since: i64, now: i64) -> Result<bool, DbError> {
    let updated = sqlx::query("UPDATE whatsapp_notices SET job_id = 0, sent_at = $1 WHERE chat_id = $2 AND kind = $3 AND sent_at < $4")
        .bind(now)
        .bind(chat_id)
        .bind(kind)
        .bind(not_since)
        .execute(&mut *conn)
        .await?;
    if updated.rows_affected() > 0 {
        return Ok(true);
    }
    let inserted = sqlx::query("INSERT INTO whatsapp_notices (chat_id, kind, job_id, sent_at) VALUES ($1, $2, 0, $3) ON CONFLICT DO NOTHING")
        .bind(chat_id)
        .bind(kind)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(inserted.rows_affected() > 0)
}
