//! Storing a webhook batch: every new message and the job that processes it commit in one
//! transaction, and status callbacks update the ledger in the same one. Nothing is answered 200
//! before this commits.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use sqlx::AnyConnection;
use tokio::sync::{mpsc, oneshot};

use crate::{
    db::{
        self, Db, DbError,
        jobs::NewJob,
        storage::STORAGE_FULL,
        whatsapp::{self as store, DeliveryState, StatusUpdate},
    },
    events::{Delivery, Envelope, Event, Events},
    jobs::{JobKind, JobQueue},
    traces::{self, Appended},
};

use super::payload::Batch;

/// What a batch changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IntakeReport {
    /// Messages stored and queued now.
    pub stored: usize,
    /// Messages already stored by an earlier delivery: not processed again.
    pub duplicates: usize,
    /// Statuses for unknown messages, or stale ones.
    pub statuses_ignored: usize,
    /// The places, among the batch's statuses, of those that moved the ledger.
    pub applied: Vec<usize>,
}

impl IntakeReport {
    /// Ledger rows a status moved forward.
    pub fn statuses_applied(&self) -> usize {
        self.applied.len()
    }
}

/// The `whatsapp.inbound` job: processes one stored inbound message ([`super::job`] runs it).
/// The message is the job's `message_id` (its wamid, unique among stored messages), so the job
/// can be written before the message's row id is known: on PostgreSQL by the statement that
/// stores the message.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessInbound {
    /// The message's row id, which jobs queued by earlier builds name instead; they still run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_id: Option<i64>,
}

impl JobKind for ProcessInbound {
    const KIND: &'static str = "whatsapp.inbound";
    /// A person who sends two messages in a row gets the answer to the first before the
    /// second is read, and the second is read with the first in memory (unless the first
    /// failed and waits for its retry).
    const ONE_AT_A_TIME_PER_CHAT: bool = true;
}

/// The dedupe key of the job for one wamid.
pub fn dedupe_key(wamid: &str) -> String {
    format!("{}:{wamid}", ProcessInbound::KIND)
}

/// Stores one batch in its own transaction (committed before this returns) and wakes workers.
pub async fn store_batch(db: &Db, queue: &JobQueue, batch: &Batch) -> Result<IntakeReport, DbError> {
    if batch.messages.is_empty() && batch.statuses.is_empty() {
        return Ok(IntakeReport::default());
    }
    let mut tx = db.begin_write().await?;
    let (mut reports, appended) = store_in(&mut tx, queue, &[batch], db::now_ms()).await?;
    queue.commit(tx).await?;
    queue.telemetry().appended(appended);
    Ok(reports.pop().unwrap_or_default())
}

