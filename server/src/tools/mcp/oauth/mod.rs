//! OAuth 2.1 for Streamable HTTP servers, as the MCP authorization spec describes, on rmcp's
//! auth support: discovery (protected resource metadata from the server's challenge or its
//! well-known paths, authorization server metadata, and the 2025-03-26 fallbacks), dynamic client
//! registration or a configured client, the authorization code flow with PKCE (S256), scopes
//! from the challenge or the metadata, and refresh. Gatehouse's parts: tokens sealed at rest
//! ([`Sealer`]), a login bound to the owner who started it, one refresh at a time across
//! processes ([`TokenSource`]), and "needs login" when a token cannot be refreshed.

pub(crate) mod http;
mod seal;
mod tokens;

use std::time::{Duration, Instant};

use rmcp::transport::auth::{AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession, CredentialStore, InMemoryCredentialStore, OAuthClientConfig};

pub use self::{
    http::OAuthHttp,
    seal::{SealError, Sealer},
    tokens::{TokenError, TokenSource},
};
use super::config::{AuthMode, ServerConfig, TOKEN_KEY_VAR, Transport};
use crate::{
    db::{self, Db, DbError, mcp_oauth},
    tools::checkpoint::SecretSource,
};

/// Told (and awaited) when a server's login is lost: which login (its number in the store;
/// `None` when there was no usable one) and why.
pub type NeedsLoginHook = Box<dyn Fn(Option<i64>, String) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;
/// Told (and awaited) when a server asks a login for more scope: which login, and the scope
/// the server named.
pub type StepUpHook = std::sync::Arc<dyn Fn(Option<i64>, Option<String>) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// How long an owner has to finish a login in the browser.
pub const LOGIN_TTL: Duration = Duration::from_secs(600);
/// Logins in flight per process; the oldest is dropped beyond this.
pub const MAX_LOGINS: usize = 32;
/// The name Gatehouse registers under (dynamic client registration).
const CLIENT_NAME: &str = "Gatehouse";

/// An OAuth failure with a stable code; the message holds no token.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("MCP_NOT_OAUTH: the MCP server {0} does not use OAuth (set auth = \"oauth\" in mcp.toml)")]
    NotOAuth(String),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("MCP_OAUTH_DISCOVERY_FAILED: {0}")]
    Discovery(String),
    #[error("MCP_OAUTH_REGISTRATION_FAILED: {0}")]
    Registration(String),
    #[error("MCP_OAUTH_LOGIN_UNKNOWN: this login is unknown, used or expired; start it again")]
    UnknownLogin,
    #[error("MCP_OAUTH_LOGIN_NOT_YOURS: this login was started by another owner")]
    NotYours,
    #[error("MCP_OAUTH_DENIED: the authorization server refused: {0}")]
    Denied(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl OAuthError {
    /// The stable code (the message's prefix).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotOAuth(_) => "MCP_NOT_OAUTH",
            Self::Seal(e) => e.code(),
            Self::Discovery(_) => "MCP_OAUTH_DISCOVERY_FAILED",
            Self::Registration(_) => "MCP_OAUTH_REGISTRATION_FAILED",
            Self::UnknownLogin => "MCP_OAUTH_LOGIN_UNKNOWN",
            Self::NotYours => "MCP_OAUTH_LOGIN_NOT_YOURS",
            Self::Denied(_) => "MCP_OAUTH_DENIED",
            Self::Db(e) => e.code(),
        }
    }
}

/// An rmcp auth error as text safe to show: bounded, without anything token-like.
pub(crate) fn describe(e: &AuthError) -> String {
    super::normalize::bound_text(&super::session::scrub_text(&e.to_string(), &[]), 300)
}

/// The key from the environment.
pub fn sealer(secrets: &SecretSource) -> Result<Sealer, SealError> {
    Sealer::from_hex(secrets.get(TOKEN_KEY_VAR).as_deref())
}

fn oauth_url(cfg: &ServerConfig) -> Result<&str, OAuthError> {
    match &cfg.transport {
        Transport::Http { url, .. } if cfg.auth == AuthMode::Oauth => Ok(url),
        _ => Err(OAuthError::NotOAuth(cfg.id.clone())),
    }
}

/// A login waiting for its callback, held by the process that started it.
pub struct PendingLogin {
    pub server: String,
    /// The owner who started it; `None` for `gatehouse mcp login`.
    pub owner_id: Option<i64>,
    session: AuthorizationSession,
    credentials: InMemoryCredentialStore,
    resource: String,
    metadata: String,
    client_id: String,
    client_secret: Option<String>,
    pub expires: Instant,
}

