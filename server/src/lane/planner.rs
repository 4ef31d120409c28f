//! The planner (seed §5.2): given the candidate tools only, the model decides whether to call
//! tools, ask a clarifying question, refuse, or leave the message to normal chat. Its answer is
//! a proposal: [`super::validator`] decides what may run.
//!
//! How the model answers: it must call tools (`tool_choice: any`). Real tool calls are a plan.
//! Everything else goes through one pseudo-tool, `lane.respond_tool`, whose input is
//! `{decision, reply, reason, requires_async, requires_owner_approval}` with `decision` one of
//! `no_tool`, `clarify`, `deny`, or `use_tools` (only beside real calls, carrying the reason
//! and the two advisory flags). Tool calls are parsed from the provider's structured blocks,
//! never from prose; an answer that fits none of these shapes is `PLANNER_OUTPUT_INVALID`.
//!
//! A provider error or an unusable answer is [`PlanOutcome::Failed`] with a stable code: the
//! caller records it and falls through to normal chat, never to a made-up answer.

use std::{sync::Arc, time::Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::{
    PrivateData,
    clarify::Clarification,
    data,
    detector::{FollowupHint, RecentContext},
};
use crate::{
    config::Settings,
    domain::{ChatKind, Role},
    llm::{self, ChatModel, ChatRequest, ChatResponse, ContentBlock, Message, Purpose, ToolChoice},
};

/// The planner's own codes, beside the `LLM_*` codes of provider errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
pub enum PlannerCode {
    /// The answer fits none of the shapes described in the module docs.
    #[strum(serialize = "PLANNER_OUTPUT_INVALID")]
    OutputInvalid,
    /// The answer was cut off (max tokens, context window): a call in it may be incomplete.
    #[strum(serialize = "PLANNER_OUTPUT_TRUNCATED")]
    OutputTruncated,
    /// The model declined to answer.
    #[strum(serialize = "PLANNER_REFUSED")]
    Refused,
    /// No candidate could be offered to this actor, so the model was not asked.
    #[strum(serialize = "PLANNER_NO_CANDIDATES")]
    NoCandidates,
}

impl PlannerCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Everything the planner is given for one message.
#[derive(Debug, Clone)]
pub struct PlanInput {
    pub correlation_id: String,
    /// The person's message: untrusted data.
    pub message: String,
    pub actor: Role,
    pub chat_kind: ChatKind,
    /// A short summary of the chat so far: untrusted data.
    pub memory_summary: Option<String>,
    pub private_data: PrivateData,
    /// The candidate tools, already adapted ([`super::adapter::tool_specs`]).
    pub tools: Vec<llm::ToolSpec>,
    /// The chat's recent tool results, newest first: untrusted data.
    pub recent: Vec<RecentContext>,
    /// The detector's guess that the message follows up one of them.
    pub followup: Option<FollowupHint>,
    /// The clarifying question the message answers: untrusted data.
    pub clarification: Option<Clarification>,
    pub max_steps: usize,
    /// Searches the planner may still make (`lane.search_tool`); 0 offers no search.
    pub searches_left: usize,
    /// Earlier turns of this planning: the planner's searches and their results.
    pub transcript: Vec<Message>,
}

/// One search the planner asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchCall {
    pub id: String,
    pub query: String,
}

/// One tool call as the model proposed it. Not validated: `name` may be unknown and `args` may
/// not even be an object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProposedCall {
    /// The provider's id of the tool-use block.
    pub id: String,
    pub name: String,
    pub args: Value,
    /// The model's words before the call (or its `use_tools` reason), for the trace.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum PlanOutcome {
    /// Leave the message to normal chat.
    NoTool { reason: String },
    /// Ask the person; `reply` is the model's question, cleaned and bounded.
    Clarify { reply: String, reason: String },
    /// Refuse; `reply` is `lane.denied_reply`, never the model's words.
    Deny { reply: String, reason: String },
    /// The planner searched the catalog for more tools (and made no other call); `content` is
    /// its turn, to be answered with the search results.
    Search {
        searches: Vec<SearchCall>,
        #[serde(skip)]
        content: Vec<ContentBlock>,
    },
    /// A follow-up the chat's recent tool results already answer; `reply` is the model's
    /// answer from them, cleaned and bounded. The lane takes it only when there were results.
    FromContext { reply: String, reason: String },
    /// The two flags are the model's advice only; policy and configuration decide.
    ToolUse { calls: Vec<ProposedCall>, reason: String, requires_async: bool, requires_owner_approval: bool },
    /// An `LLM_*` code or a [`PlannerCode`]: record it and fall through to normal chat.
    Failed { code: &'static str, detail: String },
}

impl PlanOutcome {
    /// `no_tool`, `clarify`, `deny`, `tool_use` or `failed`, for traces and logs.
    pub fn decision(&self) -> &'static str {
        match self {
            Self::NoTool { .. } => "no_tool",
            Self::Clarify { .. } => "clarify",
            Self::Deny { .. } => "deny",
            Self::FromContext { .. } => "answer_from_context",
            Self::Search { .. } => "search",
            Self::ToolUse { .. } => "tool_use",
            Self::Failed { .. } => "failed",
        }
    }

    fn invalid(detail: impl Into<String>) -> Self {
        Self::Failed { code: PlannerCode::OutputInvalid.as_str(), detail: detail.into() }
    }
}

