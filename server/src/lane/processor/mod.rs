//! The tool-call processor (seed §9): a stored `tool.call` job runs through the one checkpoint,
//! its result is summarized (seed §10), and the answer goes to the chat. Failures keep their
//! codes: parse, schema, policy and unknown tools are permanent, and so is a provider's definite
//! answer (a connector's 4xx); timeouts, open circuits and transient provider errors are retried
//! while attempts remain, and only the last failure is said to the person.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    PrivateData,
    context::ContextStore,
    job::ToolCallJob,
    planner::ProposedCall,
    summarizer::{Summarizer, SummaryInput, ToolResult, Writer},
    validator::{Advisory, PlanScope, Validator},
};
use crate::{
    approvals::{self, Approvals},
    channel::{DeliverError, Delivered, Outbound},
    db::{Db, DbError, jobs::JobRow},
    jobs::{Handler, JobContext, JobError, JobOutput, JobQueue},
    config::{LaneSettings, Settings},
    tools::{CallContext, Checkpoint, ToolCall, catalog::AsyncPolicy, checkpoint::ToolCode},
    telemetry::Telemetry,
    traces::{self, Step},
};

/// Why a job's approval does not let it run ([`Processor::not_granted`]).
enum NotGranted {
    /// The job names an approval it was not given: the person is told it could not be done.
    Claimed(String),
    /// Its approval ended when an owner cancelled the job, and the person was told it stopped.
    Ended(String),
}

mod again;
mod answer;
mod kept;
pub mod stopped;
mod unknown;

pub use answer::Answer;

pub struct Processor {
    /// Where each job's final answer is kept, so a retry sends it again instead of running the
    /// call twice.
    db: Db,
    /// Where owners are told of a call whose outcome is unknown, and the console's address
    /// their notice links to.
    queue: JobQueue,
    console_url: String,
    /// Runs in which the call itself is tried (`jobs.default_max_attempts`); a job's later runs
    /// (`jobs.attempts.tool_call`) only send its answer.
    call_attempts: i64,
    checkpoint: Arc<Checkpoint>,
    summarizer: Summarizer,
    outbound: Arc<dyn Outbound>,
    /// Where an approved call's outcome is recorded and told to the owner who decided.
    approvals: Arc<Approvals>,
    /// Where each chat's summarised results are kept for its follow-ups.
    contexts: Arc<ContextStore>,
    /// The lane's rules, by which a call whose tool changed while it waited is judged again.
    lane: LaneSettings,
    /// Where the steps it adds to a message's finished trace are exported.
    telemetry: Telemetry,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor").finish_non_exhaustive()
    }
}

impl Processor {
    pub fn new(queue: JobQueue, settings: &Settings, checkpoint: Arc<Checkpoint>, summarizer: Summarizer, outbound: Arc<dyn Outbound>, approvals: Arc<Approvals>, contexts: Arc<ContextStore>) -> Self {
        let call_attempts = i64::from(settings.jobs.default_max_attempts.max(1));
        Self { db: queue.db().clone(), queue, console_url: settings.server.console_url(), call_attempts, checkpoint, summarizer, outbound, approvals, contexts, lane: settings.lane.clone(), telemetry: Telemetry::default() }
    }

