//! What the lane decides for a message before anything runs: detection, then planning (with
//! the planner's catalog searches), each leaving its trace step. The live lane
//! ([`super::Lane`]) goes on to validate and run the plan; an eval replay
//! (the evals module) stops at validation, over a configuration that may be a proposed repair's.

use std::time::Instant;

use serde_json::{Value, json};

use super::{
    PrivateData,
    adapter::{self, OfferTo},
    clarify::Clarification,
    detector::{Detection, FollowupKind, Index, ReasonCode, RecentContext},
    planner::{PlanInput, PlanOutcome, Planner},
};
use crate::{
    config::LaneSettings,
    domain::{ChatKind, Role},
    llm, redact,
    tools::Catalog,
    traces::Recorder,
};

/// The parts a decision reads: the lane's settings, the detector's index and the catalog it
/// was built from, and the planner.
#[derive(Clone, Copy)]
pub struct Decider<'a> {
    pub settings: &'a LaneSettings,
    pub index: &'a Index,
    pub catalog: &'a Catalog,
    pub planner: &'a Planner,
    pub strict_supported: bool,
    /// Whether the planner's own words (text blocks) may be kept in the trace
    /// (`conversation.trace_text`); its calls are kept either way, with secrets and personal
    /// data replaced.
    pub keep_text: bool,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Decider<'_> {
    /// Detects candidates for `text` (as the answer to `clarification`, the question it
    /// answers, if any) and records the `AgentToolCandidate` step (and the follow-up step when
    /// the detector saw one).
    pub fn detect(&self, text: &str, actor: Role, chat: ChatKind, recent: &[RecentContext], clarification: Option<&Clarification>, trace: &mut Recorder) -> Detection {
        let started = Instant::now();
        let detection = self.index.detect_answering(text, actor, chat, recent, clarification.map(|c| c.tools.as_slice()));
        let candidates = detection.candidates.len();
        trace.step(
            "AgentToolCandidate",
            if detection.should_plan { "plan" } else { "normal_chat" },
            detection.reason.as_str(),
            json!({
                "candidates": detection.candidates,
                "candidate_count": candidates,
                "confidence": detection.confidence,
                "latency_us": started.elapsed().as_micros() as u64,
                // Which of the chat's stored tool contexts the detector saw (ids, no text), so
                // an eval case made from this trace replays with them.
                "context_ids": recent.iter().filter_map(|c| c.id.clone()).collect::<Vec<_>>(),
                // The question it answers (an id, no text), likewise.
                "clarification_id": clarification.filter(|_| detection.reason == ReasonCode::ClarificationAnswer).and_then(|c| c.id.clone()),
            }),
        );
        if let Some(hint) = &detection.followup {
            let (event, decision, code) = match hint.kind {
                FollowupKind::Clarify => ("AgentToolFollowupClarify", "clarify", "FOLLOWUP_AMBIGUOUS"),
                FollowupKind::AnswerFromContext => ("AgentToolFollowupResolved", "answer_from_context", "FOLLOWUP_CONTEXT"),
                FollowupKind::SameTool => ("AgentToolFollowupResolved", "call_same_tool", "FOLLOWUP_CONTEXT"),
                FollowupKind::NewTool => ("AgentToolFollowupResolved", "call_new_tool", "FOLLOWUP_CONTEXT"),
            };
            let tool = hint.context_index.and_then(|i| recent.get(i)).map(|c| c.tool.clone());
            trace.step(event, decision, code, json!({ "context_id": hint.context_id, "tool": tool, "contexts": recent.len() }));
        }
        detection
    }

    /// The planner's first turn for a message the detector sent on: nothing offered yet (see
    /// [`Self::offered`]), the lane's step and search limits, and private data guarded unless an
    /// owner asks. The live lane and an eval replay start planning from the same turn.
    #[expect(clippy::too_many_arguments, reason = "the message's parts, as the lane and an eval case each hold them")]
    pub fn first_turn(&self, correlation_id: String, text: &str, actor: Role, chat_kind: ChatKind, memory_summary: Option<String>, recent: &[RecentContext], clarification: Option<&Clarification>, detection: &Detection) -> PlanInput {
        PlanInput {
            correlation_id,
            message: text.to_string(),
            actor,
            chat_kind,
            memory_summary,
            // A group reads the answer, so an owner asking there is guarded like everyone.
            private_data: if actor == Role::Owner && chat_kind == ChatKind::Direct { PrivateData::Unguarded } else { PrivateData::Clear },
            tools: Vec::new(),
            recent: recent.to_vec(),
            followup: detection.followup.clone(),
            clarification: clarification.filter(|_| detection.reason == ReasonCode::ClarificationAnswer).cloned(),
            max_steps: self.settings.max_steps as usize,
            searches_left: if self.settings.search_tool.is_empty() { 0 } else { self.settings.max_search_calls as usize },
            transcript: Vec::new(),
        }
    }

    /// The tools first offered to the planner: the candidates and the always-offered tools.
    pub fn offered(&self, detection: &Detection) -> Vec<String> {
        let mut offered: Vec<String> = detection.candidates.iter().map(|c| c.name.clone()).collect();
        for name in &self.settings.always_offered {
            if !offered.contains(name) {
                offered.push(name.clone());
            }
        }
        offered
    }

    /// Asks the planner until it answers with something other than a search (or its searches
    /// run out: then `None`, and the message goes to normal chat). Each answer leaves an
    /// `AgentToolPlannerResult` step holding the model's answer as recorded, so an eval case
    /// made from the trace replays it; `offered` grows by what the searches found.
    pub async fn plan(&self, input: &mut PlanInput, offered: &mut Vec<String>, trace: &mut Recorder) -> Option<PlanOutcome> {
        let lane = self.settings;
        let to = OfferTo { actor: input.actor, chat: input.chat_kind, strict_supported: self.strict_supported };
        loop {
            input.tools = adapter::tool_specs(&adapter::resolve(self.catalog, offered), to, lane);
            let started = Instant::now();
            let (plan, response) = self.planner.plan_recorded(input).await;
            let (code, calls): (&str, Vec<String>) = match &plan {
                PlanOutcome::Failed { code, .. } => (code, Vec::new()),
                PlanOutcome::ToolUse { calls, .. } => ("OK", calls.iter().map(|c| c.name.clone()).collect()),
                PlanOutcome::NoTool { .. } => ("NO_TOOL", Vec::new()),
                PlanOutcome::Clarify { .. } => ("CLARIFY", Vec::new()),
                PlanOutcome::Deny { .. } => ("DENY", Vec::new()),
                PlanOutcome::FromContext { .. } => ("FROM_CONTEXT", Vec::new()),
                PlanOutcome::Search { .. } => ("SEARCH", Vec::new()),
            };
            let recorded = response.as_ref().map(|r| record(r, self.keep_text, &lane.respond_tool, &self.catalog.audit.pii_fields));
            trace.step("AgentToolPlannerResult", plan.decision(), code, json!({ "calls": calls, "offered": input.tools.len(), "latency_ms": ms(started.elapsed()), "response": recorded }));
            let PlanOutcome::Search { searches, content } = plan else {
                return Some(plan);
            };
            if input.searches_left == 0 {
                // Offered no search, or its last one was spent: nothing more to plan with.
                trace.step("AgentToolSearch", "refused", "SEARCH_LIMIT", json!({ "max_search_calls": lane.max_search_calls }));
                return None;
            }
            input.searches_left -= 1;
            let mut results = Vec::new();
            for search in &searches {
                let found: Vec<String> = self
                    .index
                    .search(&search.query, input.actor, input.chat_kind, lane.search_results as usize + offered.len())
                    .into_iter()
                    .map(|c| c.name)
                    .filter(|n| !offered.contains(n))
                    .take(lane.search_results as usize)
                    .collect();
                let lines: Vec<String> = adapter::resolve(self.catalog, &found)
                    .iter()
                    .filter(|t| adapter::offerable(t, input.actor, input.chat_kind, lane))
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
        }
    }
}

