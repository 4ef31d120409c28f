//! Request middleware: metrics, CSRF origin check, client address, and the console guard that
//! sends visitors to /setup or /login and refuses protected server functions without a session.

use std::time::Instant;

use app::{
    api::PUBLIC_SERVER_FNS,
    backend::SharedBackend,
    error::AppError,
};
use axum::{
    Json,
    extract::{MatchedPath, Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};
use tower_sessions::Session;

mod client;
mod headers;

pub use client::{client_addr, client_ip, is_local};
pub use headers::{page_policy, sanitize_request_id, security_headers, storage_header};

use super::state::AppState;

/// The most of a console request's form body [`refuse_nul`] reads: axum's own default limit.
const FORM_LIMIT: usize = 2 * 1024 * 1024;

/// A NUL character in a console request's address (`%00` in a page's filter, a server
/// function's path or query) or a server function's form is refused with 400 `INVALID_INPUT`:
/// no owner types one, and PostgreSQL refuses it in text, so a filter holding one would fail as
/// a server error. JSON bodies (the simulator's API) are left to their handlers, which remove it
/// as the WhatsApp intake does.
pub async fn refuse_nul(req: Request, next: Next) -> Response {
    let refused = |headers: &HeaderMap| error_answer(headers, StatusCode::BAD_REQUEST, &AppError::invalid("The request holds a NUL character (%00), which no field takes."));
    if req.uri().path().contains("%00") || req.uri().query().is_some_and(|q| q.contains("%00")) {
        return refused(req.headers());
    }
    let form = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    if !req.uri().path().starts_with("/api/") || !form {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        return error_answer(&parts.headers, StatusCode::PAYLOAD_TOO_LARGE, &AppError::invalid("The form is larger than the console takes."));
    };
    if bytes.windows(3).any(|w| w == b"%00") || bytes.contains(&0) {
        return refused(&parts.headers);
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// Whether the request comes from a browser navigating (a page, or a form posted without
/// scripts), which should get a page rather than JSON.
fn wants_html(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"))
}

/// An error as its caller reads it: JSON for scripts and server-function calls, a small page
/// with the code, the message and a way back for a browser.
fn error_answer(headers: &HeaderMap, status: StatusCode, e: &AppError) -> Response {
    if !wants_html(headers) {
        return json_error(status, &e.code, &e.message);
    }
    let back = same_site_referer(headers).unwrap_or_else(|| "/".into());
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{code} · Gatehouse</title><link rel=\"stylesheet\" href=\"/assets/gatehouse.css\"></head>\
         <body><main class=\"error-page\" data-error-code=\"{code}\"><h1>{title}</h1><p>{message}</p><p><code>{code}</code></p>\
         <p><a href=\"{back}\">Go back</a></p></main></body></html>",
        code = html_escape::encode_text(&e.code),
        title = if status.is_server_error() { "The console cannot answer right now" } else { "That request was not accepted" },
        message = html_escape::encode_text(&e.message),
        back = html_escape::encode_double_quoted_attribute(&back),
    );
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

/// The path (with query) of the page a browser came from, as a link on this site: only the
/// referer's path is taken (the origin check has already refused other sites' posts), and
/// never one that would leave the site (`//host/...`).
fn same_site_referer(headers: &HeaderMap) -> Option<String> {
    let referer = url::Url::parse(headers.get(header::REFERER)?.to_str().ok()?).ok()?;
    let path = referer.path();
    if !path.starts_with('/') || path.starts_with("//") {
        return None;
    }
    Some(match referer.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    })
}

/// Paths that are not console pages: they do their own checks (or need none).
fn is_page(path: &str) -> bool {
    !["/api/", "/pkg/", "/assets/", "/webhooks/"].iter().any(|p| path.starts_with(p))
        && !matches!(path, "/healthz" | "/readyz" | "/metrics" | "/favicon.ico" | crate::tools::mcp::CALLBACK_PATH)
}

/// A server function's error answered with the status its code calls for. An error its body
/// returns gets it from `app::auth::answer`; input that does not decode (a field missing, a
/// number that is not one) fails before the body runs, and server_fn answers that 500, an
/// ERROR in the log for a client's mistake. Such an answer is an [`AppError`] in JSON under the
/// `serverfnerror` header: its code decides.
pub async fn server_fn_status(res: Response) -> Response {
    const MAX_ERROR_BYTES: usize = 64 * 1024;
    if res.status() != StatusCode::INTERNAL_SERVER_ERROR || !res.headers().contains_key(leptos::server_fn::error::SERVER_FN_ERROR_HEADER) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BYTES).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    if let Ok(error) = serde_json::from_slice::<AppError>(&bytes)
        && let Ok(status) = StatusCode::from_u16(error.status())
    {
        parts.status = status;
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// Counts requests and observes latency by matched route, method and status.
pub async fn track_metrics(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = method_label(req.method());
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    let labels = [("route", route), ("method", method), ("status", status)];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", &labels).record(start.elapsed().as_secs_f64());
    res
}

/// The method as a metric label: the standard ones by name, any other as "other". A method is
/// any token a client sends (a 405 is counted too), and each label value makes a new series.
fn method_label(method: &axum::http::Method) -> String {
    use axum::http::Method;
    let known = [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS];
    if known.contains(method) { method.as_str().to_string() } else { "other".to_string() }
}

#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(ErrorBody { code, message })).into_response()
}

/// The origin a request claims to come from: `Origin`, else the origin of `Referer`.
fn request_origin(headers: &HeaderMap) -> Option<String> {
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        return Some(origin.trim_end_matches('/').to_string());
    }
    let referer = headers.get(header::REFERER).and_then(|v| v.to_str().ok())?;
    url::Url::parse(referer).ok().map(|u| u.origin().ascii_serialization())
}

/// Rejects state-changing requests whose Origin (or Referer) is not the console's own.
/// Webhooks are exempt: they are authenticated by signature instead.
pub async fn check_origin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if safe || req.uri().path().starts_with("/webhooks/") {
        return next.run(req).await;
    }
    match request_origin(req.headers()) {
        Some(origin) if state.allowed_origins.iter().any(|o| o.eq_ignore_ascii_case(&origin)) => next.run(req).await,
        other => {
            tracing::warn!(origin = other.as_deref().unwrap_or("none"), expected = %state.public_url, path = %super::loggable_path(req.uri().path()), "cross-origin request refused");
            json_error(StatusCode::FORBIDDEN, "CSRF_ORIGIN_MISMATCH", "This request did not come from the Gatehouse console.")
        }
    }
}

