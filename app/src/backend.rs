//! What the console needs from the engine, split by role as the pages use it (owners and their
//! sessions, jobs, tools, chats, traces, MCP servers, approvals, repairs). The server implements each and injects
//! one [`SharedBackend`] as context, so the UI never depends on the engine's crates; a test can
//! implement only what its page needs.

use std::sync::Arc;

use crate::{
    dto::{ApprovalsPage, ChatDetail, ConversationsPage, DashboardInfo, JobDetail, JobQuery, JobsPage, McpPage, NewOwner, ReloadOutcome, RepairsPage, SettingsInfo, ShellInfo, SimulateOutcome, SimulateRequest, ToolDetail, ToolsPage, ToolsQuery, TraceDetail, TraceMark, TraceQuery, TracesPage, TryOutcome, WaitingInfo},
    error::AppError,
};

/// The owner a valid session belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerIdentity {
    pub id: i64,
    pub epoch: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LoginOutcome {
    /// Signed in; `device_cookie` is the `Set-Cookie` value that keeps this browser a trusted
    /// device of the owner (see [`crate::auth::DEVICE_COOKIE`]).
    Ok { who: OwnerIdentity, device_cookie: String },
    /// Unknown login or wrong password; the caller cannot tell which.
    Rejected,
    Throttled { retry_after_secs: u64 },
}

/// Where a first-run setup request came from, for [`OwnersBackend::create_first_owner`].
#[derive(Debug, Clone, Default)]
pub struct SetupAccess {
    /// From this machine itself ([`crate::auth::LocalPeer`]).
    pub local: bool,
    /// The setup token the request carried (`/setup?token=...`); empty when none.
    pub token: String,
}

/// First-run setup, login, sessions, the owner's own settings and the dashboard.
#[async_trait::async_trait]
pub trait OwnersBackend: Send + Sync {
    /// Whether `/setup` is still open (no owner was ever created).
    async fn setup_open(&self) -> Result<bool, AppError>;
    /// Creates the first owner; fails with `SETUP_CLOSED` when one already exists, also when two
    /// requests race, and with `SETUP_NOT_LOCAL` when `access` is neither from this machine nor
    /// holds the setup token.
    async fn create_first_owner(&self, owner: NewOwner, ip: &str, access: SetupAccess) -> Result<OwnerIdentity, AppError>;
    /// `device` is the browser's [`crate::auth::DEVICE_COOKIE`], when it sent one.
    async fn login(&self, login: &str, password: &str, ip: &str, device: Option<&str>) -> Result<LoginOutcome, AppError>;
    async fn record_logout(&self, owner_id: i64, ip: &str) -> Result<(), AppError>;
    /// `None` when the owner is gone or the session epoch is stale (password was reset).
    async fn shell_info(&self, who: &OwnerIdentity) -> Result<Option<ShellInfo>, AppError>;
    async fn dashboard(&self) -> Result<DashboardInfo, AppError>;
    /// What waits for an owner now (the navigation's counts; the dashboard's first lines).
    async fn waiting(&self) -> Result<WaitingInfo, AppError>;
    async fn settings(&self, owner_id: i64) -> Result<SettingsInfo, AppError>;
    async fn update_phones(&self, owner_id: i64, phones: &str, ip: &str) -> Result<Vec<String>, AppError>;
    /// Keeps what a plain form post to the server function at `path` answered (JSON), for the
    /// session's next page.
    async fn keep_form_answer(&self, session_id: &str, path: &str, answer: &str) -> Result<(), AppError>;
    /// Takes that answer, once.
    async fn take_form_answer(&self, session_id: &str, path: &str) -> Result<Option<String>, AppError>;
    /// Sessions older than this since login are void, however active.
    fn session_absolute_timeout_ms(&self) -> i64;
}

/// The durable job queue.
#[async_trait::async_trait]
pub trait JobsBackend: Send + Sync {
    async fn jobs_page(&self, query: &JobQuery) -> Result<JobsPage, AppError>;
    async fn job_detail(&self, id: i64) -> Result<JobDetail, AppError>;
    /// Owner actions, audited with the owner and address.
    async fn retry_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError>;
    async fn cancel_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError>;
    /// Runs a failed tool call again as a new job, whose id it returns.
    async fn run_job_again(&self, owner_id: i64, id: i64, ip: &str) -> Result<i64, AppError>;
}

/// The tool catalog and the checkpoint.
#[async_trait::async_trait]
pub trait ToolsBackend: Send + Sync {
    async fn tools_page(&self, query: &ToolsQuery) -> Result<ToolsPage, AppError>;
    async fn tool_detail(&self, name: &str) -> Result<ToolDetail, AppError>;
    /// Runs one call through the checkpoint as this owner; audited like any other call, plus
    /// an owner audit row.
    async fn try_tool(&self, owner_id: i64, name: &str, args_json: &str, chat_type: &str, ip: &str) -> Result<TryOutcome, AppError>;
    /// Re-reads the tool catalog (tools.toml, connectors.toml); a file with problems is refused
    /// with every problem listed, and the current catalog stays.
    async fn reload_tools(&self, owner_id: i64, ip: &str) -> Result<ReloadOutcome, AppError>;
}

