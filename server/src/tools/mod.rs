//! Tools: the catalog every tool call is checked against, and the one checkpoint every call
//! passes. Built-in, connector and MCP tools share one definition type.

pub mod answer;
pub mod audit;
pub mod breaker;
pub mod builtins;
pub mod canonical;
pub mod catalog;
pub mod checkpoint;
pub mod connectors;
mod gates;
pub mod hooks;
pub mod job;
pub mod mcp;
pub mod policy;
pub mod schema;
pub mod reloads;
mod toml_file;

use std::{path::Path, sync::Arc};

pub use catalog::{Catalog, ToolDef};
pub use checkpoint::{ApprovedCall, CallContext, Checkpoint, ToolCall, ToolError, ToolExecutor};
pub use reloads::Reloads;

use crate::{
    config::{LoadedConfig, Problem, SecretSource, Settings, secrets::is_conventional_env_name},
    db::Db,
    jobs::JobQueue,
};

/// The tool files beside `gatehouse.toml`: `tools.toml` (with the connectors it names from
/// `connectors.toml`) and `mcp.toml`. A missing file means none of its kind.
#[derive(Debug, Clone, Default)]
pub struct ToolFiles {
    pub catalog: Arc<Catalog>,
    pub mcp: Arc<mcp::McpConfig>,
    /// The files' bytes as they were just before they were read ([`files_digest`]): a reload
    /// another process announced may have changed them since (see [`Reloads`]).
    pub digest: FilesDigest,
}

/// A secret the tool files name, as the console may show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSecret {
    /// The variable's name; `None` when it is not written as variables are (capitals, digits
    /// and `_`): a lower-case name may be a token pasted in its place (`ghp_...`, `sk_live_...`),
    /// and is never shown.
    pub variable: Option<String>,
    pub set: bool,
    /// What reads it: "connector shop", "MCP server github (disabled)".
    pub used_by: Vec<String>,
}

/// The environment variables the tool files name for secrets, each with whether `secrets` has
/// it and what reads it: the connectors (`${VAR}` in their headers) and the MCP servers
/// (`{ secret = "VAR" }`), a disabled one said so, since an owner sets them before enabling
/// it. Sorted by variable, the hidden ones last.
pub fn secrets_named(catalog: &Catalog, mcp: &mcp::McpManager, secrets: &SecretSource) -> Vec<NamedSecret> {
    let mut named: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = std::collections::BTreeMap::new();
    let connectors = catalog.connector_secrets.iter().map(|c| (format!("connector {}", c.connector), c.enabled, c.vars.clone()));
    let servers = mcp.secret_vars().into_iter().map(|(server, enabled, vars)| (format!("MCP server {server}"), enabled, vars));
    for (what, enabled, vars) in connectors.chain(servers) {
        let by = if enabled { what } else { format!("{what} (disabled)") };
        // A name that is no variable's is a secret pasted in its place: never shown.
        for var in vars.into_iter().filter(|v| crate::config::secrets::is_env_name(v)) {
            named.entry(var).or_default().insert(by.clone());
        }
    }
    let (shown, hidden): (Vec<_>, Vec<_>) = named.into_iter().partition(|(var, _)| is_conventional_env_name(var));
    shown
        .into_iter()
        .chain(hidden)
        .map(|(var, by)| NamedSecret { set: secrets.is_set(&var), variable: is_conventional_env_name(&var).then_some(var), used_by: by.into_iter().collect() })
        .collect()
}

/// A digest of the tool files' bytes.
pub type FilesDigest = [u8; 32];

/// The digest of the tool files in `dir` as they are now: `tools.toml`, `connectors.toml` and
/// `mcp.toml`, each present or not. Comparing two tells whether the files changed between two
/// reads, with no clock involved.
pub fn files_digest(dir: &Path) -> FilesDigest {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for name in ["tools.toml", "connectors.toml", "mcp.toml"] {
        h.update(name.as_bytes());
        match std::fs::read(dir.join(name)) {
            Ok(bytes) => {
                h.update((bytes.len() as u64 + 1).to_le_bytes());
                h.update(&bytes);
            }
            Err(_) => h.update(0u64.to_le_bytes()),
        }
    }
    h.finalize().into()
}

