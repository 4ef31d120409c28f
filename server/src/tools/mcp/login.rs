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
use crate::db::{
    self, audit,
    mcp::health,
    mcp_oauth::{self, Verdict},
};

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
        Box::new(move |seen, reason| {
            let (manager, server) = (manager.clone(), server.clone());
            Box::pin(async move { manager.mark_needs_login(&server, seen, &reason, None).await })
        })
    }

    /// The server asked for more scope (403 `insufficient_scope`): the next login asks for it.
    pub(crate) fn step_up_callback(&self, server: &str) -> oauth::StepUpHook {
        let manager = self.clone();
        let server = server.to_string();
        Arc::new(move |seen, scope| {
            let (manager, server) = (manager.clone(), server.clone());
            Box::pin(async move {
                let reason = match &scope {
                    Some(s) => format!("the server asks for more access (scope {}); log in again to grant it", super::normalize::bound_text(s, 200)),
                    None => "the server asks for more access; log in again to grant it".to_string(),
                };
                manager.mark_needs_login(&server, seen, &reason, scope.as_deref()).await;
            })
        })
    }

    /// Login number `seen` of `server` is lost (`None`: the reader found no usable login):
    /// the server goes to "needs login" with its tools withheld, and the first time a stored
    /// login is lost the owners are told. A login that landed after the reader looked stands:
    /// the verdict is then dropped, here and in the database.
    pub(crate) async fn mark_needs_login(&self, server: &str, seen: Option<i64>, reason: &str, required_scope: Option<&str>) {
        let Some(s) = self.inner.servers.get(server) else { return };
        let recorded = async {
            let mut tx = self.inner.db.begin_write().await?;
            let verdict = mcp_oauth::needs_login(&mut tx, server, seen, reason, required_scope).await?;
            if verdict == Verdict::Superseded {
                tx.commit().await?;
                return Ok(verdict);
            }
            db::mcp::set_health(&mut tx, server, health::NEEDS_LOGIN, Some(reason), false).await?;
            if verdict == Verdict::Already {
                tx.commit().await?;
                return Ok(verdict);
            }
            // Once per lost login (the row's login and state are the compare-and-set), to the
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
            Ok::<_, db::DbError>(verdict)
        }
        .await;
        match recorded {
            Ok(Verdict::Superseded) => {
                tracing::debug!(mcp.server = %server, "a newer login replaced the one found lost; it stands");
                return;
            }
            Ok(Verdict::Marked) => tracing::warn!(mcp.server = %server, reason = %reason, "MCP server needs an owner to log in again; its tools are withheld"),
            Ok(Verdict::Already) => {}
            // Unrecorded, the login is still unusable in this process.
            Err(e) => tracing::error!(mcp.server = %server, error = %e, "recording that an MCP server needs a login failed"),
        }
        s.live.send_modify(|l| {
            l.needs_login = Some(reason.to_string());
            l.health = health::NEEDS_LOGIN;
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::DatabaseSettings,
        db::{Db, mcp_oauth::Connected},
        tools::checkpoint::SecretSource,
    };

    /// A manager of one OAuth server `crm` over a fresh SQLite file (nothing started: the
    /// verdicts below are what its token sources would report).
    async fn manager(dir: &tempfile::TempDir) -> (Db, McpManager) {
        let settings = DatabaseSettings { url: format!("sqlite://{}", dir.path().join("gatehouse.db").display()), ..DatabaseSettings::default() };
        let db = Db::connect(&settings).await.expect("connect");
        db.migrate().await.expect("migrate");
        let path = dir.path().join("mcp.toml");
        std::fs::write(&path, "[[server]]\nid = \"crm\"\nauth = \"oauth\"\n[server.transport]\ntype = \"http\"\nurl = \"http://127.0.0.1:9/mcp\"\n").expect("write");
        let config = super::super::config::load(&path, &|_| true).expect("config");
        (db.clone(), McpManager::new(db, &config, SecretSource::from_fn(|_| None)))
    }

    async fn log_in(db: &Db, tokens: &str) {
        let mut tx = db.begin_write().await.expect("tx");
        let login = Connected { server_id: "crm", resource: "http://127.0.0.1:9/mcp", metadata: "{}", client_id: "c", client_secret: None, credentials: tokens };
        mcp_oauth::connect(&mut tx, &login).await.expect("connect");
        tx.commit().await.expect("commit");
    }

    /// (state, tokens, login number, notices raised)
    async fn stored(db: &Db) -> (String, Option<String>, i64, i64) {
        let mut conn = db.pool.acquire().await.expect("conn");
        let row = mcp_oauth::get(&mut conn, "crm").await.expect("get").expect("row");
        let notices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM owner_notifications WHERE reason_code = 'MCP_NEEDS_LOGIN'").fetch_one(&mut *conn).await.expect("count");
        (row.state.as_str().to_string(), row.credentials, row.logins, notices)
    }

    fn waiting(manager: &McpManager) -> bool {
        manager.live("crm").expect("live").needs_login.is_some()
    }

    /// The race behind a login undone at start: the supervisor read the store before the
    /// owner's login landed and reported "not logged in" after it. The late verdict must leave
    /// the new login (and the server) as they are; a verdict about the login itself still
    /// applies, once.
    #[tokio::test]
    async fn a_verdict_about_a_login_that_was_replaced_leaves_the_new_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (db, manager) = manager(&dir).await;
        log_in(&db, "sealed-1").await;
        manager.mark_needs_login("crm", None, "not logged in yet", None).await;
        assert_eq!(stored(&db).await, ("connected".into(), Some("sealed-1".into()), 1, 0));
        assert!(!waiting(&manager), "the server is not withheld");

        manager.mark_needs_login("crm", Some(1), "the refresh token was refused", None).await;
        assert_eq!(stored(&db).await, ("needs_login".into(), None, 1, 1));
        assert!(waiting(&manager));
        manager.mark_needs_login("crm", Some(1), "refused again", None).await;
        assert_eq!(stored(&db).await.3, 1, "the owners are told once");

        // A new login, then a late verdict about the first one (another process's refresh).
        log_in(&db, "sealed-2").await;
        manager.inner.servers["crm"].live.send_modify(|l| l.needs_login = None); // as finish_login does
        manager.mark_needs_login("crm", Some(1), "the refresh token was refused", Some("admin")).await;
        assert_eq!(stored(&db).await, ("connected".into(), Some("sealed-2".into()), 2, 1));
        assert!(!waiting(&manager));
    }

    /// A refresh of a replaced login does not write its tokens over the new login's.
    #[tokio::test]
    async fn a_refresh_of_a_replaced_login_saves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (db, _manager) = manager(&dir).await;
        log_in(&db, "sealed-1").await;
        log_in(&db, "sealed-2").await;
        let mut conn = db.pool.acquire().await.expect("conn");
        mcp_oauth::save_credentials(&mut conn, "crm", 1, "sealed-1-refreshed", true).await.expect("save");
        drop(conn);
        assert_eq!(stored(&db).await.1.as_deref(), Some("sealed-2"));
        let mut conn = db.pool.acquire().await.expect("conn");
        mcp_oauth::save_credentials(&mut conn, "crm", 2, "sealed-2-refreshed", true).await.expect("save");
        drop(conn);
        assert_eq!(stored(&db).await.1.as_deref(), Some("sealed-2-refreshed"));
    }
}
