//! MCP servers as tool sources. Each configured server has a supervisor task that connects,
//! discovers its tools within bounds, caches them in the database with quarantine state, and
//! restarts the connection with backoff when it ends. Approved tools join the catalog as
//! `<server>__<tool>` and are called through the one checkpoint by [`McpExecutor`]; results are
//! marked untrusted. [`McpManager`] is what the console and the CLI use.

pub mod config;
pub mod normalize;
pub mod session;
mod supervisor;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock, Weak},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

pub use self::{
    config::{McpConfig, ServerConfig, Trust},
    session::DiscoveryReport,
};
use super::{
    Catalog, Checkpoint, ToolDef, ToolError, ToolExecutor,
    breaker::Breakers,
    catalog::Withheld,
    checkpoint::{SecretSource, ToolCode},
};
use crate::db::{self, Db, DbError, audit, mcp::ToolRow};

/// Stable error codes of MCP calls (inside `TOOL_PROVIDER_ERROR` messages, or on their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
pub enum McpCode {
    /// Not connected, exited during the call, or its circuit breaker is open.
    #[strum(serialize = "MCP_SERVER_UNAVAILABLE")]
    ServerUnavailable,
    #[strum(serialize = "MCP_SERVER_DISABLED")]
    ServerDisabled,
    #[strum(serialize = "MCP_UNKNOWN_SERVER")]
    UnknownServer,
    /// The server answered with a protocol error (unknown tool, invalid params, ...).
    #[strum(serialize = "MCP_PROTOCOL_ERROR")]
    ProtocolError,
    /// The tool ran and reported an error (`isError: true`).
    #[strum(serialize = "MCP_TOOL_ERROR")]
    ToolError,
    #[strum(serialize = "MCP_UNKNOWN_TOOL")]
    UnknownTool,
}

impl McpCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An MCP management failure with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP_UNKNOWN_SERVER: there is no MCP server {0:?}")]
    UnknownServer(String),
    #[error("MCP_UNKNOWN_TOOL: there is no MCP tool {0:?}")]
    UnknownTool(String),
    #[error("MCP_SERVER_UNAVAILABLE: {0}")]
    Unavailable(String),
    /// The definition changed after the owner reviewed it; nothing was decided.
    #[error("MCP_DEFINITION_CHANGED: the definition of {0} changed since it was reviewed; look at it again")]
    DefinitionChanged(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for McpError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(DbError::Sql(e))
    }
}

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

/// A server's live state, published by its supervisor.
#[derive(Debug, Clone)]
pub struct Live {
    pub peer: Option<rmcp::service::Peer<rmcp::RoleClient>>,
    /// One of [`db::mcp::health`].
    pub health: &'static str,
    pub last_error: Option<String>,
    /// Successful connections so far (a restart adds one).
    pub connections: u64,
    pub last_discovery: Option<DiscoveryReport>,
}

pub(crate) struct Server {
    pub(crate) config: ServerConfig,
    pub(crate) live: watch::Sender<Live>,
    pub(crate) refresh: mpsc::UnboundedSender<session::RefreshRequest>,
    refresh_rx: std::sync::Mutex<Option<mpsc::UnboundedReceiver<session::RefreshRequest>>>,
    pub(crate) enabled: watch::Sender<bool>,
}

/// Where a catalog tool is served.
#[derive(Debug, Clone)]
struct Route {
    server: String,
    tool: String,
}

pub(crate) struct Inner {
    pub(crate) db: Db,
    pub(crate) servers: BTreeMap<String, Arc<Server>>,
    pub(crate) secrets: SecretSource,
    base: RwLock<Arc<Catalog>>,
    checkpoint: RwLock<Weak<Checkpoint>>,
    /// Usable tools by catalog name.
    routes: RwLock<HashMap<String, Route>>,
    /// Serialises catalog rebuilds so an older one never lands after a newer one.
    rebuilding: tokio::sync::Mutex<()>,
    pub(crate) breakers: Breakers,
    pub(crate) shutdown: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
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

/// The MCP side of Gatehouse: servers, their tools, quarantine decisions and supervision.
#[derive(Clone)]
pub struct McpManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpManager").field("servers", &self.inner.servers.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
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
            state: row.state,
            present: row.present,
            definition_hash: row.definition_hash,
        }
    }
}

