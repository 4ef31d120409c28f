//! The one checkpoint every tool call passes, whatever its provider, in two phases.
//!
//! The gates ([`Checkpoint::check`]): tool exists (or is withheld) and is enabled -> actor and
//! chat type allowed -> an approval's binding -> policy decision (a refusal here) -> no
//! caller-supplied managed or secret field -> managed fields injected -> input valid against
//! the schema -> before-call hooks (changed arguments validated again; every hook runs). A call
//! that needs an owner (by policy or a hook) passes the gates with the reason noted, unless it
//! is approved.
//!
//! The execution ([`Checkpoint::execute`], which runs the same gates first): circuit breaker ->
//! secrets injected -> execution with timeout -> retries with backoff for retryable errors ->
//! output valid against the output schema -> after-call hooks -> audit.
//!
//! The lane's plan validator, the approvals path and execution share the gates, so a call is
//! judged by one set of rules and codes wherever it is looked at. `check` writes nothing;
//! every executed call, allowed or denied, writes one audit row (batched) with secrets redacted.

mod executor;
mod results;
mod run;

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Instant,
};

use serde_json::Value;

pub use self::executor::{ToolError, ToolExecutor, idempotency_key};
pub use super::gates::{Checked, FailureDetail, SchemaIssues};
use super::{
    breaker::Breakers,
    catalog::{Catalog, ChatKind, Operation, Provider, ToolDef, ToolSpec},
    gates::{fail, gates},
};
use crate::{
    db::{self, Db, tool_audit::AuditRow},
    domain::Role,
    redact,
};

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum ToolCode {
    #[strum(serialize = "TOOL_UNKNOWN")]
    Unknown,
    #[strum(serialize = "TOOL_DISABLED")]
    Disabled,
    #[strum(serialize = "TOOL_NOT_ALLOWED_FOR_ACTOR")]
    NotAllowedForActor,
    #[strum(serialize = "TOOL_CHAT_TYPE_NOT_ALLOWED")]
    ChatTypeNotAllowed,
    #[strum(serialize = "TOOL_MANAGED_FIELD_SUPPLIED")]
    ManagedFieldSupplied,
    #[strum(serialize = "TOOL_SCHEMA_INVALID")]
    SchemaInvalid,
    #[strum(serialize = "TOOL_POLICY_DENIED")]
    PolicyDenied,
    #[strum(serialize = "TOOL_NEEDS_APPROVAL")]
    NeedsApproval,
    #[strum(serialize = "TOOL_CIRCUIT_OPEN")]
    CircuitOpen,
    #[strum(serialize = "TOOL_TIMEOUT")]
    Timeout,
    #[strum(serialize = "TOOL_PROVIDER_ERROR")]
    ProviderError,
    #[strum(serialize = "TOOL_RESULT_INVALID")]
    ResultInvalid,
    #[strum(serialize = "TOOL_SECRET_MISSING")]
    SecretMissing,
    #[strum(serialize = "TOOL_NO_EXECUTOR")]
    NoExecutor,
    #[strum(serialize = "TOOL_HOOK_DENIED")]
    HookDenied,
    /// A tool that is new or changed and waits for an owner's approval.
    #[strum(serialize = "TOOL_QUARANTINED")]
    Quarantined,
    /// A tool an owner rejected.
    #[strum(serialize = "TOOL_REJECTED")]
    Rejected,
    /// The call carries an approval that no longer applies: the tool's definition changed
    /// since, or the arguments differ from the ones approved.
    #[strum(serialize = "APPROVAL_STALE")]
    ApprovalStale,
    /// The call names an approval that is not an owner's approval of it: there is no such
    /// approval, it was not approved, or it was given for another call or job (a job written
    /// by hand, say).
    #[strum(serialize = "APPROVAL_NOT_GRANTED")]
    ApprovalNotGranted,
    /// A call accepted against an earlier definition of its tool, which the lane's rules no
    /// longer let run without an owner (the catalog was reloaded while its job waited).
    #[strum(serialize = "TOOL_CHANGED")]
    Changed,
    /// A call that changes something, and carries no idempotency key, was made, but whether it
    /// took effect is unknown: the run that made it stopped, or could not keep its answer, or
    /// it failed in a way that may still have taken effect (a timeout, an error answer). Never
    /// made again.
    #[strum(serialize = "TOOL_OUTCOME_UNKNOWN")]
    OutcomeUnknown,
    /// The call passed the gates and was under way when its run was stopped (the job's budget
    /// ran out, its lease was lost, the process shut down): what it did is not known here.
    #[strum(serialize = "TOOL_CANCELLED")]
    Cancelled,
    /// A tool call's job ran past the runs in which its call is made
    /// (`jobs.default_max_attempts`) with no answer kept: the runs before it stopped, or could
    /// not keep what they found. The call is not made again.
    #[strum(serialize = "TOOL_ATTEMPTS_EXHAUSTED")]
    AttemptsExhausted,
    /// A worker's run of a call to a tool that may not run as a job (`async_policy = "never"`):
    /// the lane's own run could not finish it, and the call is not made later.
    #[strum(serialize = "TOOL_NOT_RUN_AS_JOB")]
    NotRunAsJob,
}

