//! Shared state: one `AppState(Arc<App>)` handed to every handler, made from the parts the
//! composition root built. Handlers that need less take a narrow state through `FromRef`.

use std::{
    net::SocketAddr,
    ops::Deref,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use axum::extract::FromRef;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::{
    approvals::Approvals,
    budget::Budget,
    bootstrap::Gatehouse,
    channel::{
        simulator::Simulator,
        whatsapp::{WhatsAppSender, webhook::WebhookState},
    },
    config::LoadedConfig,
    conversation::Runtime,
    db::{self, Db, DbError},
    events::Events,
    jobs::{FollowUps, JobQueue},
    repairs::cycle::Cycle,
    tools::{Checkpoint, mcp::McpManager},
};

#[derive(Debug)]
pub struct App {
    pub config: Arc<LoadedConfig>,
    pub db: Db,
    pub started: Instant,
    pub started_at_ms: i64,
    /// The address actually bound (after any port fallback).
    pub listen_addr: SocketAddr,
    /// Origins (`scheme://host[:port]`) that state-changing requests may come from.
    pub allowed_origins: Vec<String>,
    pub public_url: String,
    pub metrics: PrometheusHandle,
    pub jobs: JobQueue,
    /// What follows an owner's cancel of a job, by kind (the job registry's).
    pub follow_ups: FollowUps,
    pub events: Events,
    /// Live streams open per owner session (`events.max_streams_per_session`).
    pub streams: super::live::StreamSlots,
    pub tools: Arc<Checkpoint>,
    pub mcp: McpManager,
    /// Catalog reloads, told to the other processes of the deployment.
    pub reloads: crate::tools::Reloads,
    pub runtime: Arc<Runtime>,
    pub approvals: Arc<Approvals>,
    pub budget: Arc<Budget>,
    pub simulator: Arc<Simulator>,
    /// Self-improvement: findings, eval cases, repair proposals.
    pub cycle: Cycle,
    pub webhook: WebhookState,
    /// WhatsApp's sender, for whether Meta refuses the access token.
    pub whatsapp_sender: Arc<WhatsAppSender>,
    /// Once setup is done it stays done, so a true value is cached.
    setup_done: AtomicBool,
    /// `public_url` is https (read once; every response asks, for its HSTS header).
    secure: bool,
    /// When the job counts on `/metrics` were last read: a scrape reads the jobs table at most
    /// once per `jobs.maintenance_interval`.
    pub job_counts_read: tokio::sync::Mutex<Option<Instant>>,
}

#[derive(Debug, Clone)]
pub struct AppState(pub Arc<App>);

impl Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

impl FromRef<AppState> for WebhookState {
    fn from_ref(state: &AppState) -> Self {
        state.webhook.clone()
    }
}

impl AppState {
    pub fn new(gatehouse: &Gatehouse, listen_addr: SocketAddr, metrics: PrometheusHandle) -> Self {
        let config = gatehouse.config.clone();
        let public_url = config.settings.server.console_url_at(listen_addr);
        let secure = url::Url::parse(&public_url).is_ok_and(|u| u.scheme() == "https");
        let mut allowed_origins = vec![
            url::Url::parse(&public_url).map(|u| u.origin().ascii_serialization()).unwrap_or_else(|_| public_url.clone()),
        ];
        // Without a configured URL on loopback, both names for this machine reach the console.
        if config.settings.server.public_url.is_empty() && listen_addr.ip().is_loopback() {
            allowed_origins.push(format!("http://localhost:{}", listen_addr.port()));
        }
        Self(Arc::new(App {
            config,
            db: gatehouse.db.clone(),
            started: Instant::now(),
            started_at_ms: db::now_ms(),
            listen_addr,
            allowed_origins,
            public_url,
            metrics,
            jobs: gatehouse.jobs.clone(),
            follow_ups: gatehouse.registry.follow_ups().clone(),
            events: gatehouse.events.clone(),
            streams: super::live::StreamSlots::default(),
            tools: gatehouse.tools.clone(),
            mcp: gatehouse.mcp.clone(),
            reloads: gatehouse.reloads.clone(),
            runtime: gatehouse.runtime.clone(),
            approvals: gatehouse.approvals.clone(),
            budget: gatehouse.budget.clone(),
            simulator: gatehouse.simulator.clone(),
            cycle: gatehouse.cycle.clone(),
            webhook: gatehouse.whatsapp.webhook.clone(),
            whatsapp_sender: gatehouse.whatsapp.sender.clone(),
            setup_done: AtomicBool::new(false),
            secure,
            job_counts_read: tokio::sync::Mutex::new(None),
        }))
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
        self.secure
    }

    /// The provider key variable to set, when the configured provider has no key.
    pub fn degraded(&self) -> Option<(&'static str, &'static str)> {
        crate::llm::degraded(&self.config.settings, &self.config.secrets).map(|d| (d.provider, d.variable))
    }
}
