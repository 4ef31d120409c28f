//! The plan validator (seed §7): deterministic checks of the planner's proposal before anything
//! runs or is promised. The model's flags are advice; the catalog, policy and `[lane]` decide.
//!
//! Each call is judged by the seed's fifteen checks, in the seed's order, and the first that
//! fails gives its code:
//!
//! 1. the tool exists
//! 2. it is enabled
//! 3. it is among the candidates the planner was offered
//! 4. the actor may use it (audience, policy)
//! 5. the chat type is allowed
//! 6. the arguments match the schema
//! 7. no extra arguments
//! 8. no secret field supplied
//! 9. no managed field supplied
//! 10. private data is respected
//! 11. the risk is within the actor's ceiling
//! 12. owner approval where configured (hooks included)
//! 13. the async policy is respected
//! 14. the step limit, and several steps only of chainable tools
//! 15. an MCP tool's source is trusted and enabled (not withheld)
//!
//! Checks 1, 2, 4-9, 12 and 15 are the checkpoint's own gates ([`crate::tools::Checkpoint::check`]), so a call
//! is judged here exactly as it will be judged when it runs; among themselves they keep the
//! checkpoint's order (managed fields are refused before the schema is checked, because the
//! schema is checked with them filled in). A call that lacks only required arguments is not
//! refused: the person is asked for the first one (`lane.clarify_reply`).

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::{PrivateData, canonical_json, planner::ProposedCall};
use crate::{
    config::{LaneSettings, lane::RiskCeiling},
    domain::{ChatKind, Role},
    tools::{
        CallContext, Catalog, ToolCall, ToolDef,
        catalog::{AsyncPolicy, Operation, Risk},
        checkpoint::{FailureDetail, ToolCode, ToolFailure, check_against},
    },
};

/// Why a proposed call was not accepted. Gates the checkpoint shares keep its codes; the lane's
/// own checks, and the finer cases of shared gates, have `LANE_*` and `TOOL_*` codes of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum PlanCode {
    #[strum(serialize = "TOOL_UNKNOWN")]
    Unknown,
    #[strum(serialize = "TOOL_DISABLED")]
    Disabled,
    #[strum(serialize = "LANE_TOOL_NOT_CANDIDATE")]
    NotCandidate,
    #[strum(serialize = "TOOL_NOT_ALLOWED_FOR_ACTOR")]
    NotAllowedForActor,
    /// A policy rule refused the actor (an admin operation by a customer).
    #[strum(serialize = "TOOL_POLICY_DENIED")]
    PolicyDenied,
    #[strum(serialize = "TOOL_CHAT_TYPE_NOT_ALLOWED")]
    ChatTypeNotAllowed,
    #[strum(serialize = "TOOL_SCHEMA_INVALID")]
    SchemaInvalid,
    #[strum(serialize = "TOOL_EXTRA_ARGUMENTS")]
    ExtraArguments,
    /// Only required arguments are missing: the person is asked (not a refusal).
    #[strum(serialize = "LANE_ARGUMENT_MISSING")]
    ArgumentMissing,
    #[strum(serialize = "TOOL_SECRET_FIELD_SUPPLIED")]
    SecretFieldSupplied,
    #[strum(serialize = "TOOL_MANAGED_FIELD_SUPPLIED")]
    ManagedFieldSupplied,
    #[strum(serialize = "LANE_PRIVATE_DATA")]
    PrivateData,
    #[strum(serialize = "LANE_RISK_NOT_ALLOWED")]
    RiskNotAllowed,
    #[strum(serialize = "TOOL_HOOK_DENIED")]
    HookDenied,
    #[strum(serialize = "LANE_ASYNC_NOT_ALLOWED")]
    AsyncNotAllowed,
    #[strum(serialize = "LANE_TOO_MANY_STEPS")]
    TooManySteps,
    #[strum(serialize = "LANE_NOT_CHAINABLE")]
    NotChainable,
    #[strum(serialize = "TOOL_QUARANTINED")]
    Quarantined,
    #[strum(serialize = "TOOL_REJECTED")]
    Rejected,
    /// A gate failed with a code this build does not map (kept in the reason).
    #[strum(serialize = "LANE_CHECK_FAILED")]
    CheckFailed,
}

impl PlanCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Approval reasons the lane adds to the policy's own.
pub const APPROVAL_PRIVATE_DATA: &str = "APPROVAL_PRIVATE_DATA";
pub const APPROVAL_CHAIN_WRITE: &str = "APPROVAL_CHAIN_WRITE";

