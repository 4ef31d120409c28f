//! One task per server: connect and discover within the time bound, serve refreshes while the
//! session lives, and reconnect with backoff when it ends (a stdio server that exited is started
//! again). Health goes to the database; nothing here holds a lock across an await, so a hung
//! server only ever holds up its own task.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::sync::{mpsc, oneshot};

use super::oauth::{self, OAuthHttp, TokenError};

use super::{
    Inner, McpManager, Server,
    session::{self, DiscoveryReport, Handler, RefreshRequest, Session},
};
use crate::db::{self, mcp::health};

const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A session that lived this long resets the backoff.
const STABLE: Duration = Duration::from_secs(60);
/// At most one refresh per this period comes from a server's `tools/list_changed`: a server
/// that sends them without end costs one discovery per period, not one per notification.
/// Owner refreshes are never held back.
pub const LIST_CHANGED_MIN_INTERVAL: Duration = Duration::from_secs(2);
/// The longest a ping is waited for (less when the server's `call_timeout` is shorter): an
/// MCP server answers one at once, unless it is stuck.
const PING_WAIT: Duration = Duration::from_secs(10);

type Waiters = Vec<oneshot::Sender<Result<DiscoveryReport, String>>>;

fn answer(waiters: &mut Waiters, result: &Result<DiscoveryReport, String>) {
    for w in waiters.drain(..) {
        let _ = w.send(result.clone());
    }
}

/// Logs and records a server's health.
async fn record_health(inner: &Inner, server: &Server, state: &'static str, error: Option<String>, seen: bool) {
    if let Some(e) = &error {
        tracing::warn!(event = "McpServerHealth", mcp.server = %server.config.id, health = state, error = %e, "MCP server health");
    }
    store_health(inner, server, state, error, seen).await;
}

/// Logs the `AgentToolMcpDiscoveryFailed` event (seed §17) for a server whose tools could not
/// be listed, with its scrubbed error, and records its health. A token key this process cannot
/// use is its own trouble: kept in its live state only, so the health other processes record
/// (whose key works) stands.
async fn discovery_failed(inner: &Inner, server: &Server, state: &'static str, error: String) {
    tracing::warn!(event = "AgentToolMcpDiscoveryFailed", mcp.server = %server.config.id, health = state, error = %error, "MCP discovery failed");
    if oauth::SealError::is_in(&error) {
        server.live.send_modify(|l| {
            l.health = state;
            l.last_error = Some(error);
            l.peer = None;
        });
        return;
    }
    store_health(inner, server, state, Some(error), false).await;
}

async fn store_health(inner: &Inner, server: &Server, state: &'static str, error: Option<String>, seen: bool) {
    server.live.send_modify(|l| {
        l.health = state;
        if error.is_some() || state == health::CONNECTED {
            l.last_error.clone_from(&error);
        }
        if state != health::CONNECTED && state != health::DEGRADED {
            l.peer = None;
        }
    });
    let written = async {
        let mut conn = inner.db.acquire_write().await?;
        db::mcp::set_health(&mut conn, &server.config.id, state, error.as_deref(), seen).await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(mcp.server = %server.config.id, error = %e, "recording MCP server health failed");
    }
}

/// Stores a discovery (quarantine applied) and publishes the new catalog.
async fn store(inner: &Inner, manager: &McpManager, server: &Server, found: &[db::mcp::Found], report: &DiscoveryReport) -> Result<(), String> {
    // Known before it is stored: a listing the database refuses still stops a changed tool.
    let listed = found.iter().map(|f| (f.name.clone(), f.definition_hash.clone())).collect();
    server.live.send_modify(|l| l.listed = Some(Arc::new(listed)));
    let trusted = server.config.trust == super::Trust::Trusted;
    let stored = async {
        let mut tx = inner.db.begin_write().await?;
        db::mcp::ensure_server(&mut tx, &server.config.id).await?;
        let changes = db::mcp::apply_discovery(&mut tx, &server.config.id, trusted, found).await?;
        tx.commit().await?;
        Ok::<_, db::DbError>(changes)
    }
    .await
    .map_err(|e| format!("storing the discovered tools failed: {e}"))?;
    if !(changes_empty(&stored)) {
        tracing::info!(mcp.server = %server.config.id, added = ?stored.added, changed = ?stored.changed, removed = ?stored.removed, "MCP tools changed (new and changed tools wait for an owner unless first seen on a trusted server)");
    }
    server.live.send_modify(|l| l.last_discovery = Some(report.clone()));
    manager.rebuild().await.map_err(|e| format!("publishing the catalog failed: {e}"))
}

