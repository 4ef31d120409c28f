//! Recording outcomes: batched in one transaction, retried and split when a batch keeps
//! failing, then the after-run hooks of each job whose outcome was applied.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures_util::FutureExt;
use tokio::sync::mpsc;

use super::{InFlight, Outcome, Refill, Worker, free_slots, with_slots};
use crate::{
    db::{
        self, Backend, DbError,
        jobs::{self as store, Dropped, Finished},
    },
    jobs::{
        dropped::Woken,
        outcome::{self, Applied, RetryTimes},
    },
};

/// Outcomes recorded in one transaction at most.
const MAX_OUTCOMES: usize = 512;

impl Worker {
    /// Records outcomes in batches: whatever has arrived is written in one transaction, which
    /// also claims jobs for the slots those runs free. A batch that keeps failing is split, so
    /// one unwritable outcome cannot hold up the others.
    pub(super) async fn record_outcomes(self, mut rx: mpsc::UnboundedReceiver<Outcome>, in_flight: InFlight, refill: Refill) {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, MAX_OUTCOMES).await > 0 {
            let gathered = self.record_gathering(&mut batch, &mut rx, &refill).await;
            self.db.storage().observe(&gathered);
            let recorded = match gathered {
                Ok(applied) => Some(applied),
                Err(e) => {
                    tracing::warn!(worker = %self.id, error = %e, outcomes = batch.len(), "recording job outcomes failed; retrying");
                    self.record_with_retry(&batch, 3).await
                }
            };
            let applied = match recorded {
                Some(applied) => applied,
                None => {
                    let mut each = Vec::with_capacity(batch.len());
                    for o in &batch {
                        // Retried until the database is back; given up only for this one outcome
                        // if the database keeps refusing it (its lease then expires and it reruns).
                        let one = self.record_with_retry(std::slice::from_ref(o), 20).await;
                        each.push(one.and_then(|mut v| v.pop()).unwrap_or(Applied::Stale));
                    }
                    each
                }
            };
            if let Ok(mut map) = in_flight.lock() {
                for o in &batch {
                    if map.get(&o.job.id).is_some_and(|run| run.attempt == o.job.attempt) {
                        map.remove(&o.job.id);
                    }
                }
            }
            for (outcome, applied) in batch.drain(..).zip(applied) {
                self.run_hooks(outcome, applied).await;
            }
        }
    }

    pub(super) async fn record_with_retry(&self, batch: &[Outcome], tries: u32) -> Option<Vec<Applied>> {
        let delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(usize::try_from(tries.saturating_sub(1)).unwrap_or(usize::MAX));
        (|| async { self.record(batch).await.inspect(|_| self.db.storage().wrote()).inspect_err(|e| self.db.storage().failed(e)) })
            .retry(delays)
            .notify(|e, wait| tracing::warn!(worker = %self.id, error = %e, outcomes = batch.len(), retry_in_ms = wait.as_millis() as u64, "recording job outcomes failed; retrying"))
            .await
            .inspect_err(|e| tracing::warn!(worker = %self.id, error = %e, outcomes = batch.len(), tries, "recording job outcomes failed on every try"))
            .ok()
    }

    /// Begins the transaction first, then adds every outcome that arrived while it waited for the
    /// writer (on SQLite, its turn after claims and other recorders): one commit for all of
    /// them. Taking only what had arrived before it began made a transaction per run or two.
    ///
    /// The same transaction claims as many due jobs as the worker will have free slots once it
    /// commits (those free now and those of the runs it records), and hands them to the run
    /// loop with those slots: on SQLite's one writer connection a claim of its own cost three
    /// more round trips and a commit (README, Performance). Not once the worker is stopping,
    /// and not on PostgreSQL, whose claim commits without waiting for its WAL flush: the
    /// outcomes must not (`db::jobs::claim`), and there claims do not wait for one connection.
    async fn record_gathering(&self, batch: &mut Vec<Outcome>, rx: &mut mpsc::UnboundedReceiver<Outcome>, refill: &Refill) -> Result<Vec<Applied>, DbError> {
        let mut tx = self.db.begin_write().await?;
        while batch.len() < MAX_OUTCOMES {
            match rx.try_recv() {
                Ok(outcome) => batch.push(outcome),
                Err(_) => break,
            }
        }
        let (applied, released, followed) = self.record_in(&mut tx, batch).await?;
        let refilling = if self.db.backend != Backend::Sqlite || *refill.shutdown.borrow() { None } else { free_slots(&refill.permits) };
        let claim = match refilling {
            Some(slots) => {
                let limit = slots.num_permits() + batch.iter().filter(|o| o.permit.is_some()).count();
                let now = db::now_ms();
                let jobs = if limit > 0 { self.claim_in(&mut tx, limit, now).await? } else { Vec::new() };
                Some((jobs, slots, now))
            }
            None => None,
        };
        tx.commit().await?;
        followed.wake();
        if released {
            self.wake.notify_one();
        }
        self.count_recorded(&applied);
        if let Some((jobs, mut slots, now)) = claim {
            self.count_claimed(&jobs, now);
            for outcome in batch.iter_mut() {
                if let Some(permit) = outcome.permit.take() {
                    slots.merge(permit);
                }
            }
            if !jobs.is_empty() {
                // Only if the run loop has stopped does this fail; their leases are then released.
                let _ = refill.claimed.send(with_slots(jobs, slots));
            }
        }
        Ok(applied)
    }

    pub(super) async fn record(&self, batch: &[Outcome]) -> Result<Vec<Applied>, DbError> {
        let mut tx = self.db.begin_write().await?;
        let (applied, released, followed) = self.record_in(&mut tx, batch).await?;
        tx.commit().await?;
        followed.wake();
        if released {
            self.wake.notify_one();
        }
        self.count_recorded(&applied);
        Ok(applied)
    }

    /// Writes the outcomes of `batch` in the caller's transaction: each as
    /// [`outcome::write_unfinished`] says, and those that complete their jobs in one statement.
    /// Also says whether a cancelled job's lease was let go: its chat's next job may start once
    /// the caller has committed; and enqueues the follow-ups of the jobs it discarded, whose
    /// queues the caller wakes once it has committed.
    async fn record_in(&self, tx: &mut sqlx::AnyConnection, batch: &[Outcome]) -> Result<(Vec<Applied>, bool, Woken), DbError> {
        let now = db::now_ms();
        let times = RetryTimes { base: self.settings.retry_base, max: self.settings.retry_max };
        let (mut written, mut done) = (Vec::with_capacity(batch.len()), Vec::new());
        for o in batch {
            let w = outcome::write_unfinished(tx, &o.job, &self.id, &o.result, times, now).await?;
            if w.is_none() {
                done.push(Finished { id: o.job.id, attempt: o.job.attempt, preview: o.result.as_ref().ok().and_then(|out| out.preview.clone()) });
            }
            written.push(w);
        }
        let completed = store::complete(tx, &done, &self.id, now).await?;
        let applied: Vec<Applied> = batch.iter().zip(written).map(|(o, w)| w.unwrap_or(if completed.contains(&(o.job.id, o.job.attempt)) { Applied::Completed } else { Applied::Stale })).collect();
        // A run that ended on its own after its job was cancelled: its lease, kept so the job's
        // chat waited for it, is let go now (the heartbeat that would have stopped it never
        // sees it again).
        let mut released = false;
        for (o, _) in batch.iter().zip(&applied).filter(|(_, a)| **a == Applied::Stale) {
            released |= store::release_cancelled(tx, o.job.id, o.job.attempt, &self.id).await?;
        }
        let dropped: Vec<Dropped> = batch.iter().zip(&applied).filter(|(_, a)| **a == Applied::Failed { discarded: true }).map(|(o, _)| Dropped::from(&o.job)).collect();
        let followed = self.registry.follow_ups().enqueue(tx, &dropped).await?;
        Ok((applied, released, followed))
    }

    /// Metrics of committed outcomes.
    fn count_recorded(&self, applied: &[Applied]) {
        let queue = self.settings.queue.clone();
        let completed = applied.iter().filter(|a| matches!(a, Applied::Completed)).count();
        metrics::counter!("jobs_completed_total", "queue" => queue.clone()).increment(completed as u64);
        let failed = applied.iter().filter(|a| matches!(a, Applied::Failed { .. })).count();
        metrics::counter!("jobs_failed_total", "queue" => queue).increment(failed as u64);
    }

    /// Hooks run only for outcomes the store accepted; a panicking or slow hook is contained.
    pub(super) async fn run_hooks(&self, outcome: Outcome, applied: Applied) {
        let job = &outcome.job;
        match (&outcome.result, &applied) {
            (Err(err), Applied::Failed { discarded: true }) => {
                tracing::warn!(job.id = job.id, kind = %job.kind, code = %err.code, "job discarded");
            }
            (_, Applied::Stale) => {
                tracing::info!(job.id = job.id, kind = %job.kind, "result ignored: the job was cancelled or taken over meanwhile");
            }
            _ => {}
        }
        for hook in self.registry.hooks() {
            let call = match (&outcome.result, &applied) {
                (Ok(_), Applied::Completed) => hook.on_success(job).boxed(),
                (Err(err), Applied::Failed { discarded }) => hook.on_failure(job, err, *discarded).boxed(),
                _ => continue,
            };
            let guarded = tokio::time::timeout(Duration::from_secs(10), std::panic::AssertUnwindSafe(call).catch_unwind()).await;
            match guarded {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::error!(job.id = job.id, "a job hook panicked"),
                Err(_) => tracing::error!(job.id = job.id, "a job hook took longer than 10 s"),
            }
        }
    }
}