/// The planner's advice, kept beside what was decided so traces show where they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Advisory {
    pub requires_async: bool,
    pub requires_owner_approval: bool,
}

/// Where the plan is to run.
#[derive(Debug, Clone)]
pub struct PlanScope<'a> {
    /// The detector's candidates: the only tools the planner was offered.
    pub candidates: &'a [String],
    /// Actor, chat and correlation, as the calls will run (`approved: None`).
    pub ctx: &'a CallContext,
    pub private_data: &'a PrivateData,
    pub max_steps: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidatedCall {
    pub tool: String,
    pub version: String,
    /// The arguments as proposed (never with managed or secret fields: those are refused).
    pub args: Value,
    /// [`canonical_json`] of `args`; an approval binds to this text.
    pub canonical_args: String,
    /// Why an owner must approve first; such a call is accepted, not run.
    pub needs_approval: Option<String>,
    /// The tool's async policy requires a background job (no immediate run).
    pub run_async: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub tool: String,
    pub code: PlanCode,
    /// Safe to log and show owners: names fields, never values.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Validation {
    pub accepted: Vec<ValidatedCall>,
    pub rejected: Vec<Rejection>,
    /// The question for the person when a call lacks a required argument.
    pub clarify: Option<String>,
    pub requires_owner_approval: bool,
    pub requires_async: bool,
    pub advisory: Advisory,
}

impl Validation {
    /// The plan may go on as a whole: calls accepted, none refused, nothing to ask. The lane
    /// never runs part of a plan.
    pub fn runnable(&self) -> bool {
        !self.accepted.is_empty() && self.rejected.is_empty() && self.clarify.is_none()
    }
}

/// Whether a tool of `risk` is within `actor`'s ceiling in `[lane]`.
pub fn risk_allowed(risk: Risk, actor: Role, settings: &LaneSettings) -> bool {
    let ceiling = match actor {
        Role::Customer => settings.customer_max_risk,
        Role::Owner => settings.owner_max_risk,
    };
    let level = match risk {
        Risk::Low => RiskCeiling::Low,
        Risk::Medium => RiskCeiling::Medium,
        Risk::High => RiskCeiling::High,
    };
    level <= ceiling
}

/// The longest a call of `tool` may take with every retry: the timeout per attempt plus the
/// doubling backoff between attempts.
fn worst_case(tool: &ToolDef) -> Duration {
    let spec = &tool.spec;
    let attempts = spec.retry.max_attempts.max(1);
    let backoff: Duration = (0..attempts - 1).map(|i| spec.retry.backoff.saturating_mul(1 << i.min(16))).sum();
    spec.timeout.saturating_mul(attempts).saturating_add(backoff)
}

/// The model's arguments without the top-level `null`s the tool's schema refuses: models write
/// `{"order_id": null}` for an argument they do not have, which is a missing argument (asked for
/// when required, left out when optional), not a malformed call. A `null` the schema accepts stays.
fn without_refused_nulls(tool: Option<&ToolDef>, args: &Value) -> Value {
    let (Some(tool), Value::Object(map)) = (tool, args) else { return args.clone() };
    if !map.values().any(Value::is_null) {
        return args.clone();
    }
    let refused: Vec<String> = tool.input_validator.iter_errors(args).map(|e| e.instance_path().to_string()).collect();
    let mut kept = map.clone();
    kept.retain(|key, value| !(value.is_null() && refused.contains(&format!("/{}", key.replace('~', "~0").replace('/', "~1")))));
    Value::Object(kept)
}

/// One check's verdict on one call: refused, or a question for the person.
struct Fault {
    /// The check's number in the seed's list (a missing argument ranks right after 7).
    check: u8,
    code: PlanCode,
    reason: String,
    question: Option<String>,
}

fn fault(check: u8, code: PlanCode, reason: impl Into<String>) -> Fault {
    Fault { check, code, reason: reason.into(), question: None }
}

#[derive(Debug, Clone, Copy)]
pub struct Validator<'a> {
    /// The catalog calls are judged against: the checkpoint's live one, or a replay's.
    pub catalog: &'a Catalog,
    pub settings: &'a LaneSettings,
}

