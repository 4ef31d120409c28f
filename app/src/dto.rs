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
