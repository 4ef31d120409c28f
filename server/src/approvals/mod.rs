//! Owner approvals: a tool call the checkpoint says needs an owner is stored with the exact call
//! (tool, definition version, canonical arguments and their hash, the managed fields, who asked
//! and from where) in one transaction with its trace step, and only then is the requester told
//! that an owner must approve. Owners decide on WhatsApp (buttons whose ids carry the approval
//! id and a secret nonce, or `/approve ID` and `/reject ID`), in the console or with
//! `gatehouse approvals`. A decision is one conditional update from `pending`; an approval
//! enqueues one `tool.call` job keyed by the approval, which the checkpoint runs only if the
//! tool and the arguments are still exactly the ones approved (`APPROVAL_STALE` otherwise).
//! Expiry is a job too: the requester is told and nothing runs.

pub mod jobs;

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{
    channel::{ReplyTo, SIMULATOR, WHATSAPP},
    config::Settings,
    db::{
        self, Db, DbError,
        approvals::{self as store, ApprovalRow, Decider, NewApproval, State},
        audit::{self, AuditEntry},
    },
    domain::{ChatKind, Role},
    jobs::JobQueue,
    owners::notices::DeliverNotice,
    redact,
    tools::{
        ApprovedCall, CallContext, Checkpoint, ToolCall,
        canonical::{args_hash, canonical_json},
        checkpoint::ToolFailure,
        job::ToolCallJob,
    },
    traces::{self, Ending, Recorder, Step, Subject},
};

pub use jobs::{AskOwner, Settle, SettleReason};

/// The channel of requests made in the console or on the command line: no chat to answer.
pub const CONSOLE: &str = "console";

/// The prefix of an approval button's id: `gh-approval:{id}:{approve|reject}:{nonce}`.
const BUTTON_PREFIX: &str = "gh-approval:";

/// Stable codes of the approval path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
pub enum ApprovalCode {
    #[strum(serialize = "APPROVAL_NOT_FOUND")]
    NotFound,
    #[strum(serialize = "APPROVAL_ALREADY_DECIDED")]
    AlreadyDecided,
    #[strum(serialize = "APPROVAL_EXPIRED")]
    Expired,
    #[strum(serialize = "APPROVAL_NOT_AN_OWNER")]
    NotAnOwner,
    #[strum(serialize = "APPROVAL_INVALID_BUTTON")]
    InvalidButton,
    /// The call may run without an owner: nothing was stored.
    #[strum(serialize = "APPROVAL_NOT_NEEDED")]
    NotNeeded,
}

impl ApprovalCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("APPROVAL_NOT_FOUND: there is no approval #{0}")]
    NotFound(i64),
    #[error("APPROVAL_ALREADY_DECIDED: approval #{id} was already {state} by {by}")]
    AlreadyDecided { id: i64, state: State, by: String },
    #[error("APPROVAL_EXPIRED: approval #{0} has expired")]
    Expired(i64),
    #[error("APPROVAL_INVALID_BUTTON: the button does not belong to approval #{0}")]
    InvalidButton(i64),
    #[error("APPROVAL_NOT_NEEDED: {0} may run without an owner's approval")]
    NotNeeded(String),
    /// The gates refused the call outright: there is nothing to approve.
    #[error("{0}")]
    Refused(ToolFailure),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for ApprovalError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(DbError::from(e))
    }
}

impl ApprovalError {
    /// The stable code. A refusal by the gates carries the tool's own code in its message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => ApprovalCode::NotFound.as_str(),
            Self::AlreadyDecided { .. } => ApprovalCode::AlreadyDecided.as_str(),
            Self::Expired(_) => ApprovalCode::Expired.as_str(),
            Self::InvalidButton(_) => ApprovalCode::InvalidButton.as_str(),
            Self::NotNeeded(_) => ApprovalCode::NotNeeded.as_str(),
            Self::Refused(_) => "APPROVAL_REFUSED",
            Self::Db(_) => "DATABASE_ERROR",
        }
    }
}

