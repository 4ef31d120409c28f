//! The job queue: list, detail, and the owner's retry, cancel and run again of a failed call.

use app::{
    backend::JobsBackend,
    dto::{JobDetail, JobEventView, JobQuery, JobSummary, JobsPage, StateCount},
    error::{AppError, code},
};

use super::{ConsoleBackend, internal};
use crate::{
    db::{
        self,
        jobs::{self as store, JobFilter, JobRow, JobState},
    },
    jobs::{
        JobKind,
        actions::{self, ByOwner, JobAction},
    },
    lane::{
        job::ToolCallJob,
        rerun::{self, RunAgain},
    },
    redact::redacted_pretty,
};

#[async_trait::async_trait]
impl JobsBackend for ConsoleBackend {
    async fn jobs_page(&self, query: &JobQuery) -> Result<JobsPage, AppError> {
        const PAGE: i64 = 50;
        let state = match query.state.as_str() {
            "" => None,
            s => Some(JobState::parse(s).ok_or_else(|| AppError::invalid(format!("unknown job state {s:?}")))?),
        };
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
        let filter = JobFilter {
            state,
            tool_name: text(&query.tool),
            chat_id: text(&query.chat),
            created_from: (query.since_minutes > 0).then(|| db::now_ms() - query.since_minutes.saturating_mul(60_000)),
            before_id: (query.before > 0).then_some(query.before),
            ..Default::default()
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let counts = store::counts_by_state(&mut conn).await.map_err(internal)?;
        let mut jobs = store::list(&mut conn, &filter, PAGE + 1).await.map_err(internal)?;
        let next_before = (jobs.len() as i64 > PAGE).then(|| {
            jobs.truncate(PAGE as usize);
            jobs.last().map_or(0, |j| j.id)
        });
        Ok(JobsPage {
            counts: counts.into_iter().map(|(s, count)| StateCount { state: s.as_str().into(), count }).collect(),
            jobs: jobs.iter().map(summary).collect(),
            next_before,
        })
    }

    async fn job_detail(&self, id: i64) -> Result<JobDetail, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let job = store::get(&mut conn, id).await.map_err(internal)?.ok_or_else(|| AppError::new(code::NOT_FOUND, no_job(id, self.state.config.settings.retention.finished_jobs_days)))?;
        let events = store::events(&mut conn, id).await.map_err(internal)?;
        let again = self.run_again_view(&mut conn, &job).await.map_err(internal)?;
        Ok(JobDetail {
            summary: summary(&job),
            queue: job.queue.clone(),
            priority: job.priority,
            dedupe_key: job.dedupe_key.clone(),
            sender_id: job.sender_id.clone(),
            message_id: job.message_id.clone(),
            correlation_id: job.correlation_id.clone(),
            args: redacted_pretty(&job.args),
            scheduled_at: job.scheduled_at,
            started_at: job.started_at,
            completed_at: job.completed_at,
            lease_owner: job.lease_owner.clone(),
            lease_expires_at: job.lease_expires_at,
            last_error_message: job.last_error_message.clone(),
            result_preview: job.result_preview.clone(),
            events: events
                .into_iter()
                .map(|e| JobEventView { at: e.at, state: e.state.as_str().into(), attempt: e.attempt, error_code: e.error_code, message: e.message })
                .collect(),
            can_retry: matches!(job.state, JobState::Scheduled | JobState::Retryable | JobState::Discarded | JobState::Cancelled) && again.latest.is_none(),
            can_cancel: !job.state.is_finished(),
            can_run_again: again.can,
            run_again_warning: again.warning,
            ran_again_as: again.latest,
            again_of: again.of,
        })
    }

    async fn retry_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError> {
        if let Some(refused) = self.ran_again_instead(id).await.map_err(internal)? {
            return Err(refused);
        }
        self.job_action(owner_id, id, ip, JobAction::Retry).await
    }

