//! Keeping the leases of the runs in progress: the heartbeat renews them and stops a run whose
//! lease is gone or about to run out unrenewed; a cancelled run's lease is let go once it has
//! stopped.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::task::AbortHandle;

use super::Worker;
use crate::db::{self, jobs as store};

/// A run in progress.
pub(super) struct Run {
    pub(super) attempt: i64,
    pub(super) handle: AbortHandle,
    /// Until when its lease is surely held: from its claim, then from each renewal that held.
    pub(super) held_until: Instant,
}

/// Runs in progress, by job id.
pub(super) type InFlight = Arc<Mutex<HashMap<i64, Run>>>;

/// Resolves once the task of `run` has ended (stopped, or finished).
pub(super) async fn ended(run: &AbortHandle) {
    while !run.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How a run's lease is kept: renewed every quarter of the lease, each renewal given an eighth
/// before it counts as failed (a connection whose peer went silent: no statement has a time
/// limit of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Beat {
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    /// Room for the database's clock and this process's to disagree.
    margin: Duration,
}

impl Beat {
    pub(crate) fn of(lease: Duration) -> Self {
        let every = (lease / 4).max(Duration::from_millis(50));
        Self { every, timeout: every / 2, margin: lease / 8 }
    }

    /// Whether a run whose renewal just failed must stop now: its lease, surely held until
    /// `held_until`, could run out before the next decision, which comes after one more beat and
    /// its time to fail (`every + timeout`). With the default minute: at the second failed beat
    /// in a row, some 15 to 30 s before the lease runs out.
    pub(crate) fn stop_unrenewed(&self, held_until: Instant) -> bool {
        Instant::now() + self.every + self.timeout + self.margin >= held_until
    }
}

impl Worker {
    /// Extends leases of running jobs, and stops runs whose lease is gone (cancelled by an owner
    /// or rescued elsewhere) or about to run out unrenewed (the database out of reach): another
    /// worker may rescue such a job once its lease has run out, and the two must never overlap.
    pub(super) async fn heartbeat(self, in_flight: InFlight) {
        let beat_timing = Beat::of(self.settings.lease);
        let every = beat_timing.every;
        loop {
            tokio::time::sleep(every).await;
            // With the attempt each run holds: a run that took an id's place while this beat was
            // out (the job rescued and claimed again) is not the one the answer is about.
            let runs: Vec<(i64, i64)> = in_flight.lock().map(|m| m.iter().map(|(id, run)| (*id, run.attempt)).collect()).unwrap_or_default();
            if runs.is_empty() {
                continue;
            }
            let ids: Vec<i64> = runs.iter().map(|(id, _)| *id).collect();
            let beat = Instant::now();
            let now = db::now_ms();
            let until = now + db::duration_ms(self.settings.lease);
            // A beat that hangs counts as failed after `Beat::timeout`, so the runs it holds are
            // still stopped before their leases run out.
            let result = tokio::time::timeout(beat_timing.timeout, async {
                let mut conn = self.db.pool.acquire().await?;
                store::heartbeat(&mut conn, &ids, &self.id, now, until).await
            })
            .await;
            match result {
                Ok(Ok(held)) => {
                    let Ok(mut map) = in_flight.lock() else { continue };
                    for (id, attempt) in &runs {
                        if map.get(id).is_none_or(|run| run.attempt != *attempt) {
                            continue;
                        }
                        if held.contains(id) {
                            if let Some(run) = map.get_mut(id) {
                                run.held_until = beat + self.settings.lease;
                            }
                        } else if let Some(run) = map.remove(id) {
                            run.handle.abort();
                            tracing::info!(worker = %self.id, job.id = id, "lease lost (cancelled or rescued); run stopped");
                            self.clone().release_when_stopped(*id, run.attempt, run.handle);
                        }
                    }
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {:?}", beat_timing.timeout),
                    };
                    tracing::warn!(worker = %self.id, error = %error, "lease heartbeat failed");
                    let Ok(mut map) = in_flight.lock() else { continue };
                    let due: Vec<i64> = map.iter().filter(|(_, run)| beat_timing.stop_unrenewed(run.held_until)).map(|(id, _)| *id).collect();
                    for id in due {
                        if let Some(run) = map.remove(&id) {
                            run.handle.abort();
                            tracing::warn!(worker = %self.id, job.id = id, "the lease could not be renewed before it ran out; run stopped (the job is rescued once the lease has run out)");
                        }
                    }
                }
            }
        }
    }

    /// A job an owner cancelled while it ran keeps its lease, and so its chat, until its run
    /// has stopped (see `claim_in_order`): once the stopped run's task has ended, the lease is
    /// let go and the chat's next job may start.
    pub(super) fn release_when_stopped(self, id: i64, attempt: i64, run: AbortHandle) {
        tokio::spawn(async move {
            ended(&run).await;
            let released = async {
                let mut conn = self.db.pool.acquire().await?;
                store::release_cancelled(&mut conn, id, attempt, &self.id).await
            }
            .await;
            match released {
                Ok(true) => self.wake.notify_one(),
                Ok(false) => {}
                // Maintenance lets it go once the lease has run out.
                Err(e) => tracing::warn!(worker = %self.id, job.id = id, error = %e, "a cancelled run's lease could not be let go; it is once it runs out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the default minute: one failed beat is ridden out, the second stops the run; and
    /// whenever a run is not stopped, the next decision (one beat and its time to fail later)
    /// still comes while its lease is held, with the margin to spare.
    #[test]
    fn a_run_is_stopped_before_its_lease_can_run_out_unrenewed() {
        let lease = Duration::from_secs(60);
        let beat = Beat::of(lease);
        // From one decision to the next: a beat's period, and its time to fail.
        let step = beat.every + beat.timeout;
        let now = Instant::now();
        assert!(!beat.stop_unrenewed(now + lease - step), "one failed beat after a renewal is ridden out");
        assert!(beat.stop_unrenewed(now + lease - step * 2), "the second stops the run");
        // Whenever a run goes on, the next decision still comes while its lease is held, with
        // an eighth of the lease to spare.
        for left_ms in (0..=60_000).step_by(250) {
            let left = Duration::from_millis(left_ms);
            if !beat.stop_unrenewed(Instant::now() + left) {
                assert!(left > step + lease / 8, "goes on with {left:?} left; the next decision may be {step:?} away");
            }
        }
    }
}
