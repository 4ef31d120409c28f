//! The `whatsapp.inbound` job: one per stored inbound message. Readable messages go to the
//! [`InboundHandler`] (the conversation runtime) and its reply goes out through the sender;
//! other types get the configured note, at most once per chat per period.

use std::sync::Arc;

use crate::{
    channel::{InboundHandler, InboundMessage, InboundOutcome, MessageKind, Presence},
    db::{self, Db, DbError, whatsapp as store},
    jobs::{JobContext, JobError, JobHandler, JobOutput},
};

use super::{
    intake::InboundArgs,
    sender::{Recipient, SendError, SendOutcome, WhatsAppSender},
};

/// The notice kind recorded for the unknown-type note.
const UNKNOWN_TYPE_NOTICE: &str = "unknown_type";

pub struct InboundJob {
    db: Db,
    sender: Arc<WhatsAppSender>,
    handler: Arc<dyn InboundHandler>,
}

impl InboundJob {
    /// Adds the delivery to the message's trace (the runtime recorded which trace it is).
    async fn trace_delivery(&self, wamid: &str, sent: &SendOutcome) {
        let (decision, reason, failed) = match sent {
            SendOutcome::Sent { .. } => ("sent", "WHATSAPP_SENT".to_string(), false),
            SendOutcome::OutsideWindow { template_sent: true } => ("template_sent", "WHATSAPP_131047".to_string(), false),
            SendOutcome::OutsideWindow { template_sent: false } => ("failed", "WHATSAPP_131047".to_string(), true),
            SendOutcome::Failed { code } => ("failed", super::trace_code(code), true),
        };
        self.record_delivery(wamid, decision, &reason, &describe(sent), failed).await;
    }

    /// A send that ended in an error: retried by the job, or given up for good (`last`).
    async fn trace_send_error(&self, wamid: &str, error: &SendError, last: bool) {
        let (code, permanent) = match error {
            SendError::Retry { code, .. } => (code.as_str(), false),
            SendError::Permanent { code, .. } => (code.as_str(), true),
            SendError::Db(_) => return,
        };
        let given_up = permanent || last;
        let decision = if given_up { "failed" } else { "retry" };
        let what = if given_up { format!("reply failed ({code})") } else { format!("reply not sent yet ({code}); the job retries") };
        self.record_delivery(wamid, decision, &super::trace_code(code), &what, given_up).await;
    }

    /// Appends a `delivery` step to the message's trace and, when the reply did not reach the
    /// customer, marks the whole trace failed with `reason`.
    async fn record_delivery(&self, wamid: &str, decision: &str, reason: &str, what: &str, failed: bool) {
        let result = async {
            let mut tx = self.db.begin_write().await?;
            if let Some(earlier) = db::conversation::earlier_reply(&mut tx, wamid).await? {
                let detail = serde_json::json!({ "outcome": what }).to_string();
                let step = db::traces::Step { step: "delivery".into(), decision: decision.into(), reason_code: reason.into(), duration_us: 0, detail };
                if failed {
                    db::traces::append_failure(&mut tx, earlier.trace_id, &step).await?;
                } else {
                    db::traces::append_step(&mut tx, earlier.trace_id, &step).await?;
                }
            }
            tx.commit().await?;
            Ok::<_, db::DbError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "recording the delivery in the trace failed");
        }
    }

    pub fn new(db: Db, sender: Arc<WhatsAppSender>, handler: Arc<dyn InboundHandler>) -> Self {
        Self { db, sender, handler }
    }
}

fn db_error(e: DbError) -> JobError {
    JobError::retryable("DATABASE_ERROR", e.to_string())
}

fn send_error(e: SendError) -> JobError {
    match e {
        SendError::Retry { code, message } => JobError::retryable(&code, message),
        SendError::Permanent { code, message } => JobError::permanent(&code, message),
        SendError::Db(e) => db_error(e),
    }
}

/// The typing indicator for handlers, sent with the read receipt when configured.
struct Typing<'a> {
    sender: &'a WhatsAppSender,
    wamid: &'a str,
}

