//! MCP servers as tool sources. Each configured server has a supervisor task that connects,
//! discovers its tools within bounds, caches them in the database with quarantine state, and
//! restarts the connection with backoff when it ends. Approved tools join the catalog as
//! `<server>__<tool>` (`publish`) and are called through the one checkpoint by [`McpExecutor`];
//! results are marked untrusted. [`McpManager`] is what the console and the CLI use. A server's
//! `elicitation/create` is declined, or forwarded to the owners as a form (`elicitation`).

pub mod config;
mod console;
pub mod elicitation;
mod error;
mod executor;
mod login;
pub mod normalize;
mod notices;
pub mod oauth;
mod publish;
pub mod session;
mod supervisor;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock, Weak},
    time::Duration,
};

use tokio::sync::{mpsc, watch};

use self::executor::McpExecutor;
pub use self::{
    config::{AuthMode, McpConfig, ServerConfig, Trust},
    console::{AuditActor, Reviewed, ServerStatus, ToolStatus},
    elicitation::{Answer, PendingForm},
    error::{McpCode, McpError},
    login::{CALLBACK_PATH, FINISH_PATH},
    notices::OwnerNotices,
    session::DiscoveryReport,
};
use super::{
    Catalog, Checkpoint, ToolExecutor,
    breaker::Breakers,
    checkpoint::SecretSource,
};
use crate::db::{self, Db};

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
    /// Each tool's definition hash as the server last listed it, by its name on the server: a
    /// call runs only when that is the hash an owner approved, also when the listing could not
    /// be stored (see `executor::still_allowed`).
    pub listed: Option<Arc<std::collections::HashMap<String, String>>>,
}

pub(crate) struct Server {
    pub(crate) config: ServerConfig,
    pub(crate) live: watch::Sender<Live>,
    pub(crate) refresh: mpsc::UnboundedSender<session::RefreshRequest>,
    refresh_rx: std::sync::Mutex<Option<mpsc::UnboundedReceiver<session::RefreshRequest>>>,
    pub(crate) enabled: watch::Sender<bool>,
    /// The OAuth access tokens sent to it lately, blanked in its results.
    pub(crate) sent_tokens: Arc<oauth::http::SentTokens>,
    /// When a call last had its tools listed again ([`Server::list_again_for_call`]); held while
    /// it waits, so calls that meet the same old listing share one.
    listed_for_call: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Calls on their way to it now ([`Server::call_started`]): a server busy with them is not
    /// pinged (see `supervisor::serve`).
    calls: std::sync::atomic::AtomicUsize,
    /// When a call last got an answer (ms): a server busy with calls at every ping is seen by
    /// them.
    answered_at: std::sync::atomic::AtomicI64,
}

