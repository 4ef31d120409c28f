//! Rows committed out of id order (PostgreSQL). Ids are taken when a row is inserted, not when
//! its transaction commits, so the reader can pass id 12 while the transaction holding id 11 is
//! still open. Each id the reader skipped over is remembered for [`WAIT`] and looked up again
//! every round; one that appears is published then, without a position (it is older than the
//! stream's), so a page that is open sees it. An id that never appears (a rolled-back insert,
//! a sequence gap) is forgotten after the wait.

use std::time::{Duration, Instant};

use sqlx::AnyConnection;

use super::{Envelope, EventId, classify};
use crate::db::{DbError, events as store};

/// How long a skipped id is looked for: longer than a transaction that writes steps is open.
const WAIT: Duration = Duration::from_secs(30);
/// Skipped ids remembered at most per record (the newest are kept).
const MAX: usize = 2000;

#[derive(Debug, Default)]
pub(super) struct Late {
    steps: Vec<(i64, Instant)>,
    jobs: Vec<(i64, Instant)>,
}

impl Late {
    /// Remembers the ids between `from` (exclusive) and the ids read (`read`, ascending) that
    /// were not among them.
    pub(super) fn skipped(&mut self, from: EventId, step_ids: &[i64], job_ids: &[i64]) {
        let now = Instant::now();
        remember(&mut self.steps, from.step, step_ids, now);
        remember(&mut self.jobs, from.job, job_ids, now);
    }

    /// Whether no skipped id is still looked for.
    pub(super) fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.jobs.is_empty()
    }

    /// The remembered rows that have committed since, as events; they are forgotten then.
    pub(super) async fn found(&mut self, conn: &mut AnyConnection) -> Result<Vec<Envelope>, DbError> {
        let now = Instant::now();
        self.steps.retain(|(_, since)| now.duration_since(*since) < WAIT);
        self.jobs.retain(|(_, since)| now.duration_since(*since) < WAIT);
        let mut out = Vec::new();
        if !self.steps.is_empty() {
            let ids: Vec<i64> = self.steps.iter().map(|(id, _)| *id).collect();
            let rows = store::steps_with_ids(conn, &ids).await?;
            self.steps.retain(|(id, _)| !rows.iter().any(|r| r.id == *id));
            out.extend(rows.iter().map(|r| Envelope { id: None, ..classify::from_step(r, EventId::default()) }));
        }
        if !self.jobs.is_empty() {
            let ids: Vec<i64> = self.jobs.iter().map(|(id, _)| *id).collect();
            let rows = store::job_events_with_ids(conn, &ids).await?;
            self.jobs.retain(|(id, _)| !rows.iter().any(|r| r.id == *id));
            out.extend(rows.iter().map(|r| Envelope { id: None, ..classify::from_job_event(r, EventId::default()) }));
        }
        Ok(out)
    }
}

fn remember(late: &mut Vec<(i64, Instant)>, from: i64, read: &[i64], now: Instant) {
    let mut expected = from + 1;
    for &id in read {
        // A large jump is a backlog from before the reader started, not rows in flight.
        if id - expected > MAX as i64 {
            expected = id - MAX as i64;
        }
        late.extend((expected..id).map(|missing| (missing, now)));
        expected = id + 1;
    }
    if late.len() > MAX {
        late.drain(..late.len() - MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_passed_over_are_remembered() {
        let mut late = Late::default();
        late.skipped(EventId { step: 10, job: 3 }, &[11, 14, 15], &[4]);
        let steps: Vec<i64> = late.steps.iter().map(|(id, _)| *id).collect();
        assert_eq!(steps, [12, 13]);
        assert!(late.jobs.is_empty());
    }
}