fn changes_empty(c: &db::mcp::Changes) -> bool {
    c.added.is_empty() && c.changed.is_empty() && c.removed.is_empty()
}

/// The HTTP client of an OAuth server with its tokens; `NeedsLogin` without a usable login.
async fn oauth_client(inner: &Inner, manager: &McpManager, server: &Server) -> Result<OAuthHttp, TokenError> {
    let cfg = &server.config;
    let tokens = oauth::token_source(cfg, &inner.db, &inner.secrets, &manager.redirect_uri(), manager.needs_login_callback(&cfg.id)).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        // A token never follows a redirect to another place.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| TokenError::Transient(e.to_string()))?;
    Ok(OAuthHttp { http, tokens: Arc::new(tokens), step_up: manager.step_up_callback(&cfg.id), sent: server.sent_tokens.clone() })
}

/// How often a server waiting for a login looks whether another process (the CLI, another
/// worker) completed one.
const LOGIN_POLL: Duration = Duration::from_secs(5);

/// Waits while an OAuth server needs a login: its tools stay withheld, refreshes are answered
/// with the reason, and it tries again when a login lands (here or in another process), when
/// it is re-enabled, or when an owner asks. Returns false when Gatehouse stops.
async fn wait_for_login(
    inner: &Inner,
    server: &Server,
    refresh: &mut mpsc::UnboundedReceiver<RefreshRequest>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    enabled: &mut tokio::sync::watch::Receiver<bool>,
    waiters: &mut Waiters,
) -> bool {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return false,
            _ = enabled.changed() => return true,
            Some(req) = refresh.recv() => {
                if let RefreshRequest::Refresh(w) = req {
                    waiters.push(w);
                    return true;
                }
            }
            () = tokio::time::sleep(LOGIN_POLL) => {
                let logged_in = async {
                    let mut conn = inner.db.pool.acquire().await.ok()?;
                    db::mcp_oauth::get(&mut conn, &server.config.id).await.ok().flatten()
                }
                .await
                .is_some_and(|r| r.logged_in());
                if logged_in {
                    return true;
                }
            }
        }
    }
}

/// The waits between a server's connection attempts: doubling from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], without end.
fn reconnect_delays() -> ExponentialBackoff {
    ExponentialBuilder::default().with_min_delay(FIRST_BACKOFF).with_max_delay(MAX_BACKOFF).without_max_times().build()
}

