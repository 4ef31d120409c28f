//! Tells the owners when a person's message is dropped unanswered: its `whatsapp.inbound` job
//! was discarded (a permanent failure, its last attempt failed, or its lease ran out on its last
//! attempt). The person may be waiting
//! for an answer that will not come. The notice is in the console and goes to the owner
//! numbers, with a link to the job, where an owner can retry it; one chat's owners hear of it at
//! most once per `whatsapp.undelivered_notice_every`, together with the undelivered-reply
//! notice, and on WhatsApp once per cause (`undelivered::tell_once`). The job queue enqueues
//! this job in the transaction that drops the message's job (`jobs::Registry::when_dropped`),
//! so no crash loses it. None is raised for an owner's own message (the owner saw no answer, and
//! a notice to them may meet the same trouble), for a reply Meta refused for good (the
//! undelivered-reply notice says so), nor when the person was answered after all.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::undelivered::{ChatNotice, tell_once};
use crate::{
    config::Settings,
    db::{
        self, Db, DbError,
        jobs::JobState,
        whatsapp::{self as store, DeliveryState},
    },
    jobs::{Followed, Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
};

/// The notice's stable code, in the console's list of owner notices.
pub const MESSAGE_UNHANDLED: &str = "MESSAGE_UNHANDLED";

/// Looks at a dropped `whatsapp.inbound` job, and tells the owners if it is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnhandledNotice(pub Followed);

impl JobKind for UnhandledNotice {
    const KIND: &'static str = "whatsapp.unhandled";
}

impl From<Followed> for UnhandledNotice {
    fn from(followed: Followed) -> Self {
        Self(followed)
    }
}

pub struct Unhandled {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
}

impl Unhandled {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>) -> Self {
        Self { db, queue, settings }
    }

    async fn tell(&self, UnhandledNotice(args): &UnhandledNotice, correlation_id: String) -> Result<&'static str, DbError> {
        let mut conn = self.db.pool.acquire().await?;
        let Some(job) = db::jobs::get(&mut conn, args.job_id).await? else { return Ok("no such job") };
        // An owner retried it since (it may yet be answered), or cancelled that retry.
        let dropped = job.state == JobState::Discarded || (job.state == JobState::Cancelled && job.last_error_code.as_deref() == Some(db::jobs::EXPIRED));
        if job.attempt != args.attempt || !dropped {
            return Ok("the message's job was retried since: no notice");
        }
        let Some(row) = store::inbound_by_wamid(&mut conn, job.message_id.as_deref().unwrap_or_default()).await? else {
            return Ok("the message is not stored: no notice");
        };
        if row.outcome.is_some() {
            return Ok("the message was handled: no notice");
        }
        if !row.is_group && db::owners::owner_by_phone(&mut conn, &row.sender).await?.is_some() {
            return Ok("an owner's message: no notice");
        }
        let parts = store::outbound_for_job(&mut conn, job.id).await?;
        if parts.iter().any(|p| p.state == DeliveryState::Failed) {
            return Ok("Meta refused its reply for good: the undelivered-reply notice tells the owners");
        }
        if !parts.is_empty() && parts.iter().all(store::OutboundRow::went_out) {
            return Ok("its reply went out: no notice");
        }
        // The answer the reply was to announce went out on its own (a slow tool's, an owner's
        // decision), though "I'm checking" never did.
        if let Some(reply) = db::conversation::earlier_reply(&mut conn, &row.wamid).await?
            && db::traces::later_delivery_sent(&mut conn, reply.trace_id).await?
        {
            return Ok("a later message answered them: no notice");
        }
        drop(conn);
        if self.settings.whatsapp.unhandled_notice.trim().is_empty() {
            return Ok("whatsapp.unhandled_notice is empty: no notice");
        }
        let code = super::trace_code(job.last_error_code.as_deref().unwrap_or("JOB_FAILED"));
        let link = format!("{}/jobs/{}", self.settings.server.console_url(), job.id);
        let notice = ChatNotice { chat_id: &row.chat_id, is_group: row.is_group, text: &self.settings.whatsapp.unhandled_notice, code: &code, link: &link, reason_code: MESSAGE_UNHANDLED };
        tell_once(&self.db, &self.queue, &self.settings, &notice, correlation_id).await
    }
}

#[async_trait::async_trait]
impl Handler<UnhandledNotice> for Unhandled {
    async fn run(&self, args: UnhandledNotice, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let said = self.tell(&args, ctx.job.correlation_id.clone()).await?;
        Ok(JobOutput { preview: Some(said.into()), snooze: None })
    }
}
