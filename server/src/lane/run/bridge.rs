//! The bridge (seed §8): each accepted call is stored as a `tool.call` job with its trace step
//! before anything is said, run at once within `lane.immediate_deadline`, and otherwise left to
//! finish and send its answer later. A call that needs an owner becomes an approval request.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::{FutureExt, future::Fuse};
use serde_json::json;
use tokio::sync::oneshot;

use super::{Lane, ms};
use crate::{
    approvals::{ApprovalError, Requested, Requester},
    channel::{Delivered, Inbound, ReplyTo},
    db::{self, approvals::State, jobs::NewJob},
    domain::Role,
    jobs::{JobCode, JobError, JobKind, inline},
    lane::{
        job::ToolCallJob,
        processor::{Answer, job_outcome},
        validator::ValidatedCall,
    },
    tools::ToolCall,
    traces::Recorder,
};

/// What running one accepted call came to.
pub(super) enum Ran {
    /// It answered in time: its summary, and its result for a chain's next step.
    Answered(Answer),
    /// What the person is told instead: underway, already being checked, or not started.
    Said(String),
    /// Nothing to say: this message was handled before, and the call's answer goes (or went)
    /// out by its own job.
    Quiet,
}

/// What the person is waiting for, between the lane and the run it started.
const WAITING: u8 = 0;
/// The run settled it in time (its answer, or that it will be tried again): the lane says so.
const ANSWERED: u8 = 1;
/// The lane stopped waiting and said the work is underway: the run sends its answer itself.
const ABANDONED: u8 = 2;

impl Lane {
    /// Stores the call as an approval request (with its trace step) before the person is told
    /// that an owner must approve it; nothing else is promised. `None`: nothing to say now (see
    /// below).
    pub(super) async fn ask_owner(&self, inbound: &Inbound, actor: Role, call: &ValidatedCall, reason: &str, trace: &mut Recorder) -> Option<String> {
        let lane = &self.settings.lane;
        let who = Requester {
            actor,
            channel: inbound.channel.clone(),
            chat_kind: inbound.chat_kind,
            chat_id: inbound.chat_id.clone(),
            sender: inbound.sender.clone(),
            message_id: inbound.message_id.clone(),
            request: inbound.text.clone(),
            correlation_id: inbound.correlation_id.clone(),
        };
        let tool_call = ToolCall { name: call.tool.clone(), args: call.args.clone() };
        Some(match self.approvals.request(&tool_call, &who, Some(reason), Some(trace)).await {
            Ok(Requested { state: State::Pending, .. }) => lane.approval_reply.clone(),
            // This message asked before (its first run stopped before its reply was recorded),
            // and the request was settled since. Never asked again, and nothing said here: the
            // settlement's own job tells the person (the approved call's answer, the rejection,
            // the expiry) or told them already, once.
            Ok(Requested { state, .. }) => {
                already_settled(trace, &call.tool, state);
                return None;
            }
            Err(ApprovalError::Refused(f)) => {
                trace.step("ApprovalRequested", "refused", &f.code, json!({ "tool": call.tool }));
                lane.denied_reply.clone()
            }
            Err(e) => {
                tracing::error!(event = "ApprovalRequested", correlation_id = %inbound.correlation_id, error = %e, "storing an approval request failed; nothing was promised");
                trace.step("ApprovalRequested", "failed", e.code(), json!({ "tool": call.tool }));
                lane.not_started_reply.clone()
            }
        })
    }

