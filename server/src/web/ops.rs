//! Operations endpoints: liveness, readiness and Prometheus metrics.

use std::time::Duration;

use app::auth::LocalPeer;
use axum::{
    Extension, Json,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::state::AppState;

pub async fn healthz() -> Response {
    Json(json!({ "status": "alive" })).into_response()
}

/// 200 when the database answers and every shipped migration is applied; 503 with a stable
/// code (`DATABASE_UNAVAILABLE`, `MIGRATIONS_UNREADABLE`, `MIGRATIONS_PENDING`) and a reason
/// otherwise.
pub async fn readyz(State(state): State<AppState>) -> Response {
    // Callers are unauthenticated: they get a fixed reason; the details go to the log.
    let check = async {
        state.db.ping().await.map_err(|e| {
            tracing::warn!(error = %e, "readiness: database unreachable");
            ("DATABASE_UNAVAILABLE", "database unreachable".to_string())
        })?;
        let pending = state.db.pending_migrations().await.map_err(|e| {
            tracing::warn!(error = %e, "readiness: cannot read applied migrations");
            ("MIGRATIONS_UNREADABLE", "cannot read the database's migrations".to_string())
        })?;
        if !pending.is_empty() {
            // Their names would tell anyone which build this is; the count is enough to act on.
            // Debug: a load balancer asks every few seconds.
            tracing::debug!(?pending, "readiness: migrations pending");
            return Err(("MIGRATIONS_PENDING", format!("{} migrations pending; run `gatehouse migrate`", pending.len())));
        }
        Ok::<(), (&str, String)>(())
    };
    match tokio::time::timeout(Duration::from_secs(3), check).await {
        Ok(Ok(())) => Json(json!({ "status": "ready" })).into_response(),
        Ok(Err((code, reason))) => unavailable(code, &reason),
        Err(_) => unavailable("DATABASE_UNAVAILABLE", "database did not answer within 3 s"),
    }
}

fn unavailable(code: &str, reason: &str) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "unavailable", "code": code, "reason": reason }))).into_response()
}

/// `/metrics` on the console's address, which is the webhook's and so reached from the
/// internet: without `GATEHOUSE_METRICS_TOKEN` only a request made on this machine gets them
/// (the rule first-run setup follows, [`crate::web::middleware::client::is_local`]), and
/// anyone else 403 `METRICS_NOT_LOCAL`. Tool, MCP server and job figures are the business's
/// own, not the world's.
pub async fn console_metrics(State(state): State<AppState>, local: Option<Extension<LocalPeer>>, headers: HeaderMap) -> Response {
    let local = local.is_some_and(|Extension(LocalPeer(local))| local);
    if state.config.secrets.metrics_token.is_none() && !local {
        let body = Json(json!({
            "code": "METRICS_NOT_LOCAL",
            "message": "/metrics on this address answers only this machine: set GATEHOUSE_METRICS_TOKEN and send Authorization: Bearer <token>, or serve it on a private address (server.metrics_addr)"
        }));
        return (StatusCode::FORBIDDEN, body).into_response();
    }
    metrics(State(state), headers).await
}

/// Prometheus metrics. With `GATEHOUSE_METRICS_TOKEN` set, only a request with that bearer
/// token gets them (401 `METRICS_UNAUTHORIZED` otherwise).
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.config.secrets.metrics_token {
        use secrecy::ExposeSecret;
        use subtle::ConstantTimeEq;
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or_default();
        if !bool::from(given.as_bytes().ct_eq(token.expose_secret().as_bytes())) {
            let body = Json(json!({ "code": "METRICS_UNAUTHORIZED", "message": "send Authorization: Bearer <GATEHOUSE_METRICS_TOKEN>" }));
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
        }
    }
    metrics::gauge!("gatehouse_uptime_seconds").set(state.started.elapsed().as_secs_f64());
    metrics::gauge!("database_storage_full").set(if state.db.storage().full().is_some() { 1.0 } else { 0.0 });
    if let Some(last) = state.db.storage().last_full_ms() {
        metrics::gauge!("database_storage_full_last_seconds").set(last as f64 / 1000.0);
    }
    if let Some(free) = state.db.free_bytes() {
        metrics::gauge!("database_free_bytes").set(free as f64);
    }
    let now = std::time::Instant::now();
    for tool in state.tools.catalog().all() {
        let name = tool.spec.name.clone();
        let value = match state.tools.breakers().state(&name, now) {
            crate::tools::breaker::BreakerState::Closed => 0.0,
            crate::tools::breaker::BreakerState::HalfOpen => 1.0,
            crate::tools::breaker::BreakerState::Open => 2.0,
        };
        metrics::gauge!("tool_breaker_state", "tool" => name).set(value);
    }
    for (server, health, tools) in state.mcp.health_gauges() {
        metrics::gauge!("mcp_server_health", "server" => server.clone()).set(health);
        metrics::gauge!("mcp_server_tools", "server" => server).set(tools as f64);
    }
    // Counting jobs reads the whole table: at most once per maintenance interval, however
    // often (or however many) scrapers ask; between reads the gauges keep the last counts.
    let mut last = state.job_counts_read.lock().await;
    let every = state.config.settings.jobs.maintenance_interval;
    if last.is_none_or(|at| at.elapsed() >= every)
        && let Ok(mut conn) = state.db.pool.acquire().await
        && let Ok(counts) = crate::db::jobs::counts_by_state(&mut conn).await
    {
        *last = Some(std::time::Instant::now());
        for s in crate::db::jobs::JobState::ALL {
            let n = counts.iter().find(|(st, _)| *st == s).map_or(0, |(_, n)| *n);
            metrics::gauge!("jobs", "state" => s.as_str()).set(n as f64);
        }
    }
    drop(last);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn metrics_handle() -> metrics_exporter_prometheus::PrometheusHandle {
    use std::sync::OnceLock;
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("duration_seconds".into()),
                    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
                ).map(|b| b.build_recorder());
            let recorder = match recorder {
                Ok(r) => r,
                Err(_) => metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
            };
            let handle = recorder.handle();
            // Fails only if another recorder was installed first, which this process never does.
            let _ = metrics::set_global_recorder(recorder);
            metrics::gauge!("gatehouse_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                })
                .ok();
            handle
        })
        .clone()
}
