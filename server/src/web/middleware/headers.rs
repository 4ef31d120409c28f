//! Headers on every answer: the request id a caller may pass, the storage warning, and the
//! security headers (the Content-Security-Policy among them).

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::Response,
};

use crate::web::state::AppState;

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