#[derive(Clone)]
pub struct GuardState {
    pub state: AppState,
    pub backend: SharedBackend,
    /// The idle expiry a session gets again with each of its owner's own requests.
    pub slide: tower_sessions::Expiry,
}

/// An owner's own request (a page, a form, a server function) keeps the session for another
/// `auth.session_idle_timeout`; a live update's refetch of the page (`x-gatehouse-live`) and the
/// event streams do not, so a console left open on a busy deployment still ends when its owner
/// stops using it. Only a signed-in owner's session is marked (and so saved): a visitor's
/// cookie never makes a row.
fn slide(session: &Session, req: &Request, expiry: tower_sessions::Expiry) {
    let path = req.uri().path();
    let live = req.headers().contains_key(app::live::LIVE_FETCH_HEADER) || path == app::live::EVENTS_STREAM || path == app::pages::mcp::MCP_STREAM;
    if !live {
        session.set_expiry(Some(expiry));
    }
}

/// First-run redirect, login redirect, and the server-function session check.
pub async fn console_guard(State(guard): State<GuardState>, session: Session, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let is_api = path.starts_with("/api/");
    if !is_api && !is_page(&path) {
        return next.run(req).await;
    }
    if is_api && PUBLIC_SERVER_FNS.contains(&path.as_str()) {
        return next.run(req).await;
    }
    if !is_api && let Some(clean) = without_linked_errors(req.uri(), req.headers()) {
        return Redirect::to(&clean).into_response();
    }
    let setup_done = match guard.state.setup_done().await {
        Ok(done) => done,
        Err(e) => {
            tracing::error!(error = %e, "cannot read setup state");
            return error_answer(req.headers(), StatusCode::SERVICE_UNAVAILABLE, &AppError::database_unavailable());
        }
    };
    if !is_api {
        if !setup_done {
            return if path == "/setup" { next.run(req).await } else { Redirect::to("/setup").into_response() };
        }
        if path == "/setup" {
            return Redirect::to("/login").into_response();
        }
    }
    let owner = match app::auth::owner_of(&session, &guard.backend).await {
        Ok(owner) => owner,
        Err(e) => return error_answer(req.headers(), StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &e),
    };
    match (owner.is_some(), is_api, path.as_str()) {
        (true, false, "/login") => Redirect::to("/").into_response(),
        (false, false, "/login") => next.run(req).await,
        (true, _, _) => {
            slide(&session, &req, guard.slide);
            let mut req = req;
            if let Some(me) = owner {
                // The owner this request was let in as: a route behind the guard takes it from
                // here rather than reading the session again (a second read could fail alone).
                req.extensions_mut().insert(me);
            }
            next.run(req).await
        }
        // A form posted from a page whose session ended meanwhile: to the login, then back to
        // that page.
        (false, true, _) if wants_html(req.headers()) => login_then(&same_site_referer(req.headers()).unwrap_or_else(|| "/".into())),
        (false, true, _) => {
            let err = AppError::unauthorized();
            json_error(StatusCode::UNAUTHORIZED, &err.code, &err.message)
        }
        (false, false, _) => login_then(&req.uri().path_and_query().map_or(path.clone(), |pq| pq.as_str().to_string())),
    }
}

