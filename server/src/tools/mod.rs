//! Tools: the catalog every tool call is checked against, and the one checkpoint every call
//! passes. Built-in, connector and MCP tools share one definition type.

pub mod breaker;
pub mod builtins;
pub mod catalog;
pub mod checkpoint;
pub mod connectors;
pub mod hooks;
pub mod policy;

use std::sync::Arc;

pub use catalog::{Catalog, ToolDef};
pub use checkpoint::{CallContext, Checkpoint, ToolCall, ToolError, ToolExecutor};

use crate::{config::LoadedConfig, db::Db};

/// The checkpoint with this build's built-in implementations, over the loaded catalog.
pub fn checkpoint_for(cfg: &LoadedConfig, db: &Db) -> Result<Checkpoint, reqwest::Error> {
    let secrets: checkpoint::SecretSource = Arc::new(|var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty()));
    let secrets_for_connectors = secrets.clone();
    let mut checkpoint = Checkpoint::new(db.clone(), cfg.catalog.clone(), checkpoint::AuditWriter::spawn(db.clone()), secrets);
    checkpoint.register_builtin(builtins::web_fetch::HANDLER, Arc::new(builtins::web_fetch::WebFetch::new(cfg.settings.web_fetch.limits())?));
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

/// Re-reads the configuration at `config_path` and swaps the catalog in `checkpoint`. A file with
/// problems is refused with all of them, and the current catalog stays. Calls in flight keep the
/// version they started with.
pub fn reload_catalog(config_path: &std::path::Path, checkpoint: &Checkpoint) -> Result<ReloadReport, crate::config::ConfigError> {
    let fresh = crate::config::load(config_path)?;
    let old = checkpoint.catalog();
    let mut changed: Vec<String> = fresh.catalog.all().filter(|t| old.get(&t.spec.name).is_none_or(|o| o.version != t.version)).map(|t| t.spec.name.clone()).collect();
    changed.extend(old.all().filter(|t| fresh.catalog.get(&t.spec.name).is_none()).map(|t| t.spec.name.clone()));
    changed.sort();
    let report = ReloadReport { tools: fresh.catalog.len(), changed };
    checkpoint.reload(fresh.catalog);
    tracing::info!(tools = report.tools, changed = ?report.changed, "tool catalog reloaded");
    Ok(report)
}
