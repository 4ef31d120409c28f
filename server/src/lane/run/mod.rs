//! The tool lane as the runtime's [`ToolLane`] (seed §15, §16): detection, planning and
//! validation, then the bridge (§8) that stores each accepted call as a `tool.call` job with its
//! trace step before anything is said, runs it at once within `lane.immediate_deadline`, and
//! otherwise answers that the work is underway while the job finishes and sends the answer
//! later. Every stage leaves a trace step named after its seed §17 event.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;
use tokio::sync::oneshot;

use super::{
    PrivateData,
    adapter::{self, OfferTo},
    context::{ContextStore, Recent},
    detector::{FollowupKind, Index, ReasonCode},
    job::ToolCallJob,
    planner::{PlanInput, PlanOutcome, Planner, ProposedCall},
    processor::{Answer, Processor},
    tool_docs,
    validator::{Advisory, PlanScope, ValidatedCall, Validation, Validator},
};
use crate::{
    approvals::{ApprovalError, Approvals, Requester},
    channel::{Inbound, ReplyTo},
    config::Settings,
    conversation::{LaneOutcome, ToolLane},
    db::{self, Db, jobs::NewJob},
    domain::Role,
    jobs::{JobError, JobOutput, JobQueue, inline},
    llm,
    tools::{CallContext, Catalog, Checkpoint, ToolCall, catalog::Operation},
    traces::Recorder,
};

pub struct Lane {
    settings: Arc<Settings>,
    db: Db,
    queue: JobQueue,
    checkpoint: Arc<Checkpoint>,
    planner: Planner,
    processor: Arc<Processor>,
    approvals: Arc<Approvals>,
    /// The chat's recent tool results, for follow-ups.
    contexts: Arc<ContextStore>,
    strict_supported: bool,
    /// The detector's index over the catalog it was built from; rebuilt when the catalog is
    /// swapped (a reload, MCP discovery).
    index: Mutex<Option<(Arc<Catalog>, Arc<Index>)>>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").finish_non_exhaustive()
    }
}

/// What running one accepted call came to.
enum Ran {
    /// It answered in time: its summary, and its result for a chain's next step.
    Answered(Answer),
    /// What the person is told instead: underway, already being checked, or not started.
    Said(String),
}

