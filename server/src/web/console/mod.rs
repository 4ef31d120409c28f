//! The console's backend: each role of [`app::backend`] implemented over the engine, one file
//! each. The web layer only exposes: decisions (job actions, phone numbers, policy, diffs) live
//! in their domain modules.

mod approvals;
mod charts;
mod chats;
mod jobs;
mod mcp;
mod owners;
mod repairs;
mod tools;
mod traces;

pub use mcp::oauth_routes;

use app::{dto::ToolCallView, error::AppError};

pub use owners::effective_entries;

use super::state::AppState;

#[derive(Debug, Clone)]
pub struct ConsoleBackend {
    state: AppState,
}

impl ConsoleBackend {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

/// Logs a failure the owner cannot act on and answers with the generic internal error.
fn internal(e: impl std::fmt::Display) -> AppError {
    tracing::error!(error = %e, "console backend failure");
    AppError::internal()
}

/// The snake_case name serde gives an enum value.
fn label<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

/// A tool call as the Tools and Traces pages list it.
fn call_view(r: &crate::db::tool_audit::AuditRow) -> ToolCallView {
    ToolCallView {
        at: r.at,
        tool: r.tool.clone(),
        version: r.version.clone(),
        actor: r.actor.clone(),
        chat_type: r.chat_type.clone(),
        chat_id: r.chat_id.clone(),
        decision: r.decision.clone(),
        reason_code: r.reason_code.clone(),
        latency_us: r.latency_us,
        attempts: r.attempts,
        correlation_id: r.correlation_id.clone(),
    }
}
