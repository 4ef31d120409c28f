//! The `whatsapp.inbound` job: one per stored inbound message. The message goes to the
//! [`InboundHandler`] (the conversation runtime) as an [`Inbound`], whatever its type; the reply
//! goes out through the sender, and the delivery is appended to the message's trace.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use serde_json::json;

use crate::{
    channel::{self, Acknowledgement, Handled, Inbound, InboundHandler, MessageKind, Presence},
    db::{self, Db, DbError, whatsapp as store},
    domain::ChatKind,
    jobs::{Handler, JobContext, JobError, JobOutput},
    telemetry::Telemetry,
    traces::{self, Step},
};

use super::{
    intake::ProcessInbound,
    sender::{Recipient, SendError, SendOutcome, WhatsAppSender},
};

/// Why a reply was not sent: what it said was overtaken.
const SUPERSEDED: &str = "a later message about this request went out first";

pub struct InboundJob {
    db: Db,
    telemetry: Telemetry,
    sender: Arc<WhatsAppSender>,
    handler: Arc<dyn InboundHandler>,
    /// Whether this process has said (once, at ERROR) that messages wait for a send setting.
    told_waiting: AtomicBool,
}

/// How often a message waiting for a send setting looks again: at the next multiple of this,
/// plus [`IN_TURN_MS`] for each earlier message of its chat still unanswered, so that once the
/// setting is there they come due one after the other, in the order they came (a chat's
/// earlier job that is not due yet does not hold it, see `claim_in_order`).
const SETTING_WAIT_MS: i64 = 60_000;
/// How the preview of a message waiting for a send setting starts: a start with the setting in
/// place makes such messages due at once (`WhatsApp::waiting_for_a_setting`).
pub(super) const WAITING_FOR_A_SETTING: &str = "waiting: ";
const IN_TURN_MS: i64 = 1_000;
/// WhatsApp's customer service window: a message older than this that could not be answered
/// for want of a send setting is settled unanswered rather than answered days late.
const WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

impl InboundJob {
    pub fn new(db: Db, telemetry: Telemetry, sender: Arc<WhatsAppSender>, handler: Arc<dyn InboundHandler>) -> Self {
        Self { db, telemetry, sender, handler, told_waiting: AtomicBool::new(false) }
    }

    /// Appends a `delivery` step to the message's trace and, when the reply did not reach the
    /// customer, marks the whole trace failed with its reason. Never fails the job: the reply's
    /// fate is in the ledger either way.
    async fn trace_delivery(&self, trace_id: Option<i64>, decision: &str, reason: &str, what: &str, failed: bool) {
        let Some(trace_id) = trace_id else { return };
        let step = Step::new("delivery", decision, reason, json!({ "outcome": what }));
        traces::record_delivery(&self.db, &self.telemetry, trace_id, &step, failed).await;
    }

    async fn trace_sent(&self, trace_id: Option<i64>, sent: &SendOutcome) {
        let (decision, reason, failed) = match sent {
            SendOutcome::Sent { .. } => ("sent", "WHATSAPP_SENT".to_string(), false),
            SendOutcome::OutsideWindow { template_sent: true } => ("template_sent", "WHATSAPP_131047".to_string(), false),
            SendOutcome::OutsideWindow { template_sent: false } => ("failed", "WHATSAPP_131047".to_string(), true),
            SendOutcome::Failed { code } => ("failed", super::trace_code(code), true),
        };
        self.trace_delivery(trace_id, decision, &reason, &describe(sent), failed).await;
    }

    /// A send that ended in an error: retried by the job, or given up for good (`last`).
    async fn trace_send_error(&self, trace_id: Option<i64>, error: &SendError, last: bool) {
        let Some(code) = error.code() else { return };
        let given_up = matches!(error, SendError::Permanent { .. }) || last;
        let decision = if given_up { "failed" } else { "retry" };
        let what = if given_up { format!("reply failed ({code})") } else { format!("reply not sent yet ({code}); the job retries") };
        self.trace_delivery(trace_id, decision, &super::trace_code(code), &what, given_up).await;
    }