/// Who asks, from where: filled by the runtime, the console or the CLI, never by a model.
#[derive(Debug, Clone)]
pub struct Requester {
    pub actor: Role,
    /// [`WHATSAPP`], [`SIMULATOR`] or [`CONSOLE`].
    pub channel: String,
    pub chat_kind: ChatKind,
    pub chat_id: String,
    pub sender: String,
    pub message_id: String,
    /// The person's words, kept for the summary of the result: untrusted data.
    pub request: String,
    pub correlation_id: String,
}

impl Requester {
    fn call_context(&self) -> CallContext {
        CallContext {
            actor: self.actor,
            chat_type: self.chat_kind,
            chat_id: Some(self.chat_id.clone()),
            sender_id: Some(self.sender.clone()),
            correlation_id: self.correlation_id.clone(),
            approved: None,
            trace_id: None,
        }
    }
}

/// A stored request.
#[derive(Debug, Clone)]
pub struct Requested {
    pub id: i64,
    /// The same call was already waiting: nothing new was stored or sent.
    pub reused: bool,
    pub expires_at: i64,
    pub trace_id: Option<i64>,
}

/// Approve or reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject { reason: Option<String> },
}

/// A decision that was made by this call.
#[derive(Debug, Clone)]
pub struct Decided {
    pub approval: ApprovalRow,
    /// The `tool.call` job of an approved call.
    pub job_id: Option<i64>,
}

/// A pressed approval button, as parsed from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub id: i64,
    pub approve: bool,
    pub nonce: String,
}

impl Button {
    pub fn id_for(approval_id: i64, approve: bool, nonce: &str) -> String {
        format!("{BUTTON_PREFIX}{approval_id}:{}:{nonce}", if approve { "approve" } else { "reject" })
    }

    /// `Some` for an id that has the shape of an approval button (which says nothing about
    /// whether it is genuine).
    pub fn parse(reply_id: &str) -> Option<Self> {
        let rest = reply_id.strip_prefix(BUTTON_PREFIX)?;
        let mut parts = rest.splitn(3, ':');
        let id = parts.next()?.parse().ok()?;
        let approve = match parts.next()? {
            "approve" => true,
            "reject" => false,
            _ => return None,
        };
        Some(Self { id, approve, nonce: parts.next()?.to_string() })
    }
}

/// The approval path, built once by the composition root.
pub struct Approvals {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
    checkpoint: Arc<Checkpoint>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A chat a message can be sent to later (not the console or the command line).
pub fn is_chat(channel: &str) -> bool {
    channel == WHATSAPP || channel == SIMULATOR
}

/// The reason code of a policy or hook reason (`APPROVAL_RISK`, or `APPROVAL_HOOK` for a hook's
/// words).
fn reason_code(reason: &str) -> &str {
    if !reason.is_empty() && reason.chars().all(|c| c.is_ascii_uppercase() || c == '_') { reason } else { "APPROVAL_HOOK" }
}

impl Approvals {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>, checkpoint: Arc<Checkpoint>) -> Self {
        Self { db, queue, settings, checkpoint }
    }

    pub fn settings(&self) -> &crate::config::ApprovalSettings {
        &self.settings.approvals
    }

    /// What an owner is shown of `args`: secrets and personal data replaced.
    fn display(&self, args: &Value) -> String {
        let mut shown = args.clone();
        redact::redact(&mut shown);
        redact::redact_named(&mut shown, &self.checkpoint.catalog().audit.pii_fields, redact::PII_REDACTED);
        canonical_json(&shown)
    }