    /// Stores the call as a job with its trace step, then runs it at once within the deadline.
    pub(super) async fn bridge(&self, inbound: &Inbound, actor: Role, call: &ValidatedCall, trace: &mut Recorder) -> Ran {
        let lane = &self.settings.lane;
        let job = ToolCallJob {
            tool: call.tool.clone(),
            version: call.version.clone(),
            args: call.args.clone(),
            actor,
            chat_kind: inbound.chat_kind,
            sender: inbound.sender.clone(),
            request: inbound.text.clone(),
            reply_to: ReplyTo::of(inbound),
            trace_id: Some(trace.id()),
            approval: None,
            again_of: None,
        };
        let key = job.dedupe_key(&call.canonical_args);
        if let Some(ran) = self.ran_before(&key, inbound, trace).await {
            return ran;
        }
        let new = NewJob {
            dedupe_key: Some(key),
            chat_id: Some(inbound.chat_id.clone()),
            sender_id: Some(inbound.sender.clone()),
            message_id: Some(inbound.message_id.clone()),
            original_text: Some(inbound.text.chars().take(2000).collect()),
            tool_name: Some(call.tool.clone()),
            correlation_id: inbound.correlation_id.clone(),
            // A call run at once is the lane's: workers take it only once the lane's deadline
            // has passed (should this process die before it claims it).
            scheduled_at: (!call.run_async).then(|| db::now_ms().saturating_add(i64::try_from(lane.immediate_deadline.as_millis()).unwrap_or(i64::MAX))),
            ..self.queue.job(&job)
        };
        // The job and the step that records it commit together; only then may anything say the
        // work is underway.
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            let enqueued = self.queue.enqueue_in(&mut tx, &new).await?;
            let (event, decision) = if enqueued.deduplicated { ("AgentToolJobDedupe", "already_queued") } else { ("AgentToolJobEnqueued", "stored") };
            let flushed = trace.flush_with(&mut tx, event, decision, "OK", json!({ "job_id": enqueued.job.id, "tool": call.tool })).await?;
            self.queue.commit(tx).await?;
            trace.committed(flushed);
            Ok::<_, db::DbError>(enqueued)
        }
        .await;
        let enqueued = match stored {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(event = "AgentToolJobEnqueued", correlation_id = %inbound.correlation_id, error = %e, "storing a tool call failed; nothing was started");
                trace.step("AgentToolJobEnqueued", "failed", "ASYNC_ENQUEUE_FAILED", json!({ "tool": call.tool }));
                return Ran::Said(lane.not_started_reply.clone());
            }
        };
        if enqueued.deduplicated {
            return Ran::Said(lane.already_checking_reply.clone());
        }
        let job_id = enqueued.job.id;
        if call.run_async {
            trace.step("AgentToolImmediateStart", "skip", "ASYNC_REQUIRED", json!({ "job_id": job_id }));
            return Ran::Said(lane.pending_reply.clone());
        }
        self.run_now(job, job_id, trace).await
    }

    /// The same call for the same message, run before: this message is handled again because
    /// its first run stopped before its reply was recorded (a crash, a full disk). A call that
    /// run answered is not run again: an answer the lane took is taken again, and one its job
    /// sends itself needs no word here. `None`: no such answer (an unfinished job is
    /// found by the enqueue's dedupe).
    async fn ran_before(&self, key: &str, inbound: &Inbound, trace: &mut Recorder) -> Option<Ran> {
        let found = async {
            let mut conn = self.db.pool.acquire().await?;
            let Some(row) = db::jobs::find_by_dedupe_in_chat(&mut conn, &inbound.chat_id, ToolCallJob::KIND, key).await? else { return Ok(None) };
            drop(conn);
            Ok::<_, db::DbError>(self.processor.kept(&row).await?.map(|answer| (row.id, answer)))
        };
        let (job_id, answer) = match found.await {
            Ok(found) => found?,
            Err(e) => {
                tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "looking for this call's earlier answer failed; storing it as a new call");
                return None;
            }
        };
        trace.step("AgentToolJobDedupe", "already_answered", "OK", json!({ "job_id": job_id, "in_reply": answer.in_reply }));
        Some(if answer.in_reply { Ran::Answered(answer) } else { Ran::Quiet })
    }

    /// Runs the stored job in this process while the person waits, up to the deadline.
    pub(super) async fn run_now(&self, job: ToolCallJob, job_id: i64, trace: &mut Recorder) -> Ran {
        let lane = &self.settings.lane;
        let claimed = match inline::claim(&self.db, job_id, &self.settings.jobs).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                trace.step("AgentToolImmediateStart", "skip", "WORKER_HAS_IT", json!({ "job_id": job_id }));
                return Ran::Said(lane.pending_reply.clone());
            }
            Err(e) => {
                tracing::warn!(job.id = job_id, error = %e, "claiming a tool call to run it at once failed; a worker runs it");
                trace.step("AgentToolImmediateStart", "skip", "DATABASE_ERROR", json!({ "job_id": job_id }));
                return Ran::Said(lane.pending_reply.clone());
            }
        };
        trace.step("AgentToolImmediateStart", "run", "OK", json!({ "job_id": job_id, "deadline_ms": ms(lane.immediate_deadline) }));
        let state = Arc::new(AtomicU8::new(WAITING));
        let (answered, answer) = oneshot::channel::<Answer>();
        let (db, processor, outbound_state, telemetry) = (self.db.clone(), self.processor.clone(), state.clone(), self.queue.telemetry().clone());
        let started = Instant::now();
        let budget = self.settings.jobs.timeouts.tool_call;
        tokio::spawn(async move {
            let (heartbeat, lease_lost) = inline::keep_alive(db.clone(), &claimed);
            let mut lease_lost = lease_lost.fuse();
            let started_ms = db::now_ms();
            let deadline = tokio::time::Instant::now() + budget;
            let settled = stoppable(deadline, &mut lease_lost, telemetry.in_job(&claimed.job, processor.settle(&job, &claimed.job))).await;
            let result = match settled {
                Ok(answer) => caught(async {
                    // The lane, still waiting, takes it for the message's reply. From here until
                    // the lane has it nothing stops this run: the answer is kept, with who sends
                    // it, before the lane is handed it. A crash after the keep leaves the job, run
                    // again, sending nothing, and the message, handled again, taking it again; a
                    // run stopped with the keep in flight could have left it the lane's unsent.
                    let to_lane = outbound_state.compare_exchange(WAITING, ANSWERED, Ordering::AcqRel, Ordering::Acquire).is_ok();
                    processor.keep(&job, &claimed.job, &answer, to_lane).await;
                    let unsent = if to_lane {
                        let result = job_outcome(&answer, &Delivered::Sent);
                        match answered.send(answer) {
                            Ok(()) => Err(result),
                            // The lane no longer listens (its own run was stopped): nobody will
                            // send it but this job.
                            Err(answer) => {
                                processor.handed_back(job_id).await;
                                Ok(answer)
                            }
                        }
                    } else {
                        Ok(answer)
                    };
                    match unsent {
                        Err(handed) => handed,
                        // The person was told the work is underway: the answer goes out on its own.
                        Ok(answer) => {
                            processor.trace_later(&job, &claimed.job, Ok(&answer)).await;
                            stoppable(deadline, &mut lease_lost, processor.deliver(&job, job_id, &answer)).await.and_then(|delivered| job_outcome(&answer, &delivered))
                        }
                    }
                })
                .await,
                // No answer from this run (or it was stopped): a worker tries again and sends
                // it. A lane still waiting records that itself (the sender dropped here tells
                // it); one that stopped waiting learns nothing more.
                Err(unsaid) => {
                    drop(answered);
                    if outbound_state.compare_exchange(WAITING, ANSWERED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                        processor.trace_later(&job, &claimed.job, Err(&unsaid)).await;
                    }
                    Err(unsaid)
                }
            };
            drop(heartbeat);
            telemetry.job_ran(&claimed.job, started_ms, result.as_ref().err().map(|e| e.code.as_str()));
            if let Err(e) = inline::finish(&db, &claimed, &result).await {
                tracing::warn!(job.id = job_id, error = %e, "recording a tool call run failed; its lease runs out and it is run again");
            }
        });
        match wait(lane.immediate_deadline, &state, answer).await {
            Waited::Answered(answer) => {
                let (event, code) = answer.event();
                let mut detail = answer.detail(job_id);
                detail["latency_ms"] = ms(started.elapsed()).into();
                trace.step(event, "answered", code, detail);
                if let Some((decision, code, detail)) = answer.context_stored(job_id) {
                    trace.step("AgentToolContextStored", decision, code, detail);
                }
                Ran::Answered(answer)
            }
            Waited::Retrying => {
                trace.step("AgentToolImmediateTimeout", "pending", "RETRYING", json!({ "job_id": job_id }));
                Ran::Said(lane.pending_reply.clone())
            }
            Waited::Deadline => {
                trace.step("AgentToolImmediateTimeout", "pending", "IMMEDIATE_DEADLINE", json!({ "job_id": job_id, "deadline_ms": ms(lane.immediate_deadline) }));
                Ran::Said(lane.pending_reply.clone())
            }
        }
    }
}