impl McpManager {
    pub fn new(db: Db, config: &McpConfig, secrets: SecretSource) -> Self {
        let servers = config
            .servers
            .iter()
            .map(|c| {
                let (refresh, refresh_rx) = mpsc::unbounded_channel();
                let live = Live { peer: None, health: db::mcp::health::DOWN, last_error: None, connections: 0, last_discovery: None };
                let server = Server {
                    config: c.clone(),
                    live: watch::channel(live).0,
                    refresh,
                    refresh_rx: std::sync::Mutex::new(Some(refresh_rx)),
                    enabled: watch::channel(c.enabled).0,
                };
                (c.id.clone(), Arc::new(server))
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                db,
                servers,
                secrets,
                base: RwLock::new(Arc::new(Catalog::default())),
                checkpoint: RwLock::new(Weak::new()),
                routes: RwLock::new(HashMap::new()),
                rebuilding: tokio::sync::Mutex::new(()),
                breakers: Breakers::default(),
                shutdown: watch::channel(false).0,
                tasks: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// The executor to register with `Checkpoint::register_provider(Provider::Mcp, ..)`.
    pub fn executor(&self) -> Arc<dyn ToolExecutor> {
        Arc::new(McpExecutor { inner: self.inner.clone() })
    }

    /// Registers the executor on `checkpoint`, wraps it, and keeps a handle to publish catalogs
    /// that combine `base` (the file catalog) with the usable MCP tools.
    pub fn install(&self, mut checkpoint: Checkpoint, base: Arc<Catalog>) -> Arc<Checkpoint> {
        checkpoint.register_provider(super::catalog::Provider::Mcp, self.executor());
        let checkpoint = Arc::new(checkpoint);
        if let Ok(mut w) = self.inner.checkpoint.write() {
            *w = Arc::downgrade(&checkpoint);
        }
        if let Ok(mut b) = self.inner.base.write() {
            *b = base;
        }
        checkpoint
    }

    /// Publishes the cached tools (so Gatehouse starts with the last known tools even when a
    /// server is down), then starts one supervisor per server.
    pub async fn start(&self) -> Result<(), McpError> {
        {
            let mut conn = self.inner.db.pool.acquire().await?;
            for id in self.inner.servers.keys() {
                db::mcp::ensure_server(&mut conn, id).await?;
                if let Some(row) = db::mcp::server(&mut conn, id).await?
                    && let (Some(enabled), Some(server)) = (row.enabled_override, self.inner.servers.get(id))
                {
                    server.enabled.send_replace(enabled);
                }
            }
        }
        self.rebuild().await?;
        let mut tasks = Vec::new();
        for server in self.inner.servers.values() {
            let Some(rx) = server.refresh_rx.lock().ok().and_then(|mut r| r.take()) else { continue };
            tasks.push(tokio::spawn(supervisor::run(self.inner.clone(), self.clone(), server.clone(), rx)));
        }
        if let Ok(mut t) = self.inner.tasks.lock() {
            t.extend(tasks);
        }
        Ok(())
    }

    /// Publishes the cached tools without connecting (for `gatehouse tools list`).
    pub async fn load_cached(&self) -> Result<(), McpError> {
        self.rebuild().await
    }

    /// Stops every supervisor and closes every session (stdio servers are shut down).
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let tasks: Vec<_> = self.inner.tasks.lock().map(|mut t| t.drain(..).collect()).unwrap_or_default();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    /// A new file catalog (after SIGHUP): combined with the MCP tools and published.
    pub async fn set_base_catalog(&self, base: Arc<Catalog>) -> Result<(), McpError> {
        if let Ok(mut b) = self.inner.base.write() {
            *b = base;
        }
        self.rebuild().await
    }

    /// Rebuilds the combined catalog from the database and publishes it to the checkpoint.
    pub(crate) async fn rebuild(&self) -> Result<(), McpError> {
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
            let held = if !*server.enabled.borrow() {
                Some(Withheld { code: ToolCode::Disabled.as_str(), reason: format!("the MCP server {} is disabled", server.config.id) })
            } else if row.state == db::mcp::state::REJECTED {
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
        let base = self.inner.base.read().map(|b| b.clone()).unwrap_or_default();
        let (catalog, clashes) = base.with_extra(extra, withheld);
        for name in clashes {
            routes.remove(&name);
            tracing::warn!(tool = %name, "an MCP tool has the name of a catalog tool; the catalog tool is kept");
        }
        if let Ok(mut r) = self.inner.routes.write() {
            *r = routes;
        }
        if let Some(checkpoint) = self.inner.checkpoint.read().ok().and_then(|w| w.upgrade()) {
            checkpoint.reload(Arc::new(catalog));
        }
        Ok(())
    }

    fn server(&self, id: &str) -> Result<&Arc<Server>, McpError> {
        self.inner.servers.get(id).ok_or_else(|| McpError::UnknownServer(id.to_string()))
    }

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
                        Some(r) if !supervised => r.health.clone(),
                        _ => live.health.to_string(),
                    },
                    last_error: if supervised { live.last_error.clone() } else { row.and_then(|r| r.last_error.clone()) },
                    last_seen_at: row.and_then(|r| r.last_seen_at),
                    tool_count: row.map_or(0, |r| r.tool_count),
                    pending: tools.iter().filter(|t| t.server_id == s.config.id && t.present && !t.usable() && t.state != db::mcp::state::REJECTED).count(),
                    last_discovery: live.last_discovery,
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
        s.enabled.send_replace(enabled);
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
        let (done, answer) = oneshot::channel();
        s.refresh.send(session::RefreshRequest::Refresh(done)).map_err(|_| McpError::Unavailable(format!("the supervisor of {server} is not running")))?;
        let wait = s.config.discovery.timeout + s.config.call_timeout;
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(Ok(report))) => Ok(report),
            Ok(Ok(Err(e))) => Err(McpError::Unavailable(e)),
            Ok(Err(_)) => Err(McpError::Unavailable(format!("{server} stopped before the refresh finished"))),
            Err(_) => Err(McpError::Unavailable(format!("{server} did not finish discovery within {wait:?}"))),
        }
    }

