//! The reader: one task per process that follows trace steps and job events as they are
//! committed and publishes each as an event, in id order, with the position after it.
//!
//! It wakes when a writer of this process rings `db::events::ring`, when PostgreSQL delivers a
//! `NOTIFY gatehouse_events` (migration 0023's triggers send one when another process commits
//! such rows), and every `events.poll_interval` in case both were missed. A writer rings while
//! its transaction is still open; on SQLite the reader therefore reads under the write lock
//! (`BEGIN IMMEDIATE`, rolled back), which waits for that transaction to commit, so a ring is
//! never read too early. PostgreSQL's NOTIFY arrives after the commit by itself.

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use sqlx::AnyConnection;
use tokio::sync::watch;

use super::{Envelope, Event, EventId, Events, bus::Inner, late::Late};
use crate::db::{self, Backend, DbError, events as store};

/// Rows of each record read per round; a longer backlog takes several.
const BATCH: i64 = 500;

struct Reader {
    position: EventId,
    health: Option<BTreeMap<String, String>>,
    /// PostgreSQL only: ids passed over while their transactions were still open.
    late: Late,
}

pub(super) fn start(events: &Events) {
    let weak = Arc::downgrade(&events.0);
    let (wake, woken) = watch::channel(0u64);
    if let Some(url) = events.0.db.postgres_url() {
        tokio::spawn(listen(weak.clone(), url, wake.clone()));
    }
    tokio::spawn(run(weak, wake, woken));
}

async fn run(weak: Weak<Inner>, _wake: watch::Sender<u64>, mut woken: watch::Receiver<u64>) {
    let mut bell = db::events::doorbell();
    let mut reader: Option<Reader> = None;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        match round(&inner, reader.take()).await {
            Ok(r) => {
                reader = Some(r);
                inner.ready.send_replace(true);
            }
            Err((r, e)) => {
                reader = r;
                tracing::warn!(error = %e, "reading new trace steps and job events failed; retrying");
            }
        }
        let poll = inner.settings.poll_interval;
        drop(inner);
        tokio::select! {
            _ = bell.changed() => {}
            _ = woken.changed() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}

type RoundResult = Result<Reader, (Option<Reader>, DbError)>;

/// One round: everything committed since the last, published in order.
async fn round(inner: &Arc<Inner>, reader: Option<Reader>) -> RoundResult {
    if inner.db.backend == Backend::Sqlite {
        let mut tx = match inner.db.begin_write().await {
            Ok(tx) => tx,
            Err(e) => return Err((reader, e.into())),
        };
        let result = read(inner, &mut tx, reader).await;
        let _ = tx.rollback().await;
        result
    } else {
        let mut conn = match inner.db.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return Err((reader, e.into())),
        };
        read(inner, &mut conn, reader).await
    }
}

async fn read(inner: &Arc<Inner>, conn: &mut AnyConnection, reader: Option<Reader>) -> RoundResult {
    let mut reader = match reader {
        Some(r) => r,
        // The first round starts at the newest rows: earlier ones are the database's to show.
        None => match store::newest(conn).await {
            Ok((step, job)) => Reader { position: EventId { step, job }, health: None, late: Late::default() },
            Err(e) => return Err((None, e)),
        },
    };
    let postgres = inner.db.backend == Backend::Postgres;
    if postgres {
        match reader.late.found(conn).await {
            Ok(found) => found.into_iter().for_each(|e| send(inner, e)),
            Err(e) => return Err((Some(reader), e)),
        }
    }
    loop {
        let read = match super::bus::read_after(conn, reader.position, BATCH).await {
            Ok(read) => read,
            Err(e) => return Err((Some(reader), e)),
        };
        let full = read.step_ids.len() as i64 >= BATCH || read.job_ids.len() as i64 >= BATCH;
        if postgres {
            reader.late.skipped(reader.position, &read.step_ids, &read.job_ids);
            inner.unsettled.store(!reader.late.is_empty(), Ordering::Release);
        }
        reader.position = read.next;
        read.events.into_iter().for_each(|e| send(inner, e));
        if !full {
            break;
        }
    }
    match store::mcp_health(conn).await {
        Ok(now) => {
            let now: BTreeMap<String, String> = now.into_iter().collect();
            if let Some(before) = &reader.health {
                for (server, health) in now.iter().filter(|(s, h)| before.get(*s) != Some(*h)) {
                    let event = Event::McpHealth { server: server.clone(), health: health.clone() };
                    send(inner, Envelope { id: None, channel: None, chat_id: None, event });
                }
            }
            reader.health = Some(now);
        }
        Err(e) => return Err((Some(reader), e)),
    }
    Ok(reader)
}

fn send(inner: &Inner, envelope: Envelope) {
    let _ = inner.sender.send(Arc::new(envelope));
}

/// On PostgreSQL: wakes the reader when any process commits rows it follows, and publishes
/// other processes' events that have no row (delivery receipts).
async fn listen(weak: Weak<Inner>, url: String, wake: watch::Sender<u64>) {
    let ring = || wake.send_modify(|n| *n = n.wrapping_add(1));
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut listener) => match listener.listen(store::NOTIFY_CHANNEL).await {
                Ok(()) => {
                    // Anything committed while not listening is read now.
                    ring();
                    loop {
                        let next = listener.recv().await;
                        let Some(inner) = weak.upgrade() else { return };
                        match next {
                            Err(e) => {
                                tracing::warn!(error = %e, "LISTEN for events broke; reconnecting");
                                break;
                            }
                            Ok(n) if n.payload().is_empty() => ring(),
                            Ok(n) => publish_remote(&inner, n.payload()),
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN for events failed; reading every events.poll_interval")
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect for LISTEN; reading every events.poll_interval")
            }
        }
        if weak.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// An event another process published with `Events::publish_fact`.
fn publish_remote(inner: &Inner, payload: &str) {
    #[derive(serde::Deserialize)]
    struct Remote {
        origin: String,
        event: Envelope,
    }
    match serde_json::from_str::<Remote>(payload) {
        Ok(remote) if remote.origin != inner.origin => {
            let _ = inner.sender.send(Arc::new(remote.event));
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "an event from another process could not be read"),
    }
}
