//! The console's [`ApprovalsBackend`]: the Approvals page over [`crate::approvals`], which
//! decides (one conditional update, the run enqueued, the audit and trace written).

use app::{
    backend::ApprovalsBackend,
    dto::{ApprovalView, ApprovalsPage},
    error::AppError,
};

use super::{ConsoleBackend, internal, label};
use crate::{
    approvals::{ApprovalError, CONSOLE, Verdict},
    db::{
        self,
        approvals::{ApprovalRow, Decider, State},
    },
};

/// Decided requests the page lists.
const DECIDED_SHOWN: i64 = 50;

fn view(r: ApprovalRow) -> ApprovalView {
    let requester = if r.channel == CONSOLE { "owner (console)".to_string() } else { format!("{} +{}", r.actor, r.sender.trim_start_matches('+')) };
    ApprovalView {
        id: r.id,
        state: r.state.to_string(),
        tool: r.tool,
        version: r.tool_version.chars().take(19).collect(),
        args: crate::approvals::for_the_console(&r.args),
        risk: r.risk,
        reason_code: r.reason_code,
        reason: r.reason,
        requester,
        channel: r.channel,
        trace_id: r.trace_id,
        requested_at: r.created_at,
        expires_at: r.expires_at,
        decided_at: r.decided_at,
        decided_by: r.decided_by,
        decided_via: r.decided_via,
        decision_note: r.decision_note,
        job_id: r.job_id,
        outcome: r.outcome_code,
        job_state: None,
    }
}

#[async_trait::async_trait]
impl ApprovalsBackend for ConsoleBackend {
    async fn approvals_page(&self) -> Result<ApprovalsPage, AppError> {
        let approvals = &self.state.approvals;
        let mut pending = approvals.list(Some(State::Pending), 500).await.map_err(internal)?;
        pending.reverse();
        let decided = approvals.list(None, DECIDED_SHOWN + pending.len() as i64).await.map_err(internal)?;
        let mut decided: Vec<_> = decided.into_iter().filter(|r| r.state != State::Pending).take(DECIDED_SHOWN as usize).map(view).collect();
        // A run with no outcome may still be running, or have been cancelled or given up.
        let waiting: Vec<i64> = decided.iter().filter(|a| a.outcome.is_none()).filter_map(|a| a.job_id).collect();
        let mut states = std::collections::HashMap::new();
        if !waiting.is_empty() {
            let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
            states.extend(db::jobs::states(&mut conn, &waiting).await.map_err(internal)?);
        }
        for a in &mut decided {
            a.job_state = a.job_id.and_then(|id| states.get(&id).cloned());
        }
        Ok(ApprovalsPage {
            pending: pending.into_iter().map(view).collect(),
            decided,
            now: db::now_ms(),
            approval_mode: label(&self.state.tools.catalog().approval_mode),
        })
    }

    async fn decide_approval(&self, owner_id: i64, id: i64, approve: bool, reason: &str, ip: &str) -> Result<String, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let owner = db::owners::find_by_id(&mut conn, owner_id).await.map_err(internal)?.ok_or_else(AppError::unauthorized)?;
        let phones = db::owners::phones_of(&mut conn, owner_id).await.map_err(internal)?;
        drop(conn);
        // The outcome goes to the owner's first number too, when they have one.
        let phone = phones.first().map(|p| p.trim_start_matches('+').to_string());
        let by = Decider { name: owner.display_name, owner_id: Some(owner_id), phone, via: "console" };
        let verdict = if approve { Verdict::Approve } else { Verdict::Reject { reason: Some(reason.chars().take(300).collect()) } };
        let approvals = &self.state.approvals;
        match approvals.decide(id, verdict, &by, None, Some(ip)).await {
            Ok(decided) => Ok(approvals.decided_reply(&decided)),
            Err(ApprovalError::Db(e)) => Err(internal(e)),
            Err(e) => Err(AppError::new(e.code(), approvals.error_reply(&e))),
        }
    }
}