    /// Stores a request for `call` (which the gates must say needs an owner) with its trace step,
    /// in one transaction, and asks the owners. `trace` is the message's trace when the request
    /// comes from a chat; without one (console, CLI) the request gets a trace of its own. A
    /// pending request for the same call from the same place is reused.
    ///
    /// `also` is a reason of the caller's own (the lane's plan validator asks an owner for some
    /// calls the checkpoint alone would run); the checkpoint's reason comes first.
    pub async fn request(&self, call: &ToolCall, who: &Requester, also: Option<&str>, trace: Option<&mut Recorder>) -> Result<Requested, ApprovalError> {
        let mut ctx = who.call_context();
        ctx.trace_id = trace.as_ref().map(|t| t.id());
        let checked = self.checkpoint.check(call, &ctx).map_err(ApprovalError::Refused)?;
        let Some(reason) = checked.needs_approval.clone().or_else(|| also.map(str::to_string)) else { return Err(ApprovalError::NotNeeded(call.name.clone())) };
        let spec = &checked.tool.spec;
        let args_text = canonical_json(&call.args);
        let hash = args_hash(&call.args);
        let call_key = {
            let mut h = Sha256::new();
            for part in [spec.name.as_str(), checked.version.as_str(), hash.as_str(), who.channel.as_str(), who.chat_id.as_str(), who.sender.as_str(), who.actor.as_str()] {
                h.update(part.as_bytes());
                h.update([0]);
            }
            hex::encode(h.finalize())
        };
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let now = db::now_ms();
        let risk = serde_json::to_value(spec.risk).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let managed = serde_json::to_string(&spec.managed_fields).unwrap_or_else(|_| "[]".into());
        let display = self.display(&call.args);
        let mut tx = self.db.begin_write().await?;
        let (mut own, mut trace) = match trace {
            Some(t) => (None, Some(t)),
            None => {
                let subject = Subject { correlation_id: who.correlation_id.clone(), channel: who.channel.clone(), chat_id: who.chat_id.clone(), message_id: who.message_id.clone() };
                (Some(traces::begin(&mut tx, subject).await?), None)
            }
        };
        let recorder: &mut Recorder = match (&mut trace, &mut own) {
            (Some(t), _) => t,
            (None, Some(o)) => o,
            (None, None) => unreachable!("one of the two is set above"),
        };
        let trace_id = recorder.id();
        let new = NewApproval {
            tool: &spec.name,
            tool_version: &checked.version,
            args: &args_text,
            args_hash: &hash,
            call_key: &call_key,
            managed_fields: &managed,
            display: &display,
            risk: &risk,
            reason_code: reason_code(&reason),
            reason: &reason,
            actor: who.actor.as_str(),
            channel: &who.channel,
            chat_kind: who.chat_kind.as_str(),
            chat_id: &who.chat_id,
            sender: &who.sender,
            message_id: &who.message_id,
            request: &who.request.chars().take(2000).collect::<String>(),
            correlation_id: &who.correlation_id,
            trace_id: Some(trace_id),
            nonce: &nonce,
            created_at: now,
            expires_at: now.saturating_add(ms(self.settings.approvals.ttl)),
        };
        let (row, reused) = store::insert_or_reuse(&mut tx, &new).await?;
        if !reused {
            self.ask_owners(&mut tx, &row).await?;
        }
        recorder.step(
            "ApprovalRequested",
            if reused { "reused" } else { "pending" },
            reason_code(&reason),
            json!({ "approval_id": row.id, "tool": row.tool, "version": row.tool_version, "args_hash": row.args_hash, "risk": row.risk, "expires_at": row.expires_at }),
        );
        recorder.flush(&mut tx).await?;
        if let Some(own) = own {
            let ending = Ending { actor: who.actor.as_str().into(), route: "approval".into(), outcome: "pending".into(), error_code: None };
            own.finish(&mut tx, ending).await?;
        }
        self.queue.commit(tx).await?;
        tracing::info!(event = "ApprovalRequested", approval.id = row.id, tool = %row.tool, reused, correlation_id = %who.correlation_id, "an owner must approve");
        Ok(Requested { id: row.id, reused, expires_at: row.expires_at, trace_id: row.trace_id })
    }

