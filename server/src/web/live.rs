//! Server-sent events for live console pages. The stream sends an event at once (anything that
//! changed between the page's load and its subscription is picked up), then whenever the newest
//! job state change moves (one indexed lookup per second per open page), once more shortly
//! after (PostgreSQL commits can land out of id order), and ends when the server shuts down.

use std::{convert::Infallible, time::Duration};

use axum::{
    extract::State,
    response::sse::{Event, KeepAlive, Sse},
};
use futures_util::Stream;
use tokio::time::Instant;

use super::state::AppState;

struct Watch {
    state: AppState,
    last: Option<i64>,
    echo_at: Option<Instant>,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
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

pub async fn jobs_stream(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let start = Watch { state, last: None, echo_at: None, shutdown: super::serve::shutdown_requested() };
    let stream = futures_util::stream::unfold(start, |mut w| async move {
        loop {
            if !wait_or_stop(w.last.is_none(), &mut w.shutdown).await {
                return None;
            }
            let latest = sqlx::query_as::<_, (Option<i64>,)>("SELECT MAX(id) FROM job_events").fetch_one(&w.state.db.pool).await;
            let Ok((latest,)) = latest else { continue };
            let latest = latest.unwrap_or(0);
            let changed = w.last != Some(latest);
            w.last = Some(latest);
            if changed {
                w.echo_at = Some(Instant::now() + Duration::from_secs(2));
            } else if w.echo_at.is_some_and(|at| Instant::now() >= at) {
                w.echo_at = None;
            } else {
                continue;
            }
            return Some((Ok(Event::default().event("message").data(latest.to_string())), w));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// MCP server changes for the MCP servers page: each second the servers' status (health, last
/// error, tool and pending counts, enabled) is compared with the last one sent.
pub async fn mcp_stream(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    struct McpWatch {
        state: AppState,
        last: Option<u64>,
        shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    }
    let start = McpWatch { state, last: None, shutdown: super::serve::shutdown_requested() };
    let stream = futures_util::stream::unfold(start, |mut w| async move {
        loop {
            if !wait_or_stop(w.last.is_none(), &mut w.shutdown).await {
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
            let shape = (shape, pending);
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
            return Some((Ok(Event::default().event("message").data(fingerprint.to_string())), w));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
