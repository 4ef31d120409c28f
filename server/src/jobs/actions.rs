//! Owner actions on a job, from the console: retry now, or cancel. Each changes the job and
//! writes its owner-audit row in one transaction (with a cancel, also the follow-up its kind
//! names: [`super::Registry::when_cancelled`]), then wakes the workers.

use crate::db::{
    self, DbError,
    audit::{self, AuditEntry},
    jobs::{self as store, Dropped},
};

use super::{FollowUps, JobQueue, dropped::Woken};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    /// Run a scheduled, retryable, discarded or cancelled job again now.
    Retry,
    /// Stop an unfinished job.
    Cancel,
}

/// Who acted, for the owner audit.
#[derive(Debug, Clone, Copy)]
pub struct ByOwner<'a> {
    pub owner_id: i64,
    pub ip: &'a str,
}

/// Applies `action` to job `id`. `Ok(false)` when the job's state does not allow it (or there is
/// no such job): nothing changed.
pub async fn apply(queue: &JobQueue, follow_ups: &FollowUps, action: JobAction, id: i64, by: ByOwner<'_>) -> Result<bool, DbError> {
    let now = db::now_ms();
    let mut tx = queue.db().begin_write().await?;
    let (changed, event) = match action {
        JobAction::Retry => (store::retry_now(&mut tx, id, now).await?, audit::event::JOB_RETRY),
        JobAction::Cancel => (store::cancel(&mut tx, id, "cancelled by an owner", now).await?, audit::event::JOB_CANCEL),
    };
    if !changed {
        return Ok(false);
    }
    let mut followed = Woken::default();
    if action == JobAction::Cancel
        && let Some(job) = store::get(&mut tx, id).await?
    {
        followed = follow_ups.enqueue_cancelled(&mut tx, &Dropped::from(&job)).await?;
    }
    let detail = serde_json::json!({ "job_id": id });
    audit::record(&mut tx, AuditEntry { owner_id: Some(by.owner_id), ip: Some(by.ip), event, detail: Some(detail), ..Default::default() }).await?;
    queue.commit(tx).await?;
    followed.wake();
    tracing::info!(owner.id = by.owner_id, job.id = id, action = event, "owner changed a job");
    Ok(true)
}
