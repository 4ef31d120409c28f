//! The owner audit trail: logins, failures, setup and account changes. Never holds a password.

use sqlx::AnyConnection;

use super::{DbError, now_ms};

/// Events recorded in `owner_audit.event`.
pub mod event {
    pub const SETUP_COMPLETED: &str = "setup_completed";
    pub const LOGIN_OK: &str = "login_ok";
    pub const LOGIN_FAILED: &str = "login_failed";
    pub const LOGOUT: &str = "logout";
    pub const PHONES_UPDATED: &str = "phones_updated";
    pub const OWNER_ADDED: &str = "owner_added";
    pub const PASSWORD_RESET: &str = "password_reset";
    pub const JOB_RETRY: &str = "job_retry";
    pub const JOB_CANCEL: &str = "job_cancel";
    pub const JOB_RUN_AGAIN: &str = "job_run_again";
    pub const TOOL_TRY: &str = "tool_try";
    pub const TOOLS_RELOAD: &str = "tools_reload";
    pub const MCP_TOOL_APPROVED: &str = "mcp_tool_approved";
    pub const MCP_TOOL_REJECTED: &str = "mcp_tool_rejected";
    pub const MCP_SERVER_ENABLED: &str = "mcp_server_enabled";
    pub const MCP_SERVER_DISABLED: &str = "mcp_server_disabled";
    pub const MCP_SERVER_REFRESHED: &str = "mcp_server_refreshed";
    pub const MCP_SERVER_LOGIN_STARTED: &str = "mcp_server_login_started";
    pub const MCP_SERVER_LOGGED_IN: &str = "mcp_server_logged_in";
    pub const MCP_ELICITATION_ANSWERED: &str = "mcp_elicitation_answered";
    pub const APPROVAL_APPROVED: &str = "approval_approved";
    pub const APPROVAL_REJECTED: &str = "approval_rejected";
    pub const TRACE_MARKED: &str = "trace_marked";
    pub const REPAIR_CYCLE: &str = "repair_cycle";
    pub const REPAIR_APPROVED: &str = "repair_approved";
    pub const REPAIR_REJECTED: &str = "repair_rejected";
    pub const REPAIR_ROLLED_BACK: &str = "repair_rolled_back";
}

#[derive(Debug, Clone, Default)]
pub struct AuditEntry<'a> {
    pub owner_id: Option<i64>,
    pub login: Option<&'a str>,
    pub ip: Option<&'a str>,
    pub event: &'a str,
    /// A JSON object with extra facts; never a secret.
    pub detail: Option<serde_json::Value>,
}

pub async fn record(conn: &mut AnyConnection, entry: AuditEntry<'_>) -> Result<(), DbError> {
    record_returning_id(conn, entry, None).await.map(|_| ())
}

/// Failed logins since `since_ms`: for this login name (from anywhere), from this address (for
/// any name), and for this name from this address, with the times the caller needs to say when
/// a limit frees up.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailureCounts {
    pub by_login: i64,
    pub by_ip: i64,
    pub by_pair: i64,
    pub oldest_ip_at: Option<i64>,
    pub newest_login_at: Option<i64>,
    pub newest_pair_at: Option<i64>,
}

pub async fn recent_failures(conn: &mut AnyConnection, login: &str, ip: &str, since_ms: i64) -> Result<FailureCounts, DbError> {
    let (by_login, newest_login_at, by_pair, newest_pair_at): (i64, Option<i64>, i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), MAX(at), COALESCE(SUM(CASE WHEN ip = $4 THEN 1 ELSE 0 END), 0), MAX(CASE WHEN ip = $4 THEN at END) \
         FROM owner_audit WHERE event = $1 AND login = $2 AND at > $3",
    )
    .bind(event::LOGIN_FAILED)
    .bind(login)
    .bind(since_ms)
    .bind(ip)
    .fetch_one(&mut *conn)
    .await?;
    let (by_ip, oldest_ip_at): (i64, Option<i64>) = sqlx::query_as("SELECT COUNT(*), MIN(at) FROM owner_audit WHERE event = $1 AND ip = $2 AND at > $3")
        .bind(event::LOGIN_FAILED)
        .bind(ip)
        .bind(since_ms)
        .fetch_one(&mut *conn)
        .await?;
    Ok(FailureCounts { by_login, by_ip, by_pair, oldest_ip_at, newest_login_at, newest_pair_at })
}

/// Like [`record`], returning the new row's id. `device` is the digest of the trusted device a
/// login attempt came from (`owner_devices`).
pub async fn record_returning_id(conn: &mut AnyConnection, entry: AuditEntry<'_>, device: Option<&str>) -> Result<i64, DbError> {
    let detail = entry.detail.unwrap_or_else(|| serde_json::json!({})).to_string();
    let id = sqlx::query_scalar("INSERT INTO owner_audit (at, owner_id, login, ip, event, detail, device) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id")
        .bind(now_ms())
        .bind(entry.owner_id)
        .bind(entry.login)
        .bind(entry.ip)
        .bind(entry.event)
        .bind(detail)
        .bind(device)
        .fetch_one(&mut *conn)
        .await?;
    Ok(id)
}

/// Turns a provisional failure row into a success for `owner_id`.
pub async fn mark_success(conn: &mut AnyConnection, id: i64, owner_id: i64, event: &str) -> Result<(), DbError> {
    sqlx::query("UPDATE owner_audit SET event = $1, owner_id = $2 WHERE id = $3").bind(event).bind(owner_id).bind(id).execute(&mut *conn).await?;
    Ok(())
}
