//! The tokens of one OAuth server while Gatehouse uses it: read from the database (sealed),
//! refreshed shortly before they expire by one process at a time (a lease in the database, so
//! two workers on one PostgreSQL never spend a rotating refresh token twice), and a server
//! whose token cannot be refreshed marked "needs login".

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use oauth2::TokenResponse as _;
use rmcp::transport::auth::{AuthError, AuthorizationManager, CredentialStore, StoredCredentials};

use super::{OAuthError, Sealer};
use crate::db::{self, Db, mcp_oauth};

/// A token is refreshed when less than this (or half its lifetime) is left.
const REFRESH_MARGIN_SECS: u64 = 60;
/// How long one refresh may hold the lease; a process that died holding it blocks no longer.
const LEASE: Duration = Duration::from_secs(30);
/// How long a process waits for another one's refresh before giving up for this try.
const LEASE_WAIT: Duration = Duration::from_secs(35);

/// Reads and writes the server's sealed credentials for rmcp's manager, and remembers which
/// login the tokens it last read belong to: a refresh saves only over that login, and a verdict
/// that the login is lost names it.
#[derive(Clone)]
pub(super) struct DbCredentials {
    pub(super) db: Db,
    pub(super) server: String,
    pub(super) sealer: Sealer,
    login: Arc<AtomicI64>,
}

fn store_error(e: impl std::fmt::Display) -> AuthError {
    AuthError::InternalError(format!("credential store: {e}"))
}

impl DbCredentials {
    pub(super) fn new(db: Db, server: String, sealer: Sealer, login: i64) -> Self {
        Self { db, server, sealer, login: Arc::new(AtomicI64::new(login)) }
    }

    /// The number of the login last read.
    pub(super) fn login(&self) -> i64 {
        self.login.load(Ordering::Acquire)
    }

    async fn read(&self) -> Result<Option<StoredCredentials>, OAuthError> {
        let mut conn = self.db.pool.acquire().await.map_err(|e| OAuthError::Db(e.into()))?;
        let Some(row) = mcp_oauth::get(&mut conn, &self.server).await? else { return Ok(None) };
        self.login.store(row.logins, Ordering::Release);
        let Some(sealed) = row.credentials else { return Ok(None) };
        let plain = self.sealer.open(&self.server, &sealed)?;
        Ok(serde_json::from_str(&plain).ok())
    }
}

#[async_trait::async_trait]
impl CredentialStore for DbCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.read().await.map_err(store_error)
    }

    /// Only a refresh saves through rmcp here (a login writes the whole row itself).
    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let json = serde_json::to_string(&credentials).map_err(store_error)?;
        let sealed = self.sealer.seal(&self.server, &json);
        let mut conn = self.db.pool.acquire().await.map_err(store_error)?;
        mcp_oauth::save_credentials(&mut conn, &self.server, self.login(), &sealed, true).await.map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let mut conn = self.db.pool.acquire().await.map_err(store_error)?;
        mcp_oauth::needs_login(&mut conn, &self.server, Some(self.login()), "the tokens were cleared", None).await.map_err(store_error)?;
        Ok(())
    }
}

/// What a call to the server is told about its token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// No usable token: an owner must log in. The reason holds no secret.
    #[error("MCP_NEEDS_LOGIN: {0}")]
    NeedsLogin(String),
    /// The authorization server could not be reached or failed; a later try may work.
    #[error("MCP_TOKEN_REFRESH_FAILED: {0}")]
    Transient(String),
    /// This process's token key is missing, invalid, or not the one the stored login was sealed
    /// with. Only this process is stuck: the login is left as stored for the processes whose key
    /// opens it (or until an owner logs in again with this key).
    #[error("{0}")]
    Key(super::SealError),
}

/// The tokens of one server, shared by its session's requests.
pub struct TokenSource {
    pub(super) store: Arc<DbCredentials>,
    /// rmcp's manager, configured with the client of the login it was built for (that login's
    /// number first). A new login may have registered another client: its refresh token is
    /// refreshed only by that client, so the manager is built again for it (see
    /// [`Self::refresh_holding_lease`]).
    pub(super) manager: tokio::sync::Mutex<(i64, AuthorizationManager)>,
    pub(super) client: Client,
    /// Called once when the server goes to "needs login" (owner notice, live state).
    pub(super) on_needs_login: super::NeedsLoginHook,
}

/// What configures a manager for a stored login, besides the login itself.
pub(crate) struct Client {
    pub(super) url: String,
    pub(super) redirect_uri: String,
    pub(super) login_hint: String,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource").field("server", &self.store.server).finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The access token, and whether it should be refreshed now.
fn token_of(creds: &StoredCredentials) -> Option<(String, bool)> {
    let response = creds.token_response.as_ref()?;
    let token = response.access_token().secret().clone();
    let due = match (response.expires_in(), creds.token_received_at) {
        (Some(lifetime), Some(at)) => {
            let left = (at + lifetime.as_secs()).saturating_sub(now_secs());
            left < REFRESH_MARGIN_SECS.min(lifetime.as_secs() / 2).max(1)
        }
        _ => false,
    };
    Some((token, due))
}

impl TokenSource {
    pub fn server(&self) -> &str {
        &self.store.server
    }

