//! MCP servers as tool sources. Each configured server has a supervisor task that connects,
//! discovers its tools within bounds, caches them in the database with quarantine state, and
//! restarts the connection with backoff when it ends. Approved tools join the catalog as
//! `<server>__<tool>` and are called through the one checkpoint by [`McpExecutor`]; results are
//! marked untrusted. [`McpManager`] is what the console and the CLI use.

pub mod config;
mod console;
mod executor;
mod login;
pub mod normalize;
pub mod oauth;
pub mod session;
mod supervisor;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock, Weak},
    time::Duration,
};

use serde_json::Value;
use tokio::sync::{mpsc, watch};

use self::executor::McpExecutor;
pub use self::{
    config::{AuthMode, McpConfig, ServerConfig, Trust},
    console::{AuditActor, Reviewed, ServerStatus, ToolStatus},
    login::{CALLBACK_PATH, FINISH_PATH},
    session::DiscoveryReport,
};
use super::{
    Catalog, Checkpoint, ToolDef, ToolExecutor,
    breaker::Breakers,
    catalog::Withheld,
    checkpoint::{SecretSource, ToolCode},
};
use crate::db::{self, Db, DbError};

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
    /// An OAuth server without a usable token: an owner must log in.
    #[strum(serialize = "MCP_NEEDS_LOGIN")]
    NeedsLogin,
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
    OAuth(#[from] oauth::OAuthError),
    #[error(transparent)]
    Db(#[from] DbError),
}

crate::db::from_sqlx_as_db!(McpError);

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
    /// Why an OAuth server needs an owner to log in (its tools are withheld meanwhile).
    pub needs_login: Option<String>,
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
    /// The OAuth redirect URI (the console's callback).
    redirect_uri: RwLock<String>,
    /// OAuth logins in flight in this process, by their state.
    logins: std::sync::Mutex<HashMap<String, oauth::PendingLogin>>,
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

impl McpManager {
    pub fn new(db: Db, config: &McpConfig, secrets: SecretSource) -> Self {
        let servers = config
            .servers
            .iter()
            .map(|c| {
                let (refresh, refresh_rx) = mpsc::unbounded_channel();
                let live = Live { peer: None, health: db::mcp::health::DOWN, last_error: None, connections: 0, last_discovery: None, needs_login: None };
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
                redirect_uri: RwLock::new(format!("http://127.0.0.1:3000{CALLBACK_PATH}")),
                logins: std::sync::Mutex::new(HashMap::new()),
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
                // An OAuth server without a stored login starts withheld, not failing call by call.
                if let Some(server) = self.inner.servers.get(id).filter(|s| s.config.auth == AuthMode::Oauth) {
                    let row = db::mcp_oauth::get(&mut conn, id).await?;
                    let missing = match &row {
                        None => Some("not logged in yet".to_string()),
                        Some(r) if r.state != db::mcp_oauth::state::CONNECTED => Some(r.reason.clone().unwrap_or_else(|| "not logged in".into())),
                        Some(_) => None,
                    };
                    server.live.send_modify(|l| l.needs_login = missing);
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
            let needs_login = server.live.borrow().needs_login.is_some();
            let held = if !*server.enabled.borrow() {
                Some(Withheld { code: ToolCode::Disabled.as_str(), reason: format!("the MCP server {} is disabled", server.config.id) })
            } else if needs_login {
                Some(Withheld {
                    code: McpCode::NeedsLogin.as_str(),
                    reason: format!("the MCP server {} needs an owner to log in (console, or `gatehouse mcp login {}`)", server.config.id, server.config.id),
                })
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