    /// Exports the steps it adds to a message's finished trace (a later answer, a retry).
    pub fn traced(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// Why a call accepted against an earlier definition of its tool (the catalog was reloaded
    /// while its job waited) may no longer run without an owner: it is judged again by the
    /// lane's rules, which the checkpoint does not apply (the actor's risk ceiling, the owner a
    /// customer's private-data call needs). `None` for an unchanged tool (unless an owner runs
    /// the call again), or an approved call (its approval binds the definition already).
    fn changed_since_accepted(&self, job: &ToolCallJob, ctx: &CallContext) -> Option<String> {
        let catalog = self.checkpoint.catalog();
        let tool = catalog.get(&job.tool)?;
        // A call an owner runs again is judged again in any case: the rules may have changed
        // since without a new definition (the lane's risk ceiling, say).
        if job.approval.is_some() || (tool.version == job.version && job.again_of.is_none()) {
            return None;
        }
        let call = ProposedCall { id: String::new(), name: job.tool.clone(), args: job.args.clone(), reason: String::new() };
        let private_data = if job.actor == crate::domain::Role::Owner { PrivateData::Unguarded } else { PrivateData::Clear };
        let scope = PlanScope { candidates: std::slice::from_ref(&job.tool), ctx, private_data: &private_data, max_steps: 1 };
        let judged = Validator { catalog: &catalog, settings: &self.lane }.validate(std::slice::from_ref(&call), Advisory::default(), &scope);
        match (judged.rejected.first(), judged.accepted.first()) {
            (Some(refused), _) => Some(format!("{}: {}", refused.code.as_str(), refused.reason)),
            (None, Some(accepted)) => accepted.needs_approval.clone(),
            (None, None) => Some("nothing to run".into()),
        }
    }

    /// The answer of a call that failed with `code` before or without its result: the lane's
    /// configured text for a failed call.
    fn not_made(&self, code: &str) -> Answer {
        Answer::failed(self.summarizer.without_tool(&ToolResult::Failed { code: code.into() }), code)
    }

    /// Why job `row`'s approval does not let it run, if it names one: the approval must exist,
    /// be approved, and be for this tool, this definition, these arguments and this job, whose
    /// owner has not cancelled it. A cancel ends the approval (`JOB_CANCELLED`, its approver and
    /// the person told so): a retry of the job does not make the call it no longer stands for,
    /// and an owner who still wants it asks again. The job's event trail says so, written in
    /// the cancel's own transaction, so no retry comes before it.
    async fn not_granted(&self, job: &ToolCallJob, row: &JobRow) -> Result<Option<NotGranted>, JobError> {
        let Some(approved) = &job.approval else { return Ok(None) };
        let Some(approval) = self.approvals.get(approved.approval_id).await? else { return Ok(Some(NotGranted::Claimed(format!("there is no approval #{}", approved.approval_id)))) };
        Ok(if approval.state != crate::db::approvals::State::Approved {
            Some(NotGranted::Claimed(format!("approval #{} is {}", approval.id, approval.state.as_str())))
        } else if approval.tool != job.tool || approval.tool_version != approved.version || approval.args_hash != approved.args_hash || approval.job_id != Some(row.id) {
            Some(NotGranted::Claimed(format!("approval #{} was given for another call", approval.id)))
        } else if crate::db::jobs::was_cancelled(&mut *self.db.pool.acquire().await.map_err(DbError::from)?, row.id).await? {
            Some(NotGranted::Ended(format!("approval #{} ended when an owner cancelled its job", approval.id)))
        } else {
            None
        })
    }

    /// The final answer of the call stored as job `row`: the one an earlier attempt kept, or
    /// this attempt's, kept before anything is sent. A retried job (its send failed, say) so
    /// sends the same answer again: its call never runs, nor its summary is asked for, twice.
    /// `Err` is a failure another attempt may clear: nothing is said, and nothing kept.
    pub async fn final_answer(&self, job: &ToolCallJob, row: &JobRow) -> Result<Answer, JobError> {
        let answer = self.settle(job, row).await?;
        self.keep(job, row, &answer, false).await;
        Ok(answer)
    }

    /// What [`Processor::final_answer`] comes to, before it is kept: the lane's own run keeps it
    /// once it knows who sends it.
    pub async fn settle(&self, job: &ToolCallJob, row: &JobRow) -> Result<Answer, JobError> {
        // An owner ran its call again as another job, which answers for it: such a job is not
        // retried, and should it run all the same it makes no call and says nothing.
        if row.last_error_code.as_deref() == Some(crate::db::jobs::DONE_AGAIN) {
            tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, "the call was run again as another job; not made here");
            return Err(JobError::permanent(crate::db::jobs::DONE_AGAIN, "its call was run again as another job, which answers for it"));
        }
        if let Some(kept) = self.kept(row).await? {
            tracing::info!(job.id = row.id, correlation_id = %row.correlation_id, "the call already ran; sending its kept answer");
            return Ok(kept);
        }
        // The approval a job names is only a claim: the approvals table says whether an owner
        // approved exactly this call, for this job.
        match self.not_granted(job, row).await? {
            // The cancel's own follow-up (`tool.stopped`) tells the person it stopped: nothing
            // more is said here, and the outcome stays the cancel's.
            Some(NotGranted::Ended(why)) => {
                tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, tool = %job.tool, reason = %why, "an approved call whose job an owner cancelled is not run");
                // Recorded by the cancel's follow-up, unless this retry came first.
                self.approvals.run_cancelled(row).await?;
                return Err(JobError::permanent(ToolCode::ApprovalNotGranted.as_str(), why));
            }
            Some(NotGranted::Claimed(why)) => {
                tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, tool = %job.tool, reason = %why, "a tool call names an approval it does not have; not run");
                let code = ToolCode::ApprovalNotGranted.as_str();
                return Ok(self.not_made(code));
            }
            None => {}
        }
        // A call not safe to repeat is marked as made before it is (see `unknown`): one an
        // earlier run made, whose answer was never kept, is not made again.
        let tool = self.checkpoint.catalog().get(&job.tool);
        let unsafe_repeat = self.unsafe_to_repeat(tool.as_deref());
        if unsafe_repeat && !self.mark_started(row).await? {
            return Ok(self.outcome_unknown(job, row).await);
        }
        // The call itself is made in the first `jobs.default_max_attempts` runs only. A later
        // run with nothing kept follows runs that stopped before they kept an answer (a crash,
        // a lost lease, a failed write): a call that brings its run down is not made again for
        // each of the job's remaining runs (`jobs.attempts.tool_call`). A tool that may not run
        // as a job (`async_policy = "never"`) is made in the lane's own run only: a worker's
        // run follows one the lane could not finish or start (a lost lease, a crash, a failed
        // claim), and its answer would come after the person stopped waiting for it. The
        // person is told it could not be done.
        let never_async = job.approval.is_none() && tool.as_deref().is_some_and(|t| t.spec.async_policy == AsyncPolicy::Never);
        let worker_run = !row.lease_owner.as_deref().is_some_and(crate::jobs::inline::is_lane_run);
        let refused = if never_async && worker_run {
            Some((ToolCode::NotRunAsJob, "the tool may not run as a job and the lane's own run did not finish it; not made in a worker's run"))
        } else if row.attempt > self.call_attempts {
            Some((ToolCode::AttemptsExhausted, "the call's runs are used up with no answer kept; not made again"))
        } else {
            None
        };
        if let Some((code, why)) = refused {
            if unsafe_repeat {
                // Marked just now, by this run: no earlier run made it.
                self.unmark(row).await;
            }
            let code = code.as_str();
            tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, tool = %job.tool, attempt = row.attempt, call_attempts = self.call_attempts, code, "{why}");
            return Ok(self.not_made(code));
        }
        let (answer, maybe_applied) = self.run(job, &row.correlation_id).await;
        if unsafe_repeat && answer.failure.is_some() {
            // Failed, but it may have taken effect (a timeout, an error answer): not made again.
            if maybe_applied {
                return Ok(self.outcome_unknown(job, row).await);
            }
            // Refused, or never sent: another attempt may make it.
            self.unmark(row).await;
        }
        // A tool that may not run as a job is tried in the lane's own run only: a person who
        // asked for it is never told to wait for a retry in the background.
        if let Some(code) = &answer.failure
            && answer.retryable
            && !never_async
            && row.attempt < row.max_attempts.min(self.call_attempts)
        {
            return Err(JobError::retryable(code, "the tool call failed; retrying"));
        }
        Ok(answer)
    }

    /// Runs the call through the checkpoint and summarizes what came back; a chat's summarised
    /// result is kept as a tool context for its follow-ups. With the answer: whether a failed
    /// call may have taken effect ([`ToolFailure::maybe_applied`]).
    ///
    /// [`ToolFailure::maybe_applied`]: crate::tools::ToolFailure::maybe_applied
    async fn run(&self, job: &ToolCallJob, correlation_id: &str) -> (Answer, bool) {
        let ctx = CallContext {
            actor: job.actor,
            chat_type: job.chat_kind,
            chat_id: Some(job.reply_to.chat_id.clone()),
            sender_id: Some(job.sender.clone()),
            correlation_id: correlation_id.to_string(),
            approved: job.approval.clone(),
            trace_id: job.trace_id,
        };
        if let Some(reason) = self.changed_since_accepted(job, &ctx) {
            tracing::warn!(correlation_id, tool = %job.tool, reason = %reason, "the tool changed since the call was accepted; not run");
            let code = ToolCode::Changed.as_str();
            return (self.not_made(code), false);
        }
        // The definition the call runs with, which summarizes its result: a catalog reloaded or
        // an MCP tool quarantined while it runs does not turn a call that happened into a failure.
        let ran_with = self.checkpoint.catalog().get(&job.tool);
        let outcome = self.checkpoint.execute(ToolCall { name: job.tool.clone(), args: job.args.clone() }, &ctx).await;
        let output = outcome.as_ref().ok().map(|ok| ok.output.clone());
        // Only what a later attempt may clear is retried: a timeout, an open circuit, a
        // provider's transient error; never a refusal or a provider's definite answer (a 4xx).
        let retryable = outcome.as_ref().err().is_some_and(|f| f.retryable);
        let maybe_applied = outcome.as_ref().err().is_some_and(|f| f.maybe_applied);
        let (result, failure) = match outcome {
            Ok(ok) => {
                let truncated = ok.output.get("truncated").and_then(Value::as_bool).unwrap_or(false);
                (if truncated { ToolResult::Partial(ok.output) } else { ToolResult::Complete(ok.output) }, None)
            }
            Err(f) if f.code == ToolCode::Timeout.as_str() => (ToolResult::TimedOut, Some(f.code)),
            Err(f) => (ToolResult::Failed { code: f.code.clone() }, Some(f.code)),
        };
        let Some(tool) = ran_with.or_else(|| self.checkpoint.catalog().get(&job.tool)) else {
            // Not in the catalog (the call was refused as unknown): nothing to summarize with.
            return (self.not_made(ToolCode::Unknown.as_str()), false);
        };
        let mut input = SummaryInput::new(correlation_id, &job.request, &tool, result);
        input.hidden_values = vec![job.reply_to.chat_id.clone(), job.sender.clone()];
        let summary = self.summarizer.summarize(&input).await;
        let mut context_id = None;
        if let Some(output) = &output {
            let pii = self.checkpoint.catalog().audit.pii_fields.clone();
            match self.contexts.keep(job, correlation_id, &tool, output, &summary.text, &pii).await {
                Ok(stored) => context_id = stored,
                // The answer stands; only a follow-up of it will lack its context.
                Err(e) => tracing::warn!(correlation_id, tool = %job.tool, error = %e, "keeping the tool context failed"),
            }
        }
        if let Some(id) = context_id {
            tracing::info!(event = "AgentToolContextStored", correlation_id, tool = %job.tool, context.id = id, "tool context stored");
        }
        (Answer { text: summary.text, failure, retryable, by: Some(summary.by), fallback_code: summary.fallback_code, output, replayed: false, context_id, in_reply: false }, maybe_applied)
    }
}

