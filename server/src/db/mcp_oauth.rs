//! OAuth of MCP servers: the client and tokens of each server (sealed by the caller), and the
//! refresh lease that lets one process at a time refresh a shared token.

use sqlx::AnyConnection;

use super::{DbError, backend_of, lease_end, lease_now, now_ms};

/// The login state of an OAuth server, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum State {
    Connected,
    /// No usable token: an owner must log in (console or `gatehouse mcp login`).
    NeedsLogin,
}

super::stored_name!(State, "OAuth state");

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OAuthRow {
    pub server_id: String,
    pub resource: String,
    pub metadata: String,
    pub client_id: String,
    /// Sealed.
    pub client_secret: Option<String>,
    /// Sealed.
    pub credentials: Option<String>,
    #[sqlx(try_from = "String")]
    pub state: State,
    pub reason: Option<String>,
    pub required_scope: Option<String>,
    pub refreshes: i64,
    /// Completed logins: the number of the login the tokens belong to.
    pub logins: i64,
    pub updated_at: i64,
}

impl OAuthRow {
    /// Whether it holds a usable login: connected, with its tokens.
    pub fn logged_in(&self) -> bool {
        self.state == State::Connected && self.credentials.is_some()
    }
}

const COLUMNS: &str = "server_id, resource, metadata, client_id, client_secret, credentials, state, reason, required_scope, refreshes, logins, updated_at";

pub async fn get(conn: &mut AnyConnection, server: &str) -> Result<Option<OAuthRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM mcp_oauth WHERE server_id = $1")).bind(server).fetch_optional(&mut *conn).await?)
}

/// A completed login: the client and the first tokens, replacing whatever was there (and
/// counted, so verdicts about the login it replaces no longer apply).
pub struct Connected<'a> {
    pub server_id: &'a str,
    pub resource: &'a str,
    pub metadata: &'a str,
    pub client_id: &'a str,
    pub client_secret: Option<&'a str>,
    pub credentials: &'a str,
}

pub async fn connect(conn: &mut AnyConnection, c: &Connected<'_>) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO mcp_oauth (server_id, resource, metadata, client_id, client_secret, credentials, state, reason, required_scope, refreshes, logins, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL, 0, 1, $8)
         ON CONFLICT (server_id) DO UPDATE SET resource = $2, metadata = $3, client_id = $4, client_secret = $5, credentials = $6,
           state = $7, reason = NULL, required_scope = NULL, lease_token = NULL, lease_until = NULL, logins = mcp_oauth.logins + 1, updated_at = $8",
    )
    .bind(c.server_id)
    .bind(c.resource)
    .bind(c.metadata)
    .bind(c.client_id)
    .bind(c.client_secret)
    .bind(c.credentials)
    .bind(State::Connected.as_str())
    .bind(now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// New tokens from a refresh of login number `login` (the client stays). A refresh of a login
/// that has since been replaced changes nothing.
pub async fn save_credentials(conn: &mut AnyConnection, server: &str, login: i64, credentials: &str, refreshed: bool) -> Result<(), DbError> {
    sqlx::query("UPDATE mcp_oauth SET credentials = $2, state = $3, reason = NULL, refreshes = refreshes + $4, updated_at = $5 WHERE server_id = $1 AND logins = $6")
        .bind(server)
        .bind(credentials)
        .bind(State::Connected.as_str())
        .bind(i64::from(refreshed))
        .bind(now_ms())
        .bind(login)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// What became of a verdict that a login is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The login went to "needs login" now; its tokens are dropped.
    Marked,
    /// The store already held no usable login; nothing changed.
    Already,
    /// Another login landed after the one the verdict is about: it stands, untouched.
    Superseded,
}

/// Marks a server as needing a login because login number `seen` is lost (`None`: the reader
/// found no usable login at all). Applies only while the row still holds that login, so a
/// login that landed after the reader looked is kept. The tokens are dropped.
pub async fn needs_login(conn: &mut AnyConnection, server: &str, seen: Option<i64>, reason: &str, required_scope: Option<&str>) -> Result<Verdict, DbError> {
    if let Some(login) = seen {
        let done = sqlx::query(
            "UPDATE mcp_oauth SET state = $2, reason = $3, required_scope = COALESCE($4, required_scope), credentials = NULL, updated_at = $5
             WHERE server_id = $1 AND logins = $6 AND state <> $2",
        )
        .bind(server)
        .bind(State::NeedsLogin.as_str())
        .bind(reason)
        .bind(required_scope)
        .bind(now_ms())
        .bind(login)
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() > 0 {
            return Ok(Verdict::Marked);
        }
    }
    let now: Option<(String, i64)> = sqlx::query_as("SELECT state, logins FROM mcp_oauth WHERE server_id = $1").bind(server).fetch_optional(&mut *conn).await?;
    let usable = |state: &str| state == State::Connected.as_str();
    Ok(match (now, seen) {
        (None, None) => Verdict::Already,
        (Some((state, _)), None) if !usable(&state) => Verdict::Already,
        (Some((state, logins)), Some(login)) if logins == login && !usable(&state) => Verdict::Already,
        _ => Verdict::Superseded,
    })
}

/// Takes the refresh lease, until `until` reckoned from `now`, when it is free or expired. Only
/// the holder refreshes. On PostgreSQL the lease is set and checked by the server's clock (see
/// [`lease_now`]).
pub async fn take_lease(conn: &mut AnyConnection, server: &str, token: &str, now: i64, until: i64) -> Result<bool, DbError> {
    let backend = backend_of(conn);
    let sql = format!(
        "UPDATE mcp_oauth SET lease_token = $2, lease_until = {} WHERE server_id = $1 AND (lease_token IS NULL OR lease_until < {})",
        lease_end(backend, "$4", "$3"),
        lease_now(backend, "$4")
    );
    let done = sqlx::query(&sql)
        .bind(server)
        .bind(token)
        .bind(until)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub async fn release_lease(conn: &mut AnyConnection, server: &str, token: &str) -> Result<(), DbError> {
    sqlx::query("UPDATE mcp_oauth SET lease_token = NULL, lease_until = NULL WHERE server_id = $1 AND lease_token = $2")
        .bind(server)
        .bind(token)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