pub struct Planner {
    model: Arc<dyn ChatModel>,
    settings: Arc<Settings>,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner").field("provider", &self.model.provider()).finish_non_exhaustive()
    }
}

/// Longest per-call reason kept from the model's text.
const MAX_REASON_CHARS: usize = 300;

impl Planner {
    pub fn new(model: Arc<dyn ChatModel>, settings: Arc<Settings>) -> Self {
        Self { model, settings }
    }

    /// Asks `models.planner` once. Never fails: errors become [`PlanOutcome::Failed`].
    pub async fn plan(&self, input: &PlanInput) -> PlanOutcome {
        self.plan_recorded(input).await.0
    }

    /// [`Planner::plan`], with the model's answer as it came (none when the model was not
    /// asked or failed), for the trace to record.
    pub async fn plan_recorded(&self, input: &PlanInput) -> (PlanOutcome, Option<ChatResponse>) {
        let lane = &self.settings.lane;
        let started = Instant::now();
        let offered = input.tools.iter().filter(|t| t.name != lane.respond_tool).count();
        tracing::info!(event = "AgentToolPlannerStart", correlation_id = %input.correlation_id, actor = input.actor.as_str(), candidates = offered, "planning");
        let (outcome, response) = if offered == 0 {
            (PlanOutcome::NoTool { reason: PlannerCode::NoCandidates.as_str().into() }, None)
        } else {
            match self.model.chat(&self.request(input)).await {
                Ok(response) => (self.parse(&response), Some(response)),
                Err(e) => (PlanOutcome::Failed { code: e.code.as_str(), detail: e.message }, None),
            }
        };
        let (code, calls) = match &outcome {
            PlanOutcome::Failed { code, .. } => (*code, 0),
            PlanOutcome::ToolUse { calls, .. } => ("OK", calls.len()),
            _ => ("OK", 0),
        };
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(event = "AgentToolPlannerResult", correlation_id = %input.correlation_id, decision = outcome.decision(), code, calls, latency_ms, "planned");
        (outcome, response)
    }

    /// The request [`Planner::plan`] sends: the configured prompt with the runtime's facts as
    /// the system prompt, the message and context as untrusted data, the candidates plus the
    /// respond tool, and a tool call required.
    pub fn request(&self, input: &PlanInput) -> ChatRequest {
        let lane = &self.settings.lane;
        let facts = json!({
            "actor": input.actor.as_str(),
            "chat": input.chat_kind.as_str(),
            "private_data": input.private_data,
            "max_steps": input.max_steps,
            "followup": input.followup,
            "answers_clarification": input.clarification.is_some(),
            "now": crate::conversation::clock::facts(&self.settings.conversation.timezone),
        });
        let mut user = Vec::new();
        if let Some(asked) = &input.clarification {
            user.push(data::untrusted("clarification", &asked.render()));
        }
        user.push(data::untrusted("message", &input.message));
        if let Some(memory) = input.memory_summary.as_deref().filter(|m| !m.trim().is_empty()) {
            user.push(data::untrusted("chat_summary", memory));
        }
        if !input.recent.is_empty() {
            let recent: Vec<String> = input.recent.iter().map(|c| json!(c).to_string()).collect();
            user.push(data::untrusted("recent_tool_results", &recent.join("\n")));
        }
        let strict = self.model.supports_strict_tools();
        let mut tools: Vec<llm::ToolSpec> = input.tools.iter().filter(|t| t.name != lane.respond_tool && t.name != lane.search_tool).cloned().collect();
        tools.push(llm::ToolSpec { name: lane.respond_tool.clone(), description: lane.respond_description.trim().to_string(), input_schema: respond_schema(), strict });
        if input.searches_left > 0 && !lane.search_tool.is_empty() {
            tools.push(llm::ToolSpec { name: lane.search_tool.clone(), description: lane.search_description.trim().to_string(), input_schema: search_schema(), strict });
        }
        let system = lane.planner_prompt.replace("{respond_tool}", &lane.respond_tool);
        let mut messages = vec![Message::user(user.join("\n\n"))];
        messages.extend(input.transcript.iter().cloned());
        let mut req = ChatRequest::new(&self.settings.models, Purpose::Planner, input.correlation_id.clone(), messages)
            .with_system(data::with_facts(&system, &facts))
            .with_tools(tools, ToolChoice::Any);
        // No parallel calls (seed §13): more steps come one at a time, as a chain.
        req.disable_parallel_tool_use = true;
        req.max_tokens = Some(lane.planner_max_tokens);
        req
    }