    /// Waits until the server is connected (or `timeout` passes).
    pub async fn wait_connected(&self, server: &str, timeout: Duration) -> Result<(), McpError> {
        let mut rx = self.server(server)?.live.subscribe();
        let connected = tokio::time::timeout(timeout, rx.wait_for(|l| l.peer.is_some())).await.is_ok_and(|r| r.is_ok());
        if connected {
            Ok(())
        } else {
            let last = rx.borrow().last_error.clone().unwrap_or_else(|| "no answer".into());
            Err(McpError::Unavailable(format!("{server} is not connected: {last}")))
        }
    }

    /// The live state of a server (health, last error, connections, last discovery).
    pub fn live(&self, server: &str) -> Result<Live, McpError> {
        Ok(self.server(server)?.live.borrow().clone())
    }

    /// The server that serves a catalog tool name, if it is an MCP tool of a configured server.
    pub fn server_of(&self, catalog_name: &str) -> Option<String> {
        let (prefix, _) = catalog_name.split_once(normalize::SEPARATOR)?;
        self.inner.servers.contains_key(prefix).then(|| prefix.to_string())
    }

    /// Health per server for /metrics: 0 connected, 1 degraded, 2 down.
    pub fn health_gauges(&self) -> Vec<(String, f64, usize)> {
        self.inner
            .servers
            .values()
            .map(|s| {
                let live = s.live.borrow();
                let value = match live.health {
                    db::mcp::health::CONNECTED => 0.0,
                    db::mcp::health::DEGRADED => 1.0,
                    _ => 2.0,
                };
                (s.config.id.clone(), value, live.last_discovery.as_ref().map_or(0, |d| d.taken))
            })
            .collect()
    }
}

