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

/// A run whose renewal failed is stopped when its lease would run out before the next beat
/// (`every`) could renew it, with a margin for the database's clock and this process's to
/// disagree: with the default minute, after the second failed beat in a row.
pub(crate) fn stop_unrenewed(held_until: Instant, lease: Duration, every: Duration) -> bool {
    Instant::now() + every + lease / 4 >= held_until
}

impl Worker {
    /// Extends leases of running jobs, and stops runs whose lease is gone (cancelled by an owner
    /// or rescued elsewhere) or about to run out unrenewed (the database out of reach): another
    /// worker may rescue such a job once its lease has run out, and the two must never overlap.
    pub(super) async fn heartbeat(self, in_flight: InFlight) {
        let every = (self.settings.lease / 3).max(Duration::from_millis(50));
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
            // A beat that hangs (a connection whose peer went silent: no statement has a time
            // limit of its own) counts as failed once the next is due, so the runs it holds are
            // still stopped before their leases run out.
            let result = tokio::time::timeout(every, async {
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
                        _ => format!("no answer within {every:?}"),
                    };
                    tracing::warn!(worker = %self.id, error = %error, "lease heartbeat failed");
                    let Ok(mut map) = in_flight.lock() else { continue };
                    let due: Vec<i64> = map.iter().filter(|(_, run)| stop_unrenewed(run.held_until, self.settings.lease, every)).map(|(id, _)| *id).collect();
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
