//! `gatehouse serve` and `gatehouse worker`.

use server::{
    bootstrap::Gatehouse,
    config::LoadedConfig,
    tools::ToolFiles,
    web::{self, AppState},
};

use super::{Failure, build_service as build};

/// Strict mode refuses what degraded mode would run with.
fn refuse_if_strict(cfg: &LoadedConfig) -> Result<(), Failure> {
    if cfg.settings.server.strict
        && let Some(d) = server::llm::degraded(&cfg.settings, &cfg.secrets)
    {
        tracing::error!(provider = d.provider, variable = d.variable, "strict mode: no key for the LLM provider; not starting");
        return Err(Failure::runtime(format!("strict mode (server.strict or GATEHOUSE_STRICT): {} is not set for the {} provider", d.variable, d.provider)));
    }
    Ok(())
}

/// A database that will not survive a restart is said once a minute, for as long as it runs.
fn warn_about_storage(database: &server::config::DatabaseSettings) {
    let Some(warning) = database.storage_warning() else { return };
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            every.tick().await;
            tracing::warn!("ephemeral storage: {warning}; set database.url to a lasting file or PostgreSQL");
        }
    });
}

pub async fn serve(mut cfg: LoadedConfig, files: ToolFiles) -> Result<(), Failure> {
    refuse_if_strict(&cfg)?;
    let server = cfg.settings.server.clone();
    let listener = web::serve::bind_with_fallback(server.addr, server.strict_port).await.map_err(|e| {
        tracing::error!(addr = %server.addr, error = %e, "cannot listen");
        Failure::runtime(format!("cannot listen on {}: {e}", server.addr))
    })?;
    let addr = listener.local_addr().map_err(Failure::runtime)?;
    // Bound before anything is built: what is built names the console by the address it listens
    // on (the next port when the configured one was taken, the one chosen for port 0), not the
    // configured one: an OAuth login's redirect, the links of owners' notices and of repairs.
    cfg.settings.server.addr = addr;
    let gatehouse = build(cfg, files).await?;
    let grace = server.shutdown_grace;
    let state = AppState::new(&gatehouse, addr, web::ops::metrics_handle());
    spawn_catalog_reload(&gatehouse);
    if let Err(e) = gatehouse.cycle.schedule().await {
        tracing::error!(error = %e, "the self-improvement cycle could not be scheduled");
    }
    if let Err(e) = gatehouse.retention.schedule().await {
        tracing::error!(error = %e, "the retention prune could not be scheduled");
    }
    if let Err(e) = state.mcp.start().await {
        tracing::error!(error = %e, "MCP servers could not start; their tools are not offered");
    }
    follow_catalog_reloads(&gatehouse);
    if let Some((provider, var)) = state.degraded() {
        tracing::warn!(provider, variable = var, "no LLM provider key: running in degraded mode. Set {var} to enable replies from the model");
    }
    warn_about_storage(&gatehouse.config.settings.database);
    for warning in gatehouse.config.settings.server.exposure_warnings(gatehouse.config.secrets.metrics_token.is_some()) {
        tracing::warn!("{warning}");
    }
    if let Some(warning) = gatehouse.config.settings.approvals.window_warning(&gatehouse.config.settings.whatsapp.window_template) {
        tracing::warn!("{warning}");
    }
    server::owners::storage_notice::spawn(gatehouse.db.clone(), gatehouse.jobs.clone(), gatehouse.config.settings.database.clone(), std::time::Duration::from_secs(60));
    web::session_store::DbSessionStore::new(gatehouse.db.clone()).spawn_cleanup(std::time::Duration::from_secs(600));
    let setup_done = state.setup_done().await.map_err(Failure::runtime)?;
    let links = gatehouse.config.settings.server.console_url();
    tracing::info!(addr = %addr, url = %state.public_url, links = %links, database = gatehouse.db.backend.as_str(), "Gatehouse listening");
    if !setup_done {
        let token_problem = server::owners::setup_token_problem(state.config.secrets.setup_token.as_ref());
        if let Some(problem) = &token_problem {
            tracing::warn!("{problem}");
        }
        let from_elsewhere = if state.config.secrets.setup_token.is_some() && token_problem.is_none() { "; from another machine, /setup?token=<GATEHOUSE_SETUP_TOKEN>" } else { "" };
        tracing::info!("first run: open {}/setup on this machine to create the first owner{from_elsewhere}", state.public_url);
    }
    let router = web::router(state.clone());
    let shutdown = web::serve::shutdown_watch();
    // Metrics on an address of their own: bound before anything is served, so a taken port
    // stops the start instead of silently losing the metrics.
    let metrics = match server.metrics_addr {
        Some(at) => {
            let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
                tracing::error!(addr = %at, error = %e, "cannot listen for metrics");
                Failure::runtime(format!("cannot listen for metrics on {at} (server.metrics_addr): {e}"))
            })?;
            let bound = listener.local_addr().map_err(Failure::runtime)?;
            tracing::info!(addr = %bound, "metrics listening");
            Some(tokio::spawn(web::serve::serve(listener, web::metrics_router(state.clone()), grace, shutdown.clone())))
        }
        None => None,
    };
    release_waiting(&gatehouse).await;
    let worker = gatehouse.config.settings.jobs.worker_in_serve.then(|| tokio::spawn(gatehouse.worker().run(shutdown.clone())));
    web::serve::serve(listener, router, grace, shutdown).await.map_err(Failure::runtime)?;
    let _ = tokio::time::timeout(grace, state.mcp.shutdown()).await;
    if let Some(worker) = worker {
        let _ = worker.await;
    }
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    // Spans and metrics still queued are sent before the database they are read from closes.
    if tokio::time::timeout(grace, gatehouse.telemetry.shutdown()).await.is_err() {
        tracing::warn!(code = "TELEMETRY_EXPORT_FAILED", "OpenTelemetry data still unsent after the grace period; exiting anyway");
    }
    if tokio::time::timeout(grace, gatehouse.db.close()).await.is_err() {
        tracing::warn!("database connections still busy after the grace period; exiting anyway");
    }
    tracing::info!("stopped");
    Ok(())
}

