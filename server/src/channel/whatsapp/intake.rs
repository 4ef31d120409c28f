//! Storing a webhook batch: every new message and the job that processes it commit in one
//! transaction, and status callbacks update the ledger in the same one. Nothing is answered 200
//! before this commits.

use crate::{
    config::Settings,
    db::{
        self, Backend, Db, DbError,
        jobs::NewJob,
        whatsapp::{self as store, StatusUpdate},
    },
    jobs::JobQueue,
};

use super::{INBOUND_KIND, payload::Batch};

/// What a batch changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IntakeReport {
    /// Messages stored and queued now.
    pub stored: usize,
    /// Messages already stored by an earlier delivery: not processed again.
    pub duplicates: usize,
    /// Ledger rows a status moved forward.
    pub statuses_applied: usize,
    /// Statuses for unknown messages, or stale ones.
    pub statuses_ignored: usize,
}

/// The job's args.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct InboundArgs {
    pub inbound_id: i64,
}

/// The dedupe key of the job for one wamid.
pub fn dedupe_key(wamid: &str) -> String {
    format!("{INBOUND_KIND}:{wamid}")
}

/// SQLite has one writer. Webhook posts queue here for it instead of all trying at once: a
/// connection that finds the database locked sleeps in SQLite's busy handler (1, 2, 5, 10 ms,
/// ...), which would add those sleeps to the answer Meta waits for.
static SQLITE_WRITER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Stores `batch` in one transaction. Workers are woken after the commit.
pub async fn store_batch(db: &Db, queue: &JobQueue, settings: &Settings, batch: &Batch) -> Result<IntakeReport, DbError> {
    let mut report = IntakeReport::default();
    if batch.messages.is_empty() && batch.statuses.is_empty() {
        return Ok(report);
    }
    let _writer = match db.backend {
        Backend::Sqlite => Some(SQLITE_WRITER.lock().await),
        Backend::Postgres => None,
    };
    let now = db::now_ms();
    let mut tx = db.begin_write().await?;
    for m in &batch.messages {
        let Some(id) = store::insert_inbound(&mut tx, m, now).await? else {
            report.duplicates += 1;
            continue;
        };
        let job = NewJob {
            kind: INBOUND_KIND.into(),
            queue: settings.jobs.queue.clone(),
            dedupe_key: Some(dedupe_key(&m.wamid)),
            chat_id: Some(m.chat_id.clone()),
            sender_id: Some(m.sender.clone()),
            message_id: Some(m.wamid.clone()),
            args: serde_json::to_value(InboundArgs { inbound_id: id }).unwrap_or_default(),
            max_attempts: i64::from(settings.jobs.default_max_attempts),
            correlation_id: uuid::Uuid::now_v7().to_string(),
            ..Default::default()
        };
        queue.enqueue_in(&mut tx, &job).await?;
        report.stored += 1;
    }
    for s in &batch.statuses {
        let update = StatusUpdate {
            wamid: &s.wamid,
            state: s.state,
            at: s.at,
            error_code: s.error_code.clone(),
            error_message: s.error_message.clone(),
            opaque: s.opaque.as_deref(),
        };
        if store::apply_status(&mut tx, &update, now).await? {
            report.statuses_applied += 1;
        } else {
            report.statuses_ignored += 1;
        }
    }
    tx.commit().await?;
    if report.stored > 0 {
        queue.notify();
    }
    Ok(report)
}
