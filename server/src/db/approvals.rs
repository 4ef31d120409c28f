//! Owner approvals (`approvals`): the stored call, the one decision, the run's outcome. Every
//! change of state is a conditional update, so concurrent deciders and repeated deliveries
//! change a row once.

use sqlx::AnyConnection;

use super::DbError;

/// The states of an approval, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, strum::IntoStaticStr, strum::EnumString, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum State {
    Pending,
    Approved,
    Rejected,
    Expired,
}

super::stored_name!(State, "approval state");

const COLUMNS: &str = "id, state, tool, tool_version, args, args_hash, call_key, managed_fields, display, risk, reason_code, reason, actor, channel, \
     chat_kind, chat_id, sender, message_id, request, correlation_id, trace_id, nonce, created_at, expires_at, decided_at, decided_by, \
     decider_owner_id, decider_phone, decided_via, decision_note, job_id, outcome_code, outcome_at";

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ApprovalRow {
    pub id: i64,
    #[sqlx(try_from = "String")]
    pub state: State,
    pub tool: String,
    pub tool_version: String,
    /// The canonical arguments as asked (never with a managed or secret field).
    pub args: String,
    pub args_hash: String,
    pub call_key: String,
    /// JSON array of the managed field names the runtime fills at execution.
    pub managed_fields: String,
    /// The arguments with secrets and personal data replaced: what an owner is shown.
    pub display: String,
    pub risk: String,
    pub reason_code: String,
    pub reason: String,
    pub actor: String,
    pub channel: String,
    pub chat_kind: String,
    pub chat_id: String,
    pub sender: String,
    pub message_id: String,
    pub request: String,
    pub correlation_id: String,
    pub trace_id: Option<i64>,
    pub nonce: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub decider_owner_id: Option<i64>,
    pub decider_phone: Option<String>,
    pub decided_via: Option<String>,
    pub decision_note: Option<String>,
    pub job_id: Option<i64>,
    pub outcome_code: Option<String>,
    pub outcome_at: Option<i64>,
}

/// A request as it is stored.
#[derive(Debug, Clone)]
pub struct NewApproval<'a> {
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub args: &'a str,
    pub args_hash: &'a str,
    pub call_key: &'a str,
    pub managed_fields: &'a str,
    pub display: &'a str,
    pub risk: &'a str,
    pub reason_code: &'a str,
    pub reason: &'a str,
    pub actor: &'a str,
    pub channel: &'a str,
    pub chat_kind: &'a str,
    pub chat_id: &'a str,
    pub sender: &'a str,
    pub message_id: &'a str,
    pub request: &'a str,
    pub correlation_id: &'a str,
    pub trace_id: Option<i64>,
    pub nonce: &'a str,
    pub created_at: i64,
    pub expires_at: i64,
}

/// What [`insert_or_reuse`] did.
#[derive(Debug)]
pub struct Stored {
    pub row: ApprovalRow,
    /// The pending approval of the same call was returned; nothing was stored.
    pub reused: bool,
    /// Pending rows of the same call past their expiry, settled as expired here: `(id, trace_id)`.
    pub expired: Vec<(i64, Option<i64>)>,
}

/// `decided_via` of a request that expired as the same call was asked for again
/// ([`insert_or_reuse`]): its requester is not told it expired.
pub const SUPERSEDED: &str = "superseded";

/// Stores `new`, or finds the pending approval of the same call (`call_key`) and returns it.
/// A pending row past its expiry is settled as expired first, so it never blocks a fresh
/// request. On PostgreSQL the pending row that refused the insert may be decided before it is
/// read; the insert is then tried again.
///
/// A message handled again (a retry after a crash that stored its request but not its reply)
/// finds the request it asked for (stored or found pending; see `approval_askers`), whatever
/// became of it, expired meanwhile included: an owner's decision on it is not asked for again,
/// and an approved call never gets a second approval to run on.
pub async fn insert_or_reuse(conn: &mut AnyConnection, new: &NewApproval<'_>) -> Result<Stored, DbError> {
    // Marked superseded: the same person asks for the same call again now, in another
    // message, so its expiry job does not tell them the old one expired (after, and as if
    // about, the new one). A request this very message asked for is not: handled again, the
    // message is told nothing more, and the expiry job is what tells them.
    let expired: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "UPDATE approvals SET state = 'expired', decided_at = $1, \
           decided_via = CASE WHEN EXISTS (SELECT 1 FROM approval_askers a WHERE a.approval_id = approvals.id AND a.channel = $4 AND a.message_id = $5) \
                              THEN NULL ELSE $3 END \
         WHERE call_key = $2 AND state = 'pending' AND expires_at <= $1 RETURNING id, trace_id",
    )
    .bind(new.created_at)
    .bind(new.call_key)
    .bind(SUPERSEDED)
    .bind(new.channel)
    .bind(new.message_id)
    .fetch_all(&mut *conn)
    .await?;
    // Read after the expiry: a request of this message that just expired is returned expired.
    let earlier = sqlx::query_as::<_, ApprovalRow>(&format!(
        "SELECT {COLUMNS} FROM approvals WHERE id = (SELECT approval_id FROM approval_askers WHERE channel = $1 AND message_id = $2 AND call_key = $3)"
    ))
    .bind(new.channel)
    .bind(new.message_id)
    .bind(new.call_key)
    .fetch_optional(&mut *conn)
    .await?;
    // Pending, it is the call's one pending request, which the insert below would find anyway.
    if let Some(row) = earlier {
        return Ok(Stored { row, reused: true, expired });
    }
    let mut tries = 0;
    let stored = loop {
        tries += 1;
        if let Some(row) = insert_new(conn, new).await? {
            break Stored { row, reused: false, expired };
        }
        let pending = sqlx::query_as::<_, ApprovalRow>(&format!("SELECT {COLUMNS} FROM approvals WHERE call_key = $1 AND state = 'pending'"))
            .bind(new.call_key)
            .fetch_optional(&mut *conn)
            .await?;
        match pending {
            Some(row) => break Stored { row, reused: true, expired },
            // Decided between the two statements: the call may be asked for again. A row that
            // keeps vanishing is a fault, said as the read's error.
            None if tries < 3 => continue,
            None => return Err(sqlx::Error::RowNotFound.into()),
        }
    };
    // This message asked for it, whether it stored the request or found it pending.
    sqlx::query("INSERT INTO approval_askers (channel, message_id, call_key, approval_id) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
        .bind(new.channel)
        .bind(new.message_id)
        .bind(new.call_key)
        .bind(stored.row.id)
        .execute(&mut *conn)
        .await?;
    Ok(stored)
}