pub(crate) async fn run(inner: Arc<Inner>, manager: McpManager, server: Arc<Server>, mut refresh: mpsc::UnboundedReceiver<RefreshRequest>) {
    let cfg = &server.config;
    let mut shutdown = inner.shutdown.subscribe();
    let mut enabled = server.enabled.subscribe();
    let mut delays = reconnect_delays();
    let mut waiters: Waiters = Vec::new();
    loop {
        if *shutdown.borrow() {
            break;
        }
        if !*enabled.borrow_and_update() {
            answer(&mut waiters, &Err(format!("{} is disabled", cfg.id)));
            record_health(&inner, &server, health::DOWN, Some("disabled".into()), false).await;
            tokio::select! {
                _ = enabled.changed() => continue,
                _ = shutdown.changed() => break,
                Some(req) = refresh.recv() => {
                    if let RefreshRequest::Refresh(w) = req {
                        let _ = w.send(Err(format!("{} is disabled", cfg.id)));
                    }
                    continue;
                }
            }
        }
        let (oauth, no_token) = if cfg.auth == super::AuthMode::Oauth {
            match oauth_client(&inner, &manager, &server).await {
                Ok(client) => (Some(client), None),
                Err(TokenError::NeedsLogin(reason)) => {
                    // The token source has marked the server. A login that landed after it
                    // read the store stands (the mark was dropped), and the next try uses it.
                    answer(&mut waiters, &Err(format!("MCP_NEEDS_LOGIN: {reason}")));
                    if server.live.borrow().needs_login.is_some() && !wait_for_login(&inner, &server, &mut refresh, &mut shutdown, &mut enabled, &mut waiters).await {
                        break;
                    }
                    continue;
                }
                // The authorization server failed, or this process's token key cannot open the
                // login (which stays as stored): a try after the backoff.
                Err(e) => (None, Some(e.to_string())),
            }
        } else {
            (None, None)
        };
        let mut handler = Handler::new(server.refresh.clone());
        if cfg.elicitation == super::config::ElicitationPolicy::Owner {
            handler = handler.with_owner_forms(inner.forms.clone(), cfg);
        }
        let pending = handler.pending();
        let attempt = tokio::time::timeout(cfg.discovery.timeout, async {
            if let Some(e) = no_token {
                return Err(e);
            }
            let session = session::connect(cfg, &inner.secrets, handler, oauth).await.map_err(|e| e.0)?;
            let (found, report) = session::discover(cfg, session.peer()).await?;
            Ok::<_, String>((session, found, report))
        })
        .await
        .unwrap_or_else(|_| Err(format!("connecting and listing tools took longer than discovery.timeout ({:?})", cfg.discovery.timeout)));
        match attempt {
            Ok((session, found, report)) => {
                server.live.send_modify(|l| l.needs_login = None);
                if let Err(e) = store(&inner, &manager, &server, &found, &report).await {
                    tracing::error!(mcp.server = %cfg.id, error = %e, "MCP discovery not stored");
                }
                // Recorded before the session is offered, so whoever sees it connected also
                // finds it so in the database.
                record_health(&inner, &server, health::CONNECTED, None, true).await;
                server.live.send_modify(|l| {
                    l.peer = Some(session.peer().clone());
                    l.connections += 1;
                });
                inner.breakers.record_success(&cfg.id);
                inner.reset_tool_breakers(&cfg.id);
                answer(&mut waiters, &Ok(report));
                let since = Instant::now();
                let ended = serve(&inner, &manager, &server, session, &pending, &mut refresh, &mut shutdown, &mut enabled).await;
                server.live.send_modify(|l| l.peer = None);
                if *shutdown.borrow() {
                    // This process leaving says nothing of the server: the health in the
                    // database is every process's (the console's, `gatehouse mcp list`'s), and
                    // others may still be connected to it, a `gatehouse mcp refresh` or `tools
                    // call` from a shell among them. The next start records its own.
                    server.live.send_modify(|l| {
                        l.health = health::DOWN;
                        l.last_error = Some(ended);
                    });
                } else {
                    record_health(&inner, &server, health::DOWN, Some(ended), false).await;
                }
                if since.elapsed() >= STABLE {
                    delays = reconnect_delays();
                }
            }
            Err(e) => {
                let e = session::scrub(cfg, &inner.secrets, &e);
                answer(&mut waiters, &Err(e.clone()));
                // A session refused for its token has already gone to "needs login".
                if server.live.borrow().needs_login.is_some() {
                    if !wait_for_login(&inner, &server, &mut refresh, &mut shutdown, &mut enabled, &mut waiters).await {
                        break;
                    }
                    continue;
                }
                discovery_failed(&inner, &server, health::DOWN, e).await;
            }
        }
        if *shutdown.borrow() {
            break;
        }
        // Wait before the next try; an owner's refresh tries again at once.
        tokio::select! {
            _ = tokio::time::sleep(delays.next().unwrap_or(MAX_BACKOFF)) => {}
            _ = shutdown.changed() => break,
            _ = enabled.changed() => {}
            Some(req) = refresh.recv() => {
                if let RefreshRequest::Refresh(w) = req {
                    waiters.push(w);
                }
            }
        }
    }
    answer(&mut waiters, &Err(format!("{} stopped", cfg.id)));
    server.live.send_modify(|l| {
        l.peer = None;
        l.health = health::DOWN;
    });
}

/// Asks a connected server whether it is still there (MCP `ping`). An error it answers with (a
/// server that does not know the method) is an answer too.
async fn ping_once(peer: &rmcp::service::Peer<rmcp::RoleClient>, within: Duration) -> Result<(), String> {
    let request = rmcp::model::ClientRequest::PingRequest(rmcp::model::PingRequest { method: Default::default(), extensions: Default::default() });
    match tokio::time::timeout(within, peer.send_request(request)).await {
        Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_))) => Ok(()),
        Ok(Err(e)) => Err(format!("a ping failed: {e}")),
        Err(_) => Err(format!("no answer to a ping within {within:?}")),
    }
}

/// Records that a connected server answered: when it was last seen, which readers without a
/// session of their own go by (see `health::UNKNOWN`).
async fn seen(inner: &Inner, server: &Server) {
    let written = async {
        let mut conn = inner.db.acquire_write().await?;
        db::mcp::touch_seen(&mut conn, &server.config.id, db::now_ms()).await
    }
    .await;
    if let Err(e) = written {
        tracing::warn!(mcp.server = %server.config.id, error = %e, "recording that an MCP server answered failed");
    }
}

