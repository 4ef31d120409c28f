//! Traces: what happened to each message, step by step, with decisions, reason codes and
//! timings. This module is the only writer of traces and their steps; the runtime, the channels
//! and the webhook intake hand it facts. Reads for the console are in `db::traces`.
//!
//! A trace begins when a message passes dedupe (so a tool call made while the message is handled
//! can name it in its audit row), collects its steps in memory, and is written whole when the
//! runtime finishes, in the same transaction as the runtime's reply. The channel then appends its
//! delivery.

use std::time::Instant;

use serde_json::Value;
use sqlx::AnyConnection;

pub use crate::db::traces::{Appended, RUNNING, Step, TraceRow};
use crate::{
    db::{self, DbError, traces as store},
    telemetry::Telemetry,
};

impl Step {
    /// A step that took no measurable time (a delivery, a channel's note).
    pub fn new(step: &str, decision: &str, reason_code: &str, detail: Value) -> Self {
        Self { step: step.into(), decision: decision.into(), reason_code: reason_code.into(), duration_us: 0, detail: detail.to_string() }
    }
}

/// Whose message a trace is about.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub correlation_id: String,
    pub channel: String,
    pub chat_id: String,
    pub message_id: String,
    /// The group member who sent it; none in a direct chat (its sender is the chat).
    pub sender: Option<String>,
}

/// A trace being recorded.
#[derive(Debug)]
pub struct Recorder {
    id: i64,
    subject: Subject,
    started: Instant,
    started_at: i64,
    last: Instant,
    first_seq: i64,
    steps: Vec<Step>,
}

/// Steps written by [`Recorder::flush`] in a transaction not yet committed.
#[derive(Debug)]
#[must_use = "tell the recorder when the transaction commits (Recorder::committed), or its steps are written again"]
pub struct Flushed {
    steps: usize,
    next_seq: i64,
}

/// How a traced message ended.
#[derive(Debug, Clone, Default)]
pub struct Ending {
    pub actor: String,
    pub route: String,
    /// `replied`, `ignored` or `failed`.
    pub outcome: String,
    pub error_code: Option<String>,
}

/// Begins the trace of a message (or continues the one an interrupted attempt left running).
pub async fn begin(conn: &mut AnyConnection, subject: Subject) -> Result<Recorder, DbError> {
    let started_at = db::now_ms();
    let head = TraceRow {
        id: 0,
        correlation_id: subject.correlation_id.clone(),
        channel: subject.channel.clone(),
        chat_id: subject.chat_id.clone(),
        message_id: subject.message_id.clone(),
        actor: String::new(),
        route: RUNNING.into(),
        outcome: RUNNING.into(),
        error_code: None,
        started_at,
        duration_us: 0,
    };
    let (id, first_seq) = store::begin(conn, &head, subject.sender.as_deref()).await?;
    let now = Instant::now();
    Ok(Recorder { id, subject, started: now, started_at, last: now, first_seq, steps: Vec::new() })
}

