//! The tool-call audit writer: every call's row (and every owner notice a hook raises) is
//! written in batches on a background task. It never drops a row silently: text is cleaned
//! before writing (PostgreSQL refuses NUL in TEXT), a batch that keeps failing is split so one
//! bad row cannot take others with it, and a row that still cannot be written is logged as an
//! error with what identifies it and counted in `tool_audit_rows_lost_total`.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::sync::{mpsc, oneshot};

use crate::{
    db::{self, Db, DbError, owner_notifications::Notification, tool_audit::AuditRow},
    jobs::JobQueue,
    owners,
};

#[derive(Debug)]
enum AuditMsg {
    Row(AuditRow),
    Notify(Notification),
    Flush(oneshot::Sender<()>),
}

#[derive(Debug, Clone)]
pub struct AuditWriter {
    tx: mpsc::UnboundedSender<AuditMsg>,
}

/// Rows and notices written together.
#[derive(Debug, Default, Clone)]
struct Batch {
    rows: Vec<AuditRow>,
    notices: Vec<Notification>,
}

impl Batch {
    fn len(&self) -> usize {
        self.rows.len() + self.notices.len()
    }

    /// The two halves of a batch of two or more.
    fn split(self) -> (Batch, Batch) {
        let mut rows = self.rows;
        let mut notices = self.notices;
        if rows.len() >= 2 || notices.is_empty() {
            let rest = rows.split_off(rows.len() / 2);
            (Batch { rows, notices }, Batch { rows: rest, notices: Vec::new() })
        } else {
            let rest = notices.split_off(notices.len() / 2);
            (Batch { rows, notices }, Batch { rows: Vec::new(), notices: rest })
        }
    }
}

/// Attempts per batch before it is split: a passing fault (a locked database, a dropped
/// connection) gets a few tries with backoff; a row the database refuses fails every time.
const ATTEMPTS: usize = 4;

impl AuditWriter {
    /// Owner notices raised by hooks are delivered on WhatsApp through `queue`'s jobs.
    pub fn spawn(db: Db, queue: JobQueue) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<AuditMsg>();
        tokio::spawn(async move {
            let mut msgs = Vec::new();
            while rx.recv_many(&mut msgs, 2000).await > 0 {
                let mut batch = Batch::default();
                let mut flushes = Vec::new();
                for m in msgs.drain(..) {
                    match m {
                        AuditMsg::Row(r) => batch.rows.push(clean_row(r)),
                        AuditMsg::Notify(n) => batch.notices.push(clean_notice(n)),
                        AuditMsg::Flush(done) => flushes.push(done),
                    }
                }
                write_or_split(&db, &queue, batch).await;
                for done in flushes {
                    let _ = done.send(());
                }
            }
        });
        Self { tx }
    }

    pub(super) fn write(&self, row: AuditRow) {
        if self.tx.send(AuditMsg::Row(row)).is_err() {
            tracing::error!("tool audit writer stopped; an audit row was lost");
            metrics::counter!("tool_audit_rows_lost_total").increment(1);
        }
    }

    pub(super) fn notify(&self, notice: Notification) {
        if self.tx.send(AuditMsg::Notify(notice)).is_err() {
            tracing::error!("tool audit writer stopped; an owner notice was lost");
            metrics::counter!("tool_audit_rows_lost_total").increment(1);
        }
    }

    /// Waits until every row sent so far is written (or given up on, loudly).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(AuditMsg::Flush(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

async fn write(db: &Db, queue: &JobQueue, batch: &Batch) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    db::tool_audit::insert_many(&mut tx, &batch.rows).await?;
    for n in &batch.notices {
        owners::notices::raise(&mut tx, queue, n, true).await?;
    }
    queue.commit(tx).await
}

/// Writes `batch` with a few retries; if it still fails, writes each half on its own, down to
/// single rows, so only what the database really refuses is lost, and that is logged.
async fn write_or_split(db: &Db, queue: &JobQueue, batch: Batch) {
    let mut pending = vec![batch];
    while let Some(batch) = pending.pop() {
        if batch.len() == 0 {
            continue;
        }
        let backoff = ExponentialBuilder::default().with_min_delay(Duration::from_millis(50)).with_max_delay(Duration::from_secs(2)).with_max_times(ATTEMPTS - 1);
        let written = (|| write(db, queue, &batch))
            .retry(backoff)
            .notify(|e, wait| tracing::warn!(error = %e, rows = batch.len(), retry_in_ms = wait.as_millis() as u64, "writing tool audit rows failed; retrying"))
            .await;
        match written {
            Ok(()) => {}
            Err(_) if batch.len() > 1 => {
                let (a, b) = batch.split();
                pending.push(b);
                pending.push(a);
            }
            Err(e) => {
                for r in &batch.rows {
                    tracing::error!(error = %e, tool = %r.tool, correlation_id = %r.correlation_id, reason = %r.reason_code, "a tool audit row could not be written and is lost");
                }
                for n in &batch.notices {
                    tracing::error!(error = %e, hook = %n.hook, correlation_id = %n.correlation_id, "an owner notice could not be written and is lost");
                }
                metrics::counter!("tool_audit_rows_lost_total").increment(batch.len() as u64);
            }
        }
    }
}

fn clean_row(mut r: AuditRow) -> AuditRow {
    for text in [&mut r.tool, &mut r.actor, &mut r.chat_type, &mut r.decision, &mut r.reason_code, &mut r.correlation_id, &mut r.args] {
        *text = db::clean_text(text);
    }
    for text in [&mut r.version, &mut r.chat_id].into_iter().flatten() {
        *text = db::clean_text(text);
    }
    r
}

fn clean_notice(mut n: Notification) -> Notification {
    for text in [&mut n.hook, &mut n.tool, &mut n.reason_code, &mut n.message, &mut n.correlation_id] {
        *text = db::clean_text(text);
    }
    n
}
