//! Storing a webhook batch: every new message and the job that processes it commit in one
//! transaction, and status callbacks update the ledger in the same one. Nothing is answered 200
//! before this commits.

use sqlx::AnyConnection;
use tokio::sync::oneshot;

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

/// Stores one batch in its own transaction (committed before this returns) and wakes workers.
pub async fn store_batch(db: &Db, queue: &JobQueue, settings: &Settings, batch: &Batch) -> Result<IntakeReport, DbError> {
    if batch.messages.is_empty() && batch.statuses.is_empty() {
        return Ok(IntakeReport::default());
    }
    let mut tx = db.begin_write().await?;
    let report = store_in(&mut tx, queue, settings, batch, db::now_ms()).await?;
    tx.commit().await?;
    if report.stored > 0 {
        queue.notify();
    }
    Ok(report)
}

async fn store_in(conn: &mut AnyConnection, queue: &JobQueue, settings: &Settings, batch: &Batch, now: i64) -> Result<IntakeReport, DbError> {
    let mut report = IntakeReport::default();
    for m in &batch.messages {
        let Some(id) = store::insert_inbound(conn, m, now).await? else {
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
        queue.enqueue_in(conn, &job).await?;
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
        if store::apply_status(conn, &update, now).await? {
            report.statuses_applied += 1;
        } else {
            report.statuses_ignored += 1;
        }
    }
    Ok(report)
}

#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("the transaction holding this batch was abandoned before it committed")]
    Abandoned,
}

struct Waiting {
    batch: Batch,
    done: oneshot::Sender<Result<IntakeReport, DbError>>,
}

/// Group commit for SQLite's single writer. Concurrent posts queue their batches; whoever holds
/// the writer lock stores every queued batch in one transaction and hands each its result, so
/// a burst costs one commit instead of one each, and no connection sleeps in SQLite's busy
/// handler (1, 2, 5, 10 ms, ...) waiting for another. Each post is still answered only after the
/// transaction holding its batch committed. If the group fails, each batch is retried alone, so
/// one bad batch cannot fail the others. PostgreSQL takes concurrent writers as they come.
#[derive(Default)]
pub struct Intake {
    queue: std::sync::Mutex<Vec<Waiting>>,
    writer: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake").finish_non_exhaustive()
    }
}

impl Intake {
    pub async fn store(&self, db: &Db, queue: &JobQueue, settings: &Settings, batch: Batch) -> Result<IntakeReport, IntakeError> {
        if db.backend == Backend::Postgres || (batch.messages.is_empty() && batch.statuses.is_empty()) {
            return Ok(store_batch(db, queue, settings, &batch).await?);
        }
        let (done, result) = oneshot::channel();
        self.lock_queue().push(Waiting { batch, done });
        {
            let _writer = self.writer.lock().await;
            let group = std::mem::take(&mut *self.lock_queue());
            if !group.is_empty() {
                // In a task of its own: a client hanging up on this request must not roll back
                // the other posts' batches.
                let (db, queue, settings) = (db.clone(), queue.clone(), settings.clone());
                let _ = tokio::spawn(async move { commit_group(&db, &queue, &settings, group).await }).await;
            }
        }
        Ok(result.await.map_err(|_| IntakeError::Abandoned)??)
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn commit_group(db: &Db, queue: &JobQueue, settings: &Settings, group: Vec<Waiting>) {
    let together = async {
        let mut tx = db.begin_write().await?;
        let now = db::now_ms();
        let mut reports = Vec::with_capacity(group.len());
        for w in &group {
            reports.push(store_in(&mut tx, queue, settings, &w.batch, now).await?);
        }
        tx.commit().await?;
        Ok::<_, DbError>(reports)
    };
    match together.await {
        Ok(reports) => {
            if reports.iter().any(|r| r.stored > 0) {
                queue.notify();
            }
            for (w, report) in group.into_iter().zip(reports) {
                let _ = w.done.send(Ok(report));
            }
        }
        Err(e) if group.len() == 1 => {
            if let Some(w) = group.into_iter().next() {
                let _ = w.done.send(Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, batches = group.len(), "group commit of webhook batches failed; storing each alone");
            for w in group {
                let result = store_batch(db, queue, settings, &w.batch).await;
                let _ = w.done.send(result);
            }
        }
    }
}