    /// The stored message as the runtime's input. A reply to one of the bot's own messages in
    /// the same chat addresses the bot (group rules) and quotes what it said.
    async fn inbound(&self, row: &store::InboundRow, correlation_id: &str) -> Result<Inbound, DbError> {
        let mut quoted_text = None;
        if let Some(quoted) = &row.context_id {
            let mut conn = self.db.pool.acquire().await?;
            if let Some(out) = store::outbound_by_wamid(&mut conn, quoted).await?.filter(|o| o.recipient == row.chat_id) {
                quoted_text = Some(out.body);
            }
        }
        Ok(Inbound {
            channel: channel::WHATSAPP.into(),
            message_id: row.wamid.clone(),
            chat_id: row.chat_id.clone(),
            chat_kind: if row.is_group { ChatKind::Group } else { ChatKind::Direct },
            sender: row.sender.clone(),
            sender_name: row.sender_name.clone(),
            kind: MessageKind::from_stored(&row.msg_type),
            text: row.text.clone().unwrap_or_default(),
            reply_id: row.reply_id.clone(),
            quoted_id: row.context_id.clone(),
            replies_to_bot: quoted_text.is_some(),
            quoted_text,
            mentions_bot: false,
            correlation_id: correlation_id.to_string(),
            operator: None,
            deadline: None,
        })
    }
}

/// The typing indicator for handlers, sent with the read receipt when configured, in direct
/// chats only.
struct Typing<'a> {
    sender: &'a WhatsAppSender,
    wamid: &'a str,
    direct: bool,
}

