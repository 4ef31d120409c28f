//! Tools: the catalog every tool call is checked against, and the one checkpoint every call
//! passes. Built-in, connector and MCP tools share one definition type.

pub mod breaker;
pub mod builtins;
pub mod catalog;
pub mod checkpoint;
pub mod connectors;
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
    let secrets_for_connectors = secrets.clone();
    let mut checkpoint = Checkpoint::new(db.clone(), cfg.catalog.clone(), checkpoint::AuditWriter::spawn_for(db.clone(), cfg.settings.jobs.queue.clone()), secrets);
    let web_fetch = builtins::web_fetch::WebFetch::with_connector_hosts(cfg.settings.web_fetch.limits(), &connectors::hosts(&cfg.catalog))?;
    checkpoint.register_builtin(builtins::web_fetch::HANDLER, Arc::new(web_fetch));
    let search = &cfg.settings.web_search;
    let brave_key = std::env::var(builtins::web_search::BRAVE_KEY_VAR).ok().filter(|v| !v.trim().is_empty());
    let web_search = builtins::web_search::WebSearch::new(search.provider, &search.base_url, search.max_results as usize, search.timeout, brave_key)?;
    checkpoint.register_builtin(builtins::web_search::HANDLER, Arc::new(web_search));
    checkpoint.register_provider(catalog::Provider::Connector, Arc::new(connectors::ConnectorExecutor::new(secrets_for_connectors)?));
    Ok(checkpoint)
}

/// What a catalog reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    pub tools: usize,
    /// Tools added, removed or with a new version, by name.
    pub changed: Vec<String>,
}

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Mcp(#[from] mcp::McpError),
}

/// Re-reads the configuration at `config_path` (tools.toml, connectors.toml) and gives the new
/// base catalog to `mcp`, which joins the MCP tools and swaps the checkpoint's catalog. A file with
/// problems is refused with all of them, and the current catalog stays. Calls in flight keep the
/// version they started with. `changed` names the file-declared tools added, removed or edited.
pub async fn reload_catalog(config_path: &std::path::Path, mcp: &mcp::McpManager, checkpoint: &Checkpoint) -> Result<ReloadReport, ReloadError> {
    let fresh = crate::config::load(config_path)?;
    let old = checkpoint.catalog();
    let declared = |t: &&Arc<ToolDef>| t.spec.provider != catalog::Provider::Mcp;
    let mut changed: Vec<String> = fresh.catalog.all().filter(|t| old.get(&t.spec.name).is_none_or(|o| o.version != t.version)).map(|t| t.spec.name.clone()).collect();
    changed.extend(old.all().filter(declared).filter(|t| fresh.catalog.get(&t.spec.name).is_none()).map(|t| t.spec.name.clone()));
    changed.sort();
    let report = ReloadReport { tools: fresh.catalog.len(), changed };
    mcp.set_base_catalog(fresh.catalog).await?;
    tracing::info!(tools = report.tools, changed = ?report.changed, "tool catalog reloaded");
    Ok(report)
}
