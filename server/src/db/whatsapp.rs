//! The WhatsApp channel's SQL: inbound messages (unique on wamid), the delivery ledger of
//! outbound messages, and once-per-period notices.

use sqlx::{Any, AnyConnection, any::AnyArguments, pool::PoolConnection, query::QueryAs};

use super::{DbError, IntBool, clean_text};

/// An inbound message as the webhook stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewInbound {
    pub wamid: String,
    pub phone_number_id: String,
    pub chat_id: String,
    pub sender: String,
    /// The sender's WhatsApp profile name, when the webhook gave one (their own text).
    pub sender_name: Option<String>,
    pub is_group: bool,
    pub msg_type: String,
    pub text: Option<String>,
    pub reply_id: Option<String>,
    pub context_id: Option<String>,
    pub raw: Option<String>,
    pub raw_truncated: bool,
    pub sent_at: i64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct InboundRow {
    pub id: i64,
    pub wamid: String,
    pub phone_number_id: String,
    pub chat_id: String,
    pub sender: String,
    #[sqlx(try_from = "IntBool")]
    pub is_group: bool,
    pub msg_type: String,
    pub text: Option<String>,
    pub reply_id: Option<String>,
    pub context_id: Option<String>,
    pub raw: Option<String>,
    #[sqlx(try_from = "IntBool")]
    pub raw_truncated: bool,
    pub sent_at: i64,
    pub received_at: i64,
    pub processed_at: Option<i64>,
    pub outcome: Option<String>,
}

const INBOUND_COLUMNS: &str = "id, wamid, phone_number_id, chat_id, sender, is_group, msg_type, text, reply_id, context_id, raw, \
    raw_truncated, sent_at, received_at, processed_at, outcome";

/// Rows per multi-row `INSERT` of messages ([`INBOUND_BINDS`] binds each).
const INBOUND_CHUNK: usize = 256;

/// The values [`InboundValues::bind`] binds for a message: one per [`INBOUND_INSERT_COLUMNS`].
const INBOUND_BINDS: usize = 14;

/// Stores inbound messages, one statement per chunk; the wamid's unique index is the dedupe.
/// The result is aligned with `messages`: the id for each one stored now, `None` for a wamid
/// stored before (by an earlier delivery, or by an earlier entry of `messages`).
pub async fn insert_inbound_many(conn: &mut AnyConnection, messages: &[&NewInbound], now: i64) -> Result<Vec<Option<i64>>, DbError> {
    let mut out = Vec::with_capacity(messages.len());
    for chunk in messages.chunks(INBOUND_CHUNK) {
        let sql = inbound_insert_sql(super::backend_of(conn), chunk.len());
        let mut q = sqlx::query_as::<_, (i64, String)>(&sql);
        for m in chunk {
            q = InboundValues::from(*m).bind(q, now);
        }
        out.extend(aligned(chunk, q.fetch_all(&mut *conn).await?));
    }
    Ok(out)
}

/// The insert of `rows` messages bound one by one ([`InboundValues::bind`] on SQLite), returning
/// (id, wamid) for each one stored; a wamid stored before is skipped.
fn inbound_insert_sql(backend: super::Backend, rows: usize) -> String {
    format!(
        "INSERT INTO whatsapp_inbound ({INBOUND_INSERT_COLUMNS}) VALUES {} ON CONFLICT (wamid) DO NOTHING RETURNING id, wamid",
        super::value_rows(backend, rows, INBOUND_BINDS)
    )
}

/// Aligns the (id, wamid) pairs an insert returned with `messages`: the id for each one stored
/// now, `None` for one stored before. The first entry with a wamid took the row, so a later
/// entry with the same wamid gets `None`.
fn aligned(messages: &[&NewInbound], returned: Vec<(i64, String)>) -> Vec<Option<i64>> {
    let mut stored: std::collections::HashMap<String, i64> = returned.into_iter().map(|(id, wamid)| (wamid, id)).collect();
    messages.iter().map(|m| stored.remove(&clean_text(&m.wamid))).collect()
}

/// The columns a message is stored with, in the order both inserts give them.
const INBOUND_INSERT_COLUMNS: &str =
    "wamid, phone_number_id, chat_id, sender, sender_name, is_group, msg_type, text, reply_id, context_id, raw, raw_truncated, sent_at, received_at";