    async fn cancel_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError> {
        self.job_action(owner_id, id, ip, JobAction::Cancel).await
    }

    async fn run_job_again(&self, owner_id: i64, id: i64, ip: &str) -> Result<i64, AppError> {
        let catalog = self.state.tools.catalog();
        match rerun::run_again(&self.state.jobs, &catalog, id, ByOwner { owner_id, ip }).await.map_err(internal)? {
            RunAgain::Queued { job_id, .. } => Ok(job_id),
            RunAgain::Refused(why) => Err(AppError::new(why.code(), why.message(id))),
            RunAgain::NoJob => Err(AppError::new(code::NOT_FOUND, format!("There is no job #{id}."))),
        }
    }

}

/// What the detail page says of running a job's call again.
struct AgainView {
    can: bool,
    warning: Option<String>,
    latest: Option<i64>,
    of: Option<i64>,
}

impl ConsoleBackend {
    async fn run_again_view(&self, conn: &mut sqlx::AnyConnection, job: &JobRow) -> Result<AgainView, db::DbError> {
        if job.kind != ToolCallJob::KIND {
            return Ok(AgainView { can: false, warning: None, latest: None, of: None });
        }
        let facts = rerun::Facts::read(&mut *conn, job).await?;
        let can = rerun::check(job, &facts, &self.state.tools.catalog()).is_ok();
        let of = serde_json::from_str::<ToolCallJob>(&job.args).ok().and_then(|call| call.again_of);
        Ok(AgainView { can, warning: can.then(|| facts.warning()).flatten(), latest: facts.ran_again.map(|again| again.id), of })
    }

    /// Why job `id` is not retried: its call was run again as another job, which answers for it
    /// (a run of it would make no call and say nothing).
    async fn ran_again_instead(&self, id: i64) -> Result<Option<AppError>, db::DbError> {
        let mut conn = self.state.db.pool.acquire().await?;
        let Some(job) = store::get(&mut conn, id).await? else { return Ok(None) };
        if job.kind != ToolCallJob::KIND {
            return Ok(None);
        }
        if job.last_error_code.as_deref() != Some(db::jobs::DONE_AGAIN) {
            return Ok(None);
        }
        Ok(rerun::latest(&mut conn, &job).await?.map(|again| {
            let why = rerun::NotAgain::RanAgain(again.id);
            AppError::new(why.code(), format!("Job #{id}'s call was run again as job #{}: retry or run that one again instead.", again.id))
        }))
    }

    async fn job_action(&self, owner_id: i64, id: i64, ip: &str, action: JobAction) -> Result<(), AppError> {
        let changed = actions::apply(&self.state.jobs, &self.state.follow_ups, action, id, ByOwner { owner_id, ip }).await.map_err(internal)?;
        if changed {
            return Ok(());
        }
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        match store::get(&mut conn, id).await.map_err(internal)? {
            Some(_) => Err(AppError::new(code::CONFLICT, format!("Job #{id} cannot be changed in its current state."))),
            None => Err(AppError::new(code::NOT_FOUND, format!("There is no job #{id}."))),
        }
    }
}

fn summary(j: &JobRow) -> JobSummary {
    JobSummary {
        id: j.id,
        kind: j.kind.clone(),
        state: j.state.as_str().into(),
        tool_name: j.tool_name.clone(),
        chat_id: j.chat_id.clone(),
        attempt: j.attempt,
        max_attempts: j.max_attempts,
        created_at: j.created_at,
        updated_at: j.updated_at,
        last_error_code: j.last_error_code.clone(),
    }
}

/// Why a job is not there: never made, or removed by the retention prune.
fn no_job(id: i64, kept_days: u32) -> String {
    if kept_days == 0 {
        format!("There is no job #{id}.")
    } else {
        format!("There is no job #{id}. Finished jobs are removed {kept_days} days after they end ([retention] finished_jobs_days).")
    }
}