/// A call in flight on its server, counted while it lives.
pub(crate) struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Server {
    /// Follows the server's switch as the database holds it (`enabled_override`; none follows
    /// `mcp.toml`): its supervisor stops, or connects again. Returns whether it is enabled.
    pub(crate) fn follow_switch(&self, enabled_override: Option<bool>) -> bool {
        let enabled = enabled_override.unwrap_or(self.config.enabled);
        self.enabled.send_if_modified(|now| std::mem::replace(now, enabled) != enabled);
        enabled
    }

    /// Counts a call on its way to the server until the returned guard is dropped.
    pub(crate) fn call_started(&self) -> InFlight<'_> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InFlight(&self.calls)
    }

    /// Whether calls are on their way to the server now.
    pub(crate) fn busy(&self) -> bool {
        self.calls.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// A call got an answer (a result or an error the server sent): it is there.
    pub(crate) fn answered(&self) {
        self.answered_at.store(db::now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a call got an answer within `within`.
    pub(crate) fn answered_within(&self, within: Duration) -> bool {
        db::now_ms().saturating_sub(self.answered_at.load(std::sync::atomic::Ordering::Relaxed)) <= db::duration_ms(within)
    }

    /// Lists the server's tools again now, and waits until its supervisor has stored them.
    pub(crate) async fn list_again(&self) -> Result<DiscoveryReport, McpError> {
        let server = &self.config.id;
        let (done, answer) = tokio::sync::oneshot::channel();
        self.refresh.send(session::RefreshRequest::Refresh(done)).map_err(|_| McpError::Unavailable(format!("the supervisor of {server} is not running")))?;
        let wait = self.config.discovery.timeout + self.config.call_timeout;
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(Ok(report))) => Ok(report),
            Ok(Ok(Err(e))) => Err(McpError::Unavailable(e)),
            Ok(Err(_)) => Err(McpError::Unavailable(format!("{server} stopped before the refresh finished"))),
            Err(_) => Err(McpError::Unavailable(format!("{server} did not finish discovery within {wait:?}"))),
        }
    }

    /// For a call that found this server's last listing older than an owner's approval (another
    /// process stored the new definition, and an owner approved it): lists the tools again and
    /// waits, unless `current` says the listing has caught up meanwhile (another call's). Calls
    /// meeting the same old listing wait for one listing; a server that still lists the old
    /// definition is asked again at most once per [`supervisor::LIST_CHANGED_MIN_INTERVAL`].
    pub(crate) async fn list_again_for_call(&self, current: impl Fn(&Live) -> bool) {
        let mut last = self.listed_for_call.lock().await;
        if current(&self.live.borrow()) || last.is_some_and(|at| at.elapsed() < supervisor::LIST_CHANGED_MIN_INTERVAL) {
            return;
        }
        *last = Some(std::time::Instant::now());
        if let Err(e) = self.list_again().await {
            tracing::debug!(mcp.server = %self.config.id, error = %e, "listing the tools again for a call failed");
        }
        // From its end too: a slow listing is not started again by the calls that waited for it.
        *last = Some(std::time::Instant::now());
    }
}

