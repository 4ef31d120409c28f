//! Publishing the catalog: the file catalog combined with the usable MCP tools (withheld ones
//! named with why), handed to the checkpoint; and the routes the executor calls them by.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde_json::Value;

use super::{Inner, McpCode, McpError, McpManager, normalize};
use crate::{
    db,
    tools::{Catalog, Checkpoint, ToolDef, catalog::Withheld, checkpoint::ToolCode},
};

/// Where a catalog tool is served.
#[derive(Debug, Clone)]
pub(super) struct Route {
    pub(super) server: String,
    pub(super) tool: String,
}

impl Inner {
    /// A new session starts with a clean slate: the checkpoint's breakers of the server's tools
    /// (opened by failures of the session that ended) are closed.
    pub(crate) fn reset_tool_breakers(&self, server: &str) {
        let Some(checkpoint) = self.checkpoint.read().ok().and_then(|w| w.upgrade()) else { return };
        let tools: Vec<String> = self.routes.read().map(|r| r.iter().filter(|(_, route)| route.server == server).map(|(name, _)| name.clone()).collect()).unwrap_or_default();
        for tool in tools {
            checkpoint.breakers().record_success(&tool);
        }
    }
}

impl McpManager {
    /// Registers the executor on `checkpoint`, wraps it, and keeps a handle to publish catalogs
    /// that combine `base` (the file catalog) with the usable MCP tools.
    pub fn install(&self, mut checkpoint: Checkpoint, base: Arc<Catalog>) -> Arc<Checkpoint> {
        checkpoint.register_provider(crate::tools::catalog::Provider::Mcp, self.executor());
        let checkpoint = Arc::new(checkpoint);
        if let Ok(mut w) = self.inner.checkpoint.write() {
            *w = Arc::downgrade(&checkpoint);
        }
        if let Ok(mut b) = self.inner.base.write() {
            *b = base;
        }
        checkpoint
    }

    /// A new file catalog (after SIGHUP): combined with the MCP tools and published. When that
    /// fails the current file catalog stays, for this and every later rebuild: a reload
    /// reported as refused is not published by the next MCP discovery.
    pub async fn set_base_catalog(&self, base: Arc<Catalog>) -> Result<(), McpError> {
        self.publish(Some(base)).await
    }

    /// Rebuilds the combined catalog from the database and publishes it to the checkpoint.
    pub(crate) async fn rebuild(&self) -> Result<(), McpError> {
        self.publish(None).await
    }

    /// Combines `base` (or the current file catalog) with the usable MCP tools and publishes
    /// the result; `base` becomes the current file catalog only once that is done.
    async fn publish(&self, base: Option<Arc<Catalog>>) -> Result<(), McpError> {
        let _one_at_a_time = self.inner.rebuilding.lock().await;
        let rows = {
            let mut conn = self.inner.db.pool.acquire().await?;
            db::mcp::tools(&mut conn, None).await?
        };
        let mut extra = Vec::new();
        let mut withheld = BTreeMap::new();
        let mut routes = HashMap::new();
        for row in rows {
            let Some(server) = self.inner.servers.get(&row.server_id) else { continue };
            if !row.present {
                continue;
            }
            let needs_login = server.live.borrow().needs_login.is_some();
            let held = if !*server.enabled.borrow() {
                Some(Withheld { code: ToolCode::Disabled.as_str(), reason: format!("the MCP server {} is disabled", server.config.id) })
            } else if needs_login {
                Some(Withheld {
                    code: McpCode::NeedsLogin.as_str(),
                    reason: format!("the MCP server {} needs an owner to log in (console, or `gatehouse mcp login {}`)", server.config.id, server.config.id),
                })
            } else if row.state == db::mcp::ToolState::Rejected {
                Some(Withheld { code: ToolCode::Rejected.as_str(), reason: format!("{} was rejected by an owner", row.catalog_name) })
            } else if !row.usable() {
                Some(Withheld { code: ToolCode::Quarantined.as_str(), reason: format!("{} is new or changed and waits for an owner's approval", row.catalog_name) })
            } else {
                None
            };
            if let Some(held) = held {
                withheld.insert(row.catalog_name.clone(), held);
                continue;
            }
            let def: Value = serde_json::from_str(&row.definition).unwrap_or(Value::Null);
            match normalize::to_spec(&server.config, &row.catalog_name, &def).and_then(ToolDef::from_spec) {
                Ok(tool) => {
                    routes.insert(row.catalog_name.clone(), Route { server: row.server_id.clone(), tool: row.name.clone() });
                    extra.push(Arc::new(tool));
                }
                Err(e) => {
                    tracing::warn!(mcp.server = %row.server_id, tool = %row.catalog_name, error = %e, "MCP tool left out of the catalog");
                    withheld.insert(row.catalog_name.clone(), Withheld { code: ToolCode::Disabled.as_str(), reason: format!("{} has a definition Gatehouse cannot use: {e}", row.catalog_name) });
                }
            }
        }
        let new_base = base.is_some();
        let base = base.unwrap_or_else(|| self.inner.base.read().map(|b| b.clone()).unwrap_or_default());
        let (catalog, clashes) = base.with_extra(extra, withheld);
        for name in clashes {
            routes.remove(&name);
            tracing::warn!(tool = %name, "an MCP tool has the name of a catalog tool; the catalog tool is kept");
        }
        if new_base && let Ok(mut b) = self.inner.base.write() {
            *b = base;
        }
        if let Ok(mut r) = self.inner.routes.write() {
            *r = routes;
        }
        if let Some(checkpoint) = self.inner.checkpoint.read().ok().and_then(|w| w.upgrade()) {
            checkpoint.reload(Arc::new(catalog));
        }
        Ok(())
    }
}
