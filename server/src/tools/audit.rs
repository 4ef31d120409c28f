//! The tool-call audit writer: every call's row (and every owner notice a hook raises) is
//! written in batches on a background task. It never drops a row silently: text is cleaned
//! before writing (PostgreSQL refuses NUL in TEXT), a batch the database cannot take now (a full
//! disk, the database out of reach) is held whole (up to 100,000 rows and notices; more are
//! counted lost) and written once it can, a batch that keeps
//! failing otherwise is split so one bad row cannot take others with it, and a row that still
//! cannot be written is logged as an error with what identifies it and counted in
//! `tool_audit_rows_lost_total`.

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

/// How often a held batch is tried again.
const HOLD_RETRY: Duration = Duration::from_secs(1);

/// Most rows and notices held while the database cannot take them; more are counted lost.
const HOLD_MAX: usize = 100_000;

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
                write_or_split(&db, &queue, batch, &mut flushes, &mut rx).await;
                release(&mut flushes);
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

    /// Waits until every row sent so far is written (or given up on, loudly), or is held
    /// until the database can take it.
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

/// Answers whoever waits for the rows sent before them.
fn release(flushes: &mut Vec<oneshot::Sender<()>>) {
    for done in flushes.drain(..) {
        let _ = done.send(());
    }
}

/// Whether a failed write is the database's state rather than the rows' fault: no room, or no
/// database to reach for now. The rows are then held, not split and lost. A pool closed (the
/// process is stopping) never comes back ([`closed`]).
fn not_the_rows(e: &DbError) -> bool {
    e.is_storage_full() || (e.is_unavailable() && !closed(e))
}

/// The pool is closed: the process is stopping, and nothing more will be written.
fn closed(e: &DbError) -> bool {
    matches!(e, DbError::Sql(sqlx::Error::PoolClosed))
}

/// Logs and counts `batch` as lost, with why.
fn lost(batch: &Batch, code: &str, why: &str) {
    for r in &batch.rows {
        tracing::error!(code, tool = %r.tool, correlation_id = %r.correlation_id, reason = %r.reason_code, "a tool audit row could not be written and is lost: {why}");
    }
    for n in &batch.notices {
        tracing::error!(code, hook = %n.hook, correlation_id = %n.correlation_id, "an owner notice could not be written and is lost: {why}");
    }
    metrics::counter!("tool_audit_rows_lost_total").increment(batch.len() as u64);
}

/// Holds `batch`, which the database cannot take for its own state (`first`), and tries it
/// again every [`HOLD_RETRY`] until it can. Meanwhile what is sent joins it (up to
/// [`HOLD_MAX`]; more is counted lost) and every flush is answered between tries (a try waits
/// at most for a connection): a full disk must not hold up the console. `Some` gives the batch back when it fails otherwise now.
async fn hold(db: &Db, queue: &JobQueue, mut batch: Batch, first: &DbError, rx: &mut mpsc::UnboundedReceiver<AuditMsg>) -> Option<Batch> {
    tracing::warn!(code = first.code(), error = %first, rows = batch.len(), "tool audit rows are held until the database can take them");
    let mut tick = tokio::time::interval(HOLD_RETRY);
    // A try that took long (an unreachable database waits for its connection) is followed by a
    // pause, not by the tries it missed.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut over = 0_u64;
    let over_lost = |over: u64| {
        if over > 0 {
            tracing::error!(code = first.code(), rows = over, "tool audit rows sent past the {HOLD_MAX} held were lost");
        }
    };
    loop {
        tokio::select! {
            _ = tick.tick() => match write(db, queue, &batch).await {
                Ok(()) => {
                    tracing::info!(rows = batch.len(), "held tool audit rows written");
                    over_lost(over);
                    return None;
                }
                Err(e) if not_the_rows(&e) => {}
                Err(e) if closed(&e) => {
                    lost(&batch, e.code(), "the process is stopping");
                    over_lost(over);
                    return None;
                }
                // Something else now: judged as any failed batch.
                Err(_) => {
                    over_lost(over);
                    return Some(batch);
                }
            },
            msg = rx.recv() => match msg {
                Some(AuditMsg::Flush(done)) => {
                    let _ = done.send(());
                }
                Some(AuditMsg::Row(r)) if batch.len() < HOLD_MAX => batch.rows.push(clean_row(r)),
                Some(AuditMsg::Notify(n)) if batch.len() < HOLD_MAX => batch.notices.push(clean_notice(n)),
                Some(_) => {
                    over += 1;
                    metrics::counter!("tool_audit_rows_lost_total").increment(1);
                }
                // Every writer is gone: the process is stopping.
                None => {
                    lost(&batch, first.code(), "the process stopped while the database could not take it");
                    over_lost(over);
                    return None;
                }
            },
        }
    }
}

