//! The tool lane as the runtime's [`ToolLane`] (seed §15, §16): detection, planning and
//! validation, then the bridge (§8) that stores each accepted call as a `tool.call` job with its
//! trace step before anything is said, runs it at once within `lane.immediate_deadline`, and
//! otherwise answers that the work is underway while the job finishes and sends the answer
//! later. Every stage leaves a trace step named after its seed §17 event.

mod again;
mod bridge;
mod chain;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;

use self::bridge::Ran;
use super::{
    PrivateData,
    clarify::Clarification,
    context::{ContextStore, Recent},
    decide::Decider,
    detector::{Index, ReasonCode},
    memory,
    planner::{PlanInput, PlanOutcome, Planner, ProposedCall},
    processor::Processor,
    tool_docs,
    validator::{Advisory, PlanCode, PlanScope, Validation, Validator},
};
use crate::{
    approvals::Approvals,
    channel::Inbound,
    config::Settings,
    conversation::{LaneOutcome, ToolLane},
    db::{self, Db},
    domain::Role,
    jobs::JobQueue,
    tools::{CallContext, Catalog, Checkpoint, catalog::Operation},
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

    /// The chat's memory as the planner reads it; planned without it if it cannot be read.
    async fn memory_summary(&self, inbound: &Inbound) -> Option<String> {
        let read = async {
            let mut conn = self.db.pool.acquire().await?;
            memory::for_planner(&mut conn, &inbound.chat_id, db::now_ms(), self.settings.lane.planner_recent_turns).await
        };
        read.await.unwrap_or_else(|e| {
            tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "reading the chat's memory failed; planning without it");
            None
        })
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
            self.keep_question(inbound, input, candidates, &question, trace).await;
            return LaneOutcome::Handled { reply: question, private: false };
        }
        if !validation.rejected.is_empty() {
            let first = validation.rejected.first().map_or("LANE_REJECTED", |r| r.code.as_str());
            // A tool the planner made up, or one it was not offered, is the planner's mistake
            // and refuses nothing the person asked for: the message goes on to normal chat, as a
            // router that cannot tell hands it back (seed §15).
            if validation.rejected.iter().all(|r| matches!(r.code, PlanCode::Unknown | PlanCode::NotCandidate)) {
                trace.step("AgentToolPlanRejected", "normal_chat", first, json!({ "rejected": codes }));
                return LaneOutcome::NotHandled;
            }
            trace.step("AgentToolPlanRejected", "deny", first, json!({ "rejected": codes }));
            return LaneOutcome::Handled { reply: lane.denied_reply.clone(), private: false };
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
            return match self.chain(inbound, actor, call.clone(), &proposed[0], candidates, input, trace).await {
                // Its later steps may be any of the offered tools.
                Some(reply) => LaneOutcome::Handled { reply, private: candidates.iter().any(|t| self.private(t)) },
                None => LaneOutcome::Quiet,
            };
        }
        // Several calls in one plan (a model may ignore the no-parallel request) run one after
        // the other, and are a tool session like a chain.
        let count = validation.accepted.len();
        let session = if count > 1 { self.sessions_start(inbound, trace.id()).await } else { None };
        let mut replies = Vec::new();
        let mut private = false;
        for (i, call) in validation.accepted.iter().enumerate() {
            let (reply, status, code) = match &call.needs_approval {
                Some(reason) => (self.ask_owner(inbound, actor, call, reason, trace).await, "approval", "TOOL_NEEDS_APPROVAL".to_string()),
                None => match self.bridge(inbound, actor, call, trace).await {
                    Ran::Answered(answer) => {
                        private |= self.private(&call.tool);
                        let failed = answer.failure.clone();
                        (Some(answer.text), if failed.is_some() { "failed" } else { "answered" }, failed.unwrap_or_else(|| "OK".into()))
                    }
                    Ran::Said(text) => (Some(text), "pending", "CHAIN_STEP_PENDING".into()),
                    Ran::Quiet => (None, "answered", "OK".into()),
                },
            };
            // A failed step ends the plan (seed §13): what came after it may depend on it. So
            // does one still running (or waiting to be retried), which a later step would
            // otherwise run beside, in any order: its answer comes on its own.
            let stop = matches!(status, "failed" | "pending") && i + 1 < count;
            let finished = if stop { Some("stopped") } else { (i + 1 == count).then_some("answered") };
            self.sessions_step(session, i + 1, &call.tool, status, &code, finished).await;
            if let Some(reply) = reply
                && !replies.contains(&reply)
            {
                replies.push(reply);
            }
            if stop {
                trace.step("AgentToolChainStopped", "stopped", &code, json!({ "step": i + 1, "proposed": count }));
                break;
            }
        }
        if replies.is_empty() {
            return LaneOutcome::Quiet;
        }
        LaneOutcome::Handled { reply: replies.join("\n\n"), private }
    }

    /// Keeps `question`, asked of `inbound`'s sender about the `offered` tools, so that their
    /// answer is planned with this message (and with what it answered, if it was an answer). A
    /// question that cannot be kept is still asked: its answer is then detected on its own.
    async fn keep_question(&self, inbound: &Inbound, input: &PlanInput, offered: &[String], question: &str, trace: &mut Recorder) {
        let lane = &self.settings.lane;
        let tools = offered.iter().filter(|t| !lane.always_offered.contains(t)).cloned().collect();
        let asked = Clarification::asked(input.clarification.as_ref(), &inbound.text, question, tools);
        match self.contexts.ask(inbound, &asked, Some(trace.id())).await {
            Ok(Some(id)) => trace.step("AgentToolClarificationKept", "kept", "OK", json!({ "clarification_id": id.to_string(), "turns": asked.turns.len(), "tools": asked.tools })),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "keeping the clarifying question failed; its answer will be detected on its own");
                trace.step("AgentToolClarificationKept", "failed", e.code(), json!({}));
            }
        }
    }

    /// Judges proposed calls for this message: a plan and each later step of a chain alike.
    #[expect(clippy::too_many_arguments, reason = "the message, its actor and trace, and the plan's scope")]
    fn validate(&self, inbound: &Inbound, actor: Role, trace_id: i64, calls: &[ProposedCall], advisory: Advisory, candidates: &[String], private: &PrivateData, max_steps: usize) -> Validation {
        let ctx = self.call_context(inbound, actor, trace_id);
        let scope = PlanScope { candidates, ctx: &ctx, private_data: private, max_steps };
        Validator { catalog: &self.checkpoint.catalog(), settings: &self.settings.lane }.validate(calls, advisory, &scope)
    }

    fn decider<'a>(&'a self, index: &'a Index, catalog: &'a Catalog) -> Decider<'a> {
        Decider { settings: &self.settings.lane, index, catalog, planner: &self.planner, strict_supported: self.strict_supported, keep_text: self.settings.conversation.trace_text }
    }

    /// Whether `tool` answers with private account data (a `lane.private_data_tags` tag).
    fn private(&self, tool: &str) -> bool {
        crate::lane::adapter::is_private_tool(&self.checkpoint.catalog(), tool, &self.settings.lane)
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
}