/// Every message of `batches` with the index of its batch, and the job that processes each.
fn messages_and_jobs<'a>(queue: &JobQueue, batches: &[&'a Batch]) -> (Vec<(usize, &'a store::NewInbound)>, Vec<NewJob>) {
    let messages: Vec<(usize, &store::NewInbound)> = batches.iter().enumerate().flat_map(|(b, batch)| batch.messages.iter().map(move |m| (b, m))).collect();
    let jobs = messages
        .iter()
        .map(|(_, m)| {
            // The wamid as the message's row stores it, since the job finds its message by it.
            let wamid = db::clean_text(&m.wamid);
            NewJob {
                dedupe_key: Some(dedupe_key(&wamid)),
                chat_id: Some(db::clean_text(&m.chat_id)),
                sender_id: Some(db::clean_text(&m.sender)),
                message_id: Some(wamid),
                ..queue.job(&ProcessInbound::default())
            }
        })
        .collect();
    (messages, jobs)
}

/// One report per batch from the ids the insert gave its messages (`None`: stored before).
fn message_reports(batches: usize, messages: &[(usize, &store::NewInbound)], ids: &[Option<i64>]) -> Vec<IntakeReport> {
    let mut reports = vec![IntakeReport::default(); batches];
    for ((b, _), id) in messages.iter().zip(ids) {
        if id.is_some() {
            reports[*b].stored += 1;
        } else {
            reports[*b].duplicates += 1;
        }
    }
    reports
}

/// Batches of messages only (no status callbacks) are stored with their jobs by one round trip
/// to the database ([`store::insert_inbound_and_enqueue`]): on PostgreSQL one statement outside a
/// transaction block, on SQLite one multi-statement query on the writer connection, instead of
/// four (`BEGIN`, two inserts, `COMMIT`). `None` where that does not apply.
async fn store_messages_alone(db: &Db, queue: &JobQueue, batches: &[&Batch], now: i64) -> Option<Result<Vec<IntakeReport>, DbError>> {
    if batches.iter().any(|b| !b.statuses.is_empty()) {
        return None;
    }
    let (messages, jobs) = messages_and_jobs(queue, batches);
    let jobs: Vec<NewJob> = jobs.iter().map(|job| queue.defaults(job)).collect();
    let stored = async {
        let mut conn = db.acquire_write().await?;
        let ids = store::insert_inbound_and_enqueue(&mut conn, &messages.iter().map(|(_, m)| *m).collect::<Vec<_>>(), &jobs, now).await?;
        queue.notify();
        Ok(message_reports(batches.len(), &messages, &ids))
    };
    Some(stored.await)
}

/// Stores batches in the caller's transaction with a few statements for all of them: one
/// multi-row insert of the messages (the wamid's unique index is the dedupe), one of their jobs
/// and one of the jobs' events. Returns one report per batch; a wamid repeated across the
/// batches is stored for the first and counted as a duplicate for the rest. And the failed
/// deliveries it added to traces, to export once the transaction commits.
async fn store_in(conn: &mut AnyConnection, queue: &JobQueue, batches: &[&Batch], now: i64) -> Result<(Vec<IntakeReport>, Vec<Appended>), DbError> {
    let (messages, jobs) = messages_and_jobs(queue, batches);
    let ids = store::insert_inbound_many(conn, &messages.iter().map(|(_, m)| *m).collect::<Vec<_>>(), now).await?;
    let jobs: Vec<NewJob> = jobs.into_iter().zip(&ids).filter(|(_, id)| id.is_some()).map(|(job, _)| job).collect();
    if !jobs.is_empty() {
        queue.enqueue_many_in(conn, &jobs).await?;
    }
    let mut reports = message_reports(batches.len(), &messages, &ids);
    let mut appended = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        for (i, s) in batch.statuses.iter().enumerate() {
            if store::apply_status(conn, s, now).await? {
                reports[b].applied.push(i);
                if s.state == DeliveryState::Failed {
                    let traced = trace_failed_delivery(conn, s).await?;
                    appended.extend(traced);
                    // The person waits for a message that will not come: the owners are told.
                    let notice = super::undelivered::UndeliveredNotice { wamid: s.wamid.clone(), key: None, trace_id: traced.map(|a| a.trace_id) };
                    queue.enqueue_in(conn, &notice.job(queue)).await?;
                    if s.error_code.as_deref().and_then(|c| c.parse::<i64>().ok()) == Some(super::graph::code::OUTSIDE_WINDOW) {
                        template_instead(conn, queue, s).await?;
                    }
                }
            } else {
                reports[b].statuses_ignored += 1;
            }
        }
    }
    Ok((reports, appended))
}


/// The event for a receipt that has no trace step of its own (a failure gets one, and its event
/// comes from it).
fn receipt(s: &StatusUpdate) -> Option<Envelope> {
    let delivery = Delivery { wamid: Some(s.wamid.clone()), reason_code: s.state.as_str().to_uppercase(), ..Delivery::default() };
    let event = match s.state {
        DeliveryState::Sent => Event::ReplySent(delivery),
        DeliveryState::Delivered => Event::ReplyDelivered(delivery),
        DeliveryState::Read => Event::ReplyRead(delivery),
        DeliveryState::Queued | DeliveryState::Failed => return None,
    };
    Some(Envelope { id: None, channel: Some(crate::channel::WHATSAPP.into()), chat_id: None, event })
}

