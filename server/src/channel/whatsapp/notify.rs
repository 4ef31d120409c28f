//! Delivers owner notices ([`DeliverNotice`] jobs, raised by `notify_owner` tool hooks and
//! customers' private-data questions) to an owner's WhatsApp number. The notice is also in the
//! console; without a configured WhatsApp number the job ends saying so instead of failing.

use std::sync::Arc;

use super::sender::{Recipient, SendError, SendOutcome, WhatsAppSender};
use crate::{
    db::{self, Db},
    jobs::{Handler, JobContext, JobError, JobOutput},
    owners::notices::DeliverNotice,
};

pub struct OwnerNotify {
    db: Db,
    sender: Arc<WhatsAppSender>,
}

impl OwnerNotify {
    pub fn new(db: Db, sender: Arc<WhatsAppSender>) -> Self {
        Self { db, sender }
    }
}

/// Whether `to` (digits) is still an owner's number. A notice or a question queued for a
/// number its owner has since removed (a lost phone, a number given up and reassigned) is not
/// sent: it may carry a customer's words, number or a call's arguments.
pub(crate) async fn still_an_owner(db: &Db, to: &str) -> Result<bool, db::DbError> {
    let mut conn = db.pool.acquire().await?;
    Ok(db::owners::owner_by_phone(&mut conn, to).await?.is_some())
}

#[async_trait::async_trait]
impl Handler<DeliverNotice> for OwnerNotify {
    async fn run(&self, args: DeliverNotice, ctx: &JobContext) -> Result<JobOutput, JobError> {
        if !still_an_owner(&self.db, &args.to).await? {
            return Ok(JobOutput { preview: Some("the number is no longer an owner's; not sent (the notice is in the console)".into()), snooze: None });
        }
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