/// A message's column values as stored (a NUL is dropped from its text: PostgreSQL's text
/// cannot hold one), but for `received_at`; bound one by one on SQLite, as a JSON row that
/// `json_to_recordset` reads on PostgreSQL.
#[derive(serde::Serialize)]
struct InboundValues {
    wamid: String,
    phone_number_id: String,
    chat_id: String,
    sender: String,
    sender_name: Option<String>,
    is_group: i64,
    msg_type: String,
    text: Option<String>,
    reply_id: Option<String>,
    context_id: Option<String>,
    raw: Option<String>,
    raw_truncated: i64,
    sent_at: i64,
}

impl InboundValues {
    /// Binds these values and `received_at` for a SQLite insert into [`INBOUND_INSERT_COLUMNS`].
    fn bind<'q, O>(self, q: QueryAs<'q, Any, O, AnyArguments<'q>>, received_at: i64) -> QueryAs<'q, Any, O, AnyArguments<'q>> {
        q.bind(self.wamid)
            .bind(self.phone_number_id)
            .bind(self.chat_id)
            .bind(self.sender)
            .bind(self.sender_name)
            .bind(self.is_group)
            .bind(self.msg_type)
            .bind(self.text)
            .bind(self.reply_id)
            .bind(self.context_id)
            .bind(self.raw)
            .bind(self.raw_truncated)
            .bind(self.sent_at)
            .bind(received_at)
    }
}

impl From<&NewInbound> for InboundValues {
    fn from(m: &NewInbound) -> Self {
        let clean = |t: &Option<String>| t.as_deref().map(clean_text);
        Self {
            wamid: clean_text(&m.wamid),
            phone_number_id: clean_text(&m.phone_number_id),
            chat_id: clean_text(&m.chat_id),
            sender: clean_text(&m.sender),
            sender_name: clean(&m.sender_name),
            is_group: i64::from(m.is_group),
            msg_type: clean_text(&m.msg_type),
            text: clean(&m.text),
            reply_id: clean(&m.reply_id),
            context_id: clean(&m.context_id),
            raw: clean(&m.raw),
            raw_truncated: i64::from(m.raw_truncated),
            sent_at: m.sent_at,
        }
    }
}

/// [`insert_inbound_many`] and the enqueue of `jobs` as a transaction of their own, on a
/// connection outside any: each job names its message by `message_id` (the wamid) and is
/// written only if its message is stored now, so a message delivered again gets no second job
/// (nor does a wamid repeated in `messages`, as its jobs share a dedupe key). The result is
/// aligned with `messages`, as [`insert_inbound_many`]'s is. The caller wakes the workers.
///
/// It costs one round trip: on PostgreSQL one statement outside a transaction block, so neither
/// `BEGIN` nor `COMMIT` costs one; on SQLite one multi-statement query, so the writer
/// connection's thread is handed the work once rather than for `BEGIN`, each insert and `COMMIT`.
pub async fn insert_inbound_and_enqueue(conn: &mut PoolConnection<Any>, messages: &[&NewInbound], jobs: &[super::jobs::NewJob], now: i64) -> Result<Vec<Option<i64>>, DbError> {
    let stored = match super::backend_of(conn) {
        super::Backend::Postgres => insert_and_enqueue_postgres(conn, messages, jobs, now).await?,
        super::Backend::Sqlite => insert_and_enqueue_sqlite(conn, messages, jobs, now).await?,
    };
    if !stored.is_empty() {
        super::events::ring();
    }
    Ok(aligned(messages, stored))
}

