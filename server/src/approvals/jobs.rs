//! The approval path's jobs: asking one owner number ([`AskOwner`], an interactive WhatsApp
//! message with Approve and Reject buttons, through the delivery ledger) and settling a request
//! for the person who asked ([`Settle`]: rejected, or expired when its time ran out).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Approvals, is_chat};
use crate::{
    channel::{
        DeliverError, Delivered, Outbound, ReplyTo,
        whatsapp::{Recipient, SendOutcome, WhatsAppSender, sender::SendError},
    },
    db::approvals::State,
    domain::ChatKind,
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput},
};

/// Ask one owner number to decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskOwner {
    pub approval_id: i64,
    /// The owner's number, digits only.
    pub to: String,
}

impl JobKind for AskOwner {
    const KIND: &'static str = "approval.ask";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleReason {
    /// Scheduled at the expiry time: expire the request if no one decided, and say so.
    Expired,
    /// An owner rejected it: say so.
    Rejected,
}

/// Tell the person who asked how a request ended without running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settle {
    pub approval_id: i64,
    pub reason: SettleReason,
}

impl JobKind for Settle {
    const KIND: &'static str = "approval.settle";
}

pub struct AskOwnerHandler {
    approvals: Arc<Approvals>,
    sender: Arc<WhatsAppSender>,
}

impl AskOwnerHandler {
    pub fn new(approvals: Arc<Approvals>, sender: Arc<WhatsAppSender>) -> Self {
        Self { approvals, sender }
    }
}

fn output(preview: impl Into<String>) -> JobOutput {
    JobOutput { preview: Some(preview.into()), snooze: None }
}

#[async_trait::async_trait]
impl Handler<AskOwner> for AskOwnerHandler {
    async fn run(&self, args: AskOwner, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let Some(row) = self.approvals.get(args.approval_id).await? else { return Ok(output("the approval no longer exists")) };
        if row.state != State::Pending {
            return Ok(output(format!("already {}; not asked", row.state)));
        }
        if !crate::channel::whatsapp::notify::still_an_owner(&self.approvals.db, &args.to).await? {
            return Ok(output("the number is no longer an owner's; not asked (the request is in the console)"));
        }
        let (text, buttons) = self.approvals.prompt(&row);
        let to = Recipient { id: args.to, group: false };
        let preview = match self.sender.send_buttons(ctx.job.id, &to, &text, &buttons).await {
            Ok(SendOutcome::Sent { .. }) => "asked the owner on WhatsApp".to_string(),
            Ok(SendOutcome::OutsideWindow { template_sent }) => {
                format!("outside the owner's 24-hour window; template {}; the request is in the console", if template_sent { "sent" } else { "not configured" })
            }
            Ok(SendOutcome::Failed { code }) => format!("not delivered ({code}); the request is in the console"),
            Err(SendError::Permanent { code, .. }) if code == "WHATSAPP_NOT_CONFIGURED" => "WhatsApp is not configured; the request is in the console".into(),
            Err(e) => return Err(e.into()),
        };
        Ok(output(preview))
    }
}

pub struct SettleHandler {
    approvals: Arc<Approvals>,
    outbound: Arc<dyn Outbound>,
}

impl SettleHandler {
    pub fn new(approvals: Arc<Approvals>, outbound: Arc<dyn Outbound>) -> Self {
        Self { approvals, outbound }
    }
}

#[async_trait::async_trait]
impl Handler<Settle> for SettleHandler {
    async fn run(&self, args: Settle, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let Some(row) = self.approvals.get(args.approval_id).await? else { return Ok(output("the approval no longer exists")) };
        let text = match args.reason {
            SettleReason::Expired => {
                // A retried run finds it expired by its first attempt: say it (the ledger sends
                // once per job).
                if row.state == State::Pending {
                    self.approvals.expire(row.id).await?;
                }
                match self.approvals.get(row.id).await? {
                    None => {}
                    Some(now) if now.decided_via.as_deref() == Some(crate::db::approvals::SUPERSEDED) => {
                        return Ok(output("expired as the same call was asked for again; the new request is what the person hears about"));
                    }
                    Some(now) if now.state == State::Expired => {}
                    Some(now) if now.state == State::Pending => {
                        // Run before its time (an owner's "run now" on the Jobs page): it waits
                        // for the expiry again, using up no attempt, instead of failing until
                        // discarded.
                        let wait = u64::try_from(now.expires_at.saturating_sub(crate::db::now_ms())).unwrap_or(0).max(1000);
                        return Ok(JobOutput { preview: Some("not due to expire yet".into()), snooze: Some(std::time::Duration::from_millis(wait)) });
                    }
                    Some(now) => return Ok(output(format!("{} before it expired; nothing to say", now.state.as_str()))),
                }
                &self.approvals.settings().requester_expired
            }
            SettleReason::Rejected => &self.approvals.settings().requester_rejected,
        };
        if !is_chat(&row.channel) {
            return Ok(output("asked from the console; nothing to send"));
        }
        let to = ReplyTo { channel: row.channel.clone(), chat_id: row.chat_id.clone(), chat_kind: row.chat_kind.parse().unwrap_or(ChatKind::Direct), message_id: row.message_id.clone() };
        match self.outbound.deliver(&to, text, text, ctx.job.id, row.trace_id).await {
            Ok(Delivered::Sent) => Ok(output("told the person who asked")),
            // Taken, and refused for good (their 24-hour window had closed, say): the trace
            // says so, and a retry would not reach them either.
            Ok(Delivered::Refused { code }) => Ok(output(format!("not delivered to the person who asked ({code})"))),
            Err(DeliverError::Retry { code, message }) => Err(JobError::retryable(&code, message)),
            Err(DeliverError::Permanent { code, message }) => Err(JobError::permanent(&code, message)),
        }
    }
}