/// Inserts `new` unless a pending approval of the same call holds its unique key.
async fn insert_new(conn: &mut AnyConnection, new: &NewApproval<'_>) -> Result<Option<ApprovalRow>, DbError> {
    let inserted = sqlx::query_as::<_, ApprovalRow>(&format!(
        "INSERT INTO approvals (tool, tool_version, args, args_hash, call_key, managed_fields, display, risk, reason_code, reason, actor, channel, \
         chat_kind, chat_id, sender, message_id, request, correlation_id, trace_id, nonce, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22) \
         ON CONFLICT DO NOTHING RETURNING {COLUMNS}"
    ))
    .bind(new.tool)
    .bind(new.tool_version)
    .bind(new.args)
    .bind(new.args_hash)
    .bind(new.call_key)
    .bind(new.managed_fields)
    .bind(new.display)
    .bind(new.risk)
    .bind(new.reason_code)
    .bind(new.reason)
    .bind(new.actor)
    .bind(new.channel)
    .bind(new.chat_kind)
    .bind(new.chat_id)
    .bind(new.sender)
    .bind(new.message_id)
    .bind(new.request)
    .bind(new.correlation_id)
    .bind(new.trace_id)
    .bind(new.nonce)
    .bind(new.created_at)
    .bind(new.expires_at)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(inserted)
}

/// The requests message `message_id` of `channel` asked for, oldest first.
pub async fn asked_by(conn: &mut AnyConnection, channel: &str, message_id: &str) -> Result<Vec<ApprovalRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM approvals WHERE id IN (SELECT approval_id FROM approval_askers WHERE channel = $1 AND message_id = $2) ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(channel).bind(message_id).fetch_all(&mut *conn).await?)
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<ApprovalRow>, DbError> {
    Ok(sqlx::query_as::<_, ApprovalRow>(&format!("SELECT {COLUMNS} FROM approvals WHERE id = $1")).bind(id).fetch_optional(conn).await?)
}

/// The newest `limit` approvals, in `state` if given, newest first; pending ones by age.
pub async fn list(conn: &mut AnyConnection, state: Option<State>, limit: i64) -> Result<Vec<ApprovalRow>, DbError> {
    let rows = match state {
        Some(s) => {
            sqlx::query_as::<_, ApprovalRow>(&format!("SELECT {COLUMNS} FROM approvals WHERE state = $1 ORDER BY id DESC LIMIT $2"))
                .bind(s.as_str())
                .bind(limit)
                .fetch_all(conn)
                .await?
        }
        None => sqlx::query_as::<_, ApprovalRow>(&format!("SELECT {COLUMNS} FROM approvals ORDER BY id DESC LIMIT $1")).bind(limit).fetch_all(conn).await?,
    };
    Ok(rows)
}

/// Who decided, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    pub name: String,
    pub owner_id: Option<i64>,
    /// The owner's WhatsApp number, digits only, when they have one: told the outcome.
    pub phone: Option<String>,
    /// "console", "whatsapp" or "cli".
    pub via: &'static str,
}

/// The one decision: `pending` -> `to` while unexpired. False when another decision, or the
/// expiry, came first.
pub async fn decide(conn: &mut AnyConnection, id: i64, to: State, by: &Decider, note: Option<&str>, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE approvals SET state = $1, decided_at = $2, decided_by = $3, decider_owner_id = $4, decider_phone = $5, decided_via = $6, decision_note = $7 \
         WHERE id = $8 AND state = 'pending' AND expires_at > $2",
    )
    .bind(to.as_str())
    .bind(now)
    .bind(&by.name)
    .bind(by.owner_id)
    .bind(by.phone.as_deref())
    .bind(by.via)
    .bind(note)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Settles a pending approval whose time ran out. False when it was decided (or settled) first.
pub async fn expire(conn: &mut AnyConnection, id: i64, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE approvals SET state = 'expired', decided_at = $1 WHERE id = $2 AND state = 'pending' AND expires_at <= $1")
        .bind(now)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn set_job(conn: &mut AnyConnection, id: i64, job_id: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE approvals SET job_id = $1 WHERE id = $2").bind(job_id).bind(id).execute(conn).await?;
    Ok(())
}

/// Records how the approved call's run ended (`OK` or its code); the first record stays.
pub async fn set_outcome(conn: &mut AnyConnection, id: i64, code: &str, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE approvals SET outcome_code = $1, outcome_at = $2 WHERE id = $3 AND outcome_code IS NULL")
        .bind(code)
        .bind(now)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