/// [`insert_inbound_and_enqueue`] on SQLite: `BEGIN IMMEDIATE`, the jobs' inserts, the messages'
/// inserts and `COMMIT` in one query. The jobs go first, each skipped when its message is
/// already stored: with the write lock held from `BEGIN IMMEDIATE`, a message not stored yet is
/// one the inserts after them store. Their first events come from the `job_events_on_enqueue`
/// trigger. Should a statement fail, the transaction is rolled back before the error returns.
///
/// sqlx counts only the transactions it began itself, so neither it nor the pool would notice
/// one this query left open: the connection is closed instead of going back to the pool (which
/// rolls the transaction back) whenever that may be so, that is when this future is dropped
/// before the query's end, or when the `ROLLBACK` fails for another reason than finding none.
async fn insert_and_enqueue_sqlite(conn: &mut PoolConnection<Any>, messages: &[&NewInbound], jobs: &[super::jobs::NewJob], now: i64) -> Result<Vec<(i64, String)>, DbError> {
    use super::jobs::{ENQUEUE_CHUNK, INSERT_COLUMNS, SQLITE_COLUMNS, bind_sqlite};
    let mut sql = String::from("BEGIN IMMEDIATE;");
    for chunk in jobs.chunks(ENQUEUE_CHUNK) {
        sql += &format!(
            "WITH x ({INSERT_COLUMNS}) AS (VALUES {}) \
             INSERT INTO jobs ({INSERT_COLUMNS}) SELECT * FROM x \
             WHERE NOT EXISTS (SELECT 1 FROM whatsapp_inbound i WHERE i.wamid = x.message_id) \
             ON CONFLICT DO NOTHING;",
            super::value_rows(super::Backend::Sqlite, chunk.len(), SQLITE_COLUMNS)
        );
    }
    for chunk in messages.chunks(INBOUND_CHUNK) {
        sql += &inbound_insert_sql(super::Backend::Sqlite, chunk.len());
        sql += ";";
    }
    sql += "COMMIT;";
    let mut q = sqlx::query_as::<_, (i64, String)>(&sql);
    for job in jobs {
        q = bind_sqlite(q, job, now);
    }
    for m in messages {
        q = InboundValues::from(*m).bind(q, now);
    }
    let mut guard = CloseUnlessSettled { conn, settled: false };
    let stored = q.fetch_all(&mut **guard.conn).await;
    guard.settled = match &stored {
        Ok(_) => true,
        // SQLite may have rolled back already (a full disk, say): then this finds no
        // transaction, which is all right.
        Err(_) => match sqlx::query("ROLLBACK").execute(&mut **guard.conn).await {
            Ok(_) => true,
            Err(e) => e.as_database_error().is_some_and(|d| d.message().contains("no transaction is active")),
        },
    };
    Ok(stored?)
}

/// Closes a pooled connection on drop, rather than returning it to the pool, unless the
/// transaction a query began on it is known to be over.
struct CloseUnlessSettled<'c> {
    conn: &'c mut PoolConnection<Any>,
    settled: bool,
}

impl Drop for CloseUnlessSettled<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.conn.close_on_drop();
        }
    }
}

/// [`insert_inbound_and_enqueue`] on PostgreSQL: the messages' insert and the jobs' (with their
/// events, [`super::jobs::postgres_enqueue_ctes`]) are one statement, a transaction of its own.
async fn insert_and_enqueue_postgres(conn: &mut AnyConnection, messages: &[&NewInbound], jobs: &[super::jobs::NewJob], now: i64) -> Result<Vec<(i64, String)>, DbError> {
    let rows: Vec<InboundValues> = messages.iter().map(|m| InboundValues::from(*m)).collect();
    let rows = serde_json::to_string(&rows).map_err(|e| DbError::Sql(sqlx::Error::Encode(Box::new(e))))?;
    let sql = format!(
        "WITH stored AS ( \
           INSERT INTO whatsapp_inbound ({INBOUND_INSERT_COLUMNS}) \
           SELECT wamid, phone_number_id, chat_id, sender, sender_name, is_group, msg_type, text, reply_id, context_id, raw, \
             raw_truncated, sent_at, $3 \
           FROM ROWS FROM (json_to_recordset($1::json) AS (wamid TEXT, phone_number_id TEXT, chat_id TEXT, sender TEXT, \
             sender_name TEXT, is_group BIGINT, msg_type TEXT, text TEXT, reply_id TEXT, context_id TEXT, raw TEXT, \
             raw_truncated BIGINT, sent_at BIGINT)) WITH ORDINALITY AS m \
           ORDER BY m.ordinality \
           ON CONFLICT (wamid) DO NOTHING RETURNING id, wamid), \
         {enqueue} \
         SELECT id, wamid FROM stored",
        enqueue = super::jobs::postgres_enqueue_ctes("$2", "$3", "x.message_id IN (SELECT wamid FROM stored)")
    );
    Ok(sqlx::query_as(&sql).bind(rows).bind(super::jobs::postgres_batch(jobs, now)?).bind(now).fetch_all(&mut *conn).await?)
}

