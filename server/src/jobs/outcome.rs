//! How a run's end is written: completed, snoozed, retried after the backoff or discarded. One
//! path for the worker's batches and for a run the lane started at once (`inline`), so both
//! treat a failure alike.

use std::time::Duration;

use super::{JobError, JobOutput, retry};
use crate::db::{
    self, DbError,
    jobs::{self as store, FailOutcome, Finished, JobRow, Snooze},
};

/// What the store did with an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Applied {
    Completed,
    Failed { discarded: bool },
    Snoozed,
    /// The lease was gone (cancelled or rescued): the result was ignored.
    Stale,
}

/// The deployment's retry timing (`[jobs] retry_base`, `retry_max`).
#[derive(Debug, Clone, Copy)]
pub(super) struct RetryTimes {
    pub base: Duration,
    pub max: Duration,
}

/// Writes the end of a run that does not complete its job: a snooze the handler asked for; a
/// wait on the deployment, which uses no attempt; or a failure, retried after the backoff or
/// discarded. `None` for a success that asked for no snooze, which the caller completes (the
/// worker all of a batch's in one statement).
pub(super) async fn write_unfinished(
    conn: &mut sqlx::AnyConnection,
    job: &JobRow,
    owner: &str,
    result: &Result<JobOutput, JobError>,
    times: RetryTimes,
    now: i64,
) -> Result<Option<Applied>, DbError> {
    let snoozed = |held: bool| if held { Applied::Snoozed } else { Applied::Stale };
    Ok(Some(match result {
        Ok(JobOutput { snooze: None, .. }) => return Ok(None),
        Ok(JobOutput { snooze: Some(after), preview }) => {
            let until = now.saturating_add(db::duration_ms(*after));
            snoozed(store::snooze(conn, job.id, job.attempt, owner, until, now, Snooze::Rescheduled { preview: preview.as_deref() }).await?)
        }
        Err(err) if !err.uses_attempt() => {
            let at = now.saturating_add(db::duration_ms(retry::deployment_wait(times.max)));
            snoozed(store::snooze(conn, job.id, job.attempt, owner, at, now, Snooze::Waiting { code: &err.code }).await?)
        }
        Err(err) => {
            let at = now.saturating_add(db::duration_ms(retry::backoff(job.attempt, times.base, times.max)));
            match store::fail(conn, job.id, job.attempt, owner, &err.code, &err.message, err.retryable, at, now).await? {
                FailOutcome::Retry { .. } => Applied::Failed { discarded: false },
                FailOutcome::Discarded => Applied::Failed { discarded: true },
                FailOutcome::NotHeld => Applied::Stale,
            }
        }
    }))
}

/// Writes the end of one run, whatever it was.
/// A run that ended after its job was cancelled lets go of the lease it kept (see
/// `db::jobs::release_cancelled`).
pub(super) async fn write(conn: &mut sqlx::AnyConnection, job: &JobRow, owner: &str, result: &Result<JobOutput, JobError>, times: RetryTimes, now: i64) -> Result<Applied, DbError> {
    let applied = match write_unfinished(conn, job, owner, result, times, now).await? {
        Some(applied) => applied,
        None => {
            let preview = result.as_ref().ok().and_then(|out| out.preview.clone());
            let completed = store::complete(conn, &[Finished { id: job.id, attempt: job.attempt, preview }], owner, now).await?;
            if completed.contains(&(job.id, job.attempt)) { Applied::Completed } else { Applied::Stale }
        }
    };
    if applied == Applied::Stale {
        store::release_cancelled(conn, job.id, job.attempt, owner).await?;
    }
    Ok(applied)
}
