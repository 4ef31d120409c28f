//! Owner commands (`/help`, `/status`, `/jobs`, ...) and the owners' notice for a customer's
//! private-data question.

use super::{Inbound, Runtime, RuntimeError, steps};
use crate::{db, llm};

impl Runtime {
    /// The owners' notice for a customer's private-data question (`private_data.owner_notice`).
    pub(super) fn private_data_notice(&self, inbound: &Inbound, category: &str) -> db::owner_notifications::Notification {
        let settings = &self.settings.private_data;
        let description = settings.categories.iter().find(|c| c.name == category).map_or("", |c| c.description.as_str());
        let text: String = inbound.text.chars().take(300).collect();
        let message = settings
            .owner_notice
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

    pub(super) async fn owner_command(&self, command: &steps::Command) -> Result<(&'static str, String), RuntimeError> {
        use steps::Command;
        let conv = &self.settings.conversation;
        Ok(match command {
            Command::Help => ("COMMAND_HELP", conv.owner_help.trim().to_string()),
            Command::Approve(_) | Command::Reject(_) => ("APPROVALS_NOT_AVAILABLE", conv.approvals_unavailable_reply.clone()),
            Command::Status => {
                let mut conn = self.db.pool.acquire().await?;
                let counts = db::jobs::counts_by_state(&mut conn).await?;
                let shown: Vec<String> = counts.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{} {n}", s.as_str())).collect();
                let degraded = llm::degraded(&self.settings, &self.secrets).map(|d| format!(" {}", d.owner_instruction)).unwrap_or_default();
                let jobs = if shown.is_empty() { "no jobs".to_string() } else { shown.join(", ") };
                ("COMMAND_STATUS", format!("Gatehouse {} is running. Jobs: {jobs}.{degraded}", env!("CARGO_PKG_VERSION")))
            }
            Command::Jobs => {
                let mut conn = self.db.pool.acquire().await?;
                let page = db::jobs::list(&mut conn, &db::jobs::JobFilter::default(), 5).await?;
                let lines: Vec<String> = page.iter().map(|j| format!("#{} {} {}", j.id, j.kind, j.state.as_str())).collect();
                ("COMMAND_JOBS", if lines.is_empty() { "No jobs yet.".to_string() } else { format!("Latest jobs:\n{}", lines.join("\n")) })
            }
            Command::Unknown(name) => ("COMMAND_UNKNOWN", format!("There is no /{name} command.\n{}", conv.owner_help.trim())),
        })
    }

}
