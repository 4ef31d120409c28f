//! Several calls for one message: a chain of read-only steps, each planned from the last one's
//! result, or the calls of one plan run one after the other; stored as a tool session with its
//! steps.

use std::time::Instant;

use serde_json::json;

use super::{Lane, Ran, ms};
use crate::{
    channel::Inbound,
    db,
    domain::Role,
    lane::{
        canonical_json, data,
        planner::{PlanInput, PlanOutcome, ProposedCall},
        summarizer,
        validator::{self, Advisory, ValidatedCall},
    },
    llm,
    tools::catalog::Operation,
    traces::Recorder,
};

impl Lane {
    /// Whether `tool` may be a step of a chain: declared chainable, and read-only.
    pub(super) fn chainable(&self, tool: &str) -> bool {
        self.checkpoint.catalog().get(tool).is_some_and(|t| t.spec.chainable && t.spec.operation == Operation::Read)
    }

    /// Runs a chain (seed §13): the step runs like any call; if it answered and steps remain,
    /// the planner sees its result and may propose one next call, which is validated, checked
    /// and run the same way (a write or admin call takes the approval path). The next steps are
    /// planned without the chat's memory and earlier tool results. A failed, pending or
    /// refused step ends the chain; the person gets one reply, the last step's summary. The
    /// session and its steps are stored.
    #[expect(clippy::too_many_arguments, reason = "a chain step needs the message, the actor, the step and the planning state")]
    pub(super) async fn chain(&self, inbound: &Inbound, actor: Role, first: ValidatedCall, proposed: &ProposedCall, candidates: &[String], input: &mut PlanInput, trace: &mut Recorder) -> Option<String> {
        let lane = &self.settings.lane;
        let max = lane.max_steps as usize;
        let session = self.sessions_start(inbound, trace.id()).await;
        let (mut call, mut proposed) = (first, proposed.clone());
        let mut step = 1usize;
        // The answer of the step before, which the lane has taken from its job to reply with:
        // whatever ends the chain after it says it first.
        let mut earlier: Option<String> = None;
        loop {
            trace.step("AgentToolChainStep", "run", "OK", json!({ "step": step, "tool": call.tool, "session_id": session }));
            let answer = match self.bridge(inbound, actor, &call, trace).await {
                Ran::Answered(answer) => answer,
                Ran::Said(text) => {
                    // Underway in the background, or not started: its own answer follows, or none.
                    self.sessions_step(session, step, &call.tool, "pending", "CHAIN_STEP_PENDING", Some("stopped")).await;
                    return Some(after(earlier.as_deref(), &text));
                }
                // Handled before, and this step's answer went out by its own job.
                Ran::Quiet => {
                    self.sessions_step(session, step, &call.tool, "answered", "OK", Some("answered")).await;
                    return earlier;
                }
            };
            if let Some(code) = &answer.failure {
                self.sessions_step(session, step, &call.tool, "failed", code, Some("stopped")).await;
                trace.step("AgentToolChainStopped", "stopped", "CHAIN_STEP_FAILED", json!({ "step": step, "code": code }));
                return Some(after(earlier.as_deref(), &answer.text));
            }
            // Only a chainable tool's result may lead to another call: a later step that is
            // read-only but not chainable (an MCP tool, say) ends the chain with its answer.
            if step >= max || !self.chainable(&call.tool) {
                self.sessions_step(session, step, &call.tool, "answered", "OK", Some("answered")).await;
                return Some(answer.text);
            }
            self.sessions_step(session, step, &call.tool, "answered", "OK", None).await;
            // The planner sees the step's result (untrusted) and may propose the next call: as
            // cleaned as the summarizer's copy (no secret or managed fields, chat id or sender).
            let hidden = self.checkpoint.catalog().get(&call.tool).map(|t| t.spec.hidden_fields()).unwrap_or_default();
            let result = answer.output.as_ref().map_or_else(String::new, |o| {
                let shown = summarizer::clean_with(o, &hidden, &[inbound.chat_id.clone(), inbound.sender.clone()]);
                canonical_json(&shown).chars().take(lane.context_preview_chars as usize * 4).collect()
            });
            if step == 1 {
                // The first plan's own turns (its catalog searches, whose words may quote the
                // chat) stay out too: the chain's transcript starts with its first call.
                input.transcript.clear();
            }
            input.transcript.push(llm::Message { role: llm::Role::Assistant, content: vec![llm::ContentBlock::ToolUse { id: proposed.id.clone(), name: proposed.name.clone(), input: proposed.args.clone() }] });
            input.transcript.push(llm::Message {
                role: llm::Role::User,
                content: vec![llm::ContentBlock::ToolResult { tool_use_id: proposed.id.clone(), content: data::untrusted("tool_result", &result), is_error: false }],
            });
            input.max_steps = max - step;
            input.searches_left = 0;
            // A step's result can carry instructions (a web page, an MCP server's text). From here
            // the planner reads only the person's message and the chain's own calls and results:
            // the chat's memory and its earlier tool results stay out, so a result that steers the
            // next call cannot make it carry them somewhere else.
            input.memory_summary = None;
            input.recent.clear();
            input.followup = None;
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
                return Some(answer.text);
            };
            let advisory = Advisory { requires_async, requires_owner_approval };
            let validation = self.validate(inbound, actor, trace.id(), &calls, advisory, candidates, &input.private_data, max - step);
            if let Some(question) = validation.clarify.clone() {
                trace.step("AgentToolChainStopped", "clarify", "MISSING_ARGUMENT", json!({ "step": step + 1 }));
                self.sessions_finish(session, "stopped").await;
                self.keep_question(inbound, input, candidates, &question, trace).await;
                return Some(after(Some(&answer.text), &question));
            }
            let refused = validation.rejected.first().map(|r| r.code.as_str());
            let [next_call] = validation.accepted.as_slice() else {
                // More calls than steps left, or a refusal: stop safely with what the chain has.
                trace.step("AgentToolChainStopped", "stopped", refused.unwrap_or("CHAIN_LIMIT"), json!({ "step": step + 1, "proposed": calls.len() }));
                self.sessions_finish(session, "stopped").await;
                return Some(answer.text);
            };
            if let Some(code) = refused {
                trace.step("AgentToolChainStopped", "stopped", code, json!({ "step": step + 1 }));
                self.sessions_finish(session, "stopped").await;
                return Some(answer.text);
            }
            // A write or admin call never runs inside a chain without an owner.
            let needs_owner = next_call.needs_approval.clone().or_else(|| (!self.read_only(&next_call.tool)).then(|| validator::APPROVAL_CHAIN_WRITE.to_string()));
            if let Some(reason) = needs_owner {
                self.sessions_step(session, step + 1, &next_call.tool, "approval", "TOOL_NEEDS_APPROVAL", Some("stopped")).await;
                return match self.ask_owner(inbound, actor, next_call, &reason, trace).await {
                    Some(asked) => Some(after(Some(&answer.text), &asked)),
                    None => Some(answer.text),
                };
            }
            proposed = calls.into_iter().next().unwrap_or(proposed);
            call = next_call.clone();
            earlier = Some(answer.text);
            step += 1;
        }
    }

    /// Starts the chain's session row; `None` (and the chain still runs) when it cannot be stored.
    pub(super) async fn sessions_start(&self, inbound: &Inbound, trace_id: i64) -> Option<i64> {
        let new = db::tool_sessions::NewSession { channel: &inbound.channel, chat_id: &inbound.chat_id, message_id: &inbound.message_id, correlation_id: &inbound.correlation_id, trace_id: Some(trace_id), now: db::now_ms() };
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            let id = db::tool_sessions::start(&mut tx, &new).await?;
            tx.commit().await?;
            Ok::<_, db::DbError>(id)
        };
        stored.await.map_err(|e| tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "storing the tool session failed")).ok()
    }

    pub(super) async fn sessions_step(&self, session: Option<i64>, index: usize, tool: &str, status: &str, code: &str, finish: Option<&str>) {
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

    pub(super) async fn sessions_finish(&self, session: Option<i64>, status: &str) {
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
}

/// The reply of a chain that ends with `text` after an earlier step answered `earlier`: both,
/// so the earlier answer, taken from its job for this reply, is never lost.
fn after(earlier: Option<&str>, text: &str) -> String {
    match earlier {
        Some(earlier) => format!("{earlier}\n\n{text}"),
        None => text.to_string(),
    }
}
