//! `[events]`: the live view of what happens to messages and calls. Events are published on a
//! bounded in-process broadcast (and across processes on PostgreSQL through LISTEN/NOTIFY); the
//! console's pages follow them over server-sent events.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EventSettings {
    /// Events each subscriber may fall behind by before it is told it lost some (a `resync`
    /// event) and its page reloads its data from the database.
    pub capacity: usize,
    /// How often each process reads new trace steps and job events when nothing woke it: the
    /// fallback behind the wake-ups its own writes and PostgreSQL's NOTIFY give.
    #[serde(with = "duration_str")]
    pub poll_interval: Duration,
    /// Live streams one owner session may hold open at once (a page each), counted apart for the
    /// event stream and the MCP servers page's stream; one more gets 429 `TOO_MANY_STREAMS`.
    pub max_streams_per_session: usize,
    /// Events a reconnecting page is sent from the database (after its Last-Event-ID) before it
    /// is told to reload instead.
    pub resume_limit: i64,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self { capacity: 1024, poll_interval: Duration::from_secs(1), max_streams_per_session: 4, resume_limit: 500 }
    }
}
