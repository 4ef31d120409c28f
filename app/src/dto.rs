//! What the console shows, as plain serde types (no database types).

use serde::{Deserialize, Serialize};

/// The signed-in owner, as the layout needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellInfo {
    pub owner_id: i64,
    pub display_name: String,
    pub login: String,
    /// Set when no LLM provider key is configured: the variable to set.
    pub degraded: Option<DegradedNotice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegradedNotice {
    pub provider: String,
    pub variable: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationInfo {
    pub version: i64,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DashboardInfo {
    pub version: String,
    pub started_at_ms: i64,
    pub uptime_secs: u64,
    pub database_backend: String,
    pub config_path: String,
    pub listen_addr: String,
    pub public_url: String,
    pub migrations_applied: Vec<MigrationInfo>,
    pub migrations_known: usize,
    pub llm_provider: String,
    pub llm_key_variable: String,
    pub llm_configured: bool,
    pub owner_count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingEntry {
    pub key: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretEntry {
    pub variable: String,
    pub set: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsInfo {
    pub config_path: String,
    pub entries: Vec<SettingEntry>,
    pub secrets: Vec<SecretEntry>,
    pub my_phones: Vec<String>,
}

/// A new owner as the setup form or the CLI supplies it, before validation.
#[derive(Clone)]
pub struct NewOwner {
    pub display_name: String,
    pub login: String,
    pub password: String,
    pub phones: String,
}

impl std::fmt::Debug for NewOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewOwner").field("login", &self.login).field("password", &"[REDACTED]").finish_non_exhaustive()
    }
}

/// Filters of the Jobs page, as they appear in its URL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobQuery {
    pub state: String,
    pub tool: String,
    pub chat: String,
    /// Only jobs created in the last this many minutes; 0 for any time.
    pub since_minutes: i64,
    /// Paging: only jobs older than this id.
    pub before: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateCount {
    pub state: String,
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: i64,
    pub kind: String,
    pub state: String,
    pub tool_name: Option<String>,
    pub chat_id: Option<String>,
    pub attempt: i64,
    pub max_attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_error_code: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobsPage {
    pub counts: Vec<StateCount>,
    pub jobs: Vec<JobSummary>,
    /// Set when older jobs exist: the `before` value of the next page.
    pub next_before: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEventView {
    pub at: i64,
    pub state: String,
    pub attempt: i64,
    pub error_code: Option<String>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    pub summary: JobSummary,
    pub queue: String,
    pub priority: i64,
    pub dedupe_key: Option<String>,
    pub sender_id: Option<String>,
    pub message_id: Option<String>,
    pub correlation_id: String,
    /// Pretty JSON with secret-looking fields replaced by "[REDACTED]".
    pub args: String,
    pub scheduled_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub last_error_message: Option<String>,
    pub result_preview: Option<String>,
    pub events: Vec<JobEventView>,
    pub can_retry: bool,
    pub can_cancel: bool,
}
