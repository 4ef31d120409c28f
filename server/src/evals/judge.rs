//! Replaying a case over a configuration, deterministically. Two levels:
//!
//! - the detector level, with no model at all: the private-data guard, then the candidate
//!   detector (should it plan, and are the expected tools among the candidates);
//! - the plan level: the lane's own decision path ([`crate::lane::decide`]) with the planner
//!   answering from the case's recorded responses (or, `--live`, the configured model), then
//!   the plan validator over the same catalog. Nothing runs: no job, no tool call, no trace row.
//!
//! The configuration is whatever the judge is built from: the live one, or a proposed
//! repair's, so a repair's before/after table is two judges over the same cases.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use serde::Serialize;
use serde_json::Value;

use super::case::{Case, Expect};
use crate::{
    config::Settings,
    conversation::steps::PrivateGuard,
    lane::{
        decide::{self, Decider},
        detector::{FollowupKind, Index},
        planner::{PlanOutcome, Planner},
        tool_docs,
        validator::{Advisory, PlanScope, Validator},
    },
    llm::{self, ChatModel, ChatRequest, ChatResponse, LlmError},
    tools::{CallContext, Catalog},
    traces::Recorder,
};

/// What a replay saw. `route` is `guard`, `normal_chat`, `plan` (detector level only: the lane
/// would plan), `clarify`, `deny`, `tool` or `failed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Observed {
    pub route: String,
    pub should_plan: bool,
    pub candidates: Vec<String>,
    /// The accepted calls' tools and arguments (plan level).
    pub tools: Vec<String>,
    pub args: Vec<Value>,
    /// The deciding reason code.
    pub code: String,
    /// The detector's confidence in its best candidate (0..1).
    pub confidence: f32,
}

impl Observed {
    /// A short form for tables: the route, with the tools of a plan.
    pub fn brief(&self) -> String {
        match self.route.as_str() {
            "tool" => format!("tool:{}", self.tools.join(",")),
            "plan" => format!("plan[{}]", self.candidates.iter().take(3).cloned().collect::<Vec<_>>().join(",")),
            "deny" | "failed" => format!("{} {}", self.route, self.code),
            other => other.to_string(),
        }
    }
}

/// One level's verdict on a case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub pass: bool,
    pub observed: Observed,
    /// Why it failed; empty when it passed.
    pub why: String,
}

/// A case's verdicts: the detector's always, the plan's when there is a model to ask.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub expect: String,
    pub detector: Verdict,
    pub plan: Option<Verdict>,
}

impl CaseResult {
    pub fn pass(&self) -> bool {
        self.detector.pass && self.plan.as_ref().is_none_or(|p| p.pass)
    }
}

/// A model that gives back recorded answers, in order.
#[derive(Debug)]
pub struct ReplayModel {
    answers: Mutex<VecDeque<ChatResponse>>,
}

impl ReplayModel {
    pub fn new(recorded: &[Value]) -> Self {
        Self { answers: Mutex::new(recorded.iter().filter_map(decide::replayed).collect()) }
    }
}

#[async_trait::async_trait]
impl ChatModel for ReplayModel {
    fn provider(&self) -> &'static str {
        "replay"
    }

    async fn chat(&self, _req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let next = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop_front();
        next.ok_or_else(|| LlmError::new(llm::ErrorCode::InvalidResponse, "EVAL_REPLAY_EXHAUSTED: the trace recorded no further answer", false))
    }
}

/// A configuration to replay cases over.
pub struct Judge {
    settings: Arc<Settings>,
    catalog: Arc<Catalog>,
    index: Index,
    guard: PrivateGuard,
}

impl std::fmt::Debug for Judge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judge").field("tools", &self.catalog.len()).finish_non_exhaustive()
    }
}

impl Judge {
    pub fn new(settings: Arc<Settings>, catalog: Arc<Catalog>) -> Self {
        let index = Index::build(tool_docs(&catalog), settings.lane.detector.clone());
        let guard = PrivateGuard::new(&settings.private_data);
        Self { settings, catalog, index, guard }
    }

    /// The detector level: no model.
    pub fn detect(&self, case: &Case) -> Observed {
        if let Some(category) = self.guard.check(case.actor, case.chat_type, &case.message) {
            return Observed { route: "guard".into(), code: format!("PRIVATE_DATA_REQUEST {category}"), ..Observed::default() };
        }
        let d = self.index.detect_answering(&case.message, case.actor, case.chat_type, &case.contexts, case.clarification.as_ref().map(|c| c.tools.as_slice()));
        let clarify = d.followup.as_ref().is_some_and(|f| f.kind == FollowupKind::Clarify);
        Observed {
            route: if d.should_plan {
                "plan".into()
            } else if clarify {
                "clarify".into()
            } else {
                "normal_chat".into()
            },
            should_plan: d.should_plan,
            candidates: d.candidates.iter().map(|c| c.name.clone()).collect(),
            code: d.reason.as_str().into(),
            confidence: d.confidence,
            ..Observed::default()
        }
    }