impl ToolCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A call as the planner (or an owner) proposes it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub name: String,
    pub args: Value,
}

/// Who is calling, from where. Filled by the runtime, never by the model.
#[derive(Debug, Clone)]
pub struct CallContext {
    pub actor: Role,
    pub chat_type: ChatKind,
    pub chat_id: Option<String>,
    pub sender_id: Option<String>,
    pub correlation_id: String,
    /// An owner approved exactly this call: it runs only if the tool's definition and the
    /// arguments are still the ones approved, byte for byte.
    pub approved: Option<ApprovedCall>,
    /// The trace of the message this call is for; its audit row names it.
    pub trace_id: Option<i64>,
}

/// What an owner approved: the definition version and the hash of the canonical arguments
/// ([`super::canonical::args_hash`]) of the call as it was asked for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApprovedCall {
    pub approval_id: i64,
    pub version: String,
    pub args_hash: String,
}

impl ApprovedCall {
    /// Binds approval `approval_id` to `version` and exactly these arguments.
    pub fn bind(approval_id: i64, version: &str, args: &Value) -> Self {
        Self { approval_id, version: version.to_string(), args_hash: super::canonical::args_hash(args) }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolSuccess {
    pub tool: String,
    pub version: String,
    pub output: Value,
    pub attempts: u32,
}

pub use super::audit::AuditWriter;

pub use crate::config::SecretSource;

/// Results above a tool's `max_result_bytes` are stored whole; above this they are also cut.
pub const HARD_RESULT_LIMIT: usize = 5_000_000;

pub struct Checkpoint {
    db: Db,
    catalog: RwLock<Arc<Catalog>>,
    /// Built-in implementations by handler id.
    builtins: HashMap<String, Arc<dyn ToolExecutor>>,
    /// Connector and MCP executors by provider.
    providers: HashMap<&'static str, Arc<dyn ToolExecutor>>,
    breakers: Breakers,
    audit: AuditWriter,
    secrets: SecretSource,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("builtins", &self.builtins.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

/// A denial or failure, with the decision the audit recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolFailure {
    pub code: String,
    pub message: String,
    /// What exactly broke the gate, where a caller answers differently depending on it (the
    /// lane asks the person for a missing argument instead of refusing).
    pub detail: Option<FailureDetail>,
    /// A later attempt may succeed (a timeout, an open circuit, a provider's transient error);
    /// false for every refusal and for a provider's definite answer (a 4xx, say).
    pub retryable: bool,
    /// The call may have taken effect: it timed out, or its system failed in a way another try
    /// may clear (a server error), or the connection was lost during it, or it was made and its
    /// result refused. False for every
    /// refusal, an open circuit, a request that never left, and a definite error answer (a 4xx).
    pub maybe_applied: bool,
}

/// The gates over `catalog` without executing or auditing: [`Checkpoint::check`] over the live
/// catalog, or a replay over a proposed configuration's catalog (a repair's before/after).
pub fn check_against(
    catalog: &Catalog,
    call: &ToolCall,
    ctx: &CallContext,
) -> Result<Checked, ToolFailure> {
    gates(catalog, call, ctx, &mut Vec::new())
}

fn provider_key(p: Provider) -> &'static str {
    match p {
        Provider::Builtin => "builtin",
        Provider::Connector => "connector",
        Provider::Mcp => "mcp",
    }
}

impl Checkpoint {
    pub fn new(db: Db, catalog: Arc<Catalog>, audit: AuditWriter, secrets: SecretSource) -> Self {
        Self { db, catalog: RwLock::new(catalog), builtins: HashMap::new(), providers: HashMap::new(), breakers: Breakers::default(), audit, secrets }
    }

    pub fn register_builtin(&mut self, handler: &str, executor: Arc<dyn ToolExecutor>) {
        self.builtins.insert(handler.to_string(), executor);
    }

    pub fn register_provider(&mut self, provider: Provider, executor: Arc<dyn ToolExecutor>) {
        self.providers.insert(provider_key(provider), executor);
    }

    /// Swaps the catalog. Calls in flight keep the version they started with.
    pub fn reload(&self, catalog: Arc<Catalog>) {
        for executor in self.builtins.values().chain(self.providers.values()) {
            executor.catalog_changed(&catalog);
        }
        if let Ok(mut current) = self.catalog.write() {
            *current = catalog;
        }
    }

    /// What runs calls of `spec`'s tool, if anything in this build does.
    fn executor(&self, spec: &ToolSpec) -> Option<&Arc<dyn ToolExecutor>> {
        match spec.provider {
            Provider::Builtin => spec.handler.as_deref().and_then(|h| self.builtins.get(h)),
            other => self.providers.get(provider_key(other)),
        }
    }

    /// Whether a call of `tool` may be made again when whether it took effect is unknown: it
    /// only reads, or every attempt carries the same idempotency key (a system that
    /// deduplicates by key applies it once, and answers the repeat).
    pub fn repeats_safely(&self, tool: &ToolDef) -> bool {
        tool.spec.operation == Operation::Read || self.executor(&tool.spec).is_some_and(|e| e.sends_key(tool))
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.read().map(|c| c.clone()).unwrap_or_default()
    }

    pub fn breakers(&self) -> &Breakers {
        &self.breakers
    }

    pub fn audit(&self) -> &AuditWriter {
        &self.audit
    }

    /// Runs the gates on `call` without executing it and without writing an audit row: the
    /// lane's plan validator and the approvals path ask this, so a call is judged exactly as
    /// [`Checkpoint::execute`] would judge it.
    pub fn check(&self, call: &ToolCall, ctx: &CallContext) -> Result<Checked, ToolFailure> {
        check_against(&self.catalog(), call, ctx)
    }

    /// The one path for every tool call. Every call leaves one audit row: also one whose run is
    /// stopped while it is under way (this future dropped), as `TOOL_CANCELLED`.
    pub async fn execute(&self, call: ToolCall, ctx: &CallContext) -> Result<ToolSuccess, ToolFailure> {
        let started = Instant::now();
        let catalog = self.catalog();
        let tool = catalog.get(&call.name);
        let mut attempts = 0;
        let mut notify = Vec::new();
        let mut args = call.args.clone();
        if let (Some(tool), Value::Object(map)) = (&tool, &mut args) {
            for field in tool.spec.secret_fields.keys() {
                if map.contains_key(field) {
                    map.insert(field.clone(), Value::String(redact::REDACTED.into()));
                }
            }
        }
        catalog.redact_for_record(&call.name, &mut args);
        let row = |decision: &str, reason_code: String, attempts: u32| AuditRow {
            at: db::now_ms(),
            tool: call.name.clone(),
            version: tool.as_ref().map(|t| t.version.clone()),
            actor: ctx.actor.as_str().into(),
            chat_id: ctx.chat_id.clone(),
            chat_type: ctx.chat_type.as_str().into(),
            decision: decision.into(),
            reason_code,
            latency_us: i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
            attempts: i64::from(attempts),
            correlation_id: ctx.correlation_id.clone(),
            args: args.to_string(),
            trace_id: ctx.trace_id,
        };
        let result = match gates(&catalog, &call, ctx, &mut notify) {
            Ok(Checked { needs_approval: Some(reason), .. }) => Err(fail(ToolCode::NeedsApproval.as_str(), reason)),
            Ok(checked) => {
                // Written only if the run below never returns (dropped while under way).
                let unfinished = Unfinished { audit: &self.audit, row: Some(row("allow", ToolCode::Cancelled.as_str().into(), 1)), started };
                let result = self.run(&catalog, checked, ctx, &mut attempts, &mut notify).await;
                unfinished.disarm();
                result
            }
            Err(f) => Err(f),
        };
        if let Err(f) = &result {
            super::hooks::on_error(&catalog.hooks, &call.name, &f.code, &f.message, &mut notify);
        }
        let code = result.as_ref().err().map_or("OK", |f| f.code.as_str());
        for hook in notify {
            self.audit.notify(db::owner_notifications::Notification {
                at: db::now_ms(),
                hook: hook.spec.name.clone(),
                tool: call.name.clone(),
                reason_code: code.to_string(),
                message: hook.spec.notice(&call.name, code),
                correlation_id: ctx.correlation_id.clone(),
            });
        }
        let (decision, reason) = match &result {
            Ok(_) => ("allow", "OK".to_string()),
            Err(f) if f.code == ToolCode::NeedsApproval.as_str() => ("needs_approval", f.code.clone()),
            Err(f) => ("deny", f.code.clone()),
        };
        self.audit.write(row(decision, reason, attempts));
        result
    }
}

/// The audit row of a call under way, written if its run is dropped before it returns: a
/// provider that had the request still shows in the audit.
struct Unfinished<'a> {
    audit: &'a AuditWriter,
    row: Option<AuditRow>,
    started: Instant,
}

impl Unfinished<'_> {
    /// The run returned: its own row is written with how it ended.
    fn disarm(mut self) {
        self.row = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(mut row) = self.row.take() {
            row.latency_us = i64::try_from(self.started.elapsed().as_micros()).unwrap_or(i64::MAX);
            self.audit.write(row);
        }
    }
}