impl ToolFiles {
    /// Reads and checks every tool file in `dir`; on failure every problem of every file is
    /// returned, so `check-config` can list them with the settings' own.
    pub fn load(dir: &Path, secrets: &SecretSource) -> Result<Self, Vec<Problem>> {
        // Taken first: a file changed while it is read then differs from the digest, so the
        // first poll reloads it rather than miss the change.
        let digest = files_digest(dir);
        let mut problems = Vec::new();
        let catalog = load_catalog(dir, secrets).unwrap_or_else(|p| {
            problems.extend(p);
            Catalog::default()
        });
        let mcp_path = dir.join("mcp.toml");
        let is_set = |var: &str| secrets.is_set(var);
        let mcp = if mcp_path.is_file() {
            mcp::config::load(&mcp_path, &is_set).unwrap_or_else(|p| {
                problems.extend(p);
                mcp::McpConfig::default()
            })
        } else {
            mcp::McpConfig::default()
        };
        if problems.is_empty() { Ok(Self { catalog: Arc::new(catalog), mcp: Arc::new(mcp), digest }) } else { Err(problems) }
    }
}

/// `tools.toml` in `dir` (and the connectors it names), or an empty catalog without one.
fn load_catalog(dir: &Path, secrets: &SecretSource) -> Result<Catalog, Vec<Problem>> {
    let path = dir.join("tools.toml");
    if !path.is_file() {
        return Ok(Catalog::default());
    }
    Catalog::load(&path, &|var: &str| secrets.is_set(var))
}

/// The checkpoint with this build's built-in and connector implementations over `files`'
/// catalog, and the MCP servers of `files` as a tool source (their cached tools join the
/// catalog on `McpManager::start` or `load_cached`). Fails only when an HTTP client cannot be
/// set up.
pub fn build(settings: &Settings, files: &ToolFiles, secrets: &SecretSource, db: &Db, queue: &JobQueue) -> Result<(Arc<Checkpoint>, mcp::McpManager), reqwest::Error> {
    let mut checkpoint = Checkpoint::new(db.clone(), files.catalog.clone(), checkpoint::AuditWriter::spawn(db.clone(), queue.clone()), secrets.clone());
    let web_fetch = builtins::web_fetch::WebFetch::with_connector_hosts(settings.web_fetch.clone(), &connectors::hosts(&files.catalog))?;
    checkpoint.register_builtin(builtins::web_fetch::HANDLER, Arc::new(web_fetch));
    let search = &settings.web_search;
    let brave_key = secrets.get(builtins::web_search::BRAVE_KEY_VAR);
    let web_search = builtins::web_search::WebSearch::new(search.provider, &search.base_url, search.max_results as usize, search.timeout, brave_key)?;
    checkpoint.register_builtin(builtins::web_search::HANDLER, Arc::new(web_search));
    checkpoint.register_builtin(builtins::read_result::HANDLER, Arc::new(builtins::read_result::ReadResult::new(db.clone())));
    checkpoint.register_provider(catalog::Provider::Connector, Arc::new(connectors::ConnectorExecutor::new(secrets.clone())?));
    let manager = mcp::McpManager::new(db.clone(), &files.mcp, secrets.clone());
    // The console's address, where an OAuth server sends the owner back after a login.
    let public = &settings.server.public_url;
    let public = if public.is_empty() { format!("http://{}", settings.server.addr) } else { public.clone() };
    manager.set_public_url(&public);
    manager.set_owner_notices(mcp::OwnerNotices { queue: queue.clone(), public_url: public, settings: settings.mcp.clone() });
    let checkpoint = manager.install(checkpoint, files.catalog.clone());
    Ok((checkpoint, manager))
}

/// What a catalog reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    pub tools: usize,
    /// Tools added, removed or with a new version, by name.
    pub changed: Vec<String>,
    /// Whether the other processes of the deployment were told to reload too (see [`Reloads`]).
    pub told_others: bool,
}

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{} problem(s) in the tool files:\n{}", .0.len(), .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Files(Vec<Problem>),
    #[error("{0}")]
    Mcp(#[from] mcp::McpError),
}

