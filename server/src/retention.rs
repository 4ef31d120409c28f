//! `[retention]`: the `retention.prune` job removes the records of finished work older than
//! their kind's days (finished jobs with their events, and the older events of jobs that run
//! again and again; settled approval requests, owner notices and past budget warnings, recorded
//! model calls). It runs once per deployment at a time (one job, by its dedupe key), in batches
//! of [`BATCH`] rows, each its own write transaction, and then again every `retention.every`.
//! A run that has more to remove than half its job's time allows stops between batches and
//! goes on at once in its next turn (a first prune of a long-lived database). What it removed
//! is its job's preview.

use std::{future::Future, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

use tokio::time::Instant;

use crate::{
    budget,
    config::{RetentionSettings, Settings},
    db::{self, Db, DbError, retention as store},
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
};

/// Rows removed per write transaction.
pub const BATCH: i64 = 500;

const DAY_MS: i64 = 86_400_000;

/// The pause before a prune that stopped for time goes on.
const CARRY_ON: Duration = Duration::from_secs(1);

/// What one prune removed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub finished_jobs: u64,
    /// Events older than `finished_jobs_days` of jobs still unfinished (those that run again
    /// and again, such as this one).
    pub old_job_events: u64,
    pub decided_approvals: u64,
    pub notices: u64,
    pub budget_warnings: u64,
    pub model_calls: u64,
    /// It stopped for time with more to remove.
    pub more: bool,
}

impl Pruned {
    /// One line for the job's preview.
    pub fn summary(&self) -> String {
        format!(
            "removed {} finished job(s), {} older event(s) of unfinished jobs, {} settled approval request(s), {} owner notice(s), {} past budget warning(s), {} model call record(s){}",
            self.finished_jobs,
            self.old_job_events,
            self.decided_approvals,
            self.notices,
            self.budget_warnings,
            self.model_calls,
            if self.more { "; more to remove in the next turn" } else { "" }
        )
    }
}

/// The moment before which a kind kept `days` days is removed (`None`: kept for ever).
fn cutoff(now_ms: i64, days: u32) -> Option<i64> {
    (days > 0).then(|| now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS)))
}

/// Runs `one` (a batch in its own write transaction) until it removes less than a batch, or
/// `until` has come; the rows removed, and whether it stopped for time.
async fn in_batches<F, Fut>(db: &Db, until: Instant, mut one: F) -> Result<(u64, bool), DbError>
where
    F: FnMut(sqlx::Transaction<'static, sqlx::Any>) -> Fut,
    Fut: Future<Output = Result<(u64, sqlx::Transaction<'static, sqlx::Any>), DbError>>,
{
    let mut total = 0;
    loop {
        let (removed, tx) = one(db.begin_write().await?).await?;
        tx.commit().await?;
        total += removed;
        if removed < BATCH as u64 {
            return Ok((total, false));
        }
        if Instant::now() >= until {
            return Ok((total, true));
        }
    }
}

/// Removes what `settings` no longer keeps at `now_ms`, stopping between batches once `until`
/// has come ([`Pruned::more`]).
pub async fn prune(db: &Db, settings: &RetentionSettings, now_ms: i64, until: Instant) -> Result<Pruned, DbError> {
    let mut pruned = Pruned::default();
    // Each kind in turn, while there is time.
    if let Some(before) = cutoff(now_ms, settings.finished_jobs_days) {
        (pruned.finished_jobs, pruned.more) = in_batches(db, until, |mut tx| async move { Ok((store::finished_jobs(&mut tx, before, BATCH).await?, tx)) }).await?;
        if !pruned.more {
            (pruned.old_job_events, pruned.more) = in_batches(db, until, |mut tx| async move { Ok((store::old_job_events(&mut tx, before, BATCH).await?, tx)) }).await?;
        }
    }
    if let Some(before) = cutoff(now_ms, settings.decided_approvals_days).filter(|_| !pruned.more) {
        (pruned.decided_approvals, pruned.more) = in_batches(db, until, |mut tx| async move { Ok((store::decided_approvals(&mut tx, before, BATCH).await?, tx)) }).await?;
    }
    if let Some(before) = cutoff(now_ms, settings.notices_days).filter(|_| !pruned.more) {
        (pruned.notices, pruned.more) = in_batches(db, until, |mut tx| async move { Ok((store::notices(&mut tx, before, BATCH).await?, tx)) }).await?;
        // A warning of the current month (or of a day in it) is what stops that period from
        // being warned about twice: only those of months that ended go.
        let [_, (_, _, month_start)] = budget::periods_at(now_ms);
        let mut tx = db.begin_write().await?;
        pruned.budget_warnings = store::budget_warnings(&mut tx, before.min(month_start)).await?;
        tx.commit().await?;
    }
    if let Some(before) = cutoff(now_ms, settings.model_calls_days).filter(|_| !pruned.more) {
        (pruned.model_calls, pruned.more) = in_batches(db, until, |mut tx| async move { Ok((store::model_calls(&mut tx, before, BATCH).await?, tx)) }).await?;
    }
    Ok(pruned)
}

/// The periodic prune.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneJob {}

impl JobKind for PruneJob {
    const KIND: &'static str = "retention.prune";
}

impl PruneJob {
    pub const DEDUPE_KEY: &'static str = "retention:prune";
}

/// Runs [`PruneJob`]s.
#[derive(Debug, Clone)]
pub struct Retention {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
}

impl Retention {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>) -> Self {
        Self { db, queue, settings }
    }

    /// Queues the prune to run now, unless one is queued (its dedupe key) or
    /// `retention.every` is 0.
    pub async fn schedule(&self) -> Result<(), DbError> {
        if self.settings.retention.every.is_zero() {
            return Ok(());
        }
        let mut job = self.queue.job(&PruneJob {});
        job.dedupe_key = Some(PruneJob::DEDUPE_KEY.into());
        job.correlation_id = PruneJob::DEDUPE_KEY.into();
        self.queue.enqueue_periodic(&job).await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Handler<PruneJob> for Retention {
    async fn run(&self, _args: PruneJob, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let retention = &self.settings.retention;
        // Half the run's time: a long first prune stops between batches, well before the run
        // would be cut (which would use up an attempt).
        let left = ctx.deadline.saturating_duration_since(Instant::now());
        let pruned = prune(&self.db, retention, db::now_ms(), Instant::now() + left / 2).await?;
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "removed records past their retention");
        }
        // The next turn: at once while there is more to remove; none once it is turned off, so
        // a job queued before runs once.
        let snooze = if retention.every.is_zero() {
            None
        } else if pruned.more {
            Some(CARRY_ON)
        } else {
            Some(retention.every)
        };
        Ok(JobOutput { preview: Some(pruned.summary()), snooze })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_days_keeps_for_ever() {
        assert_eq!(cutoff(10 * DAY_MS, 0), None);
        assert_eq!(cutoff(10 * DAY_MS, 3), Some(7 * DAY_MS));
    }
}
