//! A free-form message Meta accepted and later reported undeliverable because the person's
//! 24-hour window had closed (a `failed` status with 131047): the configured template
//! (`whatsapp.window_template`) goes in its place, once per job, as it does when the send itself
//! is refused with 131047. Owner notices and approval requests to an owner who has not written
//! for a day meet this most.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::sender::{Recipient, SendError, WhatsAppSender};
use crate::jobs::{Handler, JobContext, JobError, JobKind, JobOutput};

/// Sends the window template for the job whose message was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendWindowTemplate {
    /// The job that sent the refused message: the template is sent once for it.
    pub job_id: i64,
    pub to: String,
    pub group: bool,
}

impl JobKind for SendWindowTemplate {
    const KIND: &'static str = "whatsapp.window_template";
}

impl SendWindowTemplate {
    /// One template per job, however many of its parts were refused.
    pub fn dedupe_key(&self) -> String {
        format!("job:{}:template", self.job_id)
    }
}

pub struct WindowTemplate {
    sender: Arc<WhatsAppSender>,
}

impl WindowTemplate {
    pub fn new(sender: Arc<WhatsAppSender>) -> Self {
        Self { sender }
    }
}

#[async_trait::async_trait]
impl Handler<SendWindowTemplate> for WindowTemplate {
    async fn run(&self, args: SendWindowTemplate, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        if self.sender.settings().window_template.trim().is_empty() {
            return Ok(JobOutput { preview: Some("no window_template is configured; nothing was sent".into()), snooze: None });
        }
        let to = Recipient { id: args.to, group: args.group };
        let preview = match self.sender.send_window_template(args.job_id, &to).await {
            Ok(true) => "the window template was sent",
            Ok(false) => "Meta refused the window template; nothing was sent",
            Err(SendError::Permanent { code, .. }) if code == "WHATSAPP_NOT_CONFIGURED" => "WhatsApp is not configured; nothing was sent",
            Err(e) => return Err(e.into()),
        };
        Ok(JobOutput { preview: Some(preview.into()), snooze: None })
    }
}