impl std::fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLogin").field("server", &self.server).field("owner_id", &self.owner_id).finish_non_exhaustive()
    }
}

/// An unauthenticated `initialize`: a server behind OAuth answers 401 with the challenge that
/// seeds discovery (its resource metadata and the scope it wants).
async fn probe(url: &str) -> Option<String> {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "gatehouse", "version": env!("CARGO_PKG_VERSION") } }
    });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(15)).redirect(reqwest::redirect::Policy::none()).build().ok()?;
    let response = client.post(url).header("accept", "application/json, text/event-stream").json(&body).send().await.ok()?;
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    response.headers().get(::http::header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Starts a login: discovery, the client (configured or registered), and the authorization URL
/// (with PKCE and a fresh state) for the owner's browser. Returns the state and the login.
pub async fn begin(cfg: &ServerConfig, db: &Db, secrets: &SecretSource, redirect_uri: &str, owner_id: Option<i64>) -> Result<(String, PendingLogin), OAuthError> {
    let url = oauth_url(cfg)?;
    sealer(secrets)?;
    let discovery = |e: AuthError| OAuthError::Discovery(describe(&e));
    let mut manager = AuthorizationManager::new(url).await.map_err(discovery)?;
    let challenge = probe(url).await;
    let resolution = manager.resolve_metadata_from_challenge(challenge.as_deref()).await.map_err(discovery)?;
    let metadata = serde_json::to_string(&resolution.metadata).unwrap_or_default();
    manager.set_metadata(resolution.metadata);

    // A step-up: the server asked for more than the last grant.
    let required = {
        let mut conn = db.pool.acquire().await.map_err(DbError::from)?;
        mcp_oauth::get(&mut conn, &cfg.id).await?.and_then(|r| r.required_scope)
    };
    let mut scopes = if cfg.oauth.scopes.is_empty() { manager.select_initial_scopes(&[]).await } else { cfg.oauth.scopes.clone() };
    for scope in required.iter().flat_map(|r| r.split_whitespace()) {
        if !scopes.iter().any(|s| s == scope) {
            scopes.push(scope.to_string());
        }
    }
    let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
    let (client_id, client_secret) = match &cfg.oauth.client_id {
        Some(id) => (id.clone(), cfg.oauth.client_secret.as_ref().and_then(|v| v.resolve(&|var| secrets.get(var)))),
        None => {
            let registered = manager.register_client(CLIENT_NAME, redirect_uri, &scope_refs).await.map_err(|e| OAuthError::Registration(describe(&e)))?;
            (registered.client_id, registered.client_secret)
        }
    };
    let credentials = InMemoryCredentialStore::new();
    manager.set_credential_store(credentials.clone());
    let mut request = AuthorizationRequest::new(redirect_uri).with_preregistered_client(client_id.clone()).with_scopes(scopes);
    if let Some(secret) = &client_secret {
        request = request.with_client_secret(secret.clone());
    }
    let session = AuthorizationSession::new(manager, request).await.map_err(|(_, e)| discovery(e))?;
    let state = url::Url::parse(session.get_authorization_url())
        .ok()
        .and_then(|u| u.query_pairs().find(|(k, _)| k == "state").map(|(_, v)| v.into_owned()))
        .ok_or_else(|| OAuthError::Discovery("the authorization URL has no state".into()))?;
    let login = PendingLogin {
        server: cfg.id.clone(),
        owner_id,
        session,
        credentials,
        resource: url.to_string(),
        metadata,
        client_id,
        client_secret,
        expires: Instant::now() + LOGIN_TTL,
    };
    Ok((state, login))
}

impl PendingLogin {
    pub fn authorization_url(&self) -> &str {
        self.session.get_authorization_url()
    }

    /// Exchanges the code (with the PKCE verifier) and stores the client and tokens, sealed.
    pub async fn finish(self, db: &Db, secrets: &SecretSource, code: &str, state: &str, issuer: Option<&str>) -> Result<(), OAuthError> {
        let sealer = sealer(secrets)?;
        self.session.handle_callback_with_issuer(code, state, issuer).await.map_err(|e| OAuthError::Denied(describe(&e)))?;
        let stored = self.credentials.load().await.ok().flatten().ok_or_else(|| OAuthError::Denied("no token came back".into()))?;
        let json = serde_json::to_string(&stored).map_err(|e| OAuthError::Denied(e.to_string()))?;
        let sealed = sealer.seal(&self.server, &json);
        let secret = self.client_secret.as_deref().map(|s| sealer.seal(&self.server, s));
        let mut tx = db.begin_write().await.map_err(DbError::from)?;
        db::mcp_oauth::connect(
            &mut tx,
            &db::mcp_oauth::Connected {
                server_id: &self.server,
                resource: &self.resource,
                metadata: &self.metadata,
                client_id: &self.client_id,
                client_secret: secret.as_deref(),
                credentials: &sealed,
            },
        )
        .await?;
        tx.commit().await.map_err(DbError::from)?;
        Ok(())
    }
}

/// The tokens of a logged-in server, for its session. `NeedsLogin` when there are none (or they
/// were issued for another URL, or the key cannot open them); `on_needs_login` has then been
/// told, about the login that was read.
pub async fn token_source(
    cfg: &ServerConfig,
    db: &Db,
    secrets: &SecretSource,
    redirect_uri: &str,
    on_needs_login: NeedsLoginHook,
) -> Result<TokenSource, TokenError> {
    let row = {
        let mut conn = db.pool.acquire().await.map_err(|e| TokenError::Transient(e.to_string()))?;
        mcp_oauth::get(&mut conn, &cfg.id).await.map_err(|e| TokenError::Transient(e.to_string()))?
    };
    let seen = row.as_ref().map(|r| r.logins);
    let lost = async |reason: String| {
        on_needs_login(seen, reason.clone()).await;
        TokenError::NeedsLogin(reason)
    };
    let login_hint = format!("connect it from the console's MCP servers page or run `gatehouse mcp login {}`", cfg.id);
    let url = match oauth_url(cfg) {
        Ok(url) => url,
        Err(e) => return Err(lost(e.to_string()).await),
    };
    let sealer = match (sealer(secrets), &row) {
        (Ok(s), _) => s,
        // A stored login another process's key may open is left alone.
        (Err(e), Some(row)) if row.logged_in() => return Err(TokenError::Key(e)),
        (Err(e), _) => return Err(lost(e.to_string()).await),
    };
    let Some(row) = row else { return Err(lost(format!("not logged in yet: {login_hint}")).await) };
    if !row.logged_in() {
        let why = row.reason.clone().unwrap_or_else(|| "not logged in".into());
        return Err(lost(format!("{why}: {login_hint}")).await);
    }
    if row.resource != url {
        return Err(lost(format!("the server's URL changed since the login: {login_hint}")).await);
    }
    let store = tokens::DbCredentials::new(db.clone(), cfg.id.clone(), sealer, row.logins);
    let client = tokens::Client { url: url.to_string(), redirect_uri: redirect_uri.to_string(), login_hint };
    let manager = match client.manager(&row, &store).await {
        Ok(manager) => manager,
        Err(Unusable::Transient(e)) => return Err(TokenError::Transient(e)),
        Err(Unusable::Lost(reason)) => return Err(lost(reason).await),
        Err(Unusable::Key(e)) => return Err(TokenError::Key(e)),
    };
    Ok(TokenSource { store: std::sync::Arc::new(store), manager: tokio::sync::Mutex::new((row.logins, manager)), client, on_needs_login })
}

/// Why a stored login cannot configure a client.
pub(crate) enum Unusable {
    /// The authorization server's address could not be used now; a later try may work.
    Transient(String),
    /// Only a new login helps: the reason, for the owner.
    Lost(String),
    /// This process's key cannot open what the login stored (see [`TokenError::Key`]).
    Key(SealError),
}

impl tokens::Client {
    /// rmcp's manager for the client and metadata stored with `row`'s login, reading and
    /// saving tokens through `store`.
    pub(crate) async fn manager(&self, row: &mcp_oauth::OAuthRow, store: &tokens::DbCredentials) -> Result<AuthorizationManager, Unusable> {
        let mut manager = AuthorizationManager::new(self.url.as_str()).await.map_err(|e| Unusable::Transient(describe(&e)))?;
        match serde_json::from_str(&row.metadata) {
            Ok(metadata) => manager.set_metadata(metadata),
            Err(e) => return Err(Unusable::Lost(format!("stored metadata unreadable ({e}): {}", self.login_hint))),
        }
        let mut client = OAuthClientConfig::new(row.client_id.clone(), &self.redirect_uri);
        if let Some(sealed) = &row.client_secret {
            match store.sealer.open(&store.server, sealed) {
                Ok(secret) => client = client.with_client_secret(secret),
                Err(e) => return Err(Unusable::Key(e)),
            }
        }
        manager.configure_client(client).map_err(|e| Unusable::Lost(describe(&e)))?;
        manager.set_credential_store(store.clone());
        Ok(manager)
    }
}