#[async_trait::async_trait]
impl Presence for Typing<'_> {
    async fn typing(&self) {
        if self.sender.settings().typing_indicator {
            self.sender.mark_read(self.wamid, true).await;
        }
    }
}

fn describe(outcome: &SendOutcome) -> String {
    match outcome {
        SendOutcome::Sent { parts, already_sent } => format!("replied ({parts} part(s), {already_sent} sent earlier)"),
        SendOutcome::OutsideWindow { template_sent: true } => "outside the 24-hour window; template sent".into(),
        SendOutcome::OutsideWindow { template_sent: false } => "outside the 24-hour window; no template configured".into(),
        SendOutcome::Failed { code } => format!("reply failed ({code})"),
    }
}

#[async_trait::async_trait]
impl JobHandler for InboundJob {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let args: InboundArgs = ctx.args()?;
        let mut conn = self.db.pool.acquire().await.map_err(|e| db_error(e.into()))?;
        let row = store::get_inbound(&mut conn, args.inbound_id)
            .await
            .map_err(db_error)?
            .ok_or_else(|| JobError::permanent("WHATSAPP_INBOUND_MISSING", format!("inbound message {} is not stored", args.inbound_id)))?;
        drop(conn);
        if let Some(outcome) = &row.outcome {
            return Ok(JobOutput { preview: Some(format!("already processed: {outcome}")), snooze: None });
        }
        // One business account can hold several numbers, and Meta sends every number's messages
        // to the app's webhook: only those addressed to ours are answered from it.
        let ours = &self.sender.settings().phone_number_id;
        let unanswerable = if ours.is_empty() {
            // Nothing can be sent: do not ask the model for a reply that cannot go out.
            Some("not answered: whatsapp.phone_number_id is not set, so nothing can be sent".to_string())
        } else if row.phone_number_id != *ours {
            Some(format!("not answered: addressed to phone number id {}, not ours", row.phone_number_id))
        } else {
            None
        };
        if let Some(outcome) = unanswerable {
            tracing::warn!(wamid = %row.wamid, "{outcome}");
            let mut conn = self.db.pool.acquire().await.map_err(|e| db_error(e.into()))?;
            store::mark_inbound_processed(&mut conn, row.id, &outcome, db::now_ms()).await.map_err(db_error)?;
            return Ok(JobOutput { preview: Some(outcome), snooze: None });
        }
        let message = InboundMessage {
            id: row.id,
            message_id: row.wamid.clone(),
            chat_id: row.chat_id.clone(),
            sender: row.sender.clone(),
            is_group: row.is_group,
            kind: MessageKind::from_stored(&row.msg_type),
            text: row.text.clone(),
            reply_id: row.reply_id.clone(),
            quoted_id: row.context_id.clone(),
            sent_at: row.sent_at,
            received_at: row.received_at,
            correlation_id: ctx.job.correlation_id.clone(),
        };
        let to = Recipient { id: message.chat_id.clone(), group: message.is_group };
        let job_id = ctx.job.id;
        let outcome = if message.kind.is_readable() {
            if self.sender.settings().mark_read {
                self.sender.mark_read(&message.message_id, false).await;
            }
            let presence = Typing { sender: &self.sender, wamid: &message.message_id };
            match self.handler.handle(&message, &presence).await {
                Ok(InboundOutcome::Reply { text, quote }) => {
                    let quote = quote.then_some(message.message_id.as_str());
                    let sent = match self.sender.send_text(job_id, &to, &text, quote).await {
                        Ok(sent) => sent,
                        Err(e) => {
                            self.trace_send_error(&message.message_id, &e, ctx.job.attempt >= ctx.job.max_attempts).await;
                            return Err(send_error(e));
                        }
                    };
                    self.trace_delivery(&message.message_id, &sent).await;
                    describe(&sent)
                }
                Ok(InboundOutcome::NoReply { reason }) => format!("no reply: {reason}"),
                Err(e) if e.retryable => return Err(JobError::retryable(&e.code, e.message)),
                Err(e) => return Err(JobError::permanent(&e.code, e.message)),
            }
        } else {
            self.note_unknown_type(job_id, &message, &to).await?
        };
        let mut conn = self.db.pool.acquire().await.map_err(|e| db_error(e.into()))?;
        store::mark_inbound_processed(&mut conn, row.id, &outcome, db::now_ms()).await.map_err(db_error)?;
        Ok(JobOutput { preview: Some(outcome), snooze: None })
    }
}

