//! The HTTP face: console pages and server functions (Leptos), operations endpoints and
//! static assets. Web code only exposes; the engine lives elsewhere.

pub mod assets;
pub mod console;
pub mod live;
pub mod middleware;
pub mod ops;
pub mod serve;
pub mod session_store;
pub mod simulator;
pub mod state;

use std::sync::Arc;

use app::{App, backend::SharedBackend, shell};
use axum::{
    Extension, Router,
    http::{StatusCode, header},
    middleware::{from_fn, from_fn_with_state, map_response},
    response::{Html, IntoResponse},
    routing::get,
};
use leptos::prelude::*;
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tower::ServiceBuilder;
use tower_http::{
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    LatencyUnit,
    trace::{DefaultOnResponse, TraceLayer},
};
use tower_sessions::{Expiry, SessionManagerLayer, cookie::SameSite};

pub use state::AppState;

const STYLESHEET: &str = include_str!("../../../style/gatehouse.css");

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "gatehouse_session";

/// The console's routes, generated once per process.
///
/// Generating runs the app with resource loading switched off, and leptos_server keeps that switch
/// in one process-wide flag (`SuppressResourceLoad`). A page whose data starts loading while any
/// thread generates routes waits for that data forever. Generating once, before the first router
/// exists, means no page can be rendering at that moment, however many routers are built.
fn console_routes() -> Vec<AxumRouteListing> {
    static ROUTES: std::sync::OnceLock<Vec<AxumRouteListing>> = std::sync::OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// Builds the whole router. Tests call this and drive it with `oneshot`.
/// `/metrics` alone, for `server.metrics_addr`; its answers carry `X-Request-Id` as the
/// console's do.
pub fn metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(ops::metrics)).with_state(state).layer(
        ServiceBuilder::new()
            .layer(from_fn(middleware::sanitize_request_id))
            .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
            .layer(PropagateRequestIdLayer::x_request_id()),
    )
}

pub fn router(state: AppState) -> Router {
    let backend: SharedBackend = Arc::new(console::ConsoleBackend::new(state.clone()));
    let site_root = state.config.settings.server.site_root.clone();
    let leptos_options = LeptosOptions::builder()
        .output_name(assets::output_name(&site_root.join("pkg")))
        .site_root(site_root.display().to_string())
        .site_pkg_dir("pkg")
        .site_addr(state.listen_addr)
        .build();
    let routes = console_routes();

    let store = session_store::DbSessionStore::new(state.db.clone());
    let idle = state.config.settings.auth.session_idle_timeout;
    let idle = time::Duration::seconds(i64::try_from(idle.as_secs()).unwrap_or(i64::MAX).max(1));
    let sessions = SessionManagerLayer::new(store)
        .with_name(SESSION_COOKIE)
        .with_http_only(true)
        .with_same_site(SameSite::Strict)
        .with_secure(state.secure_cookies())
        .with_expiry(Expiry::OnInactivity(idle))
        // Saved when changed: a signed-in owner's own request marks it (see
        // middleware::console_guard), which slides the idle expiry forward; a live refetch does not.
        .with_always_save(false);

    let guard = middleware::GuardState { state: state.clone(), backend: backend.clone(), slide: Expiry::OnInactivity(idle) };
    let context_backend = backend.clone();
    let shell_options = leptos_options.clone();
    let pkg_dir = site_root.join("pkg");

    let console: Router<LeptosOptions> = Router::new()
        .leptos_routes_with_context(
            &leptos_options,
            routes,
            move || {
                provide_context(context_backend.clone());
                // leptos_axum has made this page's nonce (its hydration scripts carry it) before
                // this runs, and sets these headers once the page's first part is ready.
                if let (Some(nonce), Some(res)) = (leptos::nonce::use_nonce(), use_context::<leptos_axum::ResponseOptions>())
                    && let Ok(policy) = header::HeaderValue::from_str(&middleware::page_policy(&nonce.to_string()))
                {
                    res.insert_header(header::CONTENT_SECURITY_POLICY, policy);
                }
            },
            move || shell(shell_options.clone()),
        );
    // Owner-only endpoints outside Leptos sit behind the same guard and session layer.
    let owner_api = Router::new()
        .route(app::live::EVENTS_STREAM, get(live::events_stream))
        .route(app::pages::mcp::MCP_STREAM, get(live::mcp_stream))
        // The streams check their session again while they stay open.
        .layer(Extension(backend.clone()))
        .with_state(state.clone())
        .merge(simulator::routes(state.clone()))
        .merge(console::oauth_routes::owner_routes(state.clone()));
    let console = console
        .with_state(leptos_options)
        .merge(owner_api)
        .layer(from_fn(middleware::refuse_nul))
        .layer(map_response(middleware::server_fn_status))
        .layer(from_fn_with_state(guard, middleware::console_guard))
        .layer(sessions);

    let ops = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/assets/gatehouse.css", get(stylesheet))
        .merge(assets::pkg_routes(pkg_dir));
    // With server.metrics_addr set, /metrics is served there only (see `metrics_router`).
    let ops = if state.config.settings.server.metrics_addr.is_none() { ops.route("/metrics", get(ops::console_metrics)) } else { ops };
    let ops = ops.with_state(state.clone());

    // Authenticated by its signature, not a session: outside the console guard, and exempt
    // from the origin check (see middleware::check_origin).
    let webhooks = crate::channel::whatsapp::webhook::routes::<AppState>().with_state(state.clone());

    let ephemeral = state.config.settings.database.storage_warning().is_some();
    let router = Router::new().merge(console).merge(ops).merge(webhooks).merge(console::oauth_routes::callback_route()).fallback(not_found);
    let router = if ephemeral { router.layer(from_fn(middleware::storage_header)) } else { router };
    router
        .route_layer(from_fn(middleware::track_metrics))
        .layer(
            ServiceBuilder::new()
                .layer(from_fn(middleware::sanitize_request_id))
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
                    // The path only (query strings can carry tokens), without phone numbers.
                    tracing::info_span!("request", request_id = %id, method = %req.method(), path = %loggable_path(req.uri().path()))
                })
                .on_request(())
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO).latency_unit(LatencyUnit::Millis))
                .on_failure(log_failure))
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(from_fn_with_state(state.clone(), middleware::security_headers))
                .layer(from_fn_with_state(state.clone(), middleware::check_origin))
                .layer(from_fn_with_state(state, middleware::client_ip)),
        )
}