pub(crate) struct Inner {
    pub(crate) db: Db,
    pub(crate) servers: BTreeMap<String, Arc<Server>>,
    pub(crate) secrets: SecretSource,
    base: RwLock<Arc<Catalog>>,
    checkpoint: RwLock<Weak<Checkpoint>>,
    /// Usable tools by catalog name.
    routes: RwLock<HashMap<String, publish::Route>>,
    /// Serialises catalog rebuilds so an older one never lands after a newer one.
    rebuilding: tokio::sync::Mutex<()>,
    pub(crate) breakers: Breakers,
    pub(crate) shutdown: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The OAuth redirect URI (the console's callback).
    redirect_uri: RwLock<String>,
    /// OAuth logins in flight in this process, by their state.
    logins: std::sync::Mutex<HashMap<String, oauth::PendingLogin>>,
    /// Forms of servers with `elicitation = "owner"`.
    pub(crate) forms: Arc<elicitation::Forms>,
    /// What owners are told (a server needs a login, a form waits).
    notices: Arc<notices::Notices>,
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
                let live = Live { peer: None, health: db::mcp::health::DOWN, last_error: None, connections: 0, last_discovery: None, needs_login: None, listed: None };
                let server = Server {
                    config: c.clone(),
                    live: watch::channel(live).0,
                    refresh,
                    refresh_rx: std::sync::Mutex::new(Some(refresh_rx)),
                    enabled: watch::channel(c.enabled).0,
                    sent_tokens: Arc::default(),
                    listed_for_call: tokio::sync::Mutex::new(None),
                    calls: std::sync::atomic::AtomicUsize::new(0),
                    answered_at: std::sync::atomic::AtomicI64::new(0),
                };
                (c.id.clone(), Arc::new(server))
            })
            .collect();
        let notices = Arc::new(notices::Notices::default());
        Self {
            inner: Arc::new(Inner {
                db: db.clone(),
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
                forms: Arc::new(elicitation::Forms::new(db, notices.clone())),
                notices,
            }),
        }
    }

    /// The executor to register with `Checkpoint::register_provider(Provider::Mcp, ..)`.
    pub fn executor(&self) -> Arc<dyn ToolExecutor> {
        Arc::new(McpExecutor { inner: self.inner.clone() })
    }

    /// Publishes the cached tools (so Gatehouse starts with the last known tools even when a
    /// server is down), then starts one supervisor per server.
    pub async fn start(&self) -> Result<(), McpError> {
        {
            let mut conn = self.inner.db.pool.acquire().await?;
            for id in self.inner.servers.keys() {
                db::mcp::ensure_server(&mut conn, id).await?;
                if let (Some(row), Some(server)) = (db::mcp::server(&mut conn, id).await?, self.inner.servers.get(id)) {
                    server.follow_switch(row.enabled_override);
                }
                // An OAuth server without a stored login starts withheld, not failing call by call.
                if let Some(server) = self.inner.servers.get(id).filter(|s| s.config.auth == AuthMode::Oauth) {
                    let row = db::mcp_oauth::get(&mut conn, id).await?;
                    let missing = match &row {
                        None => Some("not logged in yet".to_string()),
                        Some(r) if r.state != db::mcp_oauth::State::Connected => Some(r.reason.clone().unwrap_or_else(|| "not logged in".into())),
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

    /// Follows the decisions made in other processes (an owner's approval, rejection, disable or
    /// enable on another `serve`'s console, or with `gatehouse mcp ...`, and what another
    /// process's discovery found): every `every`, what the database says of the servers'
    /// switches and the tools' states is compared with what this process saw last. On a change
    /// each server follows its switch (its supervisor stops, or reconnects) and the catalog is
    /// rebuilt. Before, a process learned of them at its next discovery, or, for a server
    /// enabled again, only at a restart.
    pub async fn follow_decisions(self, every: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen: Option<Vec<u8>> = None;
        loop {
            if *shutdown.borrow_and_update() {
                return;
            }
            tokio::select! {
                _ = tick.tick() => {}
                changed = shutdown.changed() => if changed.is_err() { return },
            }
            match self.decisions().await {
                Ok((digest, switches)) if seen.as_ref() != Some(&digest) => {
                    for (id, enabled_override) in switches {
                        if let Some(server) = self.inner.servers.get(&id) {
                            server.follow_switch(enabled_override);
                        }
                    }
                    match self.rebuild().await {
                        Ok(()) => seen = Some(digest),
                        Err(e) => tracing::warn!(error = %e, "rebuilding the MCP catalog after decisions made elsewhere failed; tried again at the next poll"),
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not read the MCP decisions; checking again at the next poll"),
            }
        }
    }

    /// A digest of the servers' switches and the tools' states, and each server's switch.
    async fn decisions(&self) -> Result<(Vec<u8>, Vec<(String, Option<bool>)>), McpError> {
        use sha2::{Digest, Sha256};
        let mut conn = self.inner.db.pool.acquire().await?;
        let switches: Vec<(String, Option<bool>)> = db::mcp::servers(&mut conn).await?.into_iter().map(|s| (s.id, s.enabled_override)).collect();
        let tools = db::mcp::tool_states(&mut conn).await?;
        let mut h = Sha256::new();
        for (id, switch) in &switches {
            h.update(format!("{id}\0{switch:?}\n").as_bytes());
        }
        for t in &tools {
            h.update(format!("{t:?}\n").as_bytes());
        }
        Ok((h.finalize().to_vec(), switches))
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

    /// Each configured server's id, whether it is enabled now, and the environment variables its
    /// `mcp.toml` entry names for secrets.
    pub fn secret_vars(&self) -> Vec<(String, bool, Vec<String>)> {
        self.inner.servers.values().map(|s| (s.config.id.clone(), *s.enabled.borrow(), s.config.secret_vars().into_iter().map(str::to_string).collect())).collect()
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