    /// Enqueues the question to every owner number (requests from WhatsApp chats only: simulated
    /// chats and the console ask in the console) and the expiry, in the caller's transaction.
    async fn ask_owners(&self, conn: &mut sqlx::AnyConnection, row: &ApprovalRow) -> Result<(), DbError> {
        let mut jobs = Vec::new();
        if row.channel == WHATSAPP {
            for phone in db::owners::all_phones(conn).await? {
                let to = phone.trim_start_matches('+').to_string();
                let mut job = self.queue.job(&AskOwner { approval_id: row.id, to: to.clone() });
                job.dedupe_key = Some(format!("approval:{}:ask:{to}", row.id));
                job.correlation_id.clone_from(&row.correlation_id);
                jobs.push(job);
            }
        }
        let mut expire = self.queue.job(&Settle { approval_id: row.id, reason: SettleReason::Expired });
        expire.dedupe_key = Some(format!("approval:{}:expire", row.id));
        expire.scheduled_at = Some(row.expires_at);
        expire.correlation_id.clone_from(&row.correlation_id);
        jobs.push(expire);
        self.queue.enqueue_many_in(conn, &jobs).await?;
        Ok(())
    }

    pub async fn get(&self, id: i64) -> Result<Option<ApprovalRow>, DbError> {
        let mut conn = self.db.pool.acquire().await?;
        store::get(&mut conn, id).await
    }

    pub async fn list(&self, state: Option<State>, limit: i64) -> Result<Vec<ApprovalRow>, DbError> {
        let mut conn = self.db.pool.acquire().await?;
        store::list(&mut conn, state, limit).await
    }

    /// Decides approval `id`, once. `nonce` is a WhatsApp button's secret (None for the console,
    /// the CLI and the text commands, whose owner is known otherwise). On approval one
    /// `tool.call` job is enqueued, keyed by the approval; on rejection the requester is told.
    /// Every decision is in the owner audit and the request's trace.
    pub async fn decide(&self, id: i64, verdict: Verdict, by: &Decider, nonce: Option<&str>, ip: Option<&str>) -> Result<Decided, ApprovalError> {
        let mut conn = self.db.pool.acquire().await?;
        let Some(row) = store::get(&mut conn, id).await? else { return Err(ApprovalError::NotFound(id)) };
        drop(conn);
        if let Some(nonce) = nonce
            && !constant_eq(nonce.as_bytes(), row.nonce.as_bytes())
        {
            return Err(ApprovalError::InvalidButton(id));
        }
        let now = db::now_ms();
        let (to, event, note) = match &verdict {
            Verdict::Approve => (State::Approved, audit::event::APPROVAL_APPROVED, None),
            Verdict::Reject { reason } => (State::Rejected, audit::event::APPROVAL_REJECTED, reason.as_deref().map(str::trim).filter(|r| !r.is_empty())),
        };
        let mut tx = self.db.begin_write().await?;
        if !store::decide(&mut tx, id, to, by, note, now).await? {
            drop(tx);
            let mut conn = self.db.pool.acquire().await?;
            let current = store::get(&mut conn, id).await?.ok_or(ApprovalError::NotFound(id))?;
            return Err(match current.state() {
                State::Pending | State::Expired => ApprovalError::Expired(id),
                state => ApprovalError::AlreadyDecided { id, state, by: current.decided_by.unwrap_or_default() },
            });
        }
        let mut job_id = None;
        match &verdict {
            Verdict::Approve => {
                let job = tool_call_job(&row);
                let mut new = self.queue.job(&job);
                new.dedupe_key = Some(format!("approval:{id}:run"));
                new.chat_id = Some(row.chat_id.clone());
                new.sender_id = Some(row.sender.clone());
                new.message_id = Some(row.message_id.clone());
                new.tool_name = Some(row.tool.clone());
                new.original_text = Some(row.request.clone());
                new.correlation_id.clone_from(&row.correlation_id);
                let enqueued = self.queue.enqueue_in(&mut tx, &new).await?;
                store::set_job(&mut tx, id, enqueued.job.id).await?;
                job_id = Some(enqueued.job.id);
            }
            // The settle job tells a chat's requester; for the console it is the rejection's
            // event, which every open Approvals page follows.
            Verdict::Reject { .. } => {
                let mut tell = self.queue.job(&Settle { approval_id: id, reason: SettleReason::Rejected });
                tell.dedupe_key = Some(format!("approval:{id}:rejected"));
                tell.correlation_id.clone_from(&row.correlation_id);
                self.queue.enqueue_in(&mut tx, &tell).await?;
            }
        }
        let detail = json!({ "approval_id": id, "tool": row.tool, "via": by.via, "decided_by": by.name, "reason": note, "job_id": job_id });
        audit::record(&mut tx, AuditEntry { owner_id: by.owner_id, login: Some(&by.name), ip, event, detail: Some(detail.clone()) }).await?;
        if let Some(trace_id) = row.trace_id {
            traces::append(&mut tx, trace_id, &Step::new("ApprovalDecided", to.as_str(), "OK", detail)).await?;
        }
        self.queue.commit(tx).await?;
        tracing::info!(event = "ApprovalDecided", approval.id = id, state = to.as_str(), via = by.via, "decided");
        let mut conn = self.db.pool.acquire().await?;
        let approval = store::get(&mut conn, id).await?.ok_or(ApprovalError::NotFound(id))?;
        Ok(Decided { approval, job_id })
    }

