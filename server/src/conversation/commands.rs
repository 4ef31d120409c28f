//! Owner commands (`/help`, `/status`, `/jobs`, ...) and the owners' notice for a customer's
//! private-data question.

use super::{Inbound, Runtime, RuntimeError, steps};
use crate::{
    approvals::{ApprovalError, Verdict},
    db::{self, approvals::Decider},
    llm,
};

impl Runtime {
    /// The owners' notice for a customer's private-data question (`private_data.owner_notice`).
    pub(super) fn private_data_notice(&self, inbound: &Inbound, category: &str) -> db::owner_notifications::Notification {
        let settings = &self.settings.private_data;
        let description = settings.categories.iter().find(|c| c.name == category).map_or("", |c| c.description.as_str());
        // The notice goes to every owner in Gatehouse's voice: the customer's words must not
        // start a paragraph of their own, or end the quote, that reads as its message.
        let text = crate::untrusted::quoted_line(&inbound.text, 300);
        let message = settings
            .owner_notice
            .replace("{sender}", &inbound.sender)
            .replace("{chat}", &inbound.chat_id)
            .replace("{category}", category)
            .replace("{description}", description)
            .replace("{text}", &text);
        db::owner_notifications::Notification {
            at: db::now_ms(),
            hook: "private_data".into(),
            tool: category.into(),
            reason_code: "PRIVATE_DATA_REQUEST".into(),
            message,
            correlation_id: inbound.correlation_id.clone(),
        }
    }

    /// An owner's decision on an approval, from a button or a command: the reason code for
    /// the trace and the words for the owner.
    pub(super) async fn decide_approval(&self, id: i64, verdict: Verdict, owner_id: i64, inbound: &Inbound, nonce: Option<&str>) -> Result<(&'static str, String), RuntimeError> {
        let mut conn = self.db.pool.acquire().await?;
        let name = db::owners::find_by_id(&mut conn, owner_id).await?.map(|o| o.display_name).unwrap_or_else(|| "an owner".into());
        // A decision typed into the console's simulator is recorded as made there, and its
        // outcome goes, as for one made on the Approvals page, to the deciding owner's first
        // number, never to the number that was typed.
        let (via, phone) = if inbound.channel == crate::channel::SIMULATOR {
            let phones = db::owners::phones_of(&mut conn, owner_id).await?;
            ("simulator", phones.first().map(|p| p.trim_start_matches('+').to_string()))
        } else {
            ("whatsapp", Some(inbound.sender.chars().filter(char::is_ascii_digit).collect()))
        };
        drop(conn);
        let by = Decider { name, owner_id: Some(owner_id), phone, via };
        Ok(match self.approvals.decide(id, verdict, &by, nonce, None).await {
            Ok(decided) => ("APPROVAL_DECIDED", self.approvals.decided_reply(&decided)),
            Err(ApprovalError::Db(e)) => return Err(e.into()),
            Err(e) => (e.code(), self.approvals.error_reply(&e)),
        })
    }

