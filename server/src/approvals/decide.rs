//! An owner's decision: one conditional update from `pending`, the `tool.call` job of an
//! approved call, expiry, and the outcome told to the owner who decided.

use serde_json::{Value, json};

use super::{ApprovalCode, ApprovalError, Approvals, Settle, SettleReason};
use crate::{
    channel::ReplyTo,
    db::{
        self, DbError,
        approvals::{self as store, ApprovalRow, Decider, State},
        audit::{self, AuditEntry},
    },
    domain::{ChatKind, Role},
    owners::notices::DeliverNotice,
    tools::{ApprovedCall, checkpoint::ToolCode, job::ToolCallJob},
    traces::{self, Step},
};

/// The outcome of an approved call whose run an owner cancelled (the job's own code).
const RUN_CANCELLED: &str = crate::db::jobs::CANCELLED;

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

impl Approvals {
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
            return Err(match current.state {
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
        let mut appended = None;
        if let Some(trace_id) = row.trace_id {
            // The owner's reason is their text: in the request's trace only with trace_text on.
            let mut detail = detail;
            if !self.settings.conversation.trace_text {
                detail["reason"] = json!(note.map(|n| json!({ "chars": n.chars().count() })));
            }
            appended = Some(traces::append(&mut tx, trace_id, &Step::new("ApprovalDecided", to.as_str(), "OK", detail)).await?);
        }
        self.queue.commit(tx).await?;
        self.queue.telemetry().appended(appended);
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
        let mut appended = None;
        if expired && let Some(row) = store::get(&mut tx, id).await? && let Some(trace_id) = row.trace_id {
            appended = Some(traces::append(&mut tx, trace_id, &Step::new("ApprovalExpired", "expired", ApprovalCode::Expired.as_str(), json!({ "approval_id": id }))).await?);
        }
        tx.commit().await?;
        self.queue.telemetry().appended(appended);
        Ok(expired)
    }

    /// An owner cancelled `job` (the Jobs page). If it is the run of an approved call, its
    /// outcome is `JOB_CANCELLED` and the owner who approved it is told, as for any outcome
    /// (else the approval would stay "approved" with no outcome, and its decider waiting). A run
    /// already under way may have made the call: the notice says to check. The lane's
    /// `tool.stopped` job, which calls this, tells the person who asked that it was stopped,
    /// unless its answer reached them.
    pub async fn run_cancelled(&self, job: &crate::db::jobs::JobRow) -> Result<(), DbError> {
        if job.kind != <ToolCallJob as crate::jobs::JobKind>::KIND {
            return Ok(());
        }
        let Some(approved) = serde_json::from_str::<ToolCallJob>(&job.args).ok().and_then(|args| args.approval) else { return Ok(()) };
        match self.get(approved.approval_id).await? {
            Some(row) if row.job_id == Some(job.id) => self.record_outcome(row.id, RUN_CANCELLED, "").await,
            _ => Ok(()),
        }
    }

    /// Records how an approved call's run ended and, the first time, tells the owner who
    /// decided (on WhatsApp when they decided there or have a number; always in the console).
    pub async fn record_outcome(&self, approval_id: i64, code: &str, answer: &str) -> Result<(), DbError> {
        let mut tx = self.db.begin_write().await?;
        if !store::set_outcome(&mut tx, approval_id, code, db::now_ms()).await? {
            return Ok(());
        }
        let Some(row) = store::get(&mut tx, approval_id).await? else { return Ok(()) };
        let a = &self.settings.approvals;
        let outcome = match code {
            "OK" => answer.chars().take(600).collect::<String>(),
            unknown if unknown == ToolCode::OutcomeUnknown.as_str() => a.outcome_unknown.trim().replace("{code}", code),
            RUN_CANCELLED => a.outcome_cancelled.trim().replace("{code}", code),
            _ => a.outcome_failed.trim().replace("{code}", code),
        };
        let message = self.settings.approvals.outcome_notice.replace("{id}", &approval_id.to_string()).replace("{tool}", &row.tool).replace("{outcome}", &outcome);
        let mut appended = None;
        if let Some(trace_id) = row.trace_id {
            appended = Some(traces::append(&mut tx, trace_id, &Step::new("ApprovalExecuted", if code == "OK" { "succeeded" } else { "failed" }, code, json!({ "approval_id": approval_id, "job_id": row.job_id }))).await?);
        }
        if let Some(phone) = row.decider_phone.as_deref().filter(|p| !p.is_empty()) {
            let mut job = self.queue.job(&DeliverNotice { to: phone.trim_start_matches('+').to_string(), message });
            job.dedupe_key = Some(format!("approval:{approval_id}:outcome"));
            job.correlation_id.clone_from(&row.correlation_id);
            self.queue.enqueue_in(&mut tx, &job).await?;
        }
        self.queue.commit(tx).await?;
        self.queue.telemetry().appended(appended);
        Ok(())
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
        again_of: None,
    }
}

/// Compares secrets in constant time.
pub(super) fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}
