//! `[retention]`: the `retention.prune` job removes the records of finished work older than
//! their kind's days (finished jobs with their events, settled approval requests, owner notices
//! and past budget warnings, recorded model calls). It runs once per deployment at a time (one
//! job, by its dedupe key), in batches of [`BATCH`] rows, each its own write transaction, and
//! then again every `retention.every`. What it removed is its job's preview.

use std::{future::Future, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::{
    budget,
    config::{RetentionSettings, Settings},
    db::{self, Db, DbError, retention as store},
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
};

/// Rows removed per write transaction.
pub const BATCH: i64 = 500;

const DAY_MS: i64 = 86_400_000;

/// What one prune removed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub finished_jobs: u64,
    pub decided_approvals: u64,
    pub notices: u64,
    pub budget_warnings: u64,
    pub model_calls: u64,
}

impl Pruned {
    /// One line for the job's preview.
    pub fn summary(&self) -> String {
        format!(
            "removed {} finished job(s), {} settled approval request(s), {} owner notice(s), {} past budget warning(s), {} model call record(s)",
            self.finished_jobs, self.decided_approvals, self.notices, self.budget_warnings, self.model_calls
        )
    }
}

/// The moment before which a kind kept `days` days is removed (`None`: kept for ever).
fn cutoff(now_ms: i64, days: u32) -> Option<i64> {
    (days > 0).then(|| now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS)))
}

/// Runs `one` (a batch in its own write transaction) until it removes less than a batch.
async fn in_batches<F, Fut>(db: &Db, mut one: F) -> Result<u64, DbError>
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
            return Ok(total);
        }
    }
}

/// Removes what `settings` no longer keeps at `now_ms`.
pub async fn prune(db: &Db, settings: &RetentionSettings, now_ms: i64) -> Result<Pruned, DbError> {
    let mut pruned = Pruned::default();
    if let Some(before) = cutoff(now_ms, settings.finished_jobs_days) {
        pruned.finished_jobs = in_batches(db, |mut tx| async move { Ok((store::finished_jobs(&mut tx, before, BATCH).await?, tx)) }).await?;
    }
    if let Some(before) = cutoff(now_ms, settings.decided_approvals_days) {
        pruned.decided_approvals = in_batches(db, |mut tx| async move { Ok((store::decided_approvals(&mut tx, before, BATCH).await?, tx)) }).await?;
    }
    if let Some(before) = cutoff(now_ms, settings.notices_days) {
        pruned.notices = in_batches(db, |mut tx| async move { Ok((store::notices(&mut tx, before, BATCH).await?, tx)) }).await?;
        // A warning of the current month (or of a day in it) is what stops that period from
        // being warned about twice: only those of months that ended go.
        let [_, (_, _, month_start)] = budget::periods_at(now_ms);
        let mut tx = db.begin_write().await?;
        pruned.budget_warnings = store::budget_warnings(&mut tx, before.min(month_start)).await?;
        tx.commit().await?;
    }
    if let Some(before) = cutoff(now_ms, settings.model_calls_days) {
        pruned.model_calls = in_batches(db, |mut tx| async move { Ok((store::model_calls(&mut tx, before, BATCH).await?, tx)) }).await?;
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
        self.queue.enqueue(&job).await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Handler<PruneJob> for Retention {
    async fn run(&self, _args: PruneJob, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        let retention = &self.settings.retention;
        let pruned = prune(&self.db, retention, db::now_ms()).await?;
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "removed records past their retention");
        }
        // The next turn; none once it is turned off, so a job queued before runs once.
        let snooze = (!retention.every.is_zero()).then_some(retention.every);
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