/// Writes `batch` with a few retries. A batch the database cannot take now is held whole and
/// tried again every [`HOLD_RETRY`] until it can (those waiting for a flush are answered
/// first: a full disk must not hold up the console). A batch that fails otherwise is written
/// half by half, down to single rows, so only what the database really refuses is lost, and
/// that is logged.
async fn write_or_split(db: &Db, queue: &JobQueue, batch: Batch, flushes: &mut Vec<oneshot::Sender<()>>, rx: &mut mpsc::UnboundedReceiver<AuditMsg>) {
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
            Err(e) if not_the_rows(&e) => {
                release(flushes);
                if let Some(back) = hold(db, queue, batch, &e, rx).await {
                    pending.push(back);
                }
            }
            // The process is stopping: nothing more will be written, and splitting only delays
            // saying so.
            Err(e) if closed(&e) => lost(&batch, e.code(), "the process is stopping"),
            Err(_) if batch.len() > 1 => {
                let (a, b) = batch.split();
                pending.push(b);
                pending.push(a);
            }
            Err(e) => lost(&batch, e.code(), &e.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: usize) -> AuditRow {
        AuditRow {
            at: 0,
            tool: "order_status".into(),
            version: None,
            actor: "customer".into(),
            chat_id: None,
            chat_type: "direct".into(),
            decision: "allow".into(),
            reason_code: "OK".into(),
            latency_us: 0,
            attempts: 1,
            correlation_id: format!("corr-{i}"),
            args: "{}".into(),
            trace_id: None,
        }
    }

    async fn rows(db: &Db) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit").fetch_one(&mut *db.pool.acquire().await.expect("conn")).await.expect("count")
    }

    /// Rows written while the disk is full are held, not split and lost, and written once there
    /// is room; a flush meanwhile is answered rather than held up. Before, each batch was
    /// retried for about a second, then split down to single rows and dropped.
    #[tokio::test]
    async fn rows_wait_out_a_full_disk() {
        let (_dir, db) = Db::scratch(|s| s.max_connections = 1).await;
        {
            let mut w = db.acquire_write().await.expect("writer");
            sqlx::query("CREATE TABLE filler (b TEXT)").execute(&mut *w).await.expect("create");
            let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&mut *w).await.expect("pages");
            sqlx::query(&format!("PRAGMA max_page_count = {}", pages + 2)).execute(&mut *w).await.expect("cap");
            let full = loop {
                if let Err(e) = sqlx::query("INSERT INTO filler VALUES ($1)").bind("x".repeat(3000)).execute(&mut *w).await {
                    break DbError::from(e);
                }
            };
            assert!(full.is_storage_full(), "{full}");
        }
        let writer = AuditWriter::spawn(db.clone(), JobQueue::new(db.clone()));
        for i in 0..200 {
            writer.write(row(i));
        }
        tokio::time::timeout(Duration::from_secs(10), writer.flush()).await.expect("a flush is answered while rows are held");
        // Sent while they are held: they join them, and a flush still gets its answer.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 200..300 {
            writer.write(row(i));
        }
        tokio::time::timeout(Duration::from_secs(10), writer.flush()).await.expect("a flush sent after the hold began is answered");
        assert_eq!(rows(&db).await, 0, "nothing could be written yet");
        // Room again.
        sqlx::query("PRAGMA max_page_count = 1000000").execute(&mut *db.acquire_write().await.expect("writer")).await.expect("room");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while rows(&db).await < 300 {
            assert!(std::time::Instant::now() < deadline, "the held rows were not written: {}", rows(&db).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(rows(&db).await, 300, "every row, once");
    }
}