#[async_trait::async_trait]
impl Presence for Typing<'_> {
    async fn typing(&self) {
        if self.direct && self.sender.settings().typing_indicator {
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
impl Handler<ProcessInbound> for InboundJob {
    async fn run(&self, args: ProcessInbound, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
        let wamid = ctx.job.message_id.as_deref().unwrap_or_default();
        let row = match args.inbound_id {
            Some(id) => store::get_inbound(&mut conn, id).await,
            None => store::inbound_by_wamid(&mut conn, wamid).await,
        }
        .map_err(JobError::from)?
        .ok_or_else(|| JobError::permanent("WHATSAPP_INBOUND_MISSING", format!("inbound message {} is not stored", args.inbound_id.map_or_else(|| wamid.to_string(), |id| id.to_string()))))?;
        drop(conn);
        if let Some(outcome) = &row.outcome {
            return Ok(JobOutput { preview: Some(format!("already processed: {outcome}")), snooze: None });
        }
        // One business account can hold several numbers, and Meta sends every number's messages
        // to the app's webhook: only those addressed to ours are answered from it (while ours
        // is not set, that is decided once it is).
        let ours = &self.sender.settings().phone_number_id;
        let now = db::now_ms();
        let unanswered = if !ours.is_empty() && row.phone_number_id != *ours {
            Some(format!("not answered: addressed to phone number id {}, not ours", row.phone_number_id))
        } else {
            match self.sender.missing_setting() {
                // Too late to answer: WhatsApp's window closed while the setting was missing.
                Some(setting) if now.saturating_sub(row.sent_at) > WINDOW_MS => Some(format!("not answered: {setting} was not set within WhatsApp's 24-hour window")),
                // Messages come in but no reply can go out: the deployment's gap, not the
                // message's. The model is not asked for a reply that cannot be sent; the message
                // waits, using no attempt, until an operator sets what is missing and restarts.
                Some(setting) => {
                    let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
                    let earlier = db::jobs::unfinished_before(&mut conn, &row.chat_id, &ctx.job.kind, ctx.job.id).await.map_err(JobError::from)?;
                    return Ok(self.wait_for(setting, &row.wamid, now, earlier));
                }
                None => None,
            }
        };
        if let Some(outcome) = unanswered {
            tracing::warn!(wamid = %row.wamid, "{outcome}");
            let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
            store::mark_inbound_processed(&mut conn, row.id, &outcome, now).await.map_err(JobError::from)?;
            return Ok(JobOutput { preview: Some(outcome), snooze: None });
        }
        let mut inbound = self.inbound(&row, &ctx.job.correlation_id).await.map_err(JobError::from)?;
        // The reply's sends keep their share of the run's budget.
        inbound.deadline = Some(ctx.deadline_before(self.sender.settings().send_reserve()));
        if self.sender.settings().mark_read && inbound.kind.is_readable() {
            self.sender.mark_read(&inbound.message_id, false).await;
        }
        let presence = Typing { sender: &self.sender, wamid: &inbound.message_id, direct: inbound.chat_kind == ChatKind::Direct };
        let handled = self.handler.handle(&inbound, &presence).await.map_err(|e| if e.retryable { JobError::retryable(&e.code, e.message) } else { JobError::permanent(&e.code, e.message) })?;
        let outcome = self.deliver(ctx, &inbound, &handled).await?;
        let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
        store::mark_inbound_processed(&mut conn, row.id, &outcome, db::now_ms()).await.map_err(JobError::from)?;
        Ok(JobOutput { preview: Some(outcome), snooze: None })
    }
}

impl InboundJob {
    /// A message that waits for send `setting`, behind `earlier` unanswered messages of its
    /// chat: it runs again at the next multiple of [`SETTING_WAIT_MS`] and its turn, saying why
    /// on the Jobs page. The process says so once at ERROR.
    fn wait_for(&self, setting: &str, wamid: &str, now: i64, earlier: i64) -> JobOutput {
        let why = format!("{WAITING_FOR_A_SETTING}{setting} is not set, so no reply can be sent; set it and restart Gatehouse");
        if self.told_waiting.swap(true, Ordering::Relaxed) {
            tracing::debug!(%wamid, "{why}");
        } else {
            tracing::error!(%wamid, "WhatsApp messages come in but {setting} is not set: they wait, unanswered, until it is set and Gatehouse restarted");
        }
        let next = (now / SETTING_WAIT_MS + 1) * SETTING_WAIT_MS + earlier * IN_TURN_MS;
        JobOutput { preview: Some(why), snooze: Some(std::time::Duration::from_millis(u64::try_from(next - now).unwrap_or(0))) }
    }

    /// Sends the runtime's reply (the ledger skips parts a retry already sent) and traces it.
    async fn deliver(&self, ctx: &JobContext, inbound: &Inbound, handled: &Handled) -> Result<String, JobError> {
        let Some(text) = handled.reply.as_deref().filter(|t| !t.trim().is_empty()) else {
            return Ok(format!("no reply: {}", handled.route));
        };
        // An acknowledgement sent after a later message about the same request went out (the
        // tool's answer, an owner's decision, the word that an owner stopped the call), on any
        // attempt (usually a retried send), is stale: "I'm checking" after the answer only
        // confuses. Not once a part of it went out.
        if let Some(ack) = handled.acknowledgement
            && let Some(trace_id) = handled.trace_id
        {
            let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
            let started = store::outbound_by_key(&mut conn, &super::sender::part_key(ctx.job.id, 0)).await.map_err(JobError::from)?.is_some_and(|part| part.went_out());
            let stale = !started
                && db::traces::later_delivery_sent(&mut conn, trace_id).await.map_err(JobError::from)?
                && (ack == Acknowledgement::Underway || db::approvals::asked_by(&mut conn, &inbound.channel, &inbound.message_id).await.map_err(JobError::from)?.iter().all(|r| r.state != db::approvals::State::Pending));
            if stale {
                drop(conn);
                self.trace_delivery(Some(trace_id), "skipped", "REPLY_SUPERSEDED", SUPERSEDED, false).await;
                return Ok(format!("no reply: {SUPERSEDED}"));
            }
        }
        if !inbound.kind.is_readable() && self.sender.settings().mark_read {
            self.sender.mark_read(&inbound.message_id, self.sender.settings().typing_indicator).await;
        }
        let to = Recipient { id: inbound.chat_id.clone(), group: inbound.chat_kind == ChatKind::Group };
        let quote = handled.quote.then_some(inbound.message_id.as_str());
        match self.sender.send_text(ctx.job.id, &to, text, quote).await {
            Ok(sent) => {
                self.trace_sent(handled.trace_id, &sent).await;
                Ok(describe(&sent))
            }
            Err(e) => {
                self.trace_send_error(handled.trace_id, &e, ctx.job.attempt >= ctx.job.max_attempts).await;
                Err(e.into())
            }
        }
    }
}
