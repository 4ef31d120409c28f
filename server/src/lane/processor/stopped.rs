//! A call an owner stopped: its `tool.call` job was cancelled on the Jobs page before it
//! finished. The person who asked was told its answer would follow (or that an owner approved
//! it), so they are told it will not: `lane.cancelled_reply`, once, through the channel. An
//! approved call's outcome is `JOB_CANCELLED`, and the owner who approved it is told. The job
//! queue enqueues this job in the cancel's own transaction (`jobs::Registry::when_cancelled`).

use serde::{Deserialize, Serialize};

use super::Processor;
use crate::{
    approvals,
    channel::{DeliverError, Delivered, WHATSAPP},
    db::{
        self, DbError,
        jobs::JobState,
    },
    jobs::{Followed, Handler, JobContext, JobError, JobKind, JobOutput},
    lane::job::ToolCallJob,
};

/// Tells the person whose call an owner cancelled, if its answer had not gone out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStopped(pub Followed);

impl JobKind for CallStopped {
    const KIND: &'static str = "tool.stopped";
}

impl From<Followed> for CallStopped {
    fn from(followed: Followed) -> Self {
        Self(followed)
    }
}

impl Processor {
    async fn tell_stopped(&self, CallStopped(args): &CallStopped, own_job: i64) -> Result<String, JobError> {
        let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
        let Some(row) = db::jobs::get(&mut conn, args.job_id).await? else { return Ok("no such job".into()) };
        drop(conn);
        if row.state != JobState::Cancelled || row.attempt != args.attempt || row.last_error_code.as_deref() != Some(db::jobs::CANCELLED) {
            return Ok("the call's job was retried since: nothing to say".into());
        }
        let job: ToolCallJob = serde_json::from_str(&row.args).map_err(|e| JobError::permanent("JOB_ARGS_INVALID", format!("the stopped call's args do not decode: {e}")))?;
        // An approved call: its outcome is recorded, and the owner who approved it told.
        if job.approval.is_some() {
            self.approvals.run_cancelled(&row).await?;
        }
        if !approvals::is_chat(&job.reply_to.channel) {
            return Ok("asked in the console: no chat to tell".into());
        }
        // Its answer went out before the cancel (the run had sent it, and not yet recorded its
        // end), or the lane gave it in the message's reply.
        if self.kept(&row).await?.is_some_and(|kept| kept.in_reply) {
            return Ok("its answer was the message's reply: nothing to say".into());
        }
        if job.reply_to.channel == WHATSAPP {
            let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
            if db::whatsapp::outbound_for_job(&mut conn, row.id).await?.iter().any(|part| part.wamid.is_some()) {
                return Ok("its answer went out: nothing to say".into());
            }
        }
        match self.outbound.deliver(&job.reply_to, &self.lane.cancelled_reply, own_job, job.trace_id).await {
            Ok(Delivered::Sent) => Ok("the person was told the call was stopped".into()),
            Ok(Delivered::Refused { code }) => Ok(format!("the person could not be told ({code})")),
            Err(DeliverError::Retry { code, message }) => Err(JobError::retryable(&code, message)),
            Err(DeliverError::Permanent { code, message }) => Err(JobError::permanent(&code, message)),
        }
    }
}

#[async_trait::async_trait]
impl Handler<CallStopped> for Processor {
    async fn run(&self, args: CallStopped, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let said = self.tell_stopped(&args, ctx.job.id).await?;
        Ok(JobOutput { preview: Some(said), snooze: None })
    }
}