/// The name a chat is shown by: the latest profile name its customer sent with a message, none
/// for a group (its senders differ). A scalar subquery over the chat id `chat` (a placeholder or
/// a column), for [`sender_name`] and the console's chat list.
pub(crate) fn latest_sender_name_sql(chat: &str) -> String {
    format!("SELECT sender_name FROM whatsapp_inbound WHERE chat_id = {chat} AND is_group = 0 AND sender_name IS NOT NULL ORDER BY id DESC LIMIT 1")
}

/// The name chat `chat_id` is shown by ([`latest_sender_name_sql`]).
pub async fn sender_name(conn: &mut AnyConnection, chat_id: &str) -> Result<Option<String>, DbError> {
    let name: Option<Option<String>> = sqlx::query_scalar(&latest_sender_name_sql("$1")).bind(chat_id).fetch_optional(&mut *conn).await?;
    Ok(name.flatten())
}

pub async fn get_inbound(conn: &mut AnyConnection, id: i64) -> Result<Option<InboundRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {INBOUND_COLUMNS} FROM whatsapp_inbound WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

pub async fn inbound_by_wamid(conn: &mut AnyConnection, wamid: &str) -> Result<Option<InboundRow>, DbError> {
    let sql = format!("SELECT {INBOUND_COLUMNS} FROM whatsapp_inbound WHERE wamid = $1");
    Ok(sqlx::query_as(&sql).bind(wamid).fetch_optional(&mut *conn).await?)
}

/// The most recent inbound messages, newest first.
pub async fn recent_inbound(conn: &mut AnyConnection, limit: i64) -> Result<Vec<InboundRow>, DbError> {
    let sql = format!("SELECT {INBOUND_COLUMNS} FROM whatsapp_inbound ORDER BY id DESC LIMIT $1");
    Ok(sqlx::query_as(&sql).bind(limit).fetch_all(&mut *conn).await?)
}

pub async fn mark_inbound_processed(conn: &mut AnyConnection, id: i64, outcome: &str, now: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE whatsapp_inbound SET processed_at = $1, outcome = $2 WHERE id = $3")
        .bind(now)
        .bind(outcome)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

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

super::stored_name!(DeliveryState, "delivery state");

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
    let sql = format!("SELECT {OUTBOUND_COLUMNS} FROM whatsapp_outbound WHERE job_id = $1 ORDER BY id");
    Ok(sqlx::query_as(&sql).bind(job_id).fetch_all(&mut *conn).await?)
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
/// `false` and must not send. A crashed sender's lease runs out at `lease_until`.
pub async fn mark_sending(conn: &mut AnyConnection, id: i64, token: &str, now: i64, lease_until: i64) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE whatsapp_outbound SET send_started_at = $1, send_token = $2, send_lease_until = $3, attempts = attempts + 1, updated_at = $1 \
         WHERE id = $4 AND state = 'queued' AND wamid IS NULL \
         AND (send_lease_until IS NULL OR send_lease_until < $1 OR send_token = $2)",
    )
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

/// Meta accepted the message. A status callback that arrived first may already have moved it on.
pub async fn mark_sent(conn: &mut AnyConnection, id: i64, wamid: &str, now: i64) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE whatsapp_outbound SET wamid = $1, send_started_at = NULL, send_lease_until = NULL, error_code = NULL, error_message = NULL, \
         updated_at = $2, state = CASE WHEN state_rank < 1 THEN 'sent' ELSE state END, \
         sent_at = COALESCE(sent_at, $2), state_rank = CASE WHEN state_rank < 1 THEN 1 ELSE state_rank END WHERE id = $3",
    )
    .bind(clean_text(wamid))
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
        // The send went out but the sender died before recording it: the callback tells us.
        sqlx::query("UPDATE whatsapp_outbound SET wamid = $1, send_started_at = NULL, send_lease_until = NULL, updated_at = $2 \
             WHERE idempotency_key = $3 AND wamid IS NULL")
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