/// The query parameters a refused form post is sent back with (Leptos's server functions
/// without JavaScript): the function's path and its error, which the page shows as its own.
const FORM_ERROR_PARAMS: [&str; 2] = ["__path", "__err"];

/// The page's own address without [`FORM_ERROR_PARAMS`], when it has them and did not come
/// from this console: a link anyone can send an owner would otherwise show the link's own text
/// as the console's error, on the console's own page. A form's refusal is sent back by this
/// console, so the browser says `Sec-Fetch-Site: same-origin`; a browser that says nothing
/// loses only the refusal's message.
fn without_linked_errors(uri: &axum::http::Uri, headers: &HeaderMap) -> Option<String> {
    let query = uri.query()?;
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    if !pairs.iter().any(|(k, _)| FORM_ERROR_PARAMS.contains(&k.as_str())) || headers.get("sec-fetch-site").is_some_and(|v| v == "same-origin") {
        return None;
    }
    let kept: Vec<&(String, String)> = pairs.iter().filter(|(k, _)| !FORM_ERROR_PARAMS.contains(&k.as_str())).collect();
    if kept.is_empty() {
        return Some(uri.path().to_string());
    }
    let mut rebuilt = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in kept {
        rebuilt.append_pair(k, v);
    }
    Some(format!("{}?{}", uri.path(), rebuilt.finish()))
}

/// To the login page, and after it to `target` (a path of this console).
fn login_then(target: &str) -> Response {
    let next_param: String = url::form_urlencoded::byte_serialize(target.as_bytes()).collect();
    Redirect::to(&format!("/login?next={next_param}")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page's form error comes from the console's own redirect, never from a link: the
    /// error's parameters are dropped from a page opened from anywhere else, and kept on one the
    /// console sent the browser back to.
    #[test]
    fn a_linked_error_is_dropped_from_the_page() {
        let uri = |s: &str| s.parse::<axum::http::Uri>().expect("uri");
        let from = |site: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(site) = site {
                h.insert("sec-fetch-site", site.parse().expect("value"));
            }
            h
        };
        let forged = uri("/login?next=%2Fjobs&__path=%2Fapi%2Flogin&__err=eyJjb2RlIjoiVU5BVVRIT1JJWkVEIn0");
        assert_eq!(without_linked_errors(&forged, &from(Some("none"))).as_deref(), Some("/login?next=%2Fjobs"));
        assert_eq!(without_linked_errors(&forged, &from(Some("cross-site"))).as_deref(), Some("/login?next=%2Fjobs"));
        assert_eq!(without_linked_errors(&forged, &from(None)).as_deref(), Some("/login?next=%2Fjobs"), "a browser that says nothing");
        assert_eq!(without_linked_errors(&uri("/approvals?__err=x"), &from(Some("same-site"))).as_deref(), Some("/approvals"));
        assert_eq!(without_linked_errors(&forged, &from(Some("same-origin"))), None, "the console's own redirect");
        assert_eq!(without_linked_errors(&uri("/jobs?state=failed"), &from(Some("none"))), None, "nothing to drop");
    }
}