/// Records that a request this message asked before was settled since: its own job tells the
/// person, so nothing more is said.
pub(super) fn already_settled(trace: &mut Recorder, tool: &str, state: State) {
    trace.step("ApprovalRequested", "settled", "APPROVAL_ALREADY_SETTLED", json!({ "tool": tool, "state": state.as_str() }));
}

/// How the lane's wait for a run it started came out.
#[derive(Debug)]
enum Waited {
    /// The run answered in time: the lane replies with its answer.
    Answered(Answer),
    /// The run will be tried again: nothing to say yet but that the work is underway.
    Retrying,
    /// The deadline passed first: the run sends its answer itself.
    Deadline,
}

/// Waits up to `deadline` for the run's answer. The run and the lane settle who tells the person
/// with one compare-and-swap on `state`; when the run won it just as the deadline passed, its
/// answer is on its way here, and is waited for rather than dropped.
///
/// Dropped while it waits (the message's own run was stopped: its job's budget, a lost lease, a
/// shutdown), the lane gives the answer up as a passed deadline does: the run then sends it
/// itself. Otherwise the run would keep it as the reply of a message whose next run may already
/// have said the work is underway, and nobody would send it.
async fn wait(deadline: Duration, state: &AtomicU8, mut answer: oneshot::Receiver<Answer>) -> Waited {
    let listening = Listening(Some(state));
    let waited = wait_listening(deadline, state, &mut answer).await;
    listening.done();
    waited
}