/// Calls MCP tools for the checkpoint, which has already run every gate.
struct McpExecutor {
    inner: Arc<Inner>,
}

fn text_of(content: &[rmcp::model::ContentBlock]) -> String {
    let texts: Vec<String> = content.iter().filter_map(|c| serde_json::to_value(c).ok()).filter_map(|v| v.get("text").and_then(Value::as_str).map(str::to_string)).collect();
    if texts.is_empty() { "the tool reported an error without a message".into() } else { texts.join("\n") }
}

#[async_trait::async_trait]
impl ToolExecutor for McpExecutor {
    async fn call(&self, tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        let name = &tool.spec.name;
        // The catalog a call started with may be older than the latest decision: the routes are
        // the current usable set, so a tool quarantined since never reaches its server.
        let route = self.inner.routes.read().ok().and_then(|r| r.get(name).cloned());
        let Some(route) = route else { return Err(ToolError::new(ToolCode::Quarantined.as_str(), format!("{name} is not approved for use now"), false)) };
        let Some(server) = self.inner.servers.get(&route.server) else {
            return Err(ToolError::new(McpCode::UnknownServer.as_str(), format!("no MCP server {}", route.server), false));
        };
        if !*server.enabled.borrow() {
            return Err(ToolError::new(McpCode::ServerDisabled.as_str(), format!("the MCP server {} is disabled", route.server), false));
        }
        let (peer, last_error) = {
            let live = server.live.borrow();
            (live.peer.clone(), live.last_error.clone())
        };
        let Some(peer) = peer else {
            let last = last_error.unwrap_or_else(|| "not connected yet".into());
            return Err(ToolError::new(McpCode::ServerUnavailable.as_str(), format!("{} is not connected ({last})", route.server), false));
        };
        if let Err(wait) = self.inner.breakers.try_acquire(&route.server, Instant::now()) {
            return Err(ToolError::new(
                McpCode::ServerUnavailable.as_str(),
                format!("{} failed repeatedly; next try in {} s", route.server, wait.as_secs().max(1)),
                false,
            ));
        }
        let params = rmcp::model::CallToolRequestParams::new(route.tool.clone()).with_arguments(args.as_object().cloned().unwrap_or_default());
        let timeout = server.config.call_timeout;
        let scrub = |text: &str| session::scrub(&server.config, &self.inner.secrets, text);
        let outcome = tokio::time::timeout(timeout, peer.call_tool(params)).await;
        let result = match outcome {
            Err(_) => {
                self.inner.breakers.record_failure(&route.server, Instant::now());
                let _ = server.refresh.send(session::RefreshRequest::Probe);
                return Err(ToolError::new(ToolCode::Timeout.as_str(), format!("{} did not answer within {timeout:?}", route.server), false));
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => {
                // The server is alive and answered: a protocol error is not a health problem.
                self.inner.breakers.record_success(&route.server);
                return Err(ToolError::new(McpCode::ProtocolError.as_str(), scrub(&format!("{} ({})", e.message, e.code.0)), false));
            }
            Ok(Err(e)) => {
                self.inner.breakers.record_failure(&route.server, Instant::now());
                let closed = matches!(e, rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)) || peer.is_transport_closed();
                let message = if closed {
                    format!("the connection to {} closed during the call (the server may have exited); it is being restarted", route.server)
                } else {
                    scrub(&e.to_string())
                };
                return Err(ToolError::new(McpCode::ServerUnavailable.as_str(), message, false));
            }
            Ok(Ok(result)) => result,
        };
        self.inner.breakers.record_success(&route.server);
        if result.is_error == Some(true) {
            return Err(ToolError::new(McpCode::ToolError.as_str(), scrub(&text_of(&result.content)), false));
        }
        let content = serde_json::to_value(&result.content).unwrap_or_else(|_| Value::Array(Vec::new()));
        let mut out = json!({ "untrusted": true, "source": format!("mcp:{}", route.server), "content": content });
        if let Some(structured) = result.structured_content {
            out["structured"] = structured;
        }
        Ok(out)
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
