//! Server-sent events for live console pages.
//!
//! `GET /api/events?topics=message,job` streams typed events (`crate::events`) as JSON (`&kinds=`
//! keeps only the job events of those job kinds), each row-backed one with its position as the SSE `id`. A page that connects afresh first gets a
//! `resync` (reload: anything that changed between its render and its subscription is then
//! shown); one that reconnects sends `Last-Event-ID` and gets the events it missed, read from
//! the database, before the live ones, so nothing falls in the gap; one too far behind, or a
//! subscriber that fell behind the broadcast, gets a `resync` instead. An owner session holds
//! at most `events.max_streams_per_session` streams; one more gets 429 `TOO_MANY_STREAMS`.
//! Streams end when the server shuts down, and when their session no longer belongs to a
//! signed-in owner (a logout, a password reset, the session's expiry): each stream checks
//! that again every [`SESSION_RECHECK`].
//!
//! The MCP page also follows the servers' tool definitions, which the events do not carry; it
//! keeps its own status stream (`mcp_stream`).

use std::{
    collections::{HashMap, VecDeque},
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use app::backend::SharedBackend;
use axum::{
    Extension, Json,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures_util::Stream;
use tower_sessions::Session;

use super::state::AppState;
use crate::events::{Envelope, EventId, Events, Replay, Subscription, Topic};

/// The stable code of a stream refused for the session's limit.
pub const TOO_MANY_STREAMS: &str = "TOO_MANY_STREAMS";

/// How often an open stream checks that its session still belongs to a signed-in owner.
pub const SESSION_RECHECK: Duration = Duration::from_secs(5);

/// The session a stream was opened in, checked again while the stream stays open: the guard
/// let it in once, and a stream outlives the request.
struct Viewer {
    session: Session,
    backend: SharedBackend,
    next_check: tokio::time::Instant,
}

impl Viewer {
    fn new(session: Session, backend: SharedBackend) -> Self {
        Self { session, backend, next_check: tokio::time::Instant::now() + SESSION_RECHECK }
    }

    /// Whether the session, read again from the store, still belongs to a signed-in owner
    /// (whose password was not reset since); a store that cannot say ends the stream too.
    async fn still_signed_in(&mut self) -> bool {
        self.next_check = tokio::time::Instant::now() + SESSION_RECHECK;
        if let Err(e) = self.session.load().await {
            tracing::warn!(error = %e, "reading a live stream's session failed; the stream ends");
            return false;
        }
        matches!(app::auth::owner_of(&self.session, &self.backend).await, Ok(Some(_)))
    }
}

/// Open live streams per owner session.
#[derive(Debug, Clone, Default)]
pub struct StreamSlots(Arc<Mutex<HashMap<String, usize>>>);

/// One open stream; dropping it (the client went away) frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    slots: StreamSlots,
    key: String,
}

impl StreamSlots {
    /// A slot for `key`'s session, unless it already holds `max`.
    pub fn take(&self, key: &str, max: usize) -> Option<StreamSlot> {
        let mut open = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(key.to_string()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(StreamSlot { slots: self.clone(), key: key.to_string() })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct StreamQuery {
    /// Comma-separated topics (`message`, `approval`, `job`, `mcp`); none: all.
    #[serde(default)]
    topics: String,
    /// Comma-separated job kinds (`evals.cycle`, ...): job events about other kinds are left
    /// out; none: every kind.
    #[serde(default)]
    kinds: String,
}

/// What a stream sends: the events of its topics and, of job events, those of its kinds.
struct Wanted {
    topics: Vec<Topic>,
    kinds: Vec<String>,
}

impl Wanted {
    fn of(query: &StreamQuery) -> Self {
        let list = |text: &str| text.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect::<Vec<_>>();
        Self { topics: list(&query.topics).iter().filter_map(|t| t.parse().ok()).collect(), kinds: list(&query.kinds) }
    }

    fn wants(&self, envelope: &Envelope) -> bool {
        let event = &envelope.event;
        event.topic().is_none_or(|t| self.topics.is_empty() || self.topics.contains(&t))
            && event.job_kind().is_none_or(|k| self.kinds.is_empty() || self.kinds.iter().any(|w| w == k))
    }
}

struct Follow {
    /// Whether an id given now is a safe point to resume from.
    events: Events,
    backlog: VecDeque<Envelope>,
    sub: Subscription,
    last: EventId,
    wanted: Wanted,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    viewer: Viewer,
    _slot: StreamSlot,
}

/// The suffix of an SSE id given while a row below it may still commit (PostgreSQL): a page
/// that resumes from such an id reloads instead ([`Events::unsettled`]).
///
/// [`Events::unsettled`]: crate::events::Events::unsettled
const UNSETTLED: &str = "-u";

fn sse(envelope: &Envelope, unsettled: bool) -> Event {
    let event = Event::default().data(serde_json::to_string(envelope).unwrap_or_default());
    match envelope.id {
        Some(id) if unsettled => event.id(format!("{}{UNSETTLED}", id.to_sse())),
        Some(id) => event.id(id.to_sse()),
        None => event,
    }
}

/// A slot among the session's streams of one `kind`, unless it holds as many as it may.
fn take_slot(state: &AppState, session: &Session, kind: &str) -> Option<StreamSlot> {
    let key = format!("{kind}:{}", session.id().map(|id| id.to_string()).unwrap_or_default());
    state.streams.take(&key, state.events.settings().max_streams_per_session)
}

/// The answer to one stream more than a session may hold.
fn too_many_streams() -> Response {
    let message = "Too many live pages are open in this session; close one, or reload this page later.";
    (StatusCode::TOO_MANY_REQUESTS, Json(serde_json::json!({ "code": TOO_MANY_STREAMS, "message": message }))).into_response()
}

pub async fn events_stream(State(state): State<AppState>, Extension(backend): Extension<SharedBackend>, session: Session, headers: HeaderMap, Query(query): Query<StreamQuery>) -> Response {
    let Some(slot) = take_slot(&state, &session, "events") else {
        return too_many_streams();
    };
    let wanted = Wanted::of(&query);
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(|id| match id.strip_suffix(UNSETTLED) {
        Some(_) => Resume::Unsettled,
        None => Resume::After(EventId::parse(id)),
    });
    let sub = state.events.subscribe().await;
    let (backlog, last) = start(&state, resume).await;
    let backlog = backlog.into_iter().filter(|e| wanted.wants(e)).collect();
    let follow = Follow { events: state.events.clone(), backlog, sub, last, wanted, shutdown: super::serve::shutdown_requested(), viewer: Viewer::new(session, backend), _slot: slot };
    Sse::new(follow_stream(follow)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// Where a reconnecting page says it was (its `Last-Event-ID`).
enum Resume {
    After(Option<EventId>),
    /// An id given while a row below it might still commit: no safe point to resume from.
    Unsettled,
}

/// What a stream sends before the live events, and the position they continue after.
async fn start(state: &AppState, resume: Option<Resume>) -> (Vec<Envelope>, EventId) {
    let reload = |reason: &str, id: Option<EventId>| (vec![Envelope::resync(reason, 0, id)], id.unwrap_or_default());
    let after = match resume {
        Some(Resume::After(Some(after))) => after,
        Some(Resume::Unsettled) => return reload("unsettled_position", state.events.newest().await.ok()),
        Some(Resume::After(None)) | None => return reload("connected", state.events.newest().await.ok()),
    };
    match state.events.replay(after).await {
        Ok(Replay::Events(events)) => {
            let last = events.iter().filter_map(|e| e.id).fold(after, EventId::max);
            (events, last)
        }
        Ok(Replay::TooFarBehind) => reload("too_far_behind", state.events.newest().await.ok()),
        Ok(Replay::Unknown(newest)) => reload("unknown_position", Some(newest)),
        Err(e) => {
            tracing::warn!(error = %e, "reading missed events failed; the page reloads");
            reload("unavailable", None)
        }
    }
}

fn follow_stream(follow: Follow) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(follow, |mut f| async move {
        if let Some(envelope) = f.backlog.pop_front() {
            return Some((Ok(sse(&envelope, f.events.unsettled())), f));
        }
        loop {
            let stopping = async {
                match f.shutdown.as_mut() {
                    Some(rx) => {
                        let _ = rx.wait_for(|stop| *stop).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let next = tokio::select! {
                next = f.sub.recv() => next,
                () = stopping => None,
                () = tokio::time::sleep_until(f.viewer.next_check) => {
                    if !f.viewer.still_signed_in().await {
                        return None;
                    }
                    continue;
                }
            };
            let envelope = next?;
            if let Some(id) = envelope.id {
                // Already sent from the database after a reconnect.
                if !id.is_after(f.last) {
                    continue;
                }
                f.last = f.last.max(id);
            }
            if f.wanted.wants(&envelope) {
                return Some((Ok(sse(&envelope, f.events.unsettled())), f));
            }
        }
    })
}

/// Waits a second between polls (not before the first); false when the server is shutting down.
async fn wait_or_stop(first: bool, shutdown: &mut Option<tokio::sync::watch::Receiver<bool>>) -> bool {
    let stopping = async {
        match shutdown.as_mut() {
            Some(rx) => {
                let _ = rx.wait_for(|stop| *stop).await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let pause = if first { Duration::ZERO } else { Duration::from_secs(1) };
    tokio::select! {
        () = tokio::time::sleep(pause) => true,
        () = stopping => false,
    }
}

/// MCP server changes for the MCP servers page: each second the servers' status (health, last
/// error, tool and pending counts, enabled) and the forms waiting for an owner are compared
/// with the last one sent. A session holds at most `events.max_streams_per_session` of them, as
/// of the event streams (each reads the database every second).
pub async fn mcp_stream(State(state): State<AppState>, Extension(backend): Extension<SharedBackend>, session: Session) -> Response {
    struct McpWatch {
        state: AppState,
        last: Option<u64>,
        shutdown: Option<tokio::sync::watch::Receiver<bool>>,
        viewer: Viewer,
        _slot: StreamSlot,
    }
    let Some(slot) = take_slot(&state, &session, "mcp") else {
        return too_many_streams();
    };
    let start = McpWatch { state, last: None, shutdown: super::serve::shutdown_requested(), viewer: Viewer::new(session, backend), _slot: slot };
    let stream = futures_util::stream::unfold(start, |mut w| async move {
        loop {
            if !wait_or_stop(w.last.is_none(), &mut w.shutdown).await {
                return None;
            }
            if tokio::time::Instant::now() >= w.viewer.next_check && !w.viewer.still_signed_in().await {
                return None;
            }
            let Ok(servers) = w.state.mcp.servers().await else { continue };
            // A pending tool whose definition changes must show the new one before anyone
            // decides on it, so its hash is part of what the page follows.
            let mut pending = Vec::new();
            for s in servers.iter().filter(|s| s.pending > 0) {
                if let Ok(tools) = w.state.mcp.tools(&s.id).await {
                    pending.extend(tools.into_iter().filter(|t| t.state != "approved").map(|t| (t.catalog_name, t.definition_hash)));
                }
            }
            let shape: Vec<_> = servers.iter().map(|s| (&s.id, s.enabled, &s.health, &s.last_error, s.tool_count, s.pending)).collect();
            // A form a server asks for during a call (stored by whichever process runs the call).
            let forms: Vec<i64> = w.state.mcp.forms().await.map(|f| f.iter().map(|f| f.id).collect()).unwrap_or_default();
            let shape = (shape, pending, forms);
            let fingerprint = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                format!("{shape:?}").hash(&mut h);
                h.finish()
            };
            if w.last == Some(fingerprint) {
                continue;
            }
            w.last = Some(fingerprint);
            return Some((Ok::<Event, Infallible>(Event::default().event("message").data(fingerprint.to_string())), w));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}