/// What the person is waiting for, between the lane and the run it started.
const WAITING: u8 = 0;
/// The run answered in time: the lane replies with its answer.
const ANSWERED: u8 = 1;
/// The lane stopped waiting and said the work is underway: the run sends its answer itself.
const ABANDONED: u8 = 2;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Lane {
    #[expect(clippy::too_many_arguments, reason = "the composition root hands the lane each of its parts")]
    pub fn new(
        settings: Arc<Settings>,
        db: Db,
        queue: JobQueue,
        checkpoint: Arc<Checkpoint>,
        planner: Planner,
        processor: Arc<Processor>,
        approvals: Arc<Approvals>,
        contexts: Arc<ContextStore>,
        strict_supported: bool,
    ) -> Self {
        Self { settings, db, queue, checkpoint, planner, processor, approvals, contexts, strict_supported, index: Mutex::new(None) }
    }

    /// The index over the current catalog.
    pub fn index(&self) -> Arc<Index> {
        let catalog = self.checkpoint.catalog();
        let mut cached = self.index.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((built_from, index)) = cached.as_ref()
            && Arc::ptr_eq(built_from, &catalog)
        {
            return index.clone();
        }
        let index = Arc::new(Index::build(tool_docs(&catalog), self.settings.lane.detector.clone()));
        *cached = Some((catalog, index.clone()));
        index
    }

    async fn memory_summary(&self, chat_id: &str) -> Option<String> {
        let mut conn = self.db.pool.acquire().await.ok()?;
        db::conversation::summary(&mut conn, chat_id).await.ok().flatten().map(|s| s.text)
    }

    /// Validates the planner's calls and runs the plan, or says why not. A single call of a
    /// chainable read-only tool may be the first step of a chain (seed §13).
    async fn run_plan(&self, inbound: &Inbound, actor: Role, plan: PlanOutcome, candidates: &[String], input: &mut PlanInput, trace: &mut Recorder) -> LaneOutcome {
        let lane = &self.settings.lane;
        let PlanOutcome::ToolUse { calls, requires_async, requires_owner_approval, .. } = plan else { return LaneOutcome::NotHandled };
        let proposed = calls.clone();
        let advisory = Advisory { requires_async, requires_owner_approval };
        let validation = self.validate(inbound, actor, trace.id(), &calls, advisory, candidates, &input.private_data, lane.max_steps as usize);
        let codes: Vec<_> = validation.rejected.iter().map(|r| json!({ "tool": r.tool, "code": r.code.as_str(), "reason": r.reason })).collect();
        if let Some(question) = validation.clarify.clone() {
            trace.step("AgentToolPlanRejected", "clarify", "MISSING_ARGUMENT", json!({ "rejected": codes }));
            return LaneOutcome::Handled { reply: question };
        }
        if !validation.rejected.is_empty() {
            let first = validation.rejected.first().map_or("LANE_REJECTED", |r| r.code.as_str());
            trace.step("AgentToolPlanRejected", "deny", first, json!({ "rejected": codes }));
            return LaneOutcome::Handled { reply: lane.denied_reply.clone() };
        }
        let accepted: Vec<_> = validation.accepted.iter().map(|c| json!({ "tool": c.tool, "version": c.version, "needs_approval": c.needs_approval, "run_async": c.run_async })).collect();
        if validation.requires_owner_approval {
            let why = validation.accepted.iter().find_map(|c| c.needs_approval.clone()).unwrap_or_default();
            trace.step("AgentToolPolicyDenied", "needs_approval", "TOOL_NEEDS_APPROVAL", json!({ "calls": accepted, "reason": why }));
        } else {
            trace.step("AgentToolPlanAccepted", "accepted", "OK", json!({ "calls": accepted }));
        }
        if let [call] = validation.accepted.as_slice()
            && call.needs_approval.is_none()
            && !call.run_async
            && lane.max_steps > 1
            && self.chainable(&call.tool)
        {
            let reply = self.chain(inbound, actor, call.clone(), &proposed[0], candidates, input, trace).await;
            return LaneOutcome::Handled { reply };
        }
        // Several calls in one plan (a model may ignore the no-parallel request) run one after
        // the other, and are a tool session like a chain.
        let count = validation.accepted.len();
        let session = if count > 1 { self.sessions_start(inbound, trace.id()).await } else { None };
        let mut replies = Vec::new();
        for (i, call) in validation.accepted.iter().enumerate() {
            let (reply, status, code) = match &call.needs_approval {
                Some(reason) => (self.ask_owner(inbound, actor, call, reason, trace).await, "approval", "TOOL_NEEDS_APPROVAL".to_string()),
                None => match self.bridge(inbound, actor, call, trace).await {
                    Ran::Answered(answer) => {
                        let failed = answer.failure.clone();
                        (answer.text, if failed.is_some() { "failed" } else { "answered" }, failed.unwrap_or_else(|| "OK".into()))
                    }
                    Ran::Said(text) => (text, "pending", "CHAIN_STEP_PENDING".into()),
                },
            };
            self.sessions_step(session, i + 1, &call.tool, status, &code, (i + 1 == count).then_some("answered")).await;
            if !replies.contains(&reply) {
                replies.push(reply);
            }
        }
        LaneOutcome::Handled { reply: replies.join("\n\n") }
    }

    /// Whether `tool` may be a step of a chain: declared chainable, and read-only.
    fn chainable(&self, tool: &str) -> bool {
        self.checkpoint.catalog().get(tool).is_some_and(|t| t.spec.chainable && t.spec.operation == Operation::Read)
    }

    /// Runs a chain (seed §13): the step runs like any call; if it answered and steps remain,
    /// the planner sees its result and may propose one next call, which is validated, checked
    /// and run the same way (a write or admin call takes the approval path). A failed, pending or
    /// refused step ends the chain; the person gets one reply, the last step's summary. The
    /// session and its steps are stored.
    #[expect(clippy::too_many_arguments, reason = "a chain step needs the message, the actor, the step and the planning state")]
    async fn chain(&self, inbound: &Inbound, actor: Role, first: ValidatedCall, proposed: &ProposedCall, candidates: &[String], input: &mut PlanInput, trace: &mut Recorder) -> String {
        let lane = &self.settings.lane;
        let max = lane.max_steps as usize;
        let session = self.sessions_start(inbound, trace.id()).await;
        let (mut call, mut proposed) = (first, proposed.clone());
        let mut step = 1usize;
        loop {
            trace.step("AgentToolChainStep", "run", "OK", json!({ "step": step, "tool": call.tool, "session_id": session }));
            let answer = match self.bridge(inbound, actor, &call, trace).await {
                Ran::Answered(answer) => answer,
                Ran::Said(text) => {
                    // Underway in the background, or not started: its own answer follows, or none.
                    self.sessions_step(session, step, &call.tool, "pending", "CHAIN_STEP_PENDING", Some("stopped")).await;
                    return text;
                }
            };
            if let Some(code) = &answer.failure {
                self.sessions_step(session, step, &call.tool, "failed", code, Some("stopped")).await;
                trace.step("AgentToolChainStopped", "stopped", "CHAIN_STEP_FAILED", json!({ "step": step, "code": code }));
                return answer.text;
            }
            if step >= max {
                self.sessions_step(session, step, &call.tool, "answered", "OK", Some("answered")).await;
                return answer.text;
            }
            self.sessions_step(session, step, &call.tool, "answered", "OK", None).await;
            // The planner sees the step's result (untrusted) and may propose the next call.
            let result = answer.output.as_ref().map_or_else(String::new, |o| {
                let mut shown = o.clone();
                crate::redact::redact(&mut shown);
                super::canonical_json(&shown).chars().take(lane.context_preview_chars as usize * 4).collect()
            });
            input.transcript.push(llm::Message { role: llm::Role::Assistant, content: vec![llm::ContentBlock::ToolUse { id: proposed.id.clone(), name: proposed.name.clone(), input: proposed.args.clone() }] });
            input.transcript.push(llm::Message {
                role: llm::Role::User,
                content: vec![llm::ContentBlock::ToolResult { tool_use_id: proposed.id.clone(), content: super::data::untrusted("tool_result", &result), is_error: false }],
            });
            input.max_steps = max - step;
            input.searches_left = 0;
            let started = Instant::now();
            let next = self.planner.plan(input).await;
            let calls: Vec<String> = match &next {
                PlanOutcome::ToolUse { calls, .. } => calls.iter().map(|c| c.name.clone()).collect(),
                _ => Vec::new(),
            };
            trace.step("AgentToolPlannerResult", next.decision(), "CHAIN_NEXT", json!({ "step": step + 1, "calls": calls, "latency_ms": ms(started.elapsed()) }));
            let PlanOutcome::ToolUse { calls, requires_async, requires_owner_approval, .. } = next else {
                // No further step: the chain's answer is this step's.
                self.sessions_finish(session, "answered").await;
                return answer.text;
            };
            let advisory = Advisory { requires_async, requires_owner_approval };
            let validation = self.validate(inbound, actor, trace.id(), &calls, advisory, candidates, &input.private_data, max - step);
            if let Some(question) = validation.clarify.clone() {
                trace.step("AgentToolChainStopped", "clarify", "MISSING_ARGUMENT", json!({ "step": step + 1 }));
                self.sessions_finish(session, "stopped").await;
                return question;
            }
            let refused = validation.rejected.first().map(|r| r.code.as_str());
            let [next_call] = validation.accepted.as_slice() else {
                // More calls than steps left, or a refusal: stop safely with what the chain has.
                trace.step("AgentToolChainStopped", "stopped", refused.unwrap_or("CHAIN_LIMIT"), json!({ "step": step + 1, "proposed": calls.len() }));
                self.sessions_finish(session, "stopped").await;
                return answer.text;
            };
            if let Some(code) = refused {
                trace.step("AgentToolChainStopped", "stopped", code, json!({ "step": step + 1 }));
                self.sessions_finish(session, "stopped").await;
                return answer.text;
            }
            // A write or admin call never runs inside a chain without an owner.
            let needs_owner = next_call.needs_approval.clone().or_else(|| (!self.read_only(&next_call.tool)).then(|| "CHAIN_WRITE".to_string()));
            if let Some(reason) = needs_owner {
                self.sessions_step(session, step + 1, &next_call.tool, "approval", "TOOL_NEEDS_APPROVAL", Some("stopped")).await;
                let asked = self.ask_owner(inbound, actor, next_call, &reason, trace).await;
                return format!("{}\n\n{asked}", answer.text);
            }
            proposed = calls.into_iter().next().unwrap_or(proposed);
            call = next_call.clone();
            step += 1;
        }
    }

    /// Judges proposed calls for this message: a plan and each later step of a chain alike.
    #[expect(clippy::too_many_arguments, reason = "the message, its actor and trace, and the plan's scope")]
    fn validate(&self, inbound: &Inbound, actor: Role, trace_id: i64, calls: &[ProposedCall], advisory: Advisory, candidates: &[String], private: &PrivateData, max_steps: usize) -> Validation {
        let ctx = self.call_context(inbound, actor, trace_id);
        let scope = PlanScope { candidates, ctx: &ctx, private_data: private, max_steps };
        Validator { checkpoint: &self.checkpoint, settings: &self.settings.lane }.validate(calls, advisory, &scope)
    }

    fn read_only(&self, tool: &str) -> bool {
        self.checkpoint.catalog().get(tool).is_some_and(|t| t.spec.operation == Operation::Read)
    }

    fn call_context(&self, inbound: &Inbound, actor: Role, trace_id: i64) -> CallContext {
        CallContext {
            actor,
            chat_type: inbound.chat_kind,
            chat_id: Some(inbound.chat_id.clone()),
            sender_id: Some(inbound.sender.clone()),
            correlation_id: inbound.correlation_id.clone(),
            approved: None,
            trace_id: Some(trace_id),
        }
    }

    /// Starts the chain's session row; `None` (and the chain still runs) when it cannot be stored.
    async fn sessions_start(&self, inbound: &Inbound, trace_id: i64) -> Option<i64> {
        let new = db::tool_sessions::NewSession { channel: &inbound.channel, chat_id: &inbound.chat_id, message_id: &inbound.message_id, correlation_id: &inbound.correlation_id, trace_id: Some(trace_id), now: db::now_ms() };
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            let id = db::tool_sessions::start(&mut tx, &new).await?;
            tx.commit().await?;
            Ok::<_, db::DbError>(id)
        };
        stored.await.map_err(|e| tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "storing the tool session failed")).ok()
    }

    async fn sessions_step(&self, session: Option<i64>, index: usize, tool: &str, status: &str, code: &str, finish: Option<&str>) {
        let Some(id) = session else { return };
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            db::tool_sessions::step(&mut tx, id, index as i64, tool, status, code, db::now_ms()).await?;
            if let Some(end) = finish {
                db::tool_sessions::finish(&mut tx, id, end, db::now_ms()).await?;
            }
            tx.commit().await?;
            Ok::<_, db::DbError>(())
        };
        if let Err(e) = stored.await {
            tracing::warn!(session = id, error = %e, "storing a tool session step failed");
        }
    }

    async fn sessions_finish(&self, session: Option<i64>, status: &str) {
        let Some(id) = session else { return };
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            db::tool_sessions::finish(&mut tx, id, status, db::now_ms()).await?;
            tx.commit().await?;
            Ok::<_, db::DbError>(())
        };
        if let Err(e) = stored.await {
            tracing::warn!(session = id, error = %e, "storing a tool session's end failed");
        }
    }

    /// Stores the call as an approval request (with its trace step) before the person is told
    /// that an owner must approve it; nothing else is promised.
    async fn ask_owner(&self, inbound: &Inbound, actor: Role, call: &ValidatedCall, reason: &str, trace: &mut Recorder) -> String {
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
        match self.approvals.request(&tool_call, &who, Some(reason), Some(trace)).await {
            Ok(_) => lane.approval_reply.clone(),
            Err(ApprovalError::Refused(f)) => {
                trace.step("ApprovalRequested", "refused", &f.code, json!({ "tool": call.tool }));
                lane.denied_reply.clone()
            }
            Err(e) => {
                tracing::error!(event = "ApprovalRequested", correlation_id = %inbound.correlation_id, error = %e, "storing an approval request failed; nothing was promised");
                trace.step("ApprovalRequested", "failed", e.code(), json!({ "tool": call.tool }));
                lane.not_started_reply.clone()
            }
        }
    }

    /// Stores the call as a job with its trace step, then runs it at once within the deadline.
    async fn bridge(&self, inbound: &Inbound, actor: Role, call: &ValidatedCall, trace: &mut Recorder) -> Ran {
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
        };
        let new = NewJob {
            dedupe_key: Some(job.dedupe_key(&call.canonical_args)),
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
            trace.step(event, decision, "OK", json!({ "job_id": enqueued.job.id, "tool": call.tool }));
            trace.flush(&mut tx).await?;
            self.queue.commit(tx).await?;
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
        self.run_now(job, job_id, &inbound.correlation_id, trace).await
    }

    /// Runs the stored job in this process while the person waits, up to the deadline.
    async fn run_now(&self, job: ToolCallJob, job_id: i64, correlation_id: &str, trace: &mut Recorder) -> Ran {
        let lane = &self.settings.lane;
        let lease = self.settings.jobs.lease;
        let claimed = match inline::claim(&self.db, job_id, lease).await {
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
        let (db, processor, outbound_state) = (self.db.clone(), self.processor.clone(), state.clone());
        let correlation = correlation_id.to_string();
        let started = Instant::now();
        tokio::spawn(async move {
            let heartbeat = inline::keep_alive(db.clone(), &claimed, lease);
            let answer = processor.run(&job, &correlation).await;
            let last = claimed.job.attempt >= claimed.job.max_attempts;
            let retry = answer.failure.is_some() && answer.retryable && !last;
            let result = if retry {
                // Nothing is said yet: a worker tries again and sends the answer.
                Err(JobError::retryable(answer.failure.as_deref().unwrap_or_default(), "the tool call failed; retrying"))
            } else if outbound_state.compare_exchange(WAITING, ANSWERED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                let result = outcome(&answer);
                let _ = answered.send(answer);
                result
            } else {
                // The person was told the work is underway: the answer goes out on its own.
                processor.deliver(&job, job_id, &answer).await.and_then(|()| outcome(&answer))
            };
            heartbeat.abort();
            if let Err(e) = inline::finish(&db, &claimed, &result).await {
                tracing::warn!(job.id = job_id, error = %e, "recording a tool call run failed; its lease runs out and it is run again");
            }
        });
        match tokio::time::timeout(lane.immediate_deadline, answer).await {
            Ok(Ok(answer)) => {
                let (event, code) = match &answer.failure {
                    None => ("AgentToolExecutionSucceeded", "OK"),
                    Some(code) => ("AgentToolExecutionFailed", code.as_str()),
                };
                trace.step(event, "answered", code, json!({ "job_id": job_id, "latency_ms": ms(started.elapsed()), "summarized_by_model": answer.used_model }));
                Ran::Answered(answer)
            }
            // The run decided to retry (nothing to say yet), or gave up waiting on us.
            Ok(Err(_)) => {
                trace.step("AgentToolImmediateTimeout", "pending", "RETRYING", json!({ "job_id": job_id }));
                Ran::Said(lane.pending_reply.clone())
            }
            Err(_) => {
                if state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    trace.step("AgentToolImmediateTimeout", "pending", "IMMEDIATE_DEADLINE", json!({ "job_id": job_id, "deadline_ms": ms(lane.immediate_deadline) }));
                    Ran::Said(lane.pending_reply.clone())
                } else {
                    // It answered just as the deadline passed.
                    trace.step("AgentToolExecutionSucceeded", "answered", "OK", json!({ "job_id": job_id, "latency_ms": ms(started.elapsed()) }));
                    Ran::Said(lane.pending_reply.clone())
                }
            }
        }
    }
}