/// A free-form message refused after Meta accepted it, outside the person's 24-hour window: the
/// window template goes in its place, by a job of its own (one per job, however many parts).
async fn template_instead(conn: &mut AnyConnection, queue: &JobQueue, s: &StatusUpdate) -> Result<(), DbError> {
    let Some(row) = store::outbound_by_wamid(conn, &s.wamid).await? else { return Ok(()) };
    let Some(job_id) = row.job_id.filter(|_| row.kind != "template") else { return Ok(()) };
    let args = super::window::SendWindowTemplate { job_id, to: row.recipient, group: row.is_group };
    let mut job = queue.job(&args);
    job.dedupe_key = Some(args.dedupe_key());
    queue.enqueue_in(conn, &job).await?;
    Ok(())
}

/// A reply Meta accepted and then could not deliver: the message's trace gets the failure, so
/// the Traces page shows it under outcome "failed" and its WhatsApp error code.
async fn trace_failed_delivery(conn: &mut AnyConnection, s: &StatusUpdate) -> Result<Option<Appended>, DbError> {
    let code = s.error_code.as_deref().map_or_else(|| "WHATSAPP_FAILED".to_string(), super::trace_code);
    let step = traces::Step::new("delivery_status", "failed", &code, serde_json::json!({ "outcome": "Meta reported the reply undelivered", "wamid": s.wamid }));
    traces::fail_outbound(conn, &s.wamid, &step).await
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// No room on the database's disk; nothing of the batch was stored.
    #[error("STORAGE_FULL: {0}")]
    StorageFull(String),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("the transaction holding this batch was abandoned before it committed")]
    Abandoned,
}

impl IntakeError {
    /// The stable code the webhook answers with.
    pub fn code(&self) -> &'static str {
        match self {
            Self::StorageFull(_) => STORAGE_FULL,
            Self::Db(e) => e.code(),
            Self::Abandoned => "INTAKE_ABANDONED",
        }
    }

    fn from_db(e: DbError) -> Self {
        if e.is_storage_full() { Self::StorageFull(e.to_string()) } else { Self::Db(e) }
    }
}

struct Waiting {
    batch: Batch,
    done: oneshot::Sender<Result<IntakeReport, IntakeError>>,
}

/// Group commit. Posts hand their batches to one writer task, which stores everything that
/// queued up while it was busy in one transaction and hands each post its result: a burst costs
/// one commit (one WAL flush) instead of one each, and on SQLite no connection sleeps in the
/// busy handler (1, 2, 5, 10 ms, ...) waiting for another. Each post is still answered only
/// after the transaction holding its batch committed, and a client hanging up cannot roll back
/// anyone's batch. If a group fails, each batch is retried alone, so one bad batch cannot fail
/// the others. Several processes on one PostgreSQL database each run their own writer; the
/// wamid's unique index keeps them from storing a message twice.
pub struct Intake {
    db: Db,
    queue: JobQueue,
    events: Option<Events>,
    writer: std::sync::OnceLock<mpsc::UnboundedSender<Waiting>>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    queued: AtomicU64,
    groups: AtomicU64,
    batches: AtomicU64,
}

/// How the group commit has gone so far (also exported as metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntakeCounts {
    /// Batches handed to the writer.
    pub queued: u64,
    /// Transactions the writer ran.
    pub groups: u64,
    /// Batches those transactions held.
    pub batches: u64,
}

/// Batches stored together at most: bounds one transaction's size after a long stall.
const MAX_GROUP: usize = 512;

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake").finish_non_exhaustive()
    }
}

impl Intake {
    /// The writer task starts with the first batch.
    pub fn new(db: Db, queue: JobQueue) -> Self {
        Self { db, queue, events: None, writer: std::sync::OnceLock::new(), counts: Arc::default() }
    }

