//! Shared state: one `AppState(Arc<App>)` handed to every handler.

use std::{
    net::SocketAddr,
    ops::Deref,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use metrics_exporter_prometheus::PrometheusHandle;

use crate::{
    config::LoadedConfig,
    jobs::JobQueue,
    tools::Checkpoint,
    db::{self, Db, DbError},
};

#[derive(Debug)]
pub struct App {
    pub config: LoadedConfig,
    pub db: Db,
    pub started: Instant,
    pub started_at_ms: i64,
    /// The address actually bound (after any port fallback).
    pub listen_addr: SocketAddr,
    /// Origins (`scheme://host[:port]`) that state-changing requests may come from.
    pub allowed_origins: Vec<String>,
    pub public_url: String,
    pub metrics: PrometheusHandle,
    /// Enqueues jobs and wakes this process's workers.
    pub jobs: JobQueue,
    /// The one checkpoint every tool call passes.
    pub tools: Arc<Checkpoint>,
    /// MCP servers: their tools join the checkpoint's catalog; `start()` runs them.
    pub mcp: crate::tools::mcp::McpManager,
    /// The conversation runtime (the simulator uses it directly; WhatsApp through its job).
    pub runtime: Arc<crate::conversation::Runtime>,
    /// WhatsApp webhook intake (group commit on SQLite).
    pub whatsapp_intake: crate::channel::whatsapp::intake::Intake,
    /// Once setup is done it stays done, so a true value is cached.
    setup_done: AtomicBool,
}

#[derive(Debug, Clone)]
pub struct AppState(pub Arc<App>);

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("setting up an HTTP client failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the language model cannot be set up: {0}")]
    Llm(#[from] crate::llm::LlmError),
}

impl Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

impl AppState {
    /// Fails when an HTTP client cannot be set up (TLS initialisation) or the model's key
    /// cannot be used at all.
    pub fn new(config: LoadedConfig, db: Db, listen_addr: SocketAddr, metrics: PrometheusHandle) -> Result<Self, StateError> {
        let (tools, mcp) = crate::tools::checkpoint_with_mcp(&config, &db)?;
        let runtime = Arc::new(crate::conversation::Runtime::from_config(&config, &db)?);
        let public_url = if config.settings.server.public_url.is_empty() {
            format!("http://{listen_addr}")
        } else {
            config.settings.server.public_url.trim_end_matches('/').to_string()
        };
        let mut allowed_origins = vec![
            url::Url::parse(&public_url).map(|u| u.origin().ascii_serialization()).unwrap_or_else(|_| public_url.clone()),
        ];
        // Without a configured URL on loopback, both names for this machine reach the console.
        if config.settings.server.public_url.is_empty() && listen_addr.ip().is_loopback() {
            allowed_origins.push(format!("http://localhost:{}", listen_addr.port()));
        }
        Ok(Self(Arc::new(App {
            config,
            db: db.clone(),
            started: Instant::now(),
            started_at_ms: db::now_ms(),
            listen_addr,
            allowed_origins,
            public_url,
            metrics,
            jobs: JobQueue::new(db.clone()),
            tools,
            mcp,
            runtime,
            whatsapp_intake: Default::default(),
            setup_done: AtomicBool::new(false),
        })))
    }

    /// Whether the first owner exists.
    pub async fn setup_done(&self) -> Result<bool, DbError> {
        if self.setup_done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let mut conn = self.db.pool.acquire().await?;
        let done = db::owners::setup_completed(&mut conn).await?;
        if done {
            self.setup_done.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// Cookies get `Secure` when the console is served over https.
    pub fn secure_cookies(&self) -> bool {
        url::Url::parse(&self.public_url).is_ok_and(|u| u.scheme() == "https")
    }

    /// The provider key variable to set, when the configured provider has no key.
    pub fn degraded(&self) -> Option<(&'static str, &'static str)> {
        crate::llm::degraded(&self.config.settings, &self.config.secrets).map(|d| (d.provider, d.variable))
    }
}