async fn wait_listening(deadline: Duration, state: &AtomicU8, answer: &mut oneshot::Receiver<Answer>) -> Waited {
    match tokio::time::timeout(deadline, &mut *answer).await {
        Ok(Ok(answer)) => Waited::Answered(answer),
        // The run decided to retry (it dropped its sender without answering).
        Ok(Err(_)) => Waited::Retrying,
        Err(_) if state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() => Waited::Deadline,
        Err(_) => match answer.await {
            Ok(answer) => Waited::Answered(answer),
            Err(_) => Waited::Retrying,
        },
    }
}

/// The lane's claim on a run's answer while it waits (see [`wait`]).
struct Listening<'a>(Option<&'a AtomicU8>);

impl Listening<'_> {
    /// The wait ended on its own terms: the swap, if any, is made.
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.0 {
            let _ = state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// `run`, stopped as a worker's run is when the job's budget ends at `deadline` or its lease is
/// gone (an owner cancelled the job, or it was rescued after a stall and may run elsewhere). A
/// panic in it is a failed run, retried as a worker's is, instead of leaving the job "running"
/// under a heartbeat that never stops.
async fn stoppable<T>(deadline: tokio::time::Instant, lease_lost: &mut Fuse<oneshot::Receiver<()>>, run: impl Future<Output = Result<T, JobError>>) -> Result<T, JobError> {
    let run = caught(run);
    tokio::select! {
        ran = tokio::time::timeout_at(deadline, run) => ran.unwrap_or_else(|_| Err(JobError::retryable(JobCode::Timeout.as_str(), "no result within the job's budget"))),
        Ok(()) = lease_lost => Err(JobError::retryable(JobCode::LeaseLost.as_str(), "the job was cancelled, or taken over, while this run held it")),
    }
}

/// `run`, with a panic in it a failed run (`JOB_PANICKED`, retried), as a worker's is.
async fn caught<T>(run: impl Future<Output = Result<T, JobError>>) -> Result<T, JobError> {
    std::panic::AssertUnwindSafe(run).catch_unwind().await.unwrap_or_else(|_| Err(JobError::retryable(JobCode::Panicked.as_str(), "the tool call panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Answer {
        Answer { text: text.into(), failure: None, retryable: false, by: Some(crate::lane::summarizer::Writer::Model), fallback_code: None, output: None, replayed: false, context_id: None, in_reply: false }
    }

    /// The run claims the reply just as the deadline passes and sends its answer a moment later:
    /// the lane waits for it. Telling the person the work is underway instead would leave the
    /// answer with nobody to send it.
    #[tokio::test]
    async fn an_answer_claimed_as_the_deadline_passes_is_not_dropped() {
        let state = AtomicU8::new(ANSWERED);
        let (answered, answers) = oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = answered.send(answer("shipped"));
        });
        match wait(Duration::from_millis(1), &state, answers).await {
            Waited::Answered(a) => assert_eq!(a.text, "shipped"),
            other => panic!("the late answer was dropped: {other:?}"),
        }
    }

    /// The lane's run is stopped while it waits (its job's budget, a lost lease): the run's
    /// answer is its own to send, as after a deadline, not kept for a reply nobody will make.
    #[tokio::test]
    async fn a_lane_stopped_while_waiting_leaves_the_answer_to_the_run() {
        let state = AtomicU8::new(WAITING);
        let (_answered, answers) = oneshot::channel::<Answer>();
        assert!(tokio::time::timeout(Duration::from_millis(10), wait(Duration::from_secs(60), &state, answers)).await.is_err(), "stopped");
        assert_eq!(state.load(Ordering::Acquire), ABANDONED);
    }

    /// The deadline passes first: the lane takes the swap, so the run sends its answer itself.
    #[tokio::test]
    async fn a_run_past_the_deadline_answers_on_its_own() {
        let state = AtomicU8::new(WAITING);
        let (_answered, answers) = oneshot::channel();
        assert!(matches!(wait(Duration::from_millis(1), &state, answers).await, Waited::Deadline));
        assert_eq!(state.load(Ordering::Acquire), ABANDONED);
    }

    /// A run that will be tried again answers nothing: the lane says the work is underway.
    #[tokio::test]
    async fn a_retried_run_says_nothing_yet() {
        let state = AtomicU8::new(WAITING);
        let (answered, answers) = oneshot::channel::<Answer>();
        drop(answered);
        assert!(matches!(wait(Duration::from_secs(5), &state, answers).await, Waited::Retrying));
    }
}