impl Recorder {
    /// A recorder that is never written: an eval's replay collects its steps in memory and
    /// reads them back; there is no trace row (its id is 0).
    pub fn detached() -> Self {
        let now = Instant::now();
        Self {
            id: 0,
            subject: Subject::default(),
            started: now,
            started_at: db::now_ms(),
            last: now,
            first_seq: 0,
            steps: Vec::new(),
        }
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    /// Records a step, timed from the previous one.
    pub fn step(&mut self, step: &str, decision: &str, reason: &str, detail: Value) {
        let now = Instant::now();
        let duration_us = i64::try_from(now.duration_since(self.last).as_micros()).unwrap_or(i64::MAX);
        self.last = now;
        self.steps.push(Step { step: step.into(), decision: decision.into(), reason_code: reason.into(), duration_us, detail: detail.to_string() });
    }

    /// The steps so far (the runtime reads its own decisions back, e.g. in tests).
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Writes the steps so far in the caller's transaction, so a fact that must be on record
    /// with something else commits together with it. The recorder keeps them until told the
    /// transaction committed ([`Recorder::committed`]): when it does not, they are written
    /// again with the next flush or the ending, not lost with the rolled-back transaction.
    pub async fn flush(&mut self, conn: &mut AnyConnection) -> Result<Flushed, DbError> {
        let next_seq = store::insert_steps(conn, self.id, self.first_seq, &self.steps).await?;
        Ok(Flushed { steps: self.steps.len(), next_seq })
    }

    /// [`Recorder::flush`] with one more step, the one that records what the transaction
    /// stores (the job enqueued, the approval requested). That step is kept only if the
    /// transaction commits: when it does not, the fact it states did not happen, and the trace
    /// never says it did.
    pub async fn flush_with(&mut self, conn: &mut AnyConnection, step: &str, decision: &str, reason: &str, detail: Value) -> Result<Flushed, DbError> {
        let before = self.steps.len();
        self.step(step, decision, reason, detail);
        let flushed = self.flush(conn).await.map(|f| Flushed { steps: before, ..f });
        // Written with the others when the transaction commits; taken back now, so that a
        // rolled-back transaction leaves no trace of it.
        self.steps.pop();
        flushed
    }

    /// The transaction of `flushed` committed: its steps are on record, and later steps
    /// continue after them.
    pub fn committed(&mut self, flushed: Flushed) {
        self.steps.drain(..flushed.steps.min(self.steps.len()));
        self.first_seq = flushed.next_seq;
    }

    /// Writes the steps and the ending in the caller's transaction.
    pub async fn finish(self, conn: &mut AnyConnection, ending: Ending) -> Result<i64, DbError> {
        let row = TraceRow {
            id: self.id,
            correlation_id: self.subject.correlation_id,
            channel: self.subject.channel,
            chat_id: self.subject.chat_id,
            message_id: self.subject.message_id,
            actor: ending.actor,
            route: ending.route,
            outcome: ending.outcome,
            error_code: ending.error_code,
            started_at: self.started_at,
            duration_us: i64::try_from(self.started.elapsed().as_micros()).unwrap_or(i64::MAX),
        };
        store::finish(conn, &row, self.first_seq, &self.steps).await?;
        Ok(self.id)
    }
}

/// Appends a step to a finished trace (the channel's delivery).
pub async fn append(conn: &mut AnyConnection, trace_id: i64, step: &Step) -> Result<Appended, DbError> {
    let seq = store::append_step(conn, trace_id, step).await?;
    Ok(Appended { trace_id, seq, failed: false })
}

/// Appends `step` and marks the whole trace failed with its reason code: a reply the runtime
/// gave that the channel then could not deliver, so the Traces page's outcome and error-code
/// filters find it.
pub async fn append_failure(conn: &mut AnyConnection, trace_id: i64, step: &Step) -> Result<Appended, DbError> {
    let seq = store::append_failure(conn, trace_id, step).await?;
    Ok(Appended { trace_id, seq, failed: true })
}

/// Appends a `step` that comes after the message's turn (a delivery, a later run of its tool
/// call) to its finished trace in a transaction of its own, marking the trace failed when
/// `failed` (see [`append_failure`]), and exports it. The trace records the work; it is not the
/// work, so a failure to write it is logged here and not returned.
pub async fn record_delivery(db: &db::Db, telemetry: &Telemetry, trace_id: i64, step: &Step, failed: bool) {
    let written = async {
        let mut tx = db.begin_write().await?;
        let appended = if failed { append_failure(&mut tx, trace_id, step).await? } else { append(&mut tx, trace_id, step).await? };
        tx.commit().await?;
        Ok::<_, DbError>(appended)
    }
    .await;
    match written {
        Ok(appended) => telemetry.appended([appended]),
        Err(e) => tracing::warn!(error = %e, trace.id = trace_id, step = %step.step, "recording a delivery in the trace failed"),
    }
}

/// A WhatsApp reply that Meta accepted and then could not deliver: the trace of the message it
/// answered gets the failure. `None` when the reply was sent for no traced message.
pub async fn fail_outbound(conn: &mut AnyConnection, outbound_wamid: &str, step: &Step) -> Result<Option<Appended>, DbError> {
    let Some(trace_id) = store::trace_of_outbound(conn, outbound_wamid).await? else { return Ok(None) };
    append_failure(conn, trace_id, step).await.map(Some)
}