/// A model answer as a trace keeps it: the stop reason and the blocks, tool inputs with secret
/// and personal (`pii_fields`) fields replaced, text only when `keep_text`.
pub fn record(response: &llm::ChatResponse, keep_text: bool, respond_tool: &str, pii_fields: &[String]) -> Value {
    let content: Vec<Value> = response
        .content
        .iter()
        .filter_map(|block| match block {
            llm::ContentBlock::Text { text } if keep_text => Some(json!({ "type": "text", "text": text })),
            llm::ContentBlock::Text { .. } => None,
            llm::ContentBlock::ToolUse { id, name, input } => {
                let mut input = input.clone();
                redact::redact_args(&mut input);
                redact::redact_named(&mut input, pii_fields, redact::PII_REDACTED);
                // The respond tool's reply is words for the person, like a text block.
                if !keep_text
                    && name == respond_tool
                    && let Some(reply) = input.get_mut("reply").filter(|r| r.as_str().is_some_and(|r| !r.is_empty()))
                {
                    *reply = json!(redact::TEXT_NOT_KEPT);
                }
                Some(json!({ "type": "tool_use", "id": id, "name": name, "input": input }))
            }
            _ => None,
        })
        .collect();
    json!({ "stop_reason": response.stop_reason.as_str(), "content": content })
}

/// A recorded answer back as the model's response, for a deterministic replay.
pub fn replayed(recorded: &Value) -> Option<llm::ChatResponse> {
    let stop = recorded.get("stop_reason")?.as_str()?;
    let content = recorded
        .get("content")?
        .as_array()?
        .iter()
        .filter_map(|b| match b.get("type")?.as_str()? {
            "text" => Some(llm::ContentBlock::text(b.get("text")?.as_str()?)),
            "tool_use" => Some(llm::ContentBlock::ToolUse { id: b.get("id")?.as_str()?.to_string(), name: b.get("name")?.as_str()?.to_string(), input: b.get("input")?.clone() }),
            _ => None,
        })
        .collect();
    Some(llm::ChatResponse {
        content,
        stop_reason: llm::StopReason::from_anthropic(stop),
        stop_details: None,
        usage: llm::Usage::default(),
        model: "replay".into(),
        request_id: None,
        latency: std::time::Duration::ZERO,
        attempts: 1,
    })
}