    /// Settles an approval whose time ran out; true when this call did (the requester is then
    /// told by the caller). False when a decision came first, or it is not due yet.
    pub async fn expire(&self, id: i64) -> Result<bool, DbError> {
        let mut tx = self.db.begin_write().await?;
        let expired = store::expire(&mut tx, id, db::now_ms()).await?;
        if expired && let Some(row) = store::get(&mut tx, id).await? && let Some(trace_id) = row.trace_id {
            traces::append(&mut tx, trace_id, &Step::new("ApprovalExpired", "expired", ApprovalCode::Expired.as_str(), json!({ "approval_id": id }))).await?;
        }
        tx.commit().await?;
        Ok(expired)
    }

    /// Records how an approved call's run ended and, the first time, tells the owner who
    /// decided (on WhatsApp when they decided there or have a number; always in the console).
    pub async fn record_outcome(&self, approval_id: i64, code: &str, answer: &str) -> Result<(), DbError> {
        let mut tx = self.db.begin_write().await?;
        if !store::set_outcome(&mut tx, approval_id, code, db::now_ms()).await? {
            return Ok(());
        }
        let Some(row) = store::get(&mut tx, approval_id).await? else { return Ok(()) };
        let outcome = if code == "OK" { answer.chars().take(600).collect::<String>() } else { format!("did not complete ({code}).") };
        let message = self.settings.approvals.outcome_notice.replace("{id}", &approval_id.to_string()).replace("{tool}", &row.tool).replace("{outcome}", &outcome);
        if let Some(trace_id) = row.trace_id {
            traces::append(&mut tx, trace_id, &Step::new("ApprovalExecuted", if code == "OK" { "succeeded" } else { "failed" }, code, json!({ "approval_id": approval_id, "job_id": row.job_id }))).await?;
        }
        if let Some(phone) = row.decider_phone.as_deref().filter(|p| !p.is_empty()) {
            let mut job = self.queue.job(&DeliverNotice { to: phone.trim_start_matches('+').to_string(), message });
            job.dedupe_key = Some(format!("approval:{approval_id}:outcome"));
            job.correlation_id.clone_from(&row.correlation_id);
            self.queue.enqueue_in(&mut tx, &job).await?;
        }
        self.queue.commit(tx).await?;
        Ok(())
    }

