//! Logging in to an OAuth server (the console's Connect button, `gatehouse mcp login`), and a
//! server going to "needs login": its tools withheld at once, the owner told once.

use std::{sync::Arc, time::Instant};

use serde_json::json;

use super::{
    AuditActor, McpError, McpManager,
    config::AuthMode,
    oauth::{self, MAX_LOGINS, OAuthError},
    session::RefreshRequest,
};
use crate::db::{self, audit, mcp::health, mcp_oauth};

impl McpManager {
    /// Where the authorization server sends the owner's browser back: the console.
    pub fn set_public_url(&self, base: &str) {
        if let Ok(mut r) = self.inner.redirect_uri.write() {
            *r = format!("{}{}", base.trim_end_matches('/'), CALLBACK_PATH);
        }
    }

    /// The console's OAuth callback address (the redirect URI).
    pub fn callback_url(&self) -> String {
        self.redirect_uri()
    }

    pub(crate) fn redirect_uri(&self) -> String {
        self.inner.redirect_uri.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// Starts a login to an OAuth server and returns the address to open in the owner's
    /// browser. `owner` is the owner whose session must receive the callback (`None`: the CLI,
    /// which takes the callback address itself). Audited.
    pub async fn begin_login(&self, server: &str, owner: Option<i64>, by: &AuditActor) -> Result<String, McpError> {
        let cfg = self.server(server)?.config.clone();
        if cfg.auth != AuthMode::Oauth {
            return Err(OAuthError::NotOAuth(server.to_string()).into());
        }
        let (state, login) = oauth::begin(&cfg, &self.inner.db, &self.inner.secrets, &self.redirect_uri(), owner).await?;
        let url = login.authorization_url().to_string();
        {
            let mut logins = self.inner.logins.lock().map_err(|_| McpError::Unavailable("the login table is unusable".into()))?;
            let now = Instant::now();
            logins.retain(|_, l| l.expires > now);
            while logins.len() >= MAX_LOGINS {
                let Some(oldest) = logins.iter().min_by_key(|(_, l)| l.expires).map(|(k, _)| k.clone()) else { break };
                logins.remove(&oldest);
            }
            logins.insert(state, login);
        }
        let mut conn = self.inner.db.pool.acquire().await?;
        let entry = audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event: audit::event::MCP_SERVER_LOGIN_STARTED, detail: Some(json!({ "server": server })) };
        audit::record(&mut conn, entry).await?;
        Ok(url)
    }

