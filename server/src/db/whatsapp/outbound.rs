//! The delivery ledger of outbound messages: reservation, the send lease, and Meta's status
//! callbacks.

use sqlx::AnyConnection;

use crate::db::{DbError, IntBool, backend_of, clean_text, lease_end, lease_now};

/// A delivery state. The rank orders them: a late "delivered" never overwrites "read".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum DeliveryState {
    Queued,
    Sent,
    Delivered,
    Read,
    Failed,
}

crate::db::stored_name!(DeliveryState, "delivery state");

impl DeliveryState {
    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }

    fn rank(self) -> i64 {
        match self {
            Self::Queued => 0,
            Self::Sent => 1,
            Self::Delivered => 2,
            Self::Read => 3,
            Self::Failed => 4,
        }
    }

    /// The timestamp column this state sets (a fixed name, never caller text).
    fn at_column(self) -> &'static str {
        match self {
            Self::Queued => "created_at",
            Self::Sent => "sent_at",
            Self::Delivered => "delivered_at",
            Self::Read => "read_at",
            Self::Failed => "failed_at",
        }
    }
}

/// One outbound message to reserve in the ledger.
#[derive(Debug, Clone)]
pub struct NewOutbound<'a> {
    pub idempotency_key: &'a str,
    pub job_id: Option<i64>,
    pub part: i64,
    pub recipient: &'a str,
    pub is_group: bool,
    pub kind: &'a str,
    pub body: &'a str,
    pub quoted_id: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct OutboundRow {
    pub id: i64,
    pub idempotency_key: String,
    pub job_id: Option<i64>,
    pub part: i64,
    pub recipient: String,
    #[sqlx(try_from = "IntBool")]
    pub is_group: bool,
    pub kind: String,
    pub body: String,
    pub quoted_id: Option<String>,
    pub wamid: Option<String>,
    #[sqlx(try_from = "String")]
    pub state: DeliveryState,
    pub attempts: i64,
    pub send_started_at: Option<i64>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub sent_at: Option<i64>,
    pub delivered_at: Option<i64>,
    pub read_at: Option<i64>,
    pub failed_at: Option<i64>,
}

impl OutboundRow {
    /// Whether Meta took this part: its wamid is known, or its send was accepted with an answer
    /// that named none (sent, the status callback to fill the wamid in), or a callback moved it
    /// on. Not a part queued or failed.
    pub fn went_out(&self) -> bool {
        self.wamid.is_some() || matches!(self.state, DeliveryState::Sent | DeliveryState::Delivered | DeliveryState::Read)
    }
}

const OUTBOUND_COLUMNS: &str = "id, idempotency_key, job_id, part, recipient, is_group, kind, body, quoted_id, wamid, state, attempts, \
    send_started_at, error_code, error_message, created_at, updated_at, sent_at, delivered_at, read_at, failed_at";

/// Reserves a ledger row for `m` (or finds the one an earlier attempt reserved) and returns it.
pub async fn reserve_outbound(conn: &mut AnyConnection, m: &NewOutbound<'_>, now: i64) -> Result<OutboundRow, DbError> {
    sqlx::query(
        "INSERT INTO whatsapp_outbound (idempotency_key, job_id, part, recipient, is_group, kind, body, quoted_id, state, state_rank, \
         created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'queued', 0, $9, $9) ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(m.idempotency_key)
    .bind(m.job_id)
    .bind(m.part)
    .bind(clean_text(m.recipient))
    .bind(i64::from(m.is_group))
    .bind(m.kind)
    .bind(clean_text(m.body))
    .bind(m.quoted_id.map(clean_text))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    outbound_by_key(conn, m.idempotency_key)
        .await?
        .ok_or_else(|| DbError::Sql(sqlx::Error::RowNotFound))
}

/// Puts a part Meta refused (failed with no wamid: nothing went out) back in the queue, for a
/// later run of its job to send. Not a part refused outside the 24-hour window (131047), which
/// the window template replaces. False when the row is not such a part.
pub async fn requeue_refused(conn: &mut AnyConnection, id: i64, now: i64) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE whatsapp_outbound SET state = 'queued', state_rank = 0, failed_at = NULL, updated_at = $1 \
         WHERE id = $2 AND state = 'failed' AND wamid IS NULL AND (error_code IS NULL OR error_code <> '131047')",
    )
    .bind(now)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn outbound_by_key(conn: &mut AnyConnection, key: &str) -> Result<Option<OutboundRow>, DbError> {
    let sql = format!("SELECT {OUTBOUND_COLUMNS} FROM whatsapp_outbound WHERE idempotency_key = $1");
    Ok(sqlx::query_as(&sql).bind(key).fetch_optional(&mut *conn).await?)
}

