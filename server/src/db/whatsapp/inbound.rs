//! Inbound messages, unique on wamid: the webhook's group insert (with the messages' jobs on
//! SQLite and PostgreSQL alike) and the runtime's reads.

use sqlx::{Any, AnyConnection, any::AnyArguments, pool::PoolConnection, query::QueryAs};

use crate::db::{
    Backend, DbError, IntBool, backend_of, clean_text, events,
    jobs::{ENQUEUE_CHUNK, INSERT_COLUMNS, NewJob, SQLITE_COLUMNS, bind_sqlite, postgres_batch, postgres_enqueue_ctes},
    value_rows,
};

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
    pub sender_name: Option<String>,
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

const INBOUND_COLUMNS: &str = "id, wamid, phone_number_id, chat_id, sender, sender_name, is_group, msg_type, text, reply_id, context_id, raw, \
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
        let sql = inbound_insert_sql(backend_of(conn), chunk.len());
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
fn inbound_insert_sql(backend: Backend, rows: usize) -> String {
    format!(
        "INSERT INTO whatsapp_inbound ({INBOUND_INSERT_COLUMNS}) VALUES {} ON CONFLICT (wamid) DO NOTHING RETURNING id, wamid",
        value_rows(backend, rows, INBOUND_BINDS)
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
pub async fn insert_inbound_and_enqueue(conn: &mut PoolConnection<Any>, messages: &[&NewInbound], jobs: &[NewJob], now: i64) -> Result<Vec<Option<i64>>, DbError> {
    let stored = match backend_of(conn) {
        Backend::Postgres => insert_and_enqueue_postgres(conn, messages, jobs, now).await?,
        Backend::Sqlite => insert_and_enqueue_sqlite(conn, messages, jobs, now).await?,
    };
    if !stored.is_empty() {
        events::ring();
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
async fn insert_and_enqueue_sqlite(conn: &mut PoolConnection<Any>, messages: &[&NewInbound], jobs: &[NewJob], now: i64) -> Result<Vec<(i64, String)>, DbError> {
    let mut sql = String::from("BEGIN IMMEDIATE;");
    for chunk in jobs.chunks(ENQUEUE_CHUNK) {
        sql += &format!(
            "WITH x ({INSERT_COLUMNS}) AS (VALUES {}) \
             INSERT INTO jobs ({INSERT_COLUMNS}) SELECT * FROM x \
             WHERE NOT EXISTS (SELECT 1 FROM whatsapp_inbound i WHERE i.wamid = x.message_id) \
             ON CONFLICT DO NOTHING;",
            value_rows(Backend::Sqlite, chunk.len(), SQLITE_COLUMNS)
        );
    }
    for chunk in messages.chunks(INBOUND_CHUNK) {
        sql += &inbound_insert_sql(Backend::Sqlite, chunk.len());
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
/// events, [`postgres_enqueue_ctes`]) are one statement, a transaction of its own.
async fn insert_and_enqueue_postgres(conn: &mut AnyConnection, messages: &[&NewInbound], jobs: &[NewJob], now: i64) -> Result<Vec<(i64, String)>, DbError> {
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
        enqueue = postgres_enqueue_ctes("$2", "$3", "x.message_id IN (SELECT wamid FROM stored)")
    );
    Ok(sqlx::query_as(&sql).bind(rows).bind(postgres_batch(jobs, now)?).bind(now).fetch_all(&mut *conn).await?)
}

/// The name chat `chat_id` is shown by: its customer's latest profile name, which `chats` keeps
/// (none for a group, whose senders differ, nor for a chat the webhook named nobody for).
pub async fn sender_name(conn: &mut AnyConnection, chat_id: &str) -> Result<Option<String>, DbError> {
    let name: Option<Option<String>> = sqlx::query_scalar("SELECT name FROM chats WHERE channel = 'whatsapp' AND chat_id = $1").bind(chat_id).fetch_optional(&mut *conn).await?;
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