/// What the settings and this build refuse of a file catalog, as problems of `dir`'s
/// tools.toml: tools whose calls cannot fit their `tool.call` job (see
/// [`catalog::fits_tool_call_budget`]), tools named like the planner's own `lane.respond_tool`
/// or `lane.search_tool`, which would never be offered, a `web_search` tool turned on with no
/// search provider to ask, an enabled builtin tool whose `handler` this build does not have
/// (every call would fail), and a `lane.always_offered` name no tool has (it would be offered
/// to nobody, silently). Names of MCP tools (`<server>__<tool>`) are the MCP servers' to check.
pub fn catalog_problems(catalog: &Catalog, dir: &Path, settings: &Settings) -> Vec<Problem> {
    let path = dir.join("tools.toml");
    let mut problems = catalog::fits_tool_call_budget(catalog, &path, settings.jobs.timeouts.tool_call, settings.reply_reserve());
    let unknown_handler = |t: &&Arc<ToolDef>| t.spec.enabled && t.spec.provider == catalog::Provider::Builtin && t.spec.handler.as_deref().is_some_and(|h| !builtins::HANDLERS.contains(&h));
    for tool in catalog.all().filter(unknown_handler) {
        let problem = toml_file::problem_at(&path);
        let known = builtins::HANDLERS.join(", ");
        problems.push(problem(format!("tool ({}).handler", tool.spec.name), format!("names no builtin this build has (it has {known}), so every call would fail")));
    }
    let lane = &settings.lane;
    for name in lane.always_offered.iter().filter(|n| !n.contains(mcp::normalize::SEPARATOR) && catalog.get(n).is_none()) {
        let message = format!("names {name:?}, which no tool in tools.toml has, so it would never be offered");
        problems.push(Problem::new("lane.always_offered", "the main config file (gatehouse.toml, or the one given with --config)", message));
    }
    for (key, name) in [("lane.respond_tool", &lane.respond_tool), ("lane.search_tool", &lane.search_tool)] {
        if !name.is_empty() && catalog.get(name).is_some() {
            let problem = toml_file::problem_at(&path);
            problems.push(problem(format!("tool ({name}).name"), format!("is the name of {key} in gatehouse.toml, the planner's own tool: rename one of them")));
        }
    }
    if settings.web_search.base_url.trim().is_empty() {
        let searches = |t: &&Arc<ToolDef>| t.spec.enabled && t.spec.provider == catalog::Provider::Builtin && t.spec.handler.as_deref() == Some(builtins::web_search::HANDLER);
        for tool in catalog.all().filter(searches) {
            let problem = toml_file::problem_at(&path);
            problems.push(problem(format!("tool ({}).enabled", tool.spec.name), "is true, but [web_search] base_url in gatehouse.toml is empty, so every call would fail: set a search provider there, or keep the tool off".into()));
        }
    }
    problems
}

/// Re-reads the tool files in `config.dir` (tools.toml, connectors.toml; never gatehouse.toml,
/// so a broken main file does not block a catalog fix), checks them as `check-config` does, and
/// gives the new base catalog to `mcp`, which joins the MCP tools and swaps the checkpoint's
/// catalog. A file with problems is refused with all of them, and the current catalog stays.
/// Calls in flight keep the version they started with. `changed` names the file-declared tools
/// added, removed or edited. Reached only through [`Reloads`], which tells the other processes.
async fn reload_catalog(config: &LoadedConfig, mcp: &mcp::McpManager, checkpoint: &Checkpoint) -> Result<ReloadReport, ReloadError> {
    let dir = config.dir.as_path();
    let fresh = load_catalog(dir, &config.secrets.source).map_err(ReloadError::Files)?;
    let problems = catalog_problems(&fresh, dir, &config.settings);
    if !problems.is_empty() {
        return Err(ReloadError::Files(problems));
    }
    let fresh = Arc::new(fresh);
    let old = checkpoint.catalog();
    let declared = |t: &&Arc<ToolDef>| t.spec.provider != catalog::Provider::Mcp;
    let mut changed: Vec<String> = fresh.all().filter(|t| old.get(&t.spec.name).is_none_or(|o| o.version != t.version)).map(|t| t.spec.name.clone()).collect();
    changed.extend(old.all().filter(declared).filter(|t| fresh.get(&t.spec.name).is_none()).map(|t| t.spec.name.clone()));
    changed.sort();
    let report = ReloadReport { tools: fresh.len(), changed, told_others: false };
    mcp.set_base_catalog(fresh).await?;
    tracing::info!(tools = report.tools, changed = ?report.changed, "tool catalog reloaded");
    Ok(report)
}

/// Why an answer's body was not read whole by [`read_capped`].
#[derive(Debug)]
pub enum CappedRead {
    /// The connection failed while the body came.
    Read(reqwest::Error),
    /// The body is over the limit; what came is dropped.
    TooLarge,
}

/// An HTTP answer's body, read up to `limit` bytes: a connector's answer, a search provider's.
pub async fn read_capped(res: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, CappedRead> {
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(CappedRead::Read)? {
        if body.len() + chunk.len() > limit {
            return Err(CappedRead::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