/// How a run of a call is recorded on its job.
fn outcome(answer: &Answer) -> Result<JobOutput, JobError> {
    match &answer.failure {
        None => Ok(JobOutput { preview: Some(format!("answered ({} chars)", answer.text.chars().count())), snooze: None }),
        Some(code) => Err(JobError::permanent(code, "the tool call failed; the person was told")),
    }
}

#[async_trait::async_trait]
impl ToolLane for Lane {
    async fn try_handle(&self, inbound: &Inbound, actor: Role, trace: &mut Recorder) -> LaneOutcome {
        let lane = &self.settings.lane;
        if !lane.enabled {
            trace.step("AgentToolCandidate", "normal_chat", "LANE_DISABLED", json!({}));
            return LaneOutcome::NotHandled;
        }
        // The chat's own contexts only: the key is its channel and chat id.
        let recent = self.contexts.recent(&inbound.channel, &inbound.chat_id).await.unwrap_or_else(|e| {
            tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "reading the chat's tool contexts failed; planning without them");
            Recent::default()
        });
        let started = Instant::now();
        let detection = self.index().detect(&inbound.text, actor, inbound.chat_kind, &recent.contexts);
        let candidates: Vec<String> = detection.candidates.iter().map(|c| c.name.clone()).collect();
        trace.step(
            "AgentToolCandidate",
            if detection.should_plan { "plan" } else { "normal_chat" },
            detection.reason.as_str(),
            json!({ "candidates": detection.candidates, "candidate_count": candidates.len(), "confidence": detection.confidence, "latency_us": started.elapsed().as_micros() as u64 }),
        );
        tracing::info!(event = "AgentToolCandidate", correlation_id = %inbound.correlation_id, actor = actor.as_str(), candidates = candidates.len(), reason = detection.reason.as_str(), "detected");
        if let Some(hint) = &detection.followup {
            let (decision, code) = match hint.kind {
                FollowupKind::Clarify => ("clarify", "FOLLOWUP_AMBIGUOUS"),
                FollowupKind::AnswerFromContext => ("answer_from_context", "FOLLOWUP_CONTEXT"),
                FollowupKind::SameTool => ("call_same_tool", "FOLLOWUP_CONTEXT"),
                FollowupKind::NewTool => ("call_new_tool", "FOLLOWUP_CONTEXT"),
            };
            let tool = hint.context_index.and_then(|i| recent.contexts.get(i)).map(|c| c.tool.clone());
            trace.step("AgentToolFollowup", decision, code, json!({ "context_id": hint.context_id, "tool": tool, "contexts": recent.contexts.len() }));
        }
        if !detection.should_plan {
            if detection.reason == ReasonCode::FollowupWithoutContext && recent.expired {
                // A follow-up of a result that has expired: normal chat, never the old result.
                trace.step("AgentToolFollowup", "expired", "FOLLOWUP_CONTEXT_EXPIRED", json!({}));
            }
            return LaneOutcome::NotHandled;
        }
        let catalog = self.checkpoint.catalog();
        let to = OfferTo { actor, chat: inbound.chat_kind, strict_supported: self.strict_supported };
        // What the planner is offered: the candidates and the always-offered tools, plus what
        // its searches find. The validator accepts calls of exactly these.
        let mut offered = candidates.clone();
        for name in &lane.always_offered {
            if !offered.contains(name) {
                offered.push(name.clone());
            }
        }
        let mut input = PlanInput {
            correlation_id: inbound.correlation_id.clone(),
            message: inbound.text.clone(),
            actor,
            chat_kind: inbound.chat_kind,
            memory_summary: self.memory_summary(&inbound.chat_id).await,
            private_data: if actor == Role::Owner { PrivateData::Unguarded } else { PrivateData::Clear },
            tools: Vec::new(),
            recent: recent.contexts.clone(),
            followup: detection.followup.clone(),
            max_steps: lane.max_steps as usize,
            searches_left: if lane.search_tool.is_empty() { 0 } else { lane.max_search_calls as usize },
            transcript: Vec::new(),
        };
        let plan = loop {
            input.tools = adapter::tool_specs(&adapter::resolve(&catalog, &offered), to, lane);
            let started = Instant::now();
            let plan = self.planner.plan(&input).await;
            let (code, calls): (&str, Vec<String>) = match &plan {
                PlanOutcome::Failed { code, .. } => (code, Vec::new()),
                PlanOutcome::ToolUse { calls, .. } => ("OK", calls.iter().map(|c| c.name.clone()).collect()),
                PlanOutcome::NoTool { .. } => ("NO_TOOL", Vec::new()),
                PlanOutcome::Clarify { .. } => ("CLARIFY", Vec::new()),
                PlanOutcome::Deny { .. } => ("DENY", Vec::new()),
                PlanOutcome::FromContext { .. } => ("FROM_CONTEXT", Vec::new()),
                PlanOutcome::Search { .. } => ("SEARCH", Vec::new()),
            };
            trace.step("AgentToolPlannerResult", plan.decision(), code, json!({ "calls": calls, "offered": input.tools.len(), "latency_ms": ms(started.elapsed()) }));
            let PlanOutcome::Search { searches, content } = plan else { break plan };
            if input.searches_left == 0 {
                // Offered no search, or its last one was spent: nothing more to plan with.
                trace.step("AgentToolSearch", "refused", "SEARCH_LIMIT", json!({ "max_search_calls": lane.max_search_calls }));
                return LaneOutcome::NotHandled;
            }
            input.searches_left -= 1;
            let index = self.index();
            let mut results = Vec::new();
            for search in &searches {
                let found: Vec<String> = index
                    .search(&search.query, actor, inbound.chat_kind, lane.search_results as usize + offered.len())
                    .into_iter()
                    .map(|c| c.name)
                    .filter(|n| !offered.contains(n))
                    .take(lane.search_results as usize)
                    .collect();
                let lines: Vec<String> = adapter::resolve(&catalog, &found)
                    .iter()
                    .filter(|t| adapter::offerable(t, actor, inbound.chat_kind, lane))
                    .map(|t| format!("{}: {}", t.spec.name, adapter::description(t, &lane.tool_description).lines().next().unwrap_or_default()))
                    .collect();
                trace.step("AgentToolSearch", "searched", "OK", json!({ "found": found, "offered": lines.len() }));
                offered.extend(found);
                let text = if lines.is_empty() { "No other tool matches.".to_string() } else { lines.join("\n") };
                // Tool descriptions are catalog data: untrusted, like every text the model reads.
                results.push(llm::ContentBlock::ToolResult { tool_use_id: search.id.clone(), content: super::data::untrusted("tool_search_results", &text), is_error: false });
            }
            input.transcript.push(llm::Message { role: llm::Role::Assistant, content });
            input.transcript.push(llm::Message { role: llm::Role::User, content: results });
        };
        match plan {
            PlanOutcome::NoTool { .. } | PlanOutcome::Failed { .. } | PlanOutcome::Search { .. } => LaneOutcome::NotHandled,
            PlanOutcome::Clarify { reply, .. } | PlanOutcome::Deny { reply, .. } => LaneOutcome::Handled { reply },
            // An answer from results this chat was given; without any, it would be made up.
            PlanOutcome::FromContext { .. } if recent.contexts.is_empty() => {
                trace.step("AgentToolFollowup", "refused", "FOLLOWUP_WITHOUT_CONTEXT", json!({}));
                LaneOutcome::NotHandled
            }
            PlanOutcome::FromContext { reply, .. } => LaneOutcome::Handled { reply },
            tool_use @ PlanOutcome::ToolUse { .. } => self.run_plan(inbound, actor, tool_use, &offered, &mut input, trace).await,
        }
    }
}
