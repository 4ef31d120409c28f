//! Request middleware: metrics, CSRF origin check, client address, and the console guard that
//! sends visitors to /setup or /login and refuses protected server functions without a session.

use std::{
    net::{IpAddr, SocketAddr},
    time::Instant,
};

use app::{
    api::PUBLIC_SERVER_FNS,
    auth::{ClientIp, LocalPeer},
    backend::SharedBackend,
    error::AppError,
};
use axum::{
    Json,
    extract::{ConnectInfo, MatchedPath, Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};
use tower_sessions::Session;

use super::state::AppState;
use crate::config::net::{IpNet, canonical};

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

/// Puts the client's address into request extensions for the login throttle and the audit: the
/// connection's peer, or, when the peer is one of `server.trusted_proxies`, the address that
/// proxy gives in `server.client_ip_header` (see [`client_addr`]).
pub async fn client_ip(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let server = &state.config.settings.server;
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let ip = client_addr(peer, req.headers(), &server.trusted_proxies, &server.client_ip_header);
    let local = is_local(peer, req.headers(), server);
    req.extensions_mut().insert(ClientIp(ip));
    req.extensions_mut().insert(LocalPeer(local));
    next.run(req).await
}

/// Whether a request from `peer` came from this machine itself: a loopback peer that is not a
/// trusted proxy, with none of the headers a proxy adds (`Forwarded`, `X-Forwarded-For`,
/// `X-Real-IP`, or the configured client address header), to a console whose own address
/// (`server.public_url`) is this machine's. A proxy on this machine is a loopback peer for the
/// whole internet, and one left at its defaults adds no header: a console published under
/// another host is never local, whatever the request says.
pub fn is_local(peer: Option<IpAddr>, headers: &HeaderMap, server: &crate::config::ServerSettings) -> bool {
    let forwarded = ["forwarded", "x-forwarded-for", "x-real-ip", server.client_ip_header.as_str()].iter().any(|h| !h.is_empty() && headers.contains_key(*h));
    let published_here = server.public_url.is_empty() || url::Url::parse(&server.public_url).is_ok_and(|u| is_loopback_host(u.host()));
    let proxy = |ip: IpAddr| server.trusted_proxies.iter().any(|p| p.contains(ip));
    published_here && !forwarded && peer.map(canonical).is_some_and(|ip| ip.is_loopback() && !proxy(ip))
}

/// `localhost`, or a loopback address.
fn is_loopback_host(host: Option<url::Host<&str>>) -> bool {
    match host {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The client address of a request from `peer`. A proxy header is read only when `peer` is a
/// trusted proxy; in a comma-separated list (X-Forwarded-For) the rightmost address that is not
/// a trusted proxy is the client, since anything left of it came from the client itself. A
/// header that is absent or unreadable leaves the peer.
pub fn client_addr(peer: Option<IpAddr>, headers: &HeaderMap, proxies: &[IpNet], header: &str) -> String {
    let Some(peer) = peer.map(canonical) else { return "unknown".into() };
    let trusted = |ip: IpAddr| proxies.iter().any(|p| p.contains(ip));
    if header.is_empty() || !trusted(peer) {
        return peer.to_string();
    }
    let listed: Vec<&str> = headers.get_all(header).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).collect();
    let mut client = None;
    for entry in listed.iter().rev() {
        let Some(ip) = parse_forwarded(entry) else { break };
        client = Some(ip);
        if !trusted(ip) {
            break;
        }
    }
    client.unwrap_or(peer).to_string()
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `::1` or `[::1]:5678`.
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    let ip = entry.parse::<IpAddr>().ok().or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))?;
    Some(canonical(ip))
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

/// A caller may pass its own `X-Request-Id` (e.g. a proxy's) when it is a plain token; anything
/// else is dropped and replaced, so logs never carry caller-chosen text.
pub async fn sanitize_request_id(mut req: Request, next: Next) -> Response {
    let keep = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).is_some_and(|v| {
        (1..=64).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    if !keep {
        req.headers_mut().remove("x-request-id");
    }
    next.run(req).await
}

/// Says on every response that the database will not survive a restart (seed 003 WS-1.4), so
/// a test or a load balancer can see it as well as an owner.
pub async fn storage_header(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    res.headers_mut().insert("x-gatehouse-storage", header::HeaderValue::from_static("ephemeral"));
    res
}

/// The Content-Security-Policy of an answer that is not a console page: no script at all.
const OTHER_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'";

/// The Content-Security-Policy of a console page rendered with `nonce`: its scripts are the
/// hydration script Leptos writes with that nonce and the site's own files (the islands' wasm,
/// compiled under `'wasm-unsafe-eval'`), so text a chat, a tool or an MCP server put on the
/// page cannot run even if it ever escaped its escaping. No `form-action`: starting an MCP
/// login is a form whose answer sends the browser on to that server's sign-in page.
pub fn page_policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )
}

/// HTML and API answers are private and must not be cached or framed. Behind https
/// (`server.public_url`), browsers are also told to come back over https only
/// (`Strict-Transport-Security`), so a first visit typed as http:// cannot be downgraded.
pub async fn security_headers(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let is_static = req.uri().path().starts_with("/pkg/") || req.uri().path().starts_with("/assets/");
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    if state.secure_cookies() {
        h.insert(header::STRICT_TRANSPORT_SECURITY, header::HeaderValue::from_static("max-age=31536000"));
    }
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("same-origin"));
    // A console page set its own policy, with its nonce (see `page_policy`); anything else
    // (JSON, the small error pages, the stylesheet) may load nothing but that stylesheet.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static(OTHER_POLICY));
    }
    if !is_static {
        h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    }
    res
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

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().expect("net")).collect()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_proxy() {
        let peer = Some("10.0.0.2".parse().expect("ip"));
        let forwarded = headers(&["203.0.113.9"]);
        assert_eq!(client_addr(peer, &forwarded, &[], "x-forwarded-for"), "10.0.0.2", "no proxy trusted by default");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.0.0.0/24"]), ""), "10.0.0.2", "no header configured");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.9.0.1"]), "x-forwarded-for"), "10.0.0.2", "another proxy is trusted");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.0.0.0/24"]), "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(Some("::ffff:10.0.0.2".parse().expect("ip")), &forwarded, &nets(&["10.0.0.2"]), "x-forwarded-for"), "203.0.113.9");
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        let peer = Some("10.0.0.2".parse().expect("ip"));
        let proxies = nets(&["10.0.0.0/24"]);
        // A client can prepend anything; only what the proxies appended counts.
        assert_eq!(client_addr(peer, &headers(&["1.1.1.1, 203.0.113.9, 10.0.0.3"]), &proxies, "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(peer, &headers(&["1.1.1.1", "203.0.113.9:4711"]), &proxies, "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(peer, &headers(&["[2001:db8::5]:443"]), &proxies, "x-forwarded-for"), "2001:db8::5");
        assert_eq!(client_addr(peer, &headers(&["not an address"]), &proxies, "x-forwarded-for"), "10.0.0.2", "unreadable: the peer");
        assert_eq!(client_addr(peer, &HeaderMap::new(), &proxies, "x-forwarded-for"), "10.0.0.2", "absent: the peer");
        assert_eq!(client_addr(None, &HeaderMap::new(), &proxies, "x-forwarded-for"), "unknown");
    }
}
