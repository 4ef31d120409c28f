//! What the console and the CLI see and do: servers and cached tools with their quarantine
//! state, an owner's decision on a tool, enabling a server, a refresh. Each owner action is
//! written to the owner audit.

use serde_json::{Value, json};

use super::{DiscoveryReport, McpError, McpManager, Trust};
use crate::db::{
    self, audit,
    mcp::{ToolRow, health},
};

/// What the owner looked at when deciding on a tool.
#[derive(Debug, Clone, Copy)]
pub enum Reviewed<'a> {
    /// The definition with this hash (the console sends the one it showed).
    Definition(&'a str),
    /// Whatever is current: the CLI, which prints the hash it decided on.
    Current,
}

/// Who did an owner action, for the owner audit.
#[derive(Debug, Clone, Default)]
pub struct AuditActor {
    pub owner_id: Option<i64>,
    pub login: Option<String>,
    pub ip: Option<String>,
}

/// A server for the console and `gatehouse mcp list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStatus {
    pub id: String,
    pub transport: &'static str,
    /// The command or URL, without credentials.
    pub target: String,
    pub trust: Trust,
    pub enabled: bool,
    pub health: String,
    pub last_error: Option<String>,
    pub last_seen_at: Option<i64>,
    pub tool_count: i64,
    pub pending: usize,
    pub last_discovery: Option<DiscoveryReport>,
    /// "oauth" for a server behind OAuth, else "none".
    pub auth: &'static str,
    /// Why an OAuth server needs an owner to log in; its tools are withheld meanwhile.
    pub needs_login: Option<String>,
}

/// A cached tool with its quarantine state, for the console and `gatehouse mcp tools`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolStatus {
    pub catalog_name: String,
    pub name: String,
    pub state: String,
    /// Offered to the planner and callable now.
    pub usable: bool,
    pub present: bool,
    pub definition: Value,
    pub definition_hash: String,
    /// The definition before the last change, for the diff.
    pub previous_definition: Option<Value>,
}

impl ToolStatus {
    /// What changed since the previous definition, line by line ("  " same, "- " removed,
    /// "+ " added), for the owner deciding on a changed tool. Empty when nothing was there
    /// before. The diff is bounded in time, so a hostile definition cannot hold a thread.
    pub fn diff(&self) -> Vec<String> {
        let Some(old) = &self.previous_definition else { return Vec::new() };
        let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
        let (old, new) = (pretty(old), pretty(&self.definition));
        let diff = similar::TextDiff::configure().timeout(std::time::Duration::from_millis(200)).diff_lines(&old, &new);
        diff.iter_all_changes()
            .map(|c| {
                let sign = match c.tag() {
                    similar::ChangeTag::Equal => "  ",
                    similar::ChangeTag::Delete => "- ",
                    similar::ChangeTag::Insert => "+ ",
                };
                format!("{sign}{}", c.value().trim_end_matches('\n'))
            })
            .collect()
    }

    fn from_row(row: ToolRow) -> Self {
        let parse = |t: &str| serde_json::from_str(t).unwrap_or(Value::Null);
        Self {
            usable: row.usable(),
            definition: parse(&row.definition),
            previous_definition: row.previous_definition.as_deref().map(parse),
            catalog_name: row.catalog_name,
            name: row.name,
            state: row.state.to_string(),
            present: row.present,
            definition_hash: row.definition_hash,
        }
    }
}

/// The health a process without a session of its own shows for a server: as recorded, but
/// `unknown` for one recorded connected or degraded that no process has seen within `lately`
/// (each connected process pings it, and every answer is recorded).
fn shown_health(row: &db::mcp::ServerRow, lately: std::time::Duration, now: i64) -> String {
    let live = row.health == health::CONNECTED || row.health == health::DEGRADED;
    let seen_lately = row.last_seen_at.is_some_and(|at| now.saturating_sub(at) <= db::duration_ms(lately));
    if live && !seen_lately { health::UNKNOWN.to_string() } else { row.health.clone() }
}

impl McpManager {
    /// Every configured server with its health and tool counts.
    pub async fn servers(&self) -> Result<Vec<ServerStatus>, McpError> {
        // While this process supervises the servers, its live state is the truth; otherwise
        // (the CLI beside a running server) the health the server process recorded.
        let supervised = self.inner.tasks.lock().is_ok_and(|t| !t.is_empty());
        let mut conn = self.inner.db.pool.acquire().await?;
        let rows = db::mcp::servers(&mut conn).await?;
        let tools = db::mcp::tools(&mut conn, None).await?;
        Ok(self
            .inner
            .servers
            .values()
            .map(|s| {
                let row = rows.iter().find(|r| r.id == s.config.id);
                let live = s.live.borrow().clone();
                ServerStatus {
                    id: s.config.id.clone(),
                    transport: s.config.transport.kind(),
                    target: s.config.transport.target(),
                    trust: s.config.trust,
                    enabled: *s.enabled.borrow(),
                    health: match row {
                        Some(r) if !supervised => shown_health(r, s.config.seen_lately(), db::now_ms()),
                        _ => live.health.to_string(),
                    },
                    last_error: if supervised { live.last_error.clone() } else { row.and_then(|r| r.last_error.clone()) },
                    last_seen_at: row.and_then(|r| r.last_seen_at),
                    tool_count: row.map_or(0, |r| r.tool_count),
                    pending: tools.iter().filter(|t| t.server_id == s.config.id && t.present && !t.usable() && t.state != db::mcp::ToolState::Rejected).count(),
                    last_discovery: live.last_discovery,
                    auth: if s.config.auth == super::AuthMode::Oauth { "oauth" } else { "none" },
                    needs_login: live.needs_login,
                }
            })
            .collect())
    }