    /// A token to send: the stored one, or a fresh one when it is about to expire.
    pub async fn access_token(&self) -> Result<String, TokenError> {
        match self.read().await?.as_ref().and_then(token_of) {
            Some((token, false)) => Ok(token),
            Some((token, true)) => self.refresh(Some(&token)).await,
            None => Err(self.needs_login("no token is stored; log in").await),
        }
    }

    /// The server refused `sent` (401): a refresh, unless another request or process already
    /// replaced it.
    pub async fn rejected(&self, sent: &str) -> Result<String, TokenError> {
        self.refresh(Some(sent)).await
    }

    async fn read(&self) -> Result<Option<StoredCredentials>, TokenError> {
        self.store.read().await.map_err(|e| match e {
            OAuthError::Seal(e) => TokenError::Key(e),
            other => TokenError::Transient(other.to_string()),
        })
    }

    /// The number of the login whose tokens this source last read.
    pub(crate) fn login(&self) -> i64 {
        self.store.login()
    }

    /// Marks the login last read as lost and tells whoever watches.
    pub(crate) async fn needs_login(&self, reason: &str) -> TokenError {
        (self.on_needs_login)(Some(self.login()), reason.to_string()).await;
        TokenError::NeedsLogin(reason.to_string())
    }

    /// Refreshes under the lease. `stale` is the token the caller found too old or refused: when
    /// the stored one differs and is fresh, another process refreshed meanwhile and it is used.
    async fn refresh(&self, stale: Option<&str>) -> Result<String, TokenError> {
        let lease = uuid::Uuid::new_v4().to_string();
        let db = &self.store.db;
        let server = self.store.server.as_str();
        let waited = tokio::time::timeout(LEASE_WAIT, async {
            loop {
                let now = db::now_ms();
                let until = now + db::duration_ms(LEASE);
                let taken = async {
                    let mut conn = db.pool.acquire().await?;
                    mcp_oauth::take_lease(&mut conn, server, &lease, now, until).await
                }
                .await
                .map_err(|e: db::DbError| TokenError::Transient(e.to_string()))?;
                if taken {
                    return Ok::<_, TokenError>(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        match waited {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(TokenError::Transient("another process is refreshing the token and has not finished".into())),
        }
        let result = self.refresh_holding_lease(stale).await;
        let released = async {
            let mut conn = db.pool.acquire().await?;
            mcp_oauth::release_lease(&mut conn, server, &lease).await
        }
        .await;
        if let Err(e) = released {
            tracing::warn!(mcp.server = %server, error = %e, "releasing the token refresh lease failed; it expires by itself");
        }
        result
    }

    async fn refresh_holding_lease(&self, stale: Option<&str>) -> Result<String, TokenError> {
        let current = self.read().await?;
        let Some((token, due)) = current.as_ref().and_then(token_of) else { return Err(self.needs_login("no token is stored; log in").await) };
        if !due && stale != Some(token.as_str()) {
            return Ok(token);
        }
        let mut manager = self.manager.lock().await;
        if manager.0 != self.login() {
            // Another login since this source was built (here or in another process): its
            // tokens belong to the client it registered, never to the one configured before.
            let row = async {
                let mut conn = self.store.db.pool.acquire().await?;
                mcp_oauth::get(&mut conn, &self.store.server).await
            }
            .await
            .map_err(|e| TokenError::Transient(e.to_string()))?;
            let Some(row) = row else { return Err(self.needs_login("no token is stored; log in").await) };
            match self.client.manager(&row, &self.store).await {
                Ok(fresh) => *manager = (row.logins, fresh),
                Err(super::Unusable::Transient(e)) => return Err(TokenError::Transient(e)),
                Err(super::Unusable::Lost(reason)) => return Err(self.needs_login(&reason).await),
                Err(super::Unusable::Key(e)) => return Err(TokenError::Key(e)),
            }
        }
        match manager.1.refresh_token().await {
            Ok(response) => {
                tracing::info!(mcp.server = %self.store.server, "MCP OAuth token refreshed");
                Ok(response.access_token().secret().clone())
            }
            Err(AuthError::TokenRefreshRejected(_) | AuthError::AuthorizationRequired) => {
                Err(self.needs_login("the authorization server no longer accepts the refresh token; log in again").await)
            }
            Err(e) => Err(TokenError::Transient(super::describe(&e))),
        }
    }
}
