//! Owner approvals: a tool call the checkpoint says needs an owner is stored with the exact call
//! (tool, definition version, canonical arguments and their hash, the managed fields, who asked
//! and from where) in one transaction with its trace step, and only then is the requester told
//! that an owner must approve. Owners decide on WhatsApp (buttons whose ids carry the approval
//! id and a secret nonce, or `/approve ID` and `/reject ID`), in the console or with
//! `gatehouse approvals`. A decision is one conditional update from `pending`; an approval
//! enqueues one `tool.call` job keyed by the approval, which the checkpoint runs only if the
//! tool and the arguments are still exactly the ones approved (`APPROVAL_STALE` otherwise).
//! Expiry is a job too: the requester is told and nothing runs.

mod decide;
pub mod jobs;
mod messages;

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{
    channel::{SIMULATOR, WHATSAPP},
    config::Settings,
    db::{
        self, Db, DbError,
        approvals::{self as store, ApprovalRow, NewApproval, State},
    },
    domain::{ChatKind, Role},
    jobs::JobQueue,
    redact,
    tools::{
        CallContext, Checkpoint, ToolCall,
        canonical::{args_hash, canonical_json},
        checkpoint::ToolFailure,
    },
    traces::{self, Ending, Recorder, Step, Subject},
    untrusted,
};

pub use self::{
    decide::{Decided, Verdict},
    jobs::{AskOwner, Settle, SettleReason},
    messages::Button,
};

/// The channel of requests made in the console or on the command line: no chat to answer.
pub const CONSOLE: &str = "console";

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

crate::db::from_sqlx_as_db!(ApprovalError);

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
            Self::Db(e) => e.code(),
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
    /// The same call was already waiting, or this message asked for it before: nothing new was
    /// stored or sent.
    pub reused: bool,
    /// Where the request stands: `Pending`, unless this message asked before and an owner (or
    /// the clock) has settled it since.
    pub state: store::State,
    pub expires_at: i64,
    pub trace_id: Option<i64>,
}

/// The approval path, built once by the composition root.
pub struct Approvals {
    pub(crate) db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
    checkpoint: Arc<Checkpoint>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}


/// A chat a message can be sent to later (not the console or the command line).
pub fn is_chat(channel: &str) -> bool {
    channel == WHATSAPP || channel == SIMULATOR
}

/// What the console's Approvals page, behind the owner login, shows of a request's stored
/// arguments: the exact call an owner approves, personal data included (an address to ship to
/// is what the decision is about), with secret-named fields still replaced and characters that
/// do not show written as escapes ([`untrusted::escape_unseen`]).
pub fn for_the_console(args_json: &str) -> String {
    match serde_json::from_str::<Value>(args_json) {
        Ok(mut args) => {
            redact::redact_args(&mut args);
            untrusted::escape_unseen(&canonical_json(&args))
        }
        Err(_) => String::new(),
    }
}

/// The reason code of a policy or hook reason (`APPROVAL_RISK`, or `APPROVAL_HOOK` for a hook's
/// words).
fn reason_code(reason: &str) -> &str {
    if crate::config::approvals::is_reason_code(reason) { reason } else { "APPROVAL_HOOK" }
}

impl Approvals {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>, checkpoint: Arc<Checkpoint>) -> Self {
        Self { db, queue, settings, checkpoint }
    }

    pub fn settings(&self) -> &crate::config::ApprovalSettings {
        &self.settings.approvals
    }

    /// What the owners' WhatsApp prompt shows of `tool`'s `args`: what the before-call redact
    /// hooks mask for the tool, secrets and personal data replaced (the message passes through
    /// Meta to every owner number), and characters that do not show written as escapes, so a
    /// customer's argument cannot be read reversed or hide a part. The console shows more
    /// ([`for_the_console`]).
    fn display(&self, tool: &str, args: &Value) -> String {
        let mut shown = args.clone();
        self.checkpoint.catalog().redact_for_record(tool, &mut shown);
        untrusted::escape_unseen(&canonical_json(&shown))
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
        let display = self.display(&call.name, &call.args);
        // A code is told in words (config); a hook's reason is its own words.
        let words = match reason_code(&reason) {
            code if code == reason => self.settings.approvals.reason_words(code).unwrap_or_else(|| reason.clone()),
            _ => reason.clone(),
        };
        let mut tx = self.db.begin_write().await?;
        let (own, trace) = match trace {
            Some(t) => (None, Some(t)),
            None => {
                let subject = Subject { correlation_id: who.correlation_id.clone(), channel: who.channel.clone(), chat_id: who.chat_id.clone(), message_id: who.message_id.clone(), sender: None };
                (Some(traces::begin(&mut tx, subject).await?), None)
            }
        };
        let trace_id = match (&trace, &own) {
            (Some(t), _) => t.id(),
            (None, Some(o)) => o.id(),
            (None, None) => unreachable!("one of the two is set above"),
        };
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
            reason: &words,
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
            expires_at: now.saturating_add(db::duration_ms(self.settings.approvals.ttl)),
        };
        let store::Stored { row, reused, expired } = store::insert_or_reuse(&mut tx, &new).await?;
        let mut appended = Vec::new();
        for (id, trace_id) in expired {
            // Settled here rather than by its expiry job, which then finds nothing to do.
            if let Some(trace_id) = trace_id {
                appended.push(traces::append(&mut tx, trace_id, &Step::new("ApprovalExpired", "expired", ApprovalCode::Expired.as_str(), json!({ "approval_id": id }))).await?);
            }
        }
        if !reused {
            self.ask_owners(&mut tx, &row).await?;
        }
        let decision = if reused { "reused" } else { "pending" };
        let detail = json!({ "approval_id": row.id, "tool": row.tool, "version": row.tool_version, "args_hash": row.args_hash, "risk": row.risk, "expires_at": row.expires_at });
        // The caller's trace goes on after this: its steps so far commit with the request, and
        // the step naming the request is kept only if it does. A trace of the request's own
        // ends with it.
        let (flushed, own_trace) = match (trace, own) {
            (Some(trace), _) => (Some((trace.flush_with(&mut tx, "ApprovalRequested", decision, reason_code(&reason), detail).await?, trace)), None),
            (None, Some(mut own)) => {
                own.step("ApprovalRequested", decision, reason_code(&reason), detail);
                let ending = Ending { actor: who.actor.as_str().into(), route: "approval".into(), outcome: "pending".into(), error_code: None };
                (None, Some(own.finish(&mut tx, ending).await?))
            }
            (None, None) => (None, None),
        };
        self.queue.commit(tx).await?;
        self.queue.telemetry().appended(appended);
        if let Some((flushed, trace)) = flushed {
            trace.committed(flushed);
        }
        // A request from the console or the CLI has a trace of its own, exported like a message's.
        if let Some(id) = own_trace {
            self.queue.telemetry().message(id);
        }
        tracing::info!(event = "ApprovalRequested", approval.id = row.id, tool = %row.tool, reused, correlation_id = %who.correlation_id, "an owner must approve");
        Ok(Requested { id: row.id, reused, state: row.state, expires_at: row.expires_at, trace_id: row.trace_id })
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
}

#[cfg(test)]
mod tests {
    use super::{decide::constant_eq, *};

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