pub async fn outbound_by_wamid(conn: &mut AnyConnection, wamid: &str) -> Result<Option<OutboundRow>, DbError> {
    let sql = format!("SELECT {OUTBOUND_COLUMNS} FROM whatsapp_outbound WHERE wamid = $1");
    Ok(sqlx::query_as(&sql).bind(wamid).fetch_optional(&mut *conn).await?)
}

/// Ledger rows of one job, in part order.
pub async fn outbound_for_job(conn: &mut AnyConnection, job_id: i64) -> Result<Vec<OutboundRow>, DbError> {
    Ok(sqlx::query_as(&outbound_for_job_sql()).bind(job_id).fetch_all(&mut *conn).await?)
}

/// The query [`outbound_for_job`] runs (`$1` the job), through `whatsapp_outbound_job`.
pub fn outbound_for_job_sql() -> String {
    format!("SELECT {OUTBOUND_COLUMNS} FROM whatsapp_outbound WHERE job_id = $1 ORDER BY id")
}

/// Ledger rows for one recipient, oldest first.
pub async fn outbound_for_recipient(conn: &mut AnyConnection, recipient: &str) -> Result<Vec<OutboundRow>, DbError> {
    let sql = format!("SELECT {OUTBOUND_COLUMNS} FROM whatsapp_outbound WHERE recipient = $1 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(recipient).fetch_all(&mut *conn).await?)
}

/// Takes the send lease of a part and records that its send is about to go out: if the process
/// dies before [`mark_sent`] or [`mark_send_failed`], the next attempt sees `send_started_at`
/// still set.
///
/// A compare-and-set: it succeeds only while the part is unsent and nobody else holds an
/// unexpired lease on it (`token` may take its own lease again). Two runs of one job (a rescued
/// lease, a second process) therefore never have the same part in flight; the loser gets
/// `false` and must not send. A crashed sender's lease runs out at `lease_until` (on PostgreSQL
/// the same length from the server's clock, see [`lease_now`]).
pub async fn mark_sending(conn: &mut AnyConnection, id: i64, token: &str, now: i64, lease_until: i64) -> Result<bool, DbError> {
    let backend = backend_of(conn);
    let sql = format!(
        "UPDATE whatsapp_outbound SET send_started_at = $1, send_token = $2, send_lease_until = {}, attempts = attempts + 1, updated_at = $1 \
         WHERE id = $4 AND state = 'queued' AND wamid IS NULL \
         AND (send_lease_until IS NULL OR send_lease_until < {} OR send_token = $2)",
        lease_end(backend, "$1", "$3"),
        lease_now(backend, "$1")
    );
    let done = sqlx::query(&sql)
    .bind(now)
    .bind(token)
    .bind(lease_until)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends `token`'s send lease without a result (the request failed in transit): the part may or
/// may not have gone out, so `send_started_at` stays, but the next attempt need not wait.
pub async fn release_send(conn: &mut AnyConnection, id: i64, token: &str, now: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE whatsapp_outbound SET send_lease_until = NULL, updated_at = $1 WHERE id = $2 AND send_token = $3")
        .bind(now)
        .bind(id)
        .bind(token)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Meta accepted the message. A status callback that arrived first may already have moved it on,
/// and a failure it reported keeps its code.
pub async fn mark_sent(conn: &mut AnyConnection, id: i64, wamid: &str, now: i64) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE whatsapp_outbound SET wamid = COALESCE($1, wamid), send_started_at = NULL, send_lease_until = NULL, \
         error_code = CASE WHEN state_rank < 1 THEN NULL ELSE error_code END, error_message = CASE WHEN state_rank < 1 THEN NULL ELSE error_message END, \
         updated_at = $2, state = CASE WHEN state_rank < 1 THEN 'sent' ELSE state END, \
         sent_at = COALESCE(sent_at, $2), state_rank = CASE WHEN state_rank < 1 THEN 1 ELSE state_rank END WHERE id = $3",
    )
    // Unknown (Meta's answer named none): left empty for the status callback to fill in.
    .bind((!wamid.is_empty()).then(|| clean_text(wamid)))
    .bind(now)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A send that Meta answered with an error: it did not go out. `failed` ends the row; otherwise
/// it stays queued for the next attempt.
pub async fn mark_send_failed(conn: &mut AnyConnection, id: i64, code: &str, message: &str, failed: bool, now: i64) -> Result<(), DbError> {
    let message: String = clean_text(message).chars().take(500).collect();
    let sql = if failed {
        "UPDATE whatsapp_outbound SET send_started_at = NULL, send_lease_until = NULL, error_code = $1, error_message = $2, updated_at = $3, \
         state = 'failed', state_rank = 4, failed_at = $3 WHERE id = $4"
    } else {
        "UPDATE whatsapp_outbound SET send_started_at = NULL, send_lease_until = NULL, error_code = $1, error_message = $2, updated_at = $3 WHERE id = $4"
    };
    sqlx::query(sql).bind(code).bind(message).bind(now).bind(id).execute(&mut *conn).await?;
    Ok(())
}

/// A status callback from Meta, as the webhook parses it.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub wamid: String,
    pub state: DeliveryState,
    pub at: i64,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// `biz_opaque_callback_data`: the idempotency key the send carried.
    pub opaque: Option<String>,
}

/// Applies a status callback. Returns whether a ledger row changed; callbacks for messages not in
/// the ledger and ones that would move a message backwards change nothing.
pub async fn apply_status(conn: &mut AnyConnection, s: &StatusUpdate, now: i64) -> Result<bool, DbError> {
    if let Some(key) = &s.opaque {
        // The send went out but the sender died before recording it, or Meta's answer named no
        // wamid: the callback tells us. Only for a part whose send began: a late callback of
        // another database's message under the same key (job ids start again after a restore)
        // must not mark a part nobody sent yet.
        sqlx::query("UPDATE whatsapp_outbound SET wamid = $1, send_started_at = NULL, send_lease_until = NULL, updated_at = $2 \
             WHERE idempotency_key = $3 AND wamid IS NULL AND (send_started_at IS NOT NULL OR state_rank >= 1)")
            .bind(clean_text(&s.wamid))
            .bind(now)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    let at_column = s.state.at_column();
    let sql = format!(
        "UPDATE whatsapp_outbound SET state = $1, state_rank = $2, updated_at = $3, {at_column} = COALESCE({at_column}, $4), \
         error_code = COALESCE($5, error_code), error_message = COALESCE($6, error_message), send_started_at = NULL \
         WHERE wamid = $7 AND state_rank < $2"
    );
    let done = sqlx::query(&sql)
        .bind(s.state.as_str())
        .bind(s.state.rank())
        .bind(now)
        .bind(s.at)
        .bind(s.error_code.as_deref().map(clean_text))
        .bind(s.error_message.as_deref().map(|m| clean_text(m).chars().take(500).collect::<String>()))
        .bind(clean_text(&s.wamid))
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() > 0)
}