    /// The plan level: the lane's decision with `model` as the planner, then validation.
    pub async fn plan(&self, case: &Case, model: Arc<dyn ChatModel>) -> Observed {
        let detected = self.detect(case);
        if detected.route == "guard" || !detected.should_plan {
            return detected;
        }
        let lane = &self.settings.lane;
        let planner = Planner::new(model.clone(), self.settings.clone());
        let decider = Decider { settings: lane, index: &self.index, catalog: &self.catalog, planner: &planner, strict_supported: model.supports_strict_tools(), keep_text: false };
        let mut trace = Recorder::detached();
        let detection = decider.detect(&case.message, case.actor, case.chat_type, &case.contexts, case.clarification.as_ref(), &mut trace);
        let mut offered = decider.offered(&detection);
        let mut input = decider.first_turn(format!("eval-{}", case.name), &case.message, case.actor, case.chat_type, case.memory_summary.clone(), &case.contexts, case.clarification.as_ref(), &detection);
        let base = Observed { should_plan: true, candidates: detected.candidates.clone(), confidence: detected.confidence, ..Observed::default() };
        let routed = |route: &str, code: &str| Observed { route: route.into(), code: code.into(), ..base.clone() };
        let Some(plan) = decider.plan(&mut input, &mut offered, &mut trace).await else {
            return routed("normal_chat", "SEARCH_LIMIT");
        };
        match plan {
            PlanOutcome::NoTool { .. } => routed("normal_chat", "NO_TOOL"),
            PlanOutcome::Failed { code, .. } => routed("failed", code),
            PlanOutcome::Search { .. } => routed("normal_chat", "SEARCH_LIMIT"),
            PlanOutcome::Clarify { .. } => routed("clarify", "CLARIFY"),
            PlanOutcome::Deny { .. } => routed("deny", "DENY"),
            PlanOutcome::FromContext { .. } if case.contexts.is_empty() => routed("normal_chat", "FOLLOWUP_WITHOUT_CONTEXT"),
            PlanOutcome::FromContext { .. } => routed("answer_from_context", "FROM_CONTEXT"),
            PlanOutcome::ToolUse { calls, requires_async, requires_owner_approval, .. } => {
                let ctx = CallContext {
                    actor: case.actor,
                    chat_type: case.chat_type,
                    chat_id: Some(format!("eval:{}", case.name)),
                    sender_id: Some(format!("eval:{}", case.name)),
                    correlation_id: input.correlation_id.clone(),
                    approved: None,
                    trace_id: None,
                };
                let scope = PlanScope { candidates: &offered, ctx: &ctx, private_data: &input.private_data, max_steps: lane.max_steps as usize };
                let v = Validator { catalog: &self.catalog, settings: lane }.validate(&calls, Advisory { requires_async, requires_owner_approval }, &scope);
                if v.clarify.is_some() {
                    return routed("clarify", "MISSING_ARGUMENT");
                }
                if let Some(first) = v.rejected.first() {
                    return Observed { tools: calls.iter().map(|c| c.name.clone()).collect(), ..routed("deny", first.code.as_str()) };
                }
                let tools = v.accepted.iter().map(|c| c.tool.clone()).collect();
                let args = calls.iter().map(|c| c.args.clone()).collect();
                Observed { tools, args, ..routed("tool", if v.requires_owner_approval { "TOOL_NEEDS_APPROVAL" } else { "OK" }) }
            }
        }
    }

    /// Both levels of one case; the plan level only with a model (`live`) or recorded answers.
    pub async fn judge(&self, case: &Case, live: Option<Arc<dyn ChatModel>>) -> CaseResult {
        let observed = self.detect(case);
        let why = check_detector(&case.expect, &observed);
        let detector = Verdict { pass: why.is_none(), why: why.unwrap_or_default(), observed };
        let model: Option<Arc<dyn ChatModel>> = match live {
            Some(model) => Some(model),
            None if case.recorded.is_empty() => None,
            None => Some(Arc::new(ReplayModel::new(&case.recorded))),
        };
        let plan = match model {
            Some(model) => {
                let observed = self.plan(case, model).await;
                let why = check_plan(&case.expect, &observed);
                Some(Verdict { pass: why.is_none(), why: why.unwrap_or_default(), observed })
            }
            None => None,
        };
        CaseResult { name: case.name.clone(), expect: case.expect.to_string(), detector, plan }
    }
}

/// The detector-level check: would the message reach the right place without any model?
pub fn check_detector(expect: &Expect, o: &Observed) -> Option<String> {
    match expect {
        Expect::Guard => (o.route != "guard").then(|| "the private-data guard did not match".to_string()),
        _ if o.route == "guard" => Some("the private-data guard answered it".into()),
        Expect::NormalChat => o.should_plan.then(|| format!("planned with {}", o.candidates.iter().take(3).cloned().collect::<Vec<_>>().join(", "))),
        Expect::Clarify => (!o.should_plan && o.route != "clarify").then(|| format!("not planned ({})", o.code)),
        Expect::Tool { tools, .. } => {
            if !o.should_plan {
                return Some(format!("not planned ({})", o.code));
            }
            let missing: Vec<&String> = tools.iter().filter(|t| !o.candidates.contains(t)).collect();
            (!missing.is_empty()).then(|| format!("not among the candidates: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")))
        }
    }
}

/// The plan-level check: did the planner and the validator end where expected?
pub fn check_plan(expect: &Expect, o: &Observed) -> Option<String> {
    let want = match expect {
        Expect::NormalChat => "normal_chat",
        Expect::Guard => "guard",
        Expect::Clarify => "clarify",
        Expect::Tool { .. } => "tool",
    };
    if o.route != want {
        return Some(format!("ended in {} ({}), not {want}", o.route, o.code));
    }
    let Expect::Tool { tools, args } = expect else {
        return None;
    };
    let missing: Vec<&String> = tools.iter().filter(|t| !o.tools.contains(t)).collect();
    if !missing.is_empty() {
        return Some(format!("not called: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
    }
    for (key, value) in args {
        if !o.args.iter().any(|a| a.get(key).is_some_and(|v| same(v, value))) {
            return Some(format!("no call has {key} = {value}"));
        }
    }
    None
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.trim().eq_ignore_ascii_case(y.trim()),
        _ => a == b,
    }
}
