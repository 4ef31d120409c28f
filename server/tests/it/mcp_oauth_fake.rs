//! A local OAuth 2.1 authorization server and an MCP server it protects, on one loopback port,
//! speaking the real wire formats: protected resource metadata (RFC 9728), authorization server
//! metadata (RFC 8414), dynamic client registration, the authorization code flow with PKCE
//! (S256, checked), rotating refresh tokens (a reused one is refused), and Streamable HTTP
//! JSON-RPC behind `Authorization: Bearer`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Form, Json, Router,
    extract::{Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use serde_json::{Value, json};
use sha2::Digest;

#[derive(Default)]
pub struct Inner {
    /// Lifetime of the tokens a login issues (0: due for a refresh at once).
    pub login_expires_in: u64,
    pub reject_refresh: bool,
    /// Every access token is refused (as after a revocation).
    pub revoked: bool,
    /// Hold the first refresh until a second one arrives or this long passes.
    pub hold_first_refresh: Option<Duration>,
    pub refresh_grants: usize,
    pub tool_calls: usize,
    pub valid_access: Vec<String>,
    pub current_refresh: Option<String>,
    /// Every token this server issued (access and refresh).
    pub issued: Vec<String>,
    pub last_bearer: Option<String>,
    challenges: HashMap<String, String>,
    /// Clients registered so far: each registration gets a client id of its own.
    pub registrations: usize,
    /// The client id each code and refresh token was issued to: a refresh by another client
    /// is refused (RFC 6749 §6), as real authorization servers do.
    issued_to: HashMap<String, String>,
}

#[derive(Clone)]
pub struct Fake {
    pub base: String,
    pub state: Arc<Mutex<Inner>>,
    second_refresh: Arc<tokio::sync::Notify>,
}

impl Fake {
    pub async fn start(login_expires_in: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://127.0.0.1:{}", listener.local_addr().expect("addr").port());
        let fake = Self { base, state: Arc::new(Mutex::new(Inner { login_expires_in, ..Inner::default() })), second_refresh: Arc::default() };
        let app = Router::new()
            .route("/mcp", post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }))
            .route("/.well-known/oauth-protected-resource/mcp", get(prm))
            .route("/.well-known/oauth-authorization-server", get(as_metadata))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve fake") });
        fake
    }

    pub fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.state.lock().expect("fake state"))
    }
}

fn new_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

async fn prm(State(f): State<Fake>) -> Json<Value> {
    Json(json!({ "resource": f.url(), "authorization_servers": [f.base], "scopes_supported": ["crm.read"] }))
}

async fn as_metadata(State(f): State<Fake>) -> Json<Value> {
    Json(json!({
        "issuer": f.base,
        "authorization_endpoint": format!("{}/authorize", f.base),
        "token_endpoint": format!("{}/token", f.base),
        "registration_endpoint": format!("{}/register", f.base),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": ["crm.read"],
    }))
}

async fn register(State(f): State<Fake>, Json(body): Json<Value>) -> Response {
    let client_id = f.with(|s| {
        s.registrations += 1;
        format!("gatehouse-client-{}", s.registrations)
    });
    (StatusCode::CREATED, Json(json!({ "client_id": client_id, "redirect_uris": body["redirect_uris"], "token_endpoint_auth_method": "none" }))).into_response()
}

async fn authorize(State(f): State<Fake>, Query(q): Query<HashMap<String, String>>) -> Response {
    let code = format!("code-{}", uuid::Uuid::new_v4().simple());
    assert_eq!(q.get("code_challenge_method").map(String::as_str), Some("S256"), "PKCE S256");
    f.with(|s| s.challenges.insert(code.clone(), q.get("code_challenge").cloned().unwrap_or_default()));
    let mut to = url::Url::parse(&q["redirect_uri"]).expect("redirect_uri");
    to.query_pairs_mut().append_pair("code", &code).append_pair("state", &q["state"]);
    Redirect::to(to.as_str()).into_response()
}

