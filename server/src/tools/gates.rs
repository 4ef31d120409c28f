//! The checkpoint's gates: everything a call must pass before it may run, without running it.
//! [`super::checkpoint::Checkpoint::check`] asks them alone (the lane's plan validator, the
//! approvals path); [`super::checkpoint::Checkpoint::execute`] asks them first. One set of
//! gates and codes, wherever a call is judged.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{
    catalog::{Audience, Catalog, ToolDef},
    checkpoint::{CallContext, ToolCall, ToolCode, ToolFailure},
    hooks::{self, Before, Hook},
    policy::{self, Decision},
};
use crate::domain::{ChatKind, Role};

/// A call that passed the gates, as it would run.
#[derive(Debug, Clone)]
pub struct Checked {
    pub tool: Arc<ToolDef>,
    /// The definition's version the call was checked against.
    pub version: String,
    /// The arguments after managed fields and before-call hooks. Secrets are never in it: they
    /// are injected at execution only.
    pub input: Map<String, Value>,
    /// Why an owner must approve before the call may run (a policy or hook reason); `None` when
    /// it may run now, which is always the case for a call marked approved.
    pub needs_approval: Option<String>,
}

/// The specifics of a gate failure. Field names only, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureDetail {
    /// The caller supplied a field Gatehouse fills; `secret` when it is one of the tool's
    /// secret fields rather than a managed one.
    FieldSupplied { field: String, secret: bool },
    Schema(SchemaIssues),
}

/// How arguments break a tool's input schema.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaIssues {
    /// Required top-level properties that are absent.
    pub missing: Vec<String>,
    /// Properties the schema does not allow, at any depth.
    pub unexpected: Vec<String>,
    /// Any other violation: a wrong type, a value out of range, a nested requirement, or
    /// arguments that are not an object at all.
    pub other: bool,
}

pub(super) fn fail(code: &str, message: impl Into<String>) -> ToolFailure {
    ToolFailure { code: code.into(), message: message.into(), detail: None, retryable: false, maybe_applied: false }
}

fn fail_with(code: &str, message: impl Into<String>, detail: FailureDetail) -> ToolFailure {
    ToolFailure { code: code.into(), message: message.into(), detail: Some(detail), retryable: false, maybe_applied: false }
}

/// Most schema errors looked at for one call; the first is the one named in the message.
const MAX_SCHEMA_ERRORS: usize = 50;

/// Where `args` break the tool's input schema, if they do: the first error for the message and
/// every error sorted into [`SchemaIssues`]. Secret fields are validated as placeholders, so no
/// secret value can appear in an error message.
fn schema_problem(tool: &ToolDef, args: &Map<String, Value>) -> Option<(String, SchemaIssues)> {
    use jsonschema::error::ValidationErrorKind as Kind;
    let mut checked = args.clone();
    for field in tool.spec.secret_fields.keys() {
        checked.insert(field.clone(), Value::String("[secret]".into()));
    }
    let checked = Value::Object(checked);
    let mut first = None;
    let mut issues = SchemaIssues::default();
    for err in tool.input_validator.iter_errors(&checked).take(MAX_SCHEMA_ERRORS) {
        let at = err.instance_path().to_string();
        if first.is_none() {
            first = Some(format!("at {:?}: {}", if at.is_empty() { "/" } else { at.as_str() }, err.kind().keyword()));
        }
        match err.kind() {
            Kind::Required { property: Value::String(name) } if at.is_empty() => issues.missing.push(name.clone()),
            Kind::AdditionalProperties { unexpected } | Kind::UnevaluatedProperties { unexpected } => issues.unexpected.extend(unexpected.iter().cloned()),
            _ => issues.other = true,
        }
    }
    first.map(|message| (message, issues))
}