/// The jobs that waited on the deployment run now: this start may be the operator's fix.
async fn release_waiting(gatehouse: &Gatehouse) {
    match gatehouse.release_waiting().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "jobs that waited on the deployment (room on the disk, the access token, the account) run now"),
        Err(e) => tracing::warn!(error = %e, "could not release the jobs waiting on the deployment; they run at the end of their wait"),
    }
}

/// Reloads and MCP decisions made in the deployment's other processes are followed here,
/// checked every `jobs.poll_interval`; started once the MCP servers have (a reload publishes
/// their tools).
fn follow_catalog_reloads(gatehouse: &Gatehouse) {
    let every = gatehouse.config.settings.jobs.poll_interval;
    tokio::spawn(gatehouse.reloads.clone().follow(every, web::serve::shutdown_watch()));
    tokio::spawn(gatehouse.mcp.clone().follow_decisions(every, web::serve::shutdown_watch()));
}

/// SIGHUP reloads the tool catalog (tools.toml, connectors.toml) without a restart, in `serve`
/// and in `worker` alike (a worker's jobs plan and call tools too; without this, the signal
/// would end it). Calls in flight keep the version they started with; a file with problems is
/// refused and the current catalog kept. A reload made here, by the signal or the console, is
/// told to the deployment's other processes.
fn spawn_catalog_reload(gatehouse: &Gatehouse) {
    // Installed before this returns, so a hangup sent after the process says it started is
    // never the default one (which ends the process).
    #[cfg(unix)]
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
    #[cfg(unix)]
    let reloads = gatehouse.reloads.clone();
    #[cfg(unix)]
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reloads.reload().await {
                Ok(report) => tracing::info!(tools = report.tools, "SIGHUP: tool catalog reloaded"),
                Err(e) => tracing::error!(error = %e, "tool catalog reload failed; keeping the current catalog"),
            }
        }
    });
}

pub async fn worker(cfg: LoadedConfig, files: ToolFiles) -> Result<(), Failure> {
    refuse_if_strict(&cfg)?;
    let gatehouse = build(cfg, files).await?;
    warn_about_storage(&gatehouse.config.settings.database);
    spawn_catalog_reload(&gatehouse);
    tracing::info!(database = gatehouse.db.backend.as_str(), queue = %gatehouse.config.settings.jobs.queue, "worker process starting");
    // The jobs a worker runs (messages, tool calls, the self-improvement cycle) call MCP tools
    // as `serve` does: it keeps its own sessions with the servers.
    if let Err(e) = gatehouse.mcp.start().await {
        tracing::error!(error = %e, "MCP servers could not start; their tools are not offered");
    }
    follow_catalog_reloads(&gatehouse);
    release_waiting(&gatehouse).await;
    gatehouse.worker().run(web::serve::shutdown_watch()).await;
    let grace = gatehouse.config.settings.server.shutdown_grace;
    let _ = tokio::time::timeout(grace, gatehouse.mcp.shutdown()).await;
    if tokio::time::timeout(grace, gatehouse.telemetry.shutdown()).await.is_err() {
        tracing::warn!(code = "TELEMETRY_EXPORT_FAILED", "OpenTelemetry data still unsent after the grace period; exiting anyway");
    }
    gatehouse.db.close().await;
    Ok(())
}