impl InboundJob {
    /// Unknown types skip the runtime, so their trace is written here: the type, and whether
    /// the note goes out. A retry of the job finds the trace and adds nothing.
    async fn trace_unknown_type(&self, message: &InboundMessage, decision: &str, reason: &str, note: Option<&str>) -> Result<(), DbError> {
        let mut tx = self.db.begin_write().await?;
        if db::conversation::earlier_reply(&mut tx, &message.message_id).await?.is_some() {
            return Ok(());
        }
        let owner = db::owners::owner_by_phone(&mut tx, &message.sender).await?;
        let now = db::now_ms();
        let row = db::traces::TraceRow {
            id: 0,
            correlation_id: message.correlation_id.clone(),
            channel: crate::conversation::WHATSAPP_CHANNEL.into(),
            chat_id: message.chat_id.clone(),
            message_id: message.message_id.clone(),
            actor: if owner.is_some() { "owner" } else { "customer" }.into(),
            route: UNKNOWN_TYPE_NOTICE.into(),
            outcome: if note.is_some() { "replied" } else { "ignored" }.into(),
            error_code: None,
            started_at: now,
            duration_us: 0,
        };
        let steps = [
            db::traces::Step {
                step: "message_type".into(),
                decision: "not_read".into(),
                reason_code: "UNSUPPORTED_TYPE".into(),
                duration_us: 0,
                detail: serde_json::json!({ "type": message.kind.as_str() }).to_string(),
            },
            db::traces::Step { step: "reply".into(), decision: decision.into(), reason_code: reason.into(), duration_us: 0, detail: "{}".into() },
        ];
        let trace_id = db::traces::insert(&mut tx, &row, &steps).await?;
        db::conversation::record_reply(&mut tx, &message.message_id, UNKNOWN_TYPE_NOTICE, note, trace_id, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn note_unknown_type(&self, job_id: i64, message: &InboundMessage, to: &Recipient) -> Result<String, JobError> {
        let settings = self.sender.settings();
        let note = settings.unknown_type_reply.trim();
        if note.is_empty() {
            self.trace_unknown_type(message, "none", "NO_NOTE_CONFIGURED", None).await.map_err(db_error)?;
            return Ok(format!("{} not read; no note configured", message.kind.as_str()));
        }
        let now = db::now_ms();
        let every = i64::try_from(settings.unknown_type_reply_every.as_millis()).unwrap_or(i64::MAX);
        let mut tx = self.db.begin_write().await.map_err(|e| db_error(e.into()))?;
        let claimed = store::claim_notice(&mut tx, &message.chat_id, UNKNOWN_TYPE_NOTICE, job_id, now.saturating_sub(every), now)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(|e| db_error(e.into()))?;
        if !claimed {
            self.trace_unknown_type(message, "none", "NOTE_ALREADY_SENT", None).await.map_err(db_error)?;
            return Ok(format!("{} not read; note already sent in this period", message.kind.as_str()));
        }
        self.trace_unknown_type(message, "send", "UNKNOWN_TYPE_NOTE", Some(note)).await.map_err(db_error)?;
        if settings.mark_read {
            self.sender.mark_read(&message.message_id, settings.typing_indicator).await;
        }
        let sent = match self.sender.send_text(job_id, to, note, None).await {
            Ok(sent) => sent,
            Err(e) => {
                self.trace_send_error(&message.message_id, &e, false).await;
                return Err(send_error(e));
            }
        };
        self.trace_delivery(&message.message_id, &sent).await;
        Ok(format!("{} not read; note: {}", message.kind.as_str(), describe(&sent)))
    }
}