/// Numbers without a fraction written as decimals (`2.0`, which JSON Schema counts as an
/// integer) as integers, so an executor that reads an integer (a page number, a path segment)
/// reads the value the schema let through.
fn whole_numbers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// The gates, in order, against `catalog` (the version the call started with: its approval
/// mode and hooks apply). `notify_owner` hooks that matched are added to `notify`.
pub(super) fn gates<'c>(catalog: &'c Catalog, call: &ToolCall, ctx: &CallContext, notify: &mut Vec<&'c Hook>) -> Result<Checked, ToolFailure> {
    let Some(tool) = catalog.get(&call.name) else {
        return Err(match catalog.withheld(&call.name) {
            Some(w) => fail(w.code, w.reason.clone()),
            None => fail(ToolCode::Unknown.as_str(), format!("there is no tool named {:?}", call.name)),
        });
    };
    let spec = &tool.spec;
    if !spec.enabled {
        return Err(fail(ToolCode::Disabled.as_str(), format!("{} is disabled", spec.name)));
    }
    if ctx.actor == Role::Customer && spec.audience == Audience::OwnerOnly {
        return Err(fail(ToolCode::NotAllowedForActor.as_str(), format!("{} is for owners only", spec.name)));
    }
    if !spec.chat_types.contains(&ctx.chat_type) {
        return Err(fail(ToolCode::ChatTypeNotAllowed.as_str(), format!("{} is not available in this kind of chat", spec.name)));
    }
    // Its answer would be posted to everyone in the group (as an owner's command would be).
    if spec.audience == Audience::OwnerOnly && ctx.chat_type == ChatKind::Group {
        return Err(fail(ToolCode::ChatTypeNotAllowed.as_str(), format!("{} is for owners only, so it answers in an owner's direct chat, not in a group", spec.name)));
    }
    if let Some(approved) = &ctx.approved {
        if approved.version != tool.version {
            return Err(fail(ToolCode::ApprovalStale.as_str(), format!("{} changed since approval {} was given", spec.name, approved.approval_id)));
        }
        if approved.args_hash != super::canonical::args_hash(&call.args) {
            return Err(fail(ToolCode::ApprovalStale.as_str(), format!("the arguments differ from the ones approval {} was given for", approved.approval_id)));
        }
    }
    // The policy depends on the tool and the caller only: a call it refuses is refused as such
    // before its arguments are looked at, so a caller who may not use the tool is never asked
    // for a missing argument of it, nor told what its schema wants.
    let policy = policy::decide(spec, catalog.approval_mode, ctx.actor);
    if let Decision::Deny { reason } = policy {
        return Err(fail(ToolCode::PolicyDenied.as_str(), reason));
    }
    let Value::Object(supplied) = &call.args else {
        return Err(fail_with(ToolCode::SchemaInvalid.as_str(), "arguments must be a JSON object", FailureDetail::Schema(SchemaIssues { other: true, ..SchemaIssues::default() })));
    };
    if let Some(field) = supplied.keys().find(|k| spec.managed_fields.contains(k) || spec.secret_fields.contains_key(*k)) {
        let detail = FailureDetail::FieldSupplied { field: field.clone(), secret: spec.secret_fields.contains_key(field) };
        return Err(fail_with(ToolCode::ManagedFieldSupplied.as_str(), format!("{field:?} is filled by Gatehouse, not by the caller"), detail));
    }
    let mut input: Map<String, Value> = supplied.clone();
    for field in &spec.managed_fields {
        let value = match field.as_str() {
            "chat_id" => ctx.chat_id.clone(),
            "sender_id" | "sender" => ctx.sender_id.clone(),
            "correlation_id" => Some(ctx.correlation_id.clone()),
            _ => None,
        };
        if let Some(v) = value {
            input.insert(field.clone(), Value::String(v));
        }
    }
    if let Some((problem, issues)) = schema_problem(&tool, &input) {
        return Err(fail_with(ToolCode::SchemaInvalid.as_str(), format!("arguments do not match the schema {problem}"), FailureDetail::Schema(issues)));
    }
    input.values_mut().for_each(whole_numbers);
    // A call that needs an owner still passes the hooks: an owner is never asked to approve a
    // call a hook would refuse.
    let mut needs_approval = match policy {
        Decision::NeedsApproval { reason } if ctx.approved.is_none() => Some(reason.to_string()),
        _ => None,
    };
    match hooks::before(&catalog.hooks, &spec.name, &Value::Object(input.clone()), notify) {
        Before::Abort { hook } => return Err(fail(ToolCode::HookDenied.as_str(), format!("stopped by hook {hook:?}"))),
        Before::Proceed { args, changed, approval } => {
            if let Some(hook) = approval
                && ctx.approved.is_none()
            {
                needs_approval.get_or_insert_with(|| format!("hook {hook:?} asks for an owner"));
            }
            if let (true, Value::Object(changed_args)) = (changed, args) {
                // Changed arguments are checked against the schema again.
                if let Some((problem, issues)) = schema_problem(&tool, &changed_args) {
                    return Err(fail_with(
                        ToolCode::SchemaInvalid.as_str(),
                        format!("arguments changed by a hook no longer match the schema {problem}"),
                        FailureDetail::Schema(issues),
                    ));
                }
                input = changed_args;
            }
        }
    }
    let version = tool.version.clone();
    Ok(Checked { tool, version, input, needs_approval })
}