impl Processor {
    /// Records on the message's trace how a run the person was not waiting for came out (the
    /// lane records the runs it waits for itself): a slow call's, or a retried one's.
    pub async fn trace_later(&self, job: &ToolCallJob, row: &JobRow, outcome: Result<&Answer, &JobError>) {
        let Some(trace_id) = job.trace_id else { return };
        let steps = match outcome {
            Ok(answer) if answer.replayed => return,
            Ok(answer) => {
                let (event, code) = answer.event();
                let mut detail = answer.detail(row.id);
                detail["attempt"] = row.attempt.into();
                let ran = Step::new(event, "later", code, detail);
                let stored = answer.context_stored(row.id).map(|(decision, code, detail)| Step::new("AgentToolContextStored", decision, code, detail));
                [Some(ran), stored]
            }
            Err(e) => [Some(Step::new("AgentToolExecutionFailed", if e.retryable { "retrying" } else { "failed" }, &e.code, json!({ "job_id": row.id, "attempt": row.attempt }))), None],
        };
        for step in steps.iter().flatten() {
            traces::record_delivery(&self.db, &self.telemetry, trace_id, step, false).await;
        }
    }

    /// Sends `answer` to the chat the call came from, once per job. A call asked for in the
    /// console has no chat: its answer stays with its approval and job.
    pub async fn deliver(&self, job: &ToolCallJob, job_id: i64, answer: &Answer) -> Result<Delivered, JobError> {
        if !approvals::is_chat(&job.reply_to.channel) {
            return Ok(Delivered::Sent);
        }
        // A private-data tool's answer is not kept in chat memory, as its context is not.
        let private = super::adapter::is_private_tool(&self.checkpoint.catalog(), &job.tool, &self.lane);
        let remembered = if private { self.lane.private_answer_memory.as_str() } else { answer.text.as_str() };
        match self.outbound.deliver(&job.reply_to, &answer.text, remembered, job_id, job.trace_id).await {
            Ok(delivered) => Ok(delivered),
            Err(DeliverError::Retry { code, message }) => Err(JobError::retryable(&code, message)),
            Err(DeliverError::Permanent { code, message }) => Err(JobError::permanent(&code, message)),
        }
    }
}