async fn stylesheet() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "public, max-age=300")], STYLESHEET)
}

async fn not_found() -> impl IntoResponse {
    metrics::counter!("http_requests_total", "route" => "unmatched", "status" => "404").increment(1);
    (StatusCode::NOT_FOUND, Html("<!DOCTYPE html><title>Not found</title><p>Not found. <a href=\"/\">Gatehouse console</a></p>"))
}

/// `path` for the request log: a segment holding a run of seven or more digits, once decoded and
/// read past the separators people write in phone numbers (a chat id such as
/// `/conversations/whatsapp/15551234567`, or `sim-%2B1%20555%20123%204567`), is written as
/// `{redacted}`, so that owners' and customers' numbers stay out of the logs.
/// Every request pays for this: a path with nothing to hide is returned as it is.
pub(crate) fn loggable_path(path: &str) -> std::borrow::Cow<'_, str> {
    let phone_like = |segment: &str| {
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        let digits: String = decoded.chars().filter(|c| !matches!(c, ' ' | '+' | '-' | '_' | '.' | '(' | ')')).collect();
        digits.as_bytes().split(|b| !b.is_ascii_digit()).any(|run| run.len() >= 7)
    };
    if !path.split('/').any(phone_like) {
        return path.into();
    }
    path.split('/').map(|segment| if phone_like(segment) { "{redacted}" } else { segment }).collect::<Vec<_>>().join("/").into()
}

/// A 5xx answer, logged by the request's span. A 503 is a refusal its handler chose and logged
/// once (no room on the disk, WhatsApp not configured, too many live streams), and its client
/// asks again (Meta redelivers a webhook post for days): an ERROR line a refused request would
/// bury the one that says why, so those are at DEBUG.
fn log_failure(class: tower_http::classify::ServerErrorsFailureClass, latency: std::time::Duration, _span: &tracing::Span) {
    let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
    match class {
        tower_http::classify::ServerErrorsFailureClass::StatusCode(axum::http::StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::debug!(latency_ms, "refused with 503");
        }
        other => tracing::error!(classification = %other, latency_ms, "response failed"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn logged_paths_leave_out_phone_numbers() {
        assert_eq!(super::loggable_path("/conversations/whatsapp/15551234567"), "/conversations/whatsapp/{redacted}");
        assert_eq!(super::loggable_path("/api/simulator/chats/sim-15551234567"), "/api/simulator/chats/{redacted}");
        assert_eq!(super::loggable_path("/api/simulator/chats/sim-%2B1%20555%20123%204567"), "/api/simulator/chats/{redacted}");
        assert_eq!(super::loggable_path("/api/simulator/chats/sim-+1_555_123_4567"), "/api/simulator/chats/{redacted}");
        assert_eq!(super::loggable_path("/jobs/123456"), "/jobs/123456", "ids stay");
        assert_eq!(super::loggable_path("/"), "/");
    }
}