/// Conversations on every channel, and the simulator.
#[async_trait::async_trait]
pub trait ChatsBackend: Send + Sync {
    async fn conversations_page(&self, owner_id: i64) -> Result<ConversationsPage, AppError>;
    async fn chat_detail(&self, channel: &str, chat_id: &str) -> Result<ChatDetail, AppError>;
    /// Runs one simulated message through the conversation runtime; only the transport differs
    /// from WhatsApp.
    async fn simulate(&self, owner_id: i64, request: SimulateRequest) -> Result<SimulateOutcome, AppError>;
}

/// What happened to each message.
#[async_trait::async_trait]
pub trait TracesBackend: Send + Sync {
    async fn traces_page(&self, query: &TraceQuery) -> Result<TracesPage, AppError>;
    async fn trace_detail(&self, id: i64) -> Result<TraceDetail, AppError>;
}

/// MCP servers and the quarantine of their tools.
#[async_trait::async_trait]
pub trait McpBackend: Send + Sync {
    async fn mcp_page(&self) -> Result<McpPage, AppError>;
    /// Owner actions on MCP servers and their tools, each audited with the owner and address.
    async fn mcp_set_enabled(&self, owner_id: i64, server: &str, enabled: bool, ip: &str) -> Result<(), AppError>;
    async fn mcp_refresh(&self, owner_id: i64, server: &str, ip: &str) -> Result<String, AppError>;
    /// `reviewed_hash` is the definition hash the owner saw; a changed definition is refused.
    async fn mcp_decide(&self, owner_id: i64, tool: &str, approve: bool, reviewed_hash: &str, ip: &str) -> Result<(), AppError>;
    /// An owner's answer to a server's form ("accept" with the form's values as text, "decline",
    /// "cancel"); audited. Returns what the server will be told.
    async fn mcp_answer_form(&self, owner_id: i64, id: i64, decision: &str, values: Vec<(String, String)>, ip: &str) -> Result<String, AppError>;
}

/// Tool calls waiting for an owner.
#[async_trait::async_trait]
pub trait ApprovalsBackend: Send + Sync {
    async fn approvals_page(&self) -> Result<ApprovalsPage, AppError>;
    /// Decides once: an approval enqueues the call's one run; a rejection tells the person who
    /// asked. Fails with APPROVAL_ALREADY_DECIDED (naming who decided), APPROVAL_EXPIRED or
    /// APPROVAL_NOT_FOUND. Audited with the owner and address. Returns what happened, in words.
    async fn decide_approval(&self, owner_id: i64, id: i64, approve: bool, reason: &str, ip: &str) -> Result<String, AppError>;
}

/// Self-improvement: findings, eval cases and repair proposals. Nothing is applied without an
/// owner's decision here (or with the CLI).
#[async_trait::async_trait]
pub trait RepairsBackend: Send + Sync {
    async fn repairs_page(&self) -> Result<RepairsPage, AppError>;
    /// Scans new traces, makes cases and proposes repairs now; says what it did, in words.
    async fn run_cycle(&self, owner_id: i64, ip: &str) -> Result<String, AppError>;
    /// `approve` (with `confirm` for one that breaks a passing case, and `seen`, the
    /// [`crate::dto::RepairView::seen`] of the diff the owner was shown), `reject` (with a
    /// reason) or `rollback`. Audited with the owner and address. Returns what happened, in words.
    #[expect(clippy::too_many_arguments, reason = "one form's fields, as the server function takes them")]
    async fn decide_repair(
        &self,
        owner_id: i64,
        id: i64,
        action: &str,
        confirm: bool,
        seen: Option<&str>,
        reason: &str,
        ip: &str,
    ) -> Result<String, AppError>;
    /// Marks a trace wrong with what should have happened: a finding and its eval case.
    async fn mark_trace(
        &self,
        owner_id: i64,
        mark: TraceMark,
        ip: &str,
    ) -> Result<String, AppError>;
}

/// Everything the console uses: one value implementing every role.
pub trait AdminBackend: OwnersBackend + JobsBackend + ToolsBackend + ChatsBackend + TracesBackend + McpBackend + ApprovalsBackend + RepairsBackend {}

impl<T: OwnersBackend + JobsBackend + ToolsBackend + ChatsBackend + TracesBackend + McpBackend + ApprovalsBackend + RepairsBackend> AdminBackend for T {}

pub type SharedBackend = Arc<dyn AdminBackend>;