    pub(super) async fn owner_command(&self, command: &steps::Command, owner_id: i64, inbound: &Inbound, trace_id: i64) -> Result<(&'static str, String), RuntimeError> {
        use steps::Command;
        let conv = &self.settings.conversation;
        Ok(match command {
            Command::Help => ("COMMAND_HELP", conv.owner_help.trim().to_string()),
            Command::Approve(arg) | Command::Reject(arg) => {
                let mut words = arg.split_whitespace();
                let Some(id) = words.next().and_then(|w| w.trim_start_matches('#').parse::<i64>().ok()) else {
                    return Ok(("APPROVAL_USAGE", self.approvals.settings().usage_reply.clone()));
                };
                let rest: Vec<&str> = words.collect();
                let verdict = if matches!(command, Command::Approve(_)) { Verdict::Approve } else { Verdict::Reject { reason: (!rest.is_empty()).then(|| rest.join(" ")) } };
                return self.decide_approval(id, verdict, owner_id, inbound, None).await;
            }
            Command::Status => {
                let mut conn = self.db.pool.acquire().await?;
                let counts = db::jobs::counts_by_state(&mut conn).await?;
                let shown: Vec<String> = counts.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{} {n}", s.as_str())).collect();
                let degraded = llm::degraded(&self.settings, &self.secrets).map(|d| format!(" {}", d.owner_instruction)).unwrap_or_default();
                let jobs = if shown.is_empty() { conv.status_no_jobs.trim().to_string() } else { shown.join(", ") };
                let status = conv.status_reply.trim().replace("{version}", env!("CARGO_PKG_VERSION")).replace("{jobs}", &jobs);
                ("COMMAND_STATUS", format!("{status}{degraded}"))
            }
            Command::Jobs => {
                let mut conn = self.db.pool.acquire().await?;
                let page = db::jobs::list(&mut conn, &db::jobs::JobFilter::default(), 5).await?;
                let lines: Vec<String> = page.iter().map(|j| format!("#{} {} {}", j.id, j.kind, j.state.as_str())).collect();
                ("COMMAND_JOBS", if lines.is_empty() { conv.jobs_empty_reply.trim().to_string() } else { conv.jobs_reply.trim().replace("{jobs}", &lines.join("\n")) })
            }
            Command::Wrong(arg) => return self.mark_wrong(arg, owner_id, inbound, trace_id).await,
            Command::Unknown(name) => ("COMMAND_UNKNOWN", format!("{}\n{}", conv.unknown_command_reply.trim().replace("{name}", name), conv.owner_help.trim())),
        })
    }

    /// `/wrong EXPECTED [note]`: the answer the owner replies to (or else the chat's last answer
    /// that was not a command) is marked wrong through a durable `evals.mark` job, which stores
    /// the finding and its eval case.
    async fn mark_wrong(&self, arg: &str, owner_id: i64, inbound: &Inbound, trace_id: i64) -> Result<(&'static str, String), RuntimeError> {
        let mut words = arg.trim().splitn(2, char::is_whitespace);
        let expect = words.next().unwrap_or_default().trim().to_string();
        let note = words.next().unwrap_or_default().trim().to_string();
        let known = matches!(expect.as_str(), "normal_chat" | "guard" | "clarify") || expect.strip_prefix("tool:").is_some_and(|t| !t.trim().is_empty());
        let conv = &self.settings.conversation;
        if !known {
            return Ok(("WRONG_USAGE", conv.wrong_usage_reply.trim().to_string()));
        }
        let mut conn = self.db.pool.acquire().await?;
        let quoted = match &inbound.quoted_id {
            Some(id) => db::traces::trace_of_outbound(&mut conn, id).await?,
            None => None,
        };
        let target = match quoted {
            Some(t) => Some(t),
            None => db::traces::previous_in_chat(&mut conn, &inbound.channel, &inbound.chat_id, &inbound.message_id, trace_id).await?,
        };
        drop(conn);
        let Some(target) = target else { return Ok(("WRONG_NO_TRACE", conv.wrong_no_trace_reply.trim().to_string())) };
        let mut job = self.queue.job(&MarkTraceJob { trace_id: target, expect: expect.clone(), note: note.chars().take(500).collect(), owner_id });
        job.correlation_id.clone_from(&inbound.correlation_id);
        self.queue.enqueue(&job).await?;
        Ok(("TRACE_MARKED", conv.wrong_noted_reply.trim().replace("{trace}", &target.to_string()).replace("{expect}", &expect)))
    }

}

/// An owner's `/wrong`, handled by the self-improvement cycle (the repairs module).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MarkTraceJob {
    pub trace_id: i64,
    /// normal_chat, guard, clarify or tool:NAME[,NAME].
    pub expect: String,
    pub note: String,
    pub owner_id: i64,
}

impl crate::jobs::JobKind for MarkTraceJob {
    const KIND: &'static str = "evals.mark";
}
