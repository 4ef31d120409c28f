//! A call an owner stopped: its `tool.call` job was cancelled on the Jobs page before it
//! finished. The person who asked was told its answer would follow (or that it waits for an
//! owner's approval), so unless that answer reached them, they are told it will not come:
//! `lane.cancelled_reply`, once, through the channel (a call an owner cancels, retries and
//! cancels again before it runs is said once: the second stop finds the first one's notice). The job queue enqueues this job in the
//! cancel's own transaction (`jobs::Registry::when_cancelled`).
//!
//! A run under way when the job was cancelled goes on until its heartbeat finds the lease gone
//! (or the run ends by itself, answer and all), and keeps its lease till then: this job waits
//! for that, so it judges what the person got from the run's end, not from its middle. An
//! approved call's outcome is then recorded (`JOB_CANCELLED`, unless the run ended with one of
//! its own) and the owner who approved it told.

use serde::{Deserialize, Serialize};

use super::Processor;
use crate::{
    approvals,
    channel::{DeliverError, Delivered},
    db::{
        self, DbError,
        jobs::{JobRow, JobState},
    },
    jobs::{Followed, Handler, JobContext, JobError, JobKind, JobOutput, follow_ups_of},
    lane::job::ToolCallJob,
};

/// How often it looks again while the cancelled run is stopping (it stops at its next
/// heartbeat, a quarter of the lease, or when its lease runs out if its process died).
const STOPPING_POLL: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// What it told, or `None` while the cancelled run may still be going.
    async fn tell_stopped(&self, CallStopped(args): &CallStopped, own_job: i64) -> Result<Option<String>, JobError> {
        let mut conn = self.db.pool.acquire().await.map_err(|e| JobError::from(DbError::from(e)))?;
        let Some(row) = db::jobs::get(&mut conn, args.job_id).await? else { return Ok(Some("no such job".into())) };
        drop(conn);
        let job: ToolCallJob = serde_json::from_str(&row.args).map_err(|e| JobError::permanent("JOB_ARGS_INVALID", format!("the stopped call's args do not decode: {e}")))?;
        // An owner's run again of a call whose first job's end the person heard: they were not
        // told this one would follow.
        if let Some(first) = job.again_of
            && self.first_told(&job, first).await?
        {
            return Ok(Some(format!("a run again of job {first}'s call, whose end the person heard: nothing to say")));
        }
        // A call retried since may still answer, and is told by its run. An approved call's
        // cancel ended its approval: a retry never makes it (and says nothing), so the stop is
        // told all the same.
        let retried = row.state != JobState::Cancelled || row.attempt != args.attempt || row.last_error_code.as_deref() != Some(db::jobs::CANCELLED);
        if retried && job.approval.is_none() {
            return Ok(Some("the call's job was retried since: nothing to say".into()));
        }
        // The cancelled run keeps its lease until it has stopped (a retried approved call's
        // run, until it has refused).
        if row.lease_expires_at.is_some() {
            return Ok(None);
        }
        if job.approval.is_some() {
            self.approvals.run_cancelled(&row).await?;
        }
        if !approvals::is_chat(&job.reply_to.channel) {
            return Ok(Some("asked in the console: no chat to tell".into()));
        }
        // The run ended with its answer: in the message's reply, or sent on its own.
        if self.kept(&row).await?.is_some_and(|kept| kept.in_reply) {
            return Ok(Some("its answer was the message's reply: nothing to say".into()));
        }
        if self.outbound.went_out(&job.reply_to, row.id).await? {
            return Ok(Some("its answer went out: nothing to say".into()));
        }
        // Stopped before (an owner cancelled it, retried it and cancelled it again before it
        // ran): the person was told then.
        if let Some(told) = self.told_stopped_before(&row, &job, own_job).await? {
            return Ok(Some(format!("job {told} told the person the call was stopped: nothing more to say")));
        }
        if self.lane.cancelled_reply.trim().is_empty() {
            return Ok(Some("lane.cancelled_reply is empty: nothing said".into()));
        }
        match self.outbound.deliver(&job.reply_to, &self.lane.cancelled_reply, &self.lane.cancelled_reply, own_job, job.trace_id).await {
            Ok(Delivered::Sent) => Ok(Some("the person was told the call was stopped".into())),
            Ok(Delivered::Refused { code }) => Ok(Some(format!("the person could not be told ({code})"))),
            Err(DeliverError::Retry { code, message }) => Err(JobError::retryable(&code, message)),
            Err(DeliverError::Permanent { code, message }) => Err(JobError::permanent(&code, message)),
        }
    }
}

impl Processor {
    /// An earlier `tool.stopped` job of call `row` whose notice went out, if one did.
    async fn told_stopped_before(&self, row: &JobRow, job: &ToolCallJob, own_job: i64) -> Result<Option<i64>, DbError> {
        let Some(chat_id) = &row.chat_id else { return Ok(None) };
        let earlier = follow_ups_of::<CallStopped>(&mut *self.db.pool.acquire().await?, chat_id, row.id).await?;
        for id in earlier.into_iter().filter(|id| *id < own_job) {
            if self.outbound.went_out(&job.reply_to, id).await? {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}

#[async_trait::async_trait]
impl Handler<CallStopped> for Processor {
    async fn run(&self, args: CallStopped, ctx: &JobContext) -> Result<JobOutput, JobError> {
        Ok(match self.tell_stopped(&args, ctx.job.id).await? {
            Some(said) => JobOutput { preview: Some(said), snooze: None },
            None => JobOutput { preview: Some("the cancelled run is still stopping".into()), snooze: Some(STOPPING_POLL) },
        })
    }
}
