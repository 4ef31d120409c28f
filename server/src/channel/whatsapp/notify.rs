//! Delivers owner notices ([`DeliverNotice`] jobs, raised by `notify_owner` tool hooks and
//! customers' private-data questions) to an owner's WhatsApp number. The notice is also in the
//! console; without a configured WhatsApp number the job ends saying so instead of failing.

use std::sync::Arc;

use super::sender::{Recipient, SendError, SendOutcome, WhatsAppSender};
use crate::{
    jobs::{Handler, JobContext, JobError, JobOutput},
    owners::notices::DeliverNotice,
};

pub struct OwnerNotify {
    sender: Arc<WhatsAppSender>,
}

impl OwnerNotify {
    pub fn new(sender: Arc<WhatsAppSender>) -> Self {
        Self { sender }
    }
}

#[async_trait::async_trait]
impl Handler<DeliverNotice> for OwnerNotify {
    async fn run(&self, args: DeliverNotice, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let to = Recipient { id: args.to, group: false };
        let preview = match self.sender.send_text(ctx.job.id, &to, &args.message, None).await {
            Ok(SendOutcome::Sent { parts, .. }) => format!("sent to the owner ({parts} part(s))"),
            Ok(SendOutcome::OutsideWindow { template_sent }) => {
                format!("outside the owner's 24-hour window; template {}", if template_sent { "sent" } else { "not configured" })
            }
            Ok(SendOutcome::Failed { code }) => format!("not delivered ({code}); the notice is in the console"),
            Err(SendError::Permanent { code, .. }) if code == "WHATSAPP_NOT_CONFIGURED" => "WhatsApp is not configured; the notice is in the console".into(),
            Err(e) => return Err(e.into()),
        };
        Ok(JobOutput { preview: Some(preview), snooze: None })
    }
}
