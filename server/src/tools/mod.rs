//! Tools: the catalog every tool call is checked against, and the one checkpoint every call
//! passes. Built-in, connector and MCP tools share one definition type.

pub mod breaker;
pub mod builtins;
pub mod catalog;
pub mod checkpoint;
pub mod hooks;
pub mod mcp;
pub mod policy;

use std::sync::Arc;

pub use catalog::{Catalog, ToolDef};
pub use checkpoint::{CallContext, Checkpoint, ToolCall, ToolError, ToolExecutor};

use crate::{config::LoadedConfig, db::Db};

fn env_secrets() -> checkpoint::SecretSource {
    Arc::new(|var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
}

/// The checkpoint with the MCP servers of `mcp.toml` as a tool source. Their cached tools join
/// the catalog on `McpManager::start` (or `load_cached`).
pub fn checkpoint_with_mcp(cfg: &LoadedConfig, db: &Db) -> Result<(Arc<Checkpoint>, mcp::McpManager), reqwest::Error> {
    let manager = mcp::McpManager::new(db.clone(), &cfg.mcp, env_secrets());
    let checkpoint = manager.install(checkpoint_for(cfg, db)?, cfg.catalog.clone());
    Ok((checkpoint, manager))
}

/// The checkpoint with this build's built-in implementations, over the loaded catalog.
pub fn checkpoint_for(cfg: &LoadedConfig, db: &Db) -> Result<Checkpoint, reqwest::Error> {
    let secrets = env_secrets();
    let mut checkpoint = Checkpoint::new(db.clone(), cfg.catalog.clone(), checkpoint::AuditWriter::spawn(db.clone()), secrets);
    checkpoint.register_builtin(builtins::web_fetch::HANDLER, Arc::new(builtins::web_fetch::WebFetch::new(cfg.settings.web_fetch.limits())?));
    let search = &cfg.settings.web_search;
    let brave_key = std::env::var(builtins::web_search::BRAVE_KEY_VAR).ok().filter(|v| !v.trim().is_empty());
    let web_search = builtins::web_search::WebSearch::new(search.provider, &search.base_url, search.max_results as usize, search.timeout, brave_key)?;
    checkpoint.register_builtin(builtins::web_search::HANDLER, Arc::new(web_search));
    Ok(checkpoint)
}