    /// Finishes a login with what the authorization server sent back (`code`, `state`, and
    /// `iss` when it names itself). Only the owner who started it (or anyone, for a CLI login in
    /// this process) can finish it, once. Returns the server, now connected. Audited.
    pub async fn finish_login(&self, owner: Option<i64>, code: &str, state: &str, issuer: Option<&str>, by: &AuditActor) -> Result<String, McpError> {
        let login = {
            let mut logins = self.inner.logins.lock().map_err(|_| McpError::Unavailable("the login table is unusable".into()))?;
            match logins.get(state) {
                Some(l) if l.expires <= Instant::now() => {
                    logins.remove(state);
                    None
                }
                Some(l) if l.owner_id.is_some() && l.owner_id != owner => return Err(OAuthError::NotYours.into()),
                Some(_) => logins.remove(state),
                None => None,
            }
        };
        let login = login.ok_or(OAuthError::UnknownLogin)?;
        let server = login.server.clone();
        login.finish(&self.inner.db, &self.inner.secrets, code, state, issuer).await?;
        let mut conn = self.inner.db.pool.acquire().await?;
        let entry = audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event: audit::event::MCP_SERVER_LOGGED_IN, detail: Some(json!({ "server": server })) };
        audit::record(&mut conn, entry).await?;
        drop(conn);
        if let Some(s) = self.inner.servers.get(&server) {
            s.live.send_modify(|l| {
                l.needs_login = None;
                l.last_error = None;
            });
            // The supervisor connects now with the new tokens.
            let (done, _answer) = tokio::sync::oneshot::channel();
            let _ = s.refresh.send(RefreshRequest::Refresh(done));
        }
        self.rebuild().await?;
        Ok(server)
    }

    /// [`Self::finish_login`] from the address the browser landed on (for the CLI).
    pub async fn finish_login_url(&self, callback: &str, by: &AuditActor) -> Result<String, McpError> {
        let url = url::Url::parse(callback.trim()).map_err(|_| OAuthError::UnknownLogin)?;
        let get = |name: &str| url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned());
        if let Some(error) = get("error") {
            let detail = get("error_description").unwrap_or_default();
            return Err(OAuthError::Denied(super::normalize::bound_text(&format!("{error} {detail}"), 300)).into());
        }
        let (Some(code), Some(state)) = (get("code"), get("state")) else { return Err(OAuthError::UnknownLogin.into()) };
        self.finish_login(None, &code, &state, get("iss").as_deref(), by).await
    }

    /// What a server's token source calls when its token is gone: the server goes to "needs
    /// login" (tools withheld) and, the first time its stored login is lost, owners get a notice.
    pub(crate) fn needs_login_callback(&self, server: &str) -> oauth::NeedsLoginHook {
        let manager = self.clone();
        let server = server.to_string();
        Box::new(move |reason| {
            let (manager, server) = (manager.clone(), server.clone());
            Box::pin(async move { manager.mark_needs_login(&server, &reason, None).await })
        })
    }

    /// The server asked for more scope (403 `insufficient_scope`): the next login asks for it.
    pub(crate) fn step_up_callback(&self, server: &str) -> oauth::StepUpHook {
        let manager = self.clone();
        let server = server.to_string();
        Arc::new(move |scope| {
            let (manager, server) = (manager.clone(), server.clone());
            Box::pin(async move {
                let reason = match &scope {
                    Some(s) => format!("the server asks for more access (scope {}); log in again to grant it", super::normalize::bound_text(s, 200)),
                    None => "the server asks for more access; log in again to grant it".to_string(),
                };
                manager.mark_needs_login(&server, &reason, scope.as_deref()).await;
            })
        })
    }

    pub(crate) async fn mark_needs_login(&self, server: &str, reason: &str, required_scope: Option<&str>) {
        let Some(s) = self.inner.servers.get(server) else { return };
        s.live.send_modify(|l| {
            l.needs_login = Some(reason.to_string());
            l.health = health::NEEDS_LOGIN;
        });
        let recorded = async {
            let mut tx = self.inner.db.begin_write().await?;
            let changed = mcp_oauth::needs_login(&mut tx, server, reason, required_scope).await?;
            db::mcp::set_health(&mut tx, server, health::NEEDS_LOGIN, Some(reason), false).await?;
            if !changed {
                tx.commit().await?;
                return Ok(false);
            }
            // Once per change to "needs login" (the row's state is the compare-and-set), to the
            // console and to every owner number.
            let notice = super::notices::Notice {
                hook: "mcp.oauth",
                server,
                reason_code: "MCP_NEEDS_LOGIN",
                correlation_id: format!("mcp-login-{server}"),
                template: |s| &s.needs_login_notice,
                values: &[("{reason}", reason.to_string())],
                anchor: format!("#server-{server}"),
            };
            self.inner.notices.raise(tx, &notice).await?;
            Ok::<_, db::DbError>(true)
        }
        .await;
        match recorded {
            Ok(true) => tracing::warn!(mcp.server = %server, reason = %reason, "MCP server needs an owner to log in again; its tools are withheld"),
            Ok(false) => {}
            Err(e) => tracing::error!(mcp.server = %server, error = %e, "recording that an MCP server needs a login failed"),
        }
        if let Err(e) = self.rebuild().await {
            tracing::error!(mcp.server = %server, error = %e, "withholding the tools of an MCP server that needs a login failed");
        }
    }
}

/// The console's OAuth callback path (the redirect URI Gatehouse registers).
pub const CALLBACK_PATH: &str = "/mcp/oauth/callback";
/// Where the callback page sends the browser on, same-site, so the owner's session cookie
/// (SameSite=Strict) comes along.
pub const FINISH_PATH: &str = "/mcp/oauth/finish";