    /// A server's cached tools with their quarantine state.
    pub async fn tools(&self, server: &str) -> Result<Vec<ToolStatus>, McpError> {
        self.server(server)?;
        let mut conn = self.inner.db.pool.acquire().await?;
        Ok(db::mcp::tools(&mut conn, Some(server)).await?.into_iter().map(ToolStatus::from_row).collect())
    }

    /// Approves a tool's current definition (by catalog name); audited. It is offered at once.
    pub async fn approve(&self, tool: &str, reviewed: Reviewed<'_>, by: &AuditActor) -> Result<ToolStatus, McpError> {
        self.decide(tool, true, reviewed, by).await
    }

    /// Rejects a tool; audited. It is not offered and calls fail with `TOOL_REJECTED`.
    pub async fn reject(&self, tool: &str, reviewed: Reviewed<'_>, by: &AuditActor) -> Result<ToolStatus, McpError> {
        self.decide(tool, false, reviewed, by).await
    }

    async fn decide(&self, tool: &str, approve: bool, reviewed: Reviewed<'_>, by: &AuditActor) -> Result<ToolStatus, McpError> {
        let mut tx = self.inner.db.begin_write().await?;
        let hash = match reviewed {
            Reviewed::Definition(hash) => Some(hash),
            Reviewed::Current => None,
        };
        let row = match db::mcp::decide(&mut tx, tool, approve, by.owner_id, hash).await? {
            db::mcp::Decided::Done(row) => row,
            db::mcp::Decided::Changed(_) => return Err(McpError::DefinitionChanged(tool.to_string())),
            db::mcp::Decided::Missing => return Err(McpError::UnknownTool(tool.to_string())),
        };
        let detail = json!({ "server": row.server_id, "tool": row.name, "catalog_name": row.catalog_name, "definition_hash": row.definition_hash });
        let event = if approve { audit::event::MCP_TOOL_APPROVED } else { audit::event::MCP_TOOL_REJECTED };
        audit::record(&mut tx, audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event, detail: Some(detail) }).await?;
        tx.commit().await?;
        self.rebuild().await?;
        Ok(ToolStatus::from_row(row))
    }

    /// Enables or disables a server (overriding config/mcp.toml); audited. Disabling closes its
    /// session and withdraws its tools.
    pub async fn set_enabled(&self, server: &str, enabled: bool, by: &AuditActor) -> Result<(), McpError> {
        let s = self.server(server)?.clone();
        let mut tx = self.inner.db.begin_write().await?;
        db::mcp::ensure_server(&mut tx, server).await?;
        db::mcp::set_enabled_override(&mut tx, server, Some(enabled)).await?;
        let event = if enabled { audit::event::MCP_SERVER_ENABLED } else { audit::event::MCP_SERVER_DISABLED };
        audit::record(&mut tx, audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event, detail: Some(json!({ "server": server })) }).await?;
        tx.commit().await?;
        s.follow_switch(Some(enabled));
        self.rebuild().await
    }

    /// Discovers a connected server's tools again now and waits for the result; audited when an
    /// owner asks.
    pub async fn refresh(&self, server: &str, by: Option<&AuditActor>) -> Result<DiscoveryReport, McpError> {
        let s = self.server(server)?.clone();
        if let Some(by) = by {
            let mut conn = self.inner.db.pool.acquire().await?;
            let entry = audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event: audit::event::MCP_SERVER_REFRESHED, detail: Some(json!({ "server": server })) };
            audit::record(&mut conn, entry).await?;
        }
        s.list_again().await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::ToolStatus;

    #[test]
    fn a_changed_definition_reads_as_a_line_diff() {
        let status = ToolStatus {
            catalog_name: "fx__echo".into(),
            name: "echo".into(),
            state: "pending".into(),
            usable: false,
            present: true,
            definition: json!({ "description": "Echo the text back, and email it to the admin", "name": "echo" }),
            definition_hash: "sha256:new".into(),
            previous_definition: Some(json!({ "description": "Echo the text back", "name": "echo" })),
        };
        insta::assert_snapshot!(status.diff().join("\n"), @r#"
          {
        -   "description": "Echo the text back",
        +   "description": "Echo the text back, and email it to the admin",
            "name": "echo"
          }
        "#);
        assert!(ToolStatus { previous_definition: None, ..status }.diff().is_empty(), "a new tool has nothing to compare");
    }
}
