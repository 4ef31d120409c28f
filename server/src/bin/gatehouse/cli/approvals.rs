//! `gatehouse approvals`: tool calls waiting for an owner, decided by the same rules as the
//! console and WhatsApp (one decision; exit 0 only for the command that made it).

use server::{
    approvals::ApprovalError,
    approvals::Verdict,
    config::LoadedConfig,
    db::approvals::{Decider, State},
    tools::ToolFiles,
};

use super::{ApprovalsCommand, Failure, build};

fn when(ms: i64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))).to_string()
}

pub async fn run(cfg: LoadedConfig, files: ToolFiles, cmd: &ApprovalsCommand) -> Result<(), Failure> {
    let gatehouse = build(cfg, files).await?;
    let approvals = &gatehouse.approvals;
    let cli = Decider { name: "cli".into(), owner_id: None, phone: None, via: "cli" };
    let result = match cmd {
        ApprovalsCommand::List { state, json, limit } => {
            let state = match state.as_deref() {
                None => None,
                Some(s) => Some(s.parse::<State>().map_err(|_| Failure::usage(format!("--state {s:?}: use pending, approved, rejected or expired")))?),
            };
            let rows = approvals.list(state, (*limit).clamp(1, 1000)).await.map_err(Failure::runtime)?;
            if rows.is_empty() && !json {
                println!("no approvals{}", state.map(|s| format!(" in state {s}")).unwrap_or_default());
            }
            for r in rows {
                // Requests stored before their display escaped what does not show, too.
                let display = server::untrusted::escape_unseen(&r.display);
                if *json {
                    let line = serde_json::json!({
                        "id": r.id, "state": r.state, "tool": r.tool, "version": r.tool_version, "risk": r.risk,
                        "reason_code": r.reason_code, "args": display, "actor": r.actor, "channel": r.channel,
                        "requested_at": r.created_at, "expires_at": r.expires_at, "decided_at": r.decided_at,
                        "decided_by": r.decided_by, "job_id": r.job_id, "outcome": r.outcome_code, "trace_id": r.trace_id,
                    });
                    println!("{line}");
                } else {
                    println!("#{}\t{}\t{}\t{} risk\t{} via {}\t{}\texpires {}\t{}", r.id, r.state, r.tool, r.risk, r.actor, r.channel, when(r.created_at), when(r.expires_at), display);
                }
            }
            Ok(())
        }
        ApprovalsCommand::Approve { id } => decided(approvals.decide(*id, Verdict::Approve, &cli, None, None).await),
        ApprovalsCommand::Reject { id, reason } => decided(approvals.decide(*id, Verdict::Reject { reason: reason.clone() }, &cli, None, None).await),
    };
    gatehouse.db.close().await;
    result
}

fn decided(result: Result<server::approvals::Decided, ApprovalError>) -> Result<(), Failure> {
    match result {
        Ok(d) => {
            let job = d.job_id.map(|j| format!("; job {j} runs it")).unwrap_or_default();
            println!("approval #{} {} ({}){job}", d.approval.id, d.approval.state, d.approval.tool);
            Ok(())
        }
        Err(ApprovalError::Db(e)) => Err(Failure::runtime(e)),
        Err(e) => Err(Failure { code: 1, message: e.to_string() }),
    }
}