/// Serves one session until it ends; returns why it ended. A `ListChanged` within
/// [`LIST_CHANGED_MIN_INTERVAL`] of the last one it acted on waits for that period to end, and
/// any number of them meanwhile is one refresh.
#[expect(clippy::too_many_arguments, reason = "the session's channels and flags; a struct would only rename them")]
async fn serve(
    inner: &Inner,
    manager: &McpManager,
    server: &Server,
    session: Session,
    pending: &AtomicBool,
    refresh: &mut mpsc::UnboundedReceiver<RefreshRequest>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    enabled: &mut tokio::sync::watch::Receiver<bool>,
) -> String {
    let cfg = &server.config;
    let peer = session.peer().clone();
    let mut cancel = Some(session.cancellation_token());
    let mut ended = Box::pin(session.waiting());
    let closed_by_server = || match cfg.transport.kind() {
        "stdio" => "the server process exited or closed its output".to_string(),
        _ => "the server closed the session".to_string(),
    };
    let mut last_list_changed: Option<tokio::time::Instant> = None;
    let mut deferred: Option<tokio::time::Instant> = None;
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + cfg.ping_interval, cfg.ping_interval);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The ping in flight: waited for beside the session's other events, never instead of them.
    let mut ping: Option<futures_util::future::BoxFuture<'static, Result<(), String>>> = None;
    loop {
        let req = tokio::select! {
            _ = &mut ended => return closed_by_server(),
            _ = pings.tick(), if ping.is_none() => {
                // A server busy with calls is left to them: each has its own timeout, after
                // which a server that stopped answering is replaced (`Probe`); their answers
                // say it is there.
                if !server.busy() {
                    let (peer, within) = (peer.clone(), cfg.call_timeout.min(PING_WAIT));
                    ping = Some(Box::pin(async move { ping_once(&peer, within).await }));
                } else if server.answered_within(cfg.ping_interval) {
                    seen(inner, server).await;
                }
                continue;
            }
            answered = async { ping.as_mut().expect("a ping in flight").await }, if ping.is_some() => {
                ping = None;
                match answered {
                    Ok(()) => seen(inner, server).await,
                    // Calls started meanwhile: they may be what it is busy with.
                    Err(_) if server.busy() => {}
                    // A server that hangs between calls (a stdio child stuck, an HTTP session
                    // gone) is found here, not by the next call.
                    Err(why) => {
                        if let Some(c) = cancel.take() { c.cancel(); }
                        let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
                        return format!("the server stopped answering ({}); reconnecting", session::scrub(cfg, &inner.secrets, &why));
                    }
                }
                continue;
            }
            _ = shutdown.changed() => {
                if let Some(c) = cancel.take() { c.cancel(); }
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
                return "Gatehouse is stopping".into();
            }
            _ = enabled.changed() => {
                if !*enabled.borrow_and_update() {
                    if let Some(c) = cancel.take() { c.cancel(); }
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
                    return "disabled".into();
                }
                continue;
            }
            () = tokio::time::sleep_until(deferred.unwrap_or_else(tokio::time::Instant::now)), if deferred.is_some() => RefreshRequest::ListChanged,
            Some(req) = refresh.recv() => {
                if matches!(req, RefreshRequest::ListChanged) {
                    let now = tokio::time::Instant::now();
                    let due = last_list_changed.map_or(now, |t| t + LIST_CHANGED_MIN_INTERVAL);
                    if due > now || deferred.is_some() {
                        // Held back; the flag stays set, so further notifications are dropped.
                        deferred.get_or_insert(due);
                        continue;
                    }
                }
                req
            }
        };
        // Whatever asked, this refresh covers every change announced so far.
        deferred = None;
        pending.store(false, Ordering::Release);
        if matches!(req, RefreshRequest::ListChanged) {
            last_list_changed = Some(tokio::time::Instant::now());
        }
        let listed = tokio::time::timeout(cfg.discovery.timeout, session::discover(cfg, &peer)).await;
        let result = match listed {
            Ok(Ok((found, report))) => store(inner, manager, server, &found, &report).await.map(|()| report),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("listing tools took longer than discovery.timeout ({:?})", cfg.discovery.timeout)),
        };
        let probe = matches!(req, RefreshRequest::Probe);
        match &result {
            Ok(_) => record_health(inner, server, health::CONNECTED, None, true).await,
            // A session that does not answer after a timed-out call is replaced.
            Err(e) if probe => {
                if let Some(c) = cancel.take() { c.cancel(); }
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
                return format!("the server stopped answering ({}); reconnecting", session::scrub(cfg, &inner.secrets, e));
            }
            Err(e) => discovery_failed(inner, server, health::DEGRADED, session::scrub(cfg, &inner.secrets, e)).await,
        }
        if let RefreshRequest::Refresh(w) = req {
            // The owner who asked sees the error as the health record keeps it: scrubbed.
            let _ = w.send(result.map_err(|e| session::scrub(cfg, &inner.secrets, &e)));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reconnects_wait_longer_each_time_up_to_a_minute() {
        let waits: Vec<u128> = super::reconnect_delays().take(10).map(|d| d.as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]);
    }
}