#[async_trait::async_trait]
impl ToolLane for Lane {
    async fn try_handle(&self, inbound: &Inbound, actor: Role, trace: &mut Recorder) -> LaneOutcome {
        let lane = &self.settings.lane;
        if !lane.enabled {
            trace.step("AgentToolCandidate", "normal_chat", "LANE_DISABLED", json!({}));
            return LaneOutcome::NotHandled;
        }
        if let Some(answered) = self.handled_before(inbound, trace).await {
            return answered;
        }
        // The chat's own contexts only (the key is its channel and chat id), and in a group the
        // sender's own.
        let recent = self.contexts.recent(&inbound.channel, &inbound.chat_id, inbound.chat_kind, &inbound.sender).await.unwrap_or_else(|e| {
            tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "reading the chat's tool contexts failed; planning without them");
            Recent::default()
        });
        // The question this message answers, if the lane asked its sender one.
        let clarification = self.contexts.answered(inbound).await.unwrap_or_else(|e| {
            tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "reading the open clarifying question failed; detecting the message on its own");
            None
        });
        let index = self.index();
        let catalog = self.checkpoint.catalog();
        let decider = self.decider(&index, &catalog);
        let detection = decider.detect(&inbound.text, actor, inbound.chat_kind, &recent.contexts, clarification.as_ref(), trace);
        tracing::info!(event = "AgentToolCandidate", correlation_id = %inbound.correlation_id, actor = actor.as_str(), candidates = detection.candidates.len(), reason = detection.reason.as_str(), "detected");
        if !detection.should_plan {
            if detection.reason == ReasonCode::FollowupWithoutContext && recent.expired {
                // A follow-up of a result that has expired: normal chat, never the old result.
                trace.step("AgentToolFollowupResolved", "expired", "FOLLOWUP_CONTEXT_EXPIRED", json!({}));
            }
            return LaneOutcome::NotHandled;
        }
        // What the planner is offered: the candidates and the always-offered tools, plus what
        // its searches find. The validator accepts calls of exactly these.
        let mut offered = decider.offered(&detection);
        let memory_summary = self.memory_summary(inbound).await;
        let mut input = decider.first_turn(inbound.correlation_id.clone(), &inbound.text, actor, inbound.chat_kind, memory_summary, &recent.contexts, clarification.as_ref(), &detection);
        let Some(plan) = decider.plan(&mut input, &mut offered, trace).await else { return LaneOutcome::NotHandled };
        match plan {
            PlanOutcome::NoTool { .. } | PlanOutcome::Failed { .. } | PlanOutcome::Search { .. } => LaneOutcome::NotHandled,
            PlanOutcome::Clarify { reply, .. } => {
                self.keep_question(inbound, &input, &offered, &reply, trace).await;
                LaneOutcome::Handled { reply, private: false }
            }
            PlanOutcome::Deny { reply, .. } => LaneOutcome::Handled { reply, private: false },
            // An answer from results this chat was given; without any, it would be made up.
            PlanOutcome::FromContext { .. } if recent.contexts.is_empty() => {
                trace.step("AgentToolFollowupResolved", "refused", "FOLLOWUP_WITHOUT_CONTEXT", json!({}));
                LaneOutcome::NotHandled
            }
            // From kept contexts, which a private-data tool's answer never is.
            PlanOutcome::FromContext { reply, .. } => LaneOutcome::Handled { reply, private: false },
            tool_use @ PlanOutcome::ToolUse { .. } => self.run_plan(inbound, actor, tool_use, &offered, &mut input, trace).await,
        }
    }
}