impl Validator<'_> {
    pub fn validate(&self, calls: &[ProposedCall], advisory: Advisory, scope: &PlanScope<'_>) -> Validation {
        let catalog = self.catalog;
        let mut out = Validation { advisory, ..Validation::default() };
        let over_budget = calls.len() > scope.max_steps;
        let chain = calls.len() > 1;
        for call in calls {
            let args = without_refused_nulls(catalog.get(&call.name).as_deref(), &call.args);
            let checked = check_against(catalog, &ToolCall { name: call.name.clone(), args: args.clone() }, scope.ctx);
            // The definition the gates judged, so every check sees one version of the tool.
            let tool = match &checked {
                Ok(c) => Some(c.tool.clone()),
                Err(_) => catalog.get(&call.name),
            };
            let withheld = tool.is_none() && catalog.withheld(&call.name).is_some();
            let mut faults: Vec<Fault> = Vec::new();
            let mut needs_approval = None;
            match &checked {
                Ok(c) => needs_approval = c.needs_approval.clone(),
                Err(f) => faults.push(self.gate_fault(f, withheld, tool.as_deref())),
            }
            if !scope.candidates.contains(&call.name) {
                faults.push(fault(3, PlanCode::NotCandidate, format!("{} was not among the tools offered", call.name)));
            }
            if over_budget {
                faults.push(fault(14, PlanCode::TooManySteps, format!("the plan has {} calls; at most {} are allowed", calls.len(), scope.max_steps)));
            }
            let mut run_async = false;
            if let Some(tool) = &tool {
                let spec = &tool.spec;
                let private = super::adapter::is_private(spec, self.settings);
                if matches!(scope.private_data, PrivateData::Matched { .. }) && !private {
                    faults.push(fault(10, PlanCode::PrivateData, "the message asks for private account data, which only a private-data tool may serve"));
                }
                // Every member of a group reads the answer: private account data is answered in
                // a direct chat only, whoever asks (an owner too).
                if private && scope.ctx.chat_type == ChatKind::Group {
                    faults.push(fault(5, PlanCode::ChatTypeNotAllowed, format!("{} reaches private account data, which is never answered in a group", spec.name)));
                } else if private && scope.ctx.actor == Role::Customer && scope.ctx.approved.is_none() {
                    needs_approval.get_or_insert_with(|| APPROVAL_PRIVATE_DATA.to_string());
                }
                if !risk_allowed(spec.risk, scope.ctx.actor, self.settings) {
                    faults.push(fault(11, PlanCode::RiskNotAllowed, format!("{} is {:?} risk, above the lane's ceiling for a {}", spec.name, spec.risk, scope.ctx.actor.as_str())));
                }
                match spec.async_policy {
                    AsyncPolicy::Required => run_async = true,
                    AsyncPolicy::Never if worst_case(tool) > self.settings.immediate_deadline => faults.push(fault(
                        13,
                        PlanCode::AsyncNotAllowed,
                        format!("{} may not run as a job and can take longer than lane.immediate_deadline", spec.name),
                    )),
                    _ => {}
                }
                if chain && !spec.chainable {
                    faults.push(fault(14, PlanCode::NotChainable, format!("{} may not be one step of several", spec.name)));
                }
                if chain && spec.operation != Operation::Read && scope.ctx.approved.is_none() {
                    needs_approval.get_or_insert_with(|| APPROVAL_CHAIN_WRITE.to_string());
                }
            }
            if let Some(first) = faults.into_iter().min_by_key(|f| f.check) {
                self.log_rejected(scope, &call.name, first.code);
                if let Some(question) = first.question {
                    out.clarify.get_or_insert(question);
                }
                out.rejected.push(Rejection { tool: call.name.clone(), code: first.code, reason: first.reason });
                continue;
            }
            let Ok(checked) = checked else { continue };
            tracing::info!(event = "AgentToolPlanAccepted", correlation_id = %scope.ctx.correlation_id, tool = %call.name, needs_approval = ?needs_approval, run_async, "call accepted");
            let canonical_args = canonical_json(&args);
            out.accepted.push(ValidatedCall { tool: call.name.clone(), version: checked.version, args, canonical_args, needs_approval, run_async });
        }
        out.requires_owner_approval = out.accepted.iter().any(|c| c.needs_approval.is_some());
        out.requires_async = out.accepted.iter().any(|c| c.run_async);
        out
    }

    /// The seed check a checkpoint failure belongs to, with the lane's code for it.
    fn gate_fault(&self, f: &ToolFailure, withheld: bool, tool: Option<&ToolDef>) -> Fault {
        let code = f.code.parse::<ToolCode>().ok();
        if withheld {
            let plan = match code {
                Some(ToolCode::Quarantined) => PlanCode::Quarantined,
                Some(ToolCode::Rejected) => PlanCode::Rejected,
                _ => PlanCode::Disabled,
            };
            return fault(15, plan, f.message.clone());
        }
        let Some(code) = code else { return fault(12, PlanCode::CheckFailed, format!("{}: {}", f.code, f.message)) };
        match (code, &f.detail) {
            (ToolCode::Unknown, _) => fault(1, PlanCode::Unknown, f.message.clone()),
            (ToolCode::Disabled, _) => fault(2, PlanCode::Disabled, f.message.clone()),
            (ToolCode::NotAllowedForActor, _) => fault(4, PlanCode::NotAllowedForActor, f.message.clone()),
            (ToolCode::PolicyDenied, _) => fault(4, PlanCode::PolicyDenied, f.message.clone()),
            (ToolCode::ChatTypeNotAllowed, _) => fault(5, PlanCode::ChatTypeNotAllowed, f.message.clone()),
            (ToolCode::ManagedFieldSupplied, Some(FailureDetail::FieldSupplied { secret: true, .. })) => fault(8, PlanCode::SecretFieldSupplied, f.message.clone()),
            (ToolCode::ManagedFieldSupplied, _) => fault(9, PlanCode::ManagedFieldSupplied, f.message.clone()),
            (ToolCode::SchemaInvalid, Some(FailureDetail::Schema(issues))) => {
                let filled = |name: &str| tool.is_some_and(|t| t.spec.managed_fields.iter().any(|m| m == name) || t.spec.secret_fields.contains_key(name));
                if issues.other || issues.missing.iter().any(|m| filled(m)) {
                    fault(6, PlanCode::SchemaInvalid, f.message.clone())
                } else if !issues.unexpected.is_empty() {
                    fault(7, PlanCode::ExtraArguments, format!("arguments the tool does not take: {}", issues.unexpected.join(", ")))
                } else if let (Some(missing), Some(tool)) = (issues.missing.first(), tool) {
                    Fault { check: 7, code: PlanCode::ArgumentMissing, reason: format!("the required argument {missing:?} is missing"), question: Some(self.question(tool, missing)) }
                } else {
                    fault(6, PlanCode::SchemaInvalid, f.message.clone())
                }
            }
            (ToolCode::SchemaInvalid, _) => fault(6, PlanCode::SchemaInvalid, f.message.clone()),
            (ToolCode::HookDenied, _) => fault(12, PlanCode::HookDenied, f.message.clone()),
            _ => fault(12, PlanCode::CheckFailed, format!("{}: {}", f.code, f.message)),
        }
    }

    /// `lane.clarify_reply` for `argument` of `tool`: the argument's schema title when it has
    /// one, else its name in words.
    fn question(&self, tool: &ToolDef, argument: &str) -> String {
        let title = tool.spec.input_schema.pointer(&format!("/properties/{}/title", argument.replace('~', "~0").replace('/', "~1"))).and_then(Value::as_str);
        let words = title.map_or_else(|| argument.replace(['_', '-'], " "), str::to_string);
        self.settings.clarify_reply.replace("{argument}", words.trim()).replace("{tool}", tool.spec.title.trim())
    }

    fn log_rejected(&self, scope: &PlanScope<'_>, tool: &str, code: PlanCode) {
        let event = match code {
            PlanCode::PolicyDenied | PlanCode::HookDenied | PlanCode::NotAllowedForActor | PlanCode::PrivateData | PlanCode::RiskNotAllowed => "AgentToolPolicyDenied",
            PlanCode::ArgumentMissing => "AgentToolPlanClarify",
            _ => "AgentToolPlanRejected",
        };
        tracing::info!(event, correlation_id = %scope.ctx.correlation_id, actor = scope.ctx.actor.as_str(), candidates = scope.candidates.len(), tool = %tool, code = code.as_str(), "call not accepted");
    }
}

#[cfg(test)]
mod tests {
    /// The lane's own approval reasons are told to owners in words, as the policy's are.
    #[test]
    fn the_lanes_approval_reasons_have_words() {
        let shipped = crate::config::approvals::ApprovalSettings::default();
        for reason in [super::APPROVAL_PRIVATE_DATA, super::APPROVAL_CHAIN_WRITE] {
            assert!(shipped.reason_words(reason).is_some(), "{reason} has no words in approvals_defaults.toml");
        }
    }
}