#[async_trait::async_trait]
impl Handler<ToolCallJob> for Processor {
    async fn run(&self, args: ToolCallJob, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let answer = self.final_answer(&args, &ctx.job).await;
        self.trace_later(&args, &ctx.job, answer.as_ref()).await;
        let answer = answer?;
        // The approved call's outcome is the call's, whatever becomes of the answer's delivery
        // (a customer who blocked the number still had their refund made): recorded, and the
        // deciding owner told, before the send that may fail for good.
        if let Some(approved) = &args.approval
            && answer.failure.as_deref() != Some(ToolCode::ApprovalNotGranted.as_str())
        {
            let code = answer.failure.as_deref().unwrap_or("OK");
            self.approvals.record_outcome(approved.approval_id, code, &answer.text).await?;
        }
        // A call an owner ran again that failed again: a person told how the first job ended is
        // told nothing more (the owner sees this job's failure).
        if let (Some(first), Some(code)) = (args.again_of, &answer.failure)
            && self.first_told(&args, first).await?
        {
            return Err(JobError::permanent(code, format!("the call failed again; the person, told how job {first} ended, was not told")));
        }
        // Run again after the lane took its answer as the message's reply (the run that gave it
        // could not record its end): the reply holds it, and it is not sent twice.
        let delivered = if answer.in_reply { Delivered::Sent } else { self.deliver(&args, ctx.job.id, &answer).await? };
        job_outcome(&answer, &delivered)
    }
}

/// How a tool call's job ends once its answer was handed to the channel: a failed call fails the
/// job (the person was told), and an answer the channel refused says so in either case.
pub fn job_outcome(answer: &Answer, delivered: &Delivered) -> Result<JobOutput, JobError> {
    let note = delivered.note();
    match &answer.failure {
        None => Ok(JobOutput { preview: Some(format!("answered ({} chars{}){note}", answer.text.chars().count(), match answer.by {
            Some(Writer::Model) => "",
            None => ", kept before",
            Some(Writer::AnswerTemplate) => ", the tool's answer_template",
            Some(Writer::Fallback | Writer::LaneText) => ", without the summarizer",
        })), snooze: None }),
        Some(code) if note.is_empty() => Err(JobError::permanent(code, "the tool call failed; the person was told")),
        Some(code) => Err(JobError::permanent(code, format!("the tool call failed{note}"))),
    }
}
