//! The bounded broadcast events are published on, and what a subscriber gets from it.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use tokio::sync::{broadcast, watch};

use super::{Envelope, EventId, classify};
use crate::{
    config::EventSettings,
    db::{Backend, Db, DbError, events as store},
};

/// The event bus of one process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Events(pub(super) Arc<Inner>);

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) db: Db,
    pub(super) sender: broadcast::Sender<Arc<Envelope>>,
    pub(super) settings: EventSettings,
    /// Set once the reader (`tail`) runs; it starts with the first subscriber.
    started: AtomicBool,
    /// Tells this process's own NOTIFYs from other processes' (PostgreSQL).
    pub(super) origin: String,
    /// True once the reader knows where it starts: events from then on are published.
    pub(super) ready: watch::Sender<bool>,
    /// Some row below the newest position published may still commit (see [`Events::unsettled`]).
    pub(super) unsettled: AtomicBool,
}

/// A subscriber's end: events in the order published, and a resync where some were lost.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<Envelope>>,
}

impl Subscription {
    /// The next event; a [`super::Event::Resync`] when this subscriber fell more than
    /// `events.capacity` behind and lost some. `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Arc<Envelope>> {
        match self.rx.recv().await {
            Ok(envelope) => Some(envelope),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(Arc::new(Envelope::resync("lagged", missed, None))),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// What a reconnecting page is sent from the database.
#[derive(Debug)]
pub enum Replay {
    /// The events after the page's position, in order.
    Events(Vec<Envelope>),
    /// More than `events.resume_limit` were missed: the page reloads instead.
    TooFarBehind,
    /// The page's position is past the newest record (a database restored from an older copy,
    /// or a made-up id): nothing after it would be sent until the records caught up, so the
    /// page reloads instead, from the newest position (given).
    Unknown(EventId),
}

impl Events {
    pub fn new(db: Db, settings: &EventSettings) -> Self {
        let (sender, _) = broadcast::channel(settings.capacity.max(1));
        Self(Arc::new(Inner {
            db,
            sender,
            settings: settings.clone(),
            started: AtomicBool::new(false),
            origin: uuid::Uuid::now_v7().to_string(),
            ready: watch::channel(false).0,
            unsettled: AtomicBool::new(false),
        }))
    }

    /// Subscribes to every event published from now on. The first subscription starts this
    /// process's reader (so a command that never subscribes reads nothing); this returns once
    /// the reader knows where it starts, so every row committed after it is published, and a
    /// page that resumes from the database (`replay`) after subscribing misses nothing.
    pub async fn subscribe(&self) -> Subscription {
        let rx = self.0.sender.subscribe();
        if !self.0.started.swap(true, Ordering::AcqRel) {
            super::tail::start(self);
        }
        let mut ready = self.0.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
        Subscription { rx }
    }

    /// Publishes an event that describes no trace step or job event (a delivery receipt):
    /// here at once, and to the other processes through NOTIFY on PostgreSQL. Never waits for
    /// subscribers; a failure to notify is logged, not returned (the ledger is the record).
    pub async fn publish_fact(&self, envelope: Envelope) {
        if self.0.db.backend == Backend::Postgres {
            let payload = serde_json::json!({ "origin": self.0.origin, "event": envelope }).to_string();
            let sent = store::notify(&self.0.db.pool, &payload).await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, kind = envelope.event.kind(), "notifying other processes of an event failed");
            }
        }
        self.send(envelope);
    }

    /// Sends to this process's subscribers; with none, the event is dropped.
    pub(super) fn send(&self, envelope: Envelope) {
        let _ = self.0.sender.send(Arc::new(envelope));
    }

    /// Whether some row with an id below the newest position published may still commit
    /// (PostgreSQL takes ids at insert, not at commit; see `late`). This process's own pages
    /// get such a row live once it commits; a page that reconnects after an id given while
    /// this holds cannot resume from it (the replay reads only later ids) and reloads instead.
    pub fn unsettled(&self) -> bool {
        self.0.unsettled.load(Ordering::Acquire)
    }

    pub fn settings(&self) -> &EventSettings {
        &self.0.settings
    }

    /// The position after the newest trace step and job event.
    pub async fn newest(&self) -> Result<EventId, DbError> {
        let mut conn = self.0.db.pool.acquire().await?;
        let (step, job) = store::newest(&mut conn).await?;
        Ok(EventId { step, job })
    }

    /// The events after `after`, read from the database, for a page that reconnects.
    pub async fn replay(&self, after: EventId) -> Result<Replay, DbError> {
        let limit = self.0.settings.resume_limit;
        let mut conn = self.0.db.pool.acquire().await?;
        let (step, job) = store::newest(&mut conn).await?;
        if after.step > step || after.job > job {
            return Ok(Replay::Unknown(EventId { step, job }));
        }
        let read = read_after(&mut conn, after, limit + 1).await?;
        Ok(if read.events.len() as i64 > limit { Replay::TooFarBehind } else { Replay::Events(read.events) })
    }
}

/// Rows read after a position, as events in order.
pub(super) struct Read {
    pub(super) events: Vec<Envelope>,
    /// The position after the last.
    pub(super) next: EventId,
    pub(super) step_ids: Vec<i64>,
    pub(super) job_ids: Vec<i64>,
}

/// Trace steps, then job events, after `after` (at most `limit` of each).
pub(super) async fn read_after(conn: &mut sqlx::AnyConnection, after: EventId, limit: i64) -> Result<Read, DbError> {
    let steps = store::steps_after(conn, after.step, limit).await?;
    let jobs = store::job_events_after(conn, after.job, limit).await?;
    let mut id = after;
    let mut events = Vec::with_capacity(steps.len() + jobs.len());
    for row in &steps {
        id.step = row.id;
        events.push(classify::from_step(row, id));
    }
    for row in &jobs {
        id.job = row.id;
        events.push(classify::from_job_event(row, id));
    }
    Ok(Read { events, next: id, step_ids: steps.iter().map(|r| r.id).collect(), job_ids: jobs.iter().map(|r| r.id).collect() })
}