    /// Reads the model's answer; see the module docs for the shapes accepted.
    pub fn parse(&self, response: &ChatResponse) -> PlanOutcome {
        let lane = &self.settings.lane;
        if response.stop_reason.is_truncated() {
            return PlanOutcome::Failed { code: PlannerCode::OutputTruncated.as_str(), detail: format!("stop reason {}", response.stop_reason.as_str()) };
        }
        if response.stop_reason == llm::StopReason::Refusal {
            return PlanOutcome::Failed { code: PlannerCode::Refused.as_str(), detail: "the model declined".into() };
        }
        let mut calls = Vec::new();
        let mut responds = Vec::new();
        let mut searches = Vec::new();
        let mut said = String::new();
        for block in &response.content {
            match block {
                ContentBlock::Text { text } => said.push_str(text),
                ContentBlock::ToolUse { name, input, .. } if *name == lane.respond_tool => responds.push(input),
                ContentBlock::ToolUse { id, name, input } if !lane.search_tool.is_empty() && *name == lane.search_tool => {
                    let query = input.get("query").and_then(Value::as_str).map(|q| data::cut(q.trim(), 200)).unwrap_or_default();
                    searches.push(SearchCall { id: id.clone(), query });
                }
                ContentBlock::ToolUse { id, name, input } => {
                    let reason = data::cut(said.trim(), MAX_REASON_CHARS);
                    said.clear();
                    calls.push(ProposedCall { id: id.clone(), name: name.clone(), args: input.clone(), reason });
                }
                _ => {}
            }
        }
        // Searches count only alone: beside a real call or an answer they are dropped.
        if !searches.is_empty() && calls.is_empty() && responds.is_empty() {
            return PlanOutcome::Search { searches, content: response.content.clone() };
        }
        let respond = match responds.as_slice() {
            [] if calls.is_empty() => return PlanOutcome::invalid("no tool call in the answer"),
            [] => None,
            [one] => match Respond::read(one) {
                Ok(r) => Some(r),
                Err(why) => return PlanOutcome::invalid(why),
            },
            _ => return PlanOutcome::invalid("more than one respond call"),
        };
        let Some(respond) = respond else {
            return PlanOutcome::ToolUse { calls, reason: String::new(), requires_async: false, requires_owner_approval: false };
        };
        let with_calls = !calls.is_empty();
        match respond.decision.as_str() {
            "use_tools" if with_calls => {
                for call in calls.iter_mut().filter(|c| c.reason.is_empty()) {
                    call.reason = data::cut(&respond.reason, MAX_REASON_CHARS);
                }
                PlanOutcome::ToolUse { calls, reason: respond.reason, requires_async: respond.requires_async, requires_owner_approval: respond.requires_owner_approval }
            }
            "use_tools" => PlanOutcome::invalid("use_tools without a tool call"),
            _ if with_calls => PlanOutcome::invalid(format!("decision {:?} beside tool calls", respond.decision)),
            "no_tool" => PlanOutcome::NoTool { reason: respond.reason },
            "deny" => PlanOutcome::Deny { reply: lane.denied_reply.trim().to_string(), reason: respond.reason },
            "clarify" => {
                let reply = data::plain_text(&respond.reply, lane.summary_max_chars as usize);
                if reply.is_empty() { PlanOutcome::invalid("clarify without a question") } else { PlanOutcome::Clarify { reply, reason: respond.reason } }
            }
            "answer_from_context" => {
                let reply = data::plain_text(&respond.reply, lane.summary_max_chars as usize);
                if reply.is_empty() { PlanOutcome::invalid("answer_from_context without an answer") } else { PlanOutcome::FromContext { reply, reason: respond.reason } }
            }
            other => PlanOutcome::invalid(format!("unknown decision {:?}", data::cut(other, 40))),
        }
    }
}

/// The respond tool's input schema. Every property is required, so it is valid for strict
/// mode on every provider.
fn respond_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["decision", "reply", "reason", "requires_async", "requires_owner_approval"],
        "properties": {
            "decision": { "type": "string", "enum": ["no_tool", "clarify", "deny", "use_tools", "answer_from_context"] },
            "reply": { "type": "string" },
            "reason": { "type": "string" },
            "requires_async": { "type": "boolean" },
            "requires_owner_approval": { "type": "boolean" },
        },
    })
}

/// The search tool's input schema.
fn search_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["query"],
        "properties": { "query": { "type": "string", "maxLength": 200 } },
    })
}

/// The respond tool's input, read leniently where the meaning is clear (a missing flag is
/// false, a missing reply empty) and strictly where it is not (the decision).
struct Respond {
    decision: String,
    reply: String,
    reason: String,
    requires_async: bool,
    requires_owner_approval: bool,
}

impl Respond {
    fn read(input: &Value) -> Result<Self, String> {
        let Value::Object(map) = input else { return Err("respond arguments are not an object".into()) };
        let text = |key: &str| match map.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.trim().to_string()),
            Some(_) => Err(format!("respond.{key} is not a string")),
        };
        let flag = |key: &str| match map.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("respond.{key} is not a boolean")),
        };
        let decision = text("decision")?;
        if decision.is_empty() {
            return Err("respond without a decision".into());
        }
        Ok(Self {
            decision,
            reply: text("reply")?,
            reason: data::cut(&text("reason")?, MAX_REASON_CHARS),
            requires_async: flag("requires_async")?,
            requires_owner_approval: flag("requires_owner_approval")?,
        })
    }
}