fn issue(s: &mut Inner, expires_in: u64, client_id: &str) -> Value {
    let (access, refresh) = (new_token(), new_token());
    s.valid_access.push(access.clone());
    s.current_refresh = Some(refresh.clone());
    s.issued_to.insert(refresh.clone(), client_id.to_string());
    s.issued.extend([access.clone(), refresh.clone()]);
    json!({ "access_token": access, "token_type": "Bearer", "expires_in": expires_in, "refresh_token": refresh, "scope": "crm.read" })
}

fn invalid_grant() -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": "invalid_grant", "error_description": "refresh token not valid" }))).into_response()
}

async fn token(State(f): State<Fake>, Form(form): Form<HashMap<String, String>>) -> Response {
    match form.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let challenge = f.with(|s| s.challenges.remove(form.get("code").map_or("", String::as_str)));
            let verifier = form.get("code_verifier").cloned().unwrap_or_default();
            let computed = base64_url(&sha2::Sha256::digest(verifier.as_bytes()));
            if challenge.as_deref() != Some(computed.as_str()) {
                return invalid_grant();
            }
            let client_id = form.get("client_id").cloned().unwrap_or_default();
            Json(f.with(|s| {
                let lifetime = s.login_expires_in;
                issue(s, lifetime, &client_id)
            }))
            .into_response()
        }
        Some("refresh_token") => {
            let (first, hold) = f.with(|s| {
                s.refresh_grants += 1;
                (s.refresh_grants == 1, s.hold_first_refresh)
            });
            if first {
                if let Some(hold) = hold {
                    let _ = tokio::time::timeout(hold, f.second_refresh.notified()).await;
                }
            } else {
                f.second_refresh.notify_waiters();
            }
            let sent = form.get("refresh_token").cloned();
            let client_id = form.get("client_id").cloned().unwrap_or_default();
            f.with(|s| {
                if s.reject_refresh || sent.is_none() || sent != s.current_refresh {
                    return invalid_grant();
                }
                if sent.as_ref().and_then(|t| s.issued_to.get(t)) != Some(&client_id) {
                    return invalid_grant();
                }
                Json(issue(s, 3600, &client_id)).into_response()
            })
        }
        _ => (StatusCode::BAD_REQUEST, Json(json!({ "error": "unsupported_grant_type" }))).into_response(),
    }
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

async fn mcp(State(f): State<Fake>, headers: HeaderMap, Json(msg): Json<Value>) -> Response {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::to_string);
    let allowed = f.with(|s| {
        s.last_bearer.clone_from(&bearer);
        !s.revoked && bearer.as_ref().is_some_and(|b| s.valid_access.contains(b))
    });
    if !allowed {
        let challenge = format!("Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"crm.read\"", f.base);
        return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], Json(json!({ "error": "invalid_token" }))).into_response();
    }
    let id = msg.get("id").cloned();
    let result = match msg["method"].as_str().unwrap_or("") {
        "initialize" => json!({ "protocolVersion": "2025-11-25", "capabilities": { "tools": {} }, "serverInfo": { "name": "fake-crm", "version": "1.0.0" } }),
        "tools/list" => json!({ "tools": [{ "name": "whoami", "description": "Who the token belongs to", "inputSchema": { "type": "object" }, "annotations": { "readOnlyHint": true } }] }),
        "tools/call" => {
            f.with(|s| s.tool_calls += 1);
            // A careless server that echoes the request's token: Gatehouse must blank it.
            let echoed = format!("you are the CRM owner (request headers: Authorization: Bearer {})", bearer.clone().unwrap_or_default());
            json!({ "content": [{ "type": "text", "text": "you are the CRM owner" }, { "type": "text", "text": echoed }], "structuredContent": { "token": bearer } })
        }
        _ if id.is_none() => return StatusCode::ACCEPTED.into_response(),
        _ => json!({}),
    };
    Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}
