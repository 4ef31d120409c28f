//! MCP servers and the quarantine of their tools.

use app::{
    backend::McpBackend,
    dto::{McpPage, McpServerView, McpToolView},
    error::{AppError, code},
};

use super::{ConsoleBackend, internal, label};
use crate::tools::mcp::{AuditActor, McpError, Reviewed};

#[async_trait::async_trait]
impl McpBackend for ConsoleBackend {
    async fn mcp_page(&self) -> Result<McpPage, AppError> {
        let mcp = &self.state.mcp;
        let mut servers = Vec::new();
        for s in mcp.servers().await.map_err(mcp_error)? {
            let tools = mcp
                .tools(&s.id)
                .await
                .map_err(mcp_error)?
                .into_iter()
                .map(|t| {
                    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
                    let definition = pretty(&t.definition);
                    let diff = t.diff();
                    McpToolView { catalog_name: t.catalog_name, name: t.name, state: t.state, usable: t.usable, present: t.present, definition_hash: t.definition_hash, definition, diff }
                })
                .collect();
            servers.push(McpServerView {
                id: s.id,
                transport: s.transport.to_string(),
                target: s.target,
                trust: label(&s.trust),
                enabled: s.enabled,
                health: s.health,
                last_error: s.last_error,
                last_seen_at: s.last_seen_at,
                tool_count: s.tool_count,
                pending: s.pending,
                tools,
            });
        }
        Ok(McpPage { config_path: self.state.config.dir.join("mcp.toml").display().to_string(), servers })
    }

    async fn mcp_set_enabled(&self, owner_id: i64, server: &str, enabled: bool, ip: &str) -> Result<(), AppError> {
        self.state.mcp.set_enabled(server, enabled, &self.mcp_actor(owner_id, ip)).await.map_err(mcp_error)
    }

    async fn mcp_refresh(&self, owner_id: i64, server: &str, ip: &str) -> Result<String, AppError> {
        let r = self.state.mcp.refresh(server, Some(&self.mcp_actor(owner_id, ip))).await.map_err(mcp_error)?;
        let mut text = format!("{server}: {} tool(s) listed, {} taken, in {} ms.", r.listed, r.taken, r.elapsed_ms);
        if r.truncated {
            text.push_str(" The list was longer than the configured bound; the rest was ignored.");
        }
        if !r.skipped.is_empty() {
            text.push_str(&format!(" {} skipped (see the log).", r.skipped.len()));
        }
        Ok(text)
    }

    async fn mcp_decide(&self, owner_id: i64, tool: &str, approve: bool, reviewed_hash: &str, ip: &str) -> Result<(), AppError> {
        let by = self.mcp_actor(owner_id, ip);
        let reviewed = Reviewed::Definition(reviewed_hash);
        let done = if approve { self.state.mcp.approve(tool, reviewed, &by).await } else { self.state.mcp.reject(tool, reviewed, &by).await };
        done.map(|_| ()).map_err(mcp_error)
    }

}

impl ConsoleBackend {
    fn mcp_actor(&self, owner_id: i64, ip: &str) -> AuditActor {
        AuditActor { owner_id: Some(owner_id), login: None, ip: Some(ip.to_string()) }
    }
}

fn mcp_error(e: McpError) -> AppError {
    match e {
        McpError::UnknownServer(_) | McpError::UnknownTool(_) => AppError::new(code::NOT_FOUND, e.to_string()),
        McpError::Unavailable(_) | McpError::DefinitionChanged(_) => AppError::new(code::CONFLICT, e.to_string()),
        McpError::Db(_) => internal(e),
    }
}