    /// The owner's WhatsApp message for approval `row`, with its buttons.
    pub fn prompt(&self, row: &ApprovalRow) -> (String, Vec<(String, String)>) {
        let a = &self.settings.approvals;
        let requester = if row.actor == Role::Owner.as_str() { format!("An owner (+{})", row.sender.trim_start_matches('+')) } else { format!("A customer (+{})", row.sender.trim_start_matches('+')) };
        let expires = chrono_like(row.expires_at);
        let text = a
            .owner_prompt
            .trim()
            .replace("{id}", &row.id.to_string())
            .replace("{tool}", &row.tool)
            .replace("{risk}", &row.risk)
            .replace("{args}", &row.display)
            .replace("{requester}", &requester)
            .replace("{reason}", &row.reason)
            .replace("{expires}", &expires);
        let buttons = vec![
            (Button::id_for(row.id, true, &row.nonce), a.approve_button.trim().to_string()),
            (Button::id_for(row.id, false, &row.nonce), a.reject_button.trim().to_string()),
        ];
        (text, buttons)
    }

    /// The words for an approval error, for the owner who tried.
    pub fn error_reply(&self, e: &ApprovalError) -> String {
        let a = &self.settings.approvals;
        match e {
            ApprovalError::NotFound(id) => a.not_found_reply.replace("{id}", &id.to_string()),
            ApprovalError::AlreadyDecided { id, state, by } => a.already_decided_reply.replace("{id}", &id.to_string()).replace("{state}", state.as_str()).replace("{by}", by),
            ApprovalError::Expired(id) => a.expired_reply.replace("{id}", &id.to_string()),
            ApprovalError::InvalidButton(_) => a.invalid_button_reply.clone(),
            other => format!("{other}"),
        }
    }

    /// The words for a decision this owner made.
    pub fn decided_reply(&self, d: &Decided) -> String {
        let a = &self.settings.approvals;
        let text = if d.approval.state() == State::Approved { &a.approved_reply } else { &a.rejected_reply };
        text.replace("{id}", &d.approval.id.to_string()).replace("{tool}", &d.approval.tool)
    }
}

/// The `tool.call` job of an approved request: the stored call, bound to the approval.
fn tool_call_job(row: &ApprovalRow) -> ToolCallJob {
    let args: Value = serde_json::from_str(&row.args).unwrap_or(Value::Null);
    ToolCallJob {
        tool: row.tool.clone(),
        version: row.tool_version.clone(),
        approval: Some(ApprovedCall { approval_id: row.id, version: row.tool_version.clone(), args_hash: row.args_hash.clone() }),
        args,
        actor: row.actor.parse().unwrap_or(Role::Customer),
        chat_kind: row.chat_kind.parse().unwrap_or(ChatKind::Direct),
        sender: row.sender.clone(),
        request: row.request.clone(),
        reply_to: ReplyTo { channel: row.channel.clone(), chat_id: row.chat_id.clone(), chat_kind: row.chat_kind.parse().unwrap_or(ChatKind::Direct), message_id: row.message_id.clone() },
        trace_id: row.trace_id,
    }
}

/// Compares secrets in constant time.
fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

/// A unix-ms time as "2026-11-30T14:05:00Z".
fn chrono_like(at_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(at_ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn button_ids_round_trip_and_refuse_other_shapes() {
        let id = Button::id_for(42, true, "abc123");
        assert_eq!(id, "gh-approval:42:approve:abc123");
        assert_eq!(Button::parse(&id), Some(Button { id: 42, approve: true, nonce: "abc123".into() }));
        assert_eq!(Button::parse("gh-approval:42:reject:n").map(|b| b.approve), Some(false));
        for bad in ["row-2", "gh-approval:x:approve:n", "gh-approval:1:maybe:n", "gh-approval:1:approve"] {
            assert_eq!(Button::parse(bad), None, "{bad}");
        }
        assert!(constant_eq(b"same", b"same") && !constant_eq(b"same", b"sane") && !constant_eq(b"a", b"ab"));
    }
}
