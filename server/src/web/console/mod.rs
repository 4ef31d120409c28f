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

/// Logs a failure the owner cannot act on and answers with the generic internal error, or,
/// when the database could not be reached, with `DATABASE_UNAVAILABLE` (503): a state that
/// passes, not a fault of the request or the server.
fn internal<E: std::fmt::Display + 'static>(e: E) -> AppError {
    if crate::db::is_unavailable_error(&e) {
        tracing::error!(error = %e, code = app::error::code::DATABASE_UNAVAILABLE, "console backend: the database is not reachable");
        return AppError::database_unavailable();
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::DbError;

    /// A database that cannot be reached is answered as such (503), a failed statement as a fault.
    #[test]
    fn an_unreachable_database_is_told_apart_from_a_fault() {
        let unavailable = app::error::code::DATABASE_UNAVAILABLE;
        assert_eq!(internal(DbError::Sql(sqlx::Error::PoolTimedOut)).code, unavailable);
        assert_eq!(internal(sqlx::Error::PoolClosed).code, unavailable);
        assert_eq!(internal(DbError::Sql(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)))).code, unavailable);
        assert_eq!(AppError::database_unavailable().status(), 503);
        assert_eq!(internal(DbError::Sql(sqlx::Error::RowNotFound)).code, app::error::code::INTERNAL);
        assert_eq!(internal("a message").code, app::error::code::INTERNAL);
    }
}