    /// Delivery receipts that moved the ledger are published as events once stored; one that
    /// changed nothing (an unknown message, a status older than the one recorded) is not.
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = Some(events);
        self
    }

    pub async fn store(&self, batch: Batch) -> Result<IntakeReport, IntakeError> {
        if batch.messages.is_empty() && batch.statuses.is_empty() {
            return Ok(IntakeReport::default());
        }
        let writer = self.writer.get_or_init(|| spawn_writer(self.db.clone(), self.queue.clone(), self.counts.clone()));
        let receipts: Vec<Option<Envelope>> = batch.statuses.iter().map(receipt).collect();
        let (done, result) = oneshot::channel();
        writer.send(Waiting { batch, done }).map_err(|_| IntakeError::Abandoned)?;
        self.counts.queued.fetch_add(1, Ordering::Relaxed);
        let report = result.await.map_err(|_| IntakeError::Abandoned)??;
        if let Some(events) = &self.events {
            for envelope in report.applied.iter().filter_map(|i| receipts.get(*i).cloned().flatten()) {
                events.publish_fact(envelope).await;
            }
        }
        Ok(report)
    }

    pub fn counts(&self) -> IntakeCounts {
        IntakeCounts {
            queued: self.counts.queued.load(Ordering::Relaxed),
            groups: self.counts.groups.load(Ordering::Relaxed),
            batches: self.counts.batches.load(Ordering::Relaxed),
        }
    }
}

/// The writer task; it ends when the [`Intake`] holding its sender is dropped.
fn spawn_writer(db: Db, queue: JobQueue, counts: Arc<Counts>) -> mpsc::UnboundedSender<Waiting> {
    let (writer, mut waiting) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut group = Vec::with_capacity(MAX_GROUP);
        while waiting.recv_many(&mut group, MAX_GROUP).await > 0 {
            counts.groups.fetch_add(1, Ordering::Relaxed);
            counts.batches.fetch_add(group.len() as u64, Ordering::Relaxed);
            metrics::counter!("whatsapp_intake_transactions_total").increment(1);
            metrics::counter!("whatsapp_intake_batches_total").increment(group.len() as u64);
            // A task per group: should one panic, its posts get 500 (their senders drop) and
            // this loop goes on serving the rest.
            let (db, queue, group) = (db.clone(), queue.clone(), std::mem::take(&mut group));
            if let Err(e) = tokio::spawn(async move { commit_group(&db, &queue, group).await }).await {
                tracing::error!(error = %e, "storing a group of webhook batches panicked; its posts were answered 500");
            }
        }
    });
    writer
}

async fn commit_group(db: &Db, queue: &JobQueue, group: Vec<Waiting>) {
    let together = async {
        let now = db::now_ms();
        let batches: Vec<&Batch> = group.iter().map(|w| &w.batch).collect();
        if let Some(stored) = store_messages_alone(db, queue, &batches, now).await {
            return stored;
        }
        let mut tx = db.begin_write().await?;
        let (reports, appended) = store_in(&mut tx, queue, &batches, now).await?;
        queue.commit(tx).await?;
        queue.telemetry().appended(appended);
        Ok::<_, DbError>(reports)
    };
    let stored = together.await;
    db.storage().observe(&stored);
    match stored {
        Ok(reports) => {
            for (w, report) in group.into_iter().zip(reports) {
                let _ = w.done.send(Ok(report));
            }
        }
        // Alone, each would meet the same full disk: every post of the group is refused at once.
        Err(e) if e.is_storage_full() => {
            let message = e.to_string();
            for w in group {
                let _ = w.done.send(Err(IntakeError::StorageFull(message.clone())));
            }
        }
        Err(e) if group.len() == 1 => {
            if let Some(w) = group.into_iter().next() {
                let _ = w.done.send(Err(IntakeError::Db(e)));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, batches = group.len(), "group commit of webhook batches failed; storing each alone");
            for w in group {
                let result = store_batch(db, queue, &w.batch).await;
                db.storage().observe(&result);
                let _ = w.done.send(result.map_err(IntakeError::from_db));
            }
        }
    }
}
