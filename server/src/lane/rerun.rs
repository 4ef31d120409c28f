//! An owner runs a failed call again: a `tool.call` job whose call gave no result (it failed,
//! its runs were used up, an owner cancelled it) is run again as a new job of the same call, for
//! the same message and chat, with attempts of its own. Retrying the job itself never makes its
//! call a second time (it sends again what its kept answer did not get out), so the call runs
//! again as a job of its own: its answer, delivery and trace steps are its own, and the first
//! job's history stays as it was. The job, the owner's audit row and the step on the message's
//! trace commit together.
//!
//! The person was told the first run's failure: a run again that succeeds sends them its answer,
//! and one that fails again tells them nothing more (nor does an owner's cancel of it). A
//! connector write carries the same `Idempotency-Key` as the first run (the key is the request's,
//! not the job's), so a system that deduplicates by key applies it once.
//!
//! Not run again: an approved call (an owner's decision runs its call once; the person asks
//! again), a call whose answer was a result (retrying its job sends that again), a job still
//! unfinished, a tool gone from the catalog, or one that may not run as a job.

use serde_json::json;

use crate::{
    db::{
        self, DbError,
        audit::{self, AuditEntry},
        jobs::{self as store, JobRow, JobState, NewJob},
        tool_answers::{self, KeptAnswer},
    },
    jobs::{JobKind, JobQueue, actions::ByOwner},
    tools::{Catalog, catalog::AsyncPolicy, checkpoint::ToolCode, job::ToolCallJob},
    traces::{self, Step},
};

/// Why a job's call is not run again, each with its stable code; each message says what the
/// owner can do instead.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
pub enum NotAgain {
    /// Not a `tool.call` job.
    #[strum(serialize = "RUN_AGAIN_NOT_A_CALL")]
    NotACall,
    /// Still queued or running: it may yet answer.
    #[strum(serialize = "RUN_AGAIN_UNFINISHED")]
    Unfinished,
    /// The call gave its result: retrying the job sends it again.
    #[strum(serialize = "RUN_AGAIN_ANSWERED")]
    Answered,
    /// Run again already, as this job: that one is run again, if any.
    #[strum(serialize = "RUN_AGAIN_DONE")]
    RanAgain(i64),
    /// An owner approved exactly this call, to run once.
    #[strum(serialize = "RUN_AGAIN_APPROVED")]
    Approved,
    /// The job's stored call cannot be read.
    #[strum(serialize = "RUN_AGAIN_UNREADABLE")]
    Unreadable,
    /// The tool is no longer in the catalog.
    #[strum(serialize = "RUN_AGAIN_TOOL_GONE")]
    ToolGone(String),
    /// The tool may not run as a job (`async_policy = "never"`), and a run again is one.
    #[strum(serialize = "RUN_AGAIN_NOT_AS_JOB")]
    NotAsJob(String),
}

impl NotAgain {
    pub fn code(&self) -> &'static str {
        self.into()
    }

    /// What the owner reads.
    pub fn message(&self, id: i64) -> String {
        match self {
            Self::NotACall => format!("Job #{id} is not a tool call: only a tool call is run again."),
            Self::Unfinished => format!("Job #{id} has not finished: it may still answer."),
            Self::Answered => format!("Job #{id}'s call gave its result: use Retry now to send that answer again."),
            Self::RanAgain(other) => format!("Job #{id}'s call was run again already, as job #{other}: open that job to run it again."),
            Self::Approved => format!("Job #{id} ran a call an owner approved, and an approval runs its call once: the person asks again for a new approval."),
            Self::Unreadable => format!("Job #{id}'s stored call cannot be read, so it is not run again."),
            Self::ToolGone(tool) => format!("The tool {tool} is no longer in the catalog."),
            Self::NotAsJob(tool) => format!("The tool {tool} may not run as a job (async_policy = \"never\"): the person asks again."),
        }
    }
}

/// Job `row`'s call, if an owner may run it again: `kept` is its kept answer, `ran_again` the
/// job that ran it again, if one did ([`latest`]).
pub fn check(row: &JobRow, kept: Option<&KeptAnswer>, ran_again: Option<i64>, catalog: &Catalog) -> Result<ToolCallJob, NotAgain> {
    if row.kind != ToolCallJob::KIND {
        return Err(NotAgain::NotACall);
    }
    if !matches!(row.state, JobState::Discarded | JobState::Cancelled) {
        return Err(if row.state == JobState::Completed { NotAgain::Answered } else { NotAgain::Unfinished });
    }
    if kept.is_some_and(|k| k.failure.is_none()) {
        return Err(NotAgain::Answered);
    }
    if let Some(other) = ran_again {
        return Err(NotAgain::RanAgain(other));
    }
    let job = serde_json::from_str::<ToolCallJob>(&row.args).map_err(|_| NotAgain::Unreadable)?;
    if job.approval.is_some() {
        return Err(NotAgain::Approved);
    }
    match catalog.get(&job.tool) {
        None => Err(NotAgain::ToolGone(job.tool)),
        Some(tool) if tool.spec.async_policy == AsyncPolicy::Never => Err(NotAgain::NotAsJob(job.tool)),
        Some(_) => Ok(job),
    }
}

/// What an owner is warned of before running job `row`'s call again: its first run may have
/// taken effect (`TOOL_OUTCOME_UNKNOWN`).
pub fn warning(kept: Option<&KeptAnswer>) -> Option<String> {
    let unknown = ToolCode::OutcomeUnknown.as_str();
    kept.is_some_and(|k| k.failure.as_deref() == Some(unknown)).then(|| {
        format!("Its first run may have taken effect ({unknown}): check the system it reaches before you run it again, or the change may be made twice.")
    })
}

/// The dedupe key of the run again of job `id`: two owners running it again at once make one.
pub fn dedupe_key(id: i64) -> String {
    format!("{}:again:{id}", ToolCallJob::KIND)
}

/// The job that last ran job `id`'s call again, if one did.
pub async fn latest(conn: &mut sqlx::AnyConnection, id: i64) -> Result<Option<JobRow>, DbError> {
    store::find_by_dedupe(conn, &dedupe_key(id)).await
}

/// How a run again went.
#[derive(Debug)]
pub enum RunAgain {
    /// Queued as this new job, or found already queued (`deduplicated`).
    Queued { job_id: i64, deduplicated: bool },
    Refused(NotAgain),
    NoJob,
}

/// Runs job `id`'s call again as a new job, by an owner (see the module's documentation).
pub async fn run_again(queue: &JobQueue, catalog: &Catalog, id: i64, by: ByOwner<'_>) -> Result<RunAgain, DbError> {
    let mut tx = queue.db().begin_write().await?;
    let Some(row) = store::get(&mut tx, id).await? else { return Ok(RunAgain::NoJob) };
    let kept = tool_answers::get(&mut tx, id).await?;
    let ran_again = latest(&mut tx, id).await?;
    // A second click (or a second owner) while the run again is underway: that one.
    if let Some(again) = ran_again.as_ref().filter(|again| !again.state.is_finished()) {
        return Ok(RunAgain::Queued { job_id: again.id, deduplicated: true });
    }
    let mut job = match check(&row, kept.as_ref(), ran_again.map(|again| again.id), catalog) {
        Ok(job) => job,
        Err(why) => return Ok(RunAgain::Refused(why)),
    };
    job.again_of = Some(id);
    // A trace removed by retention gets no steps, from here or from the new job's runs.
    if let Some(trace_id) = job.trace_id
        && !db::traces::exists(&mut tx, trace_id).await?
    {
        job.trace_id = None;
    }
    let new = NewJob {
        dedupe_key: Some(dedupe_key(id)),
        chat_id: row.chat_id.clone(),
        sender_id: row.sender_id.clone(),
        message_id: row.message_id.clone(),
        original_text: row.original_text.clone(),
        tool_name: row.tool_name.clone(),
        // The request's: its log lines, and a connector write's idempotency key, are the first
        // run's.
        correlation_id: row.correlation_id.clone(),
        ..queue.job(&job)
    };
    let enqueued = queue.enqueue_in(&mut tx, &new).await?;
    let job_id = enqueued.job.id;
    if enqueued.deduplicated {
        return Ok(RunAgain::Queued { job_id, deduplicated: true });
    }
    let detail = json!({ "job_id": id, "new_job_id": job_id });
    audit::record(&mut tx, AuditEntry { owner_id: Some(by.owner_id), ip: Some(by.ip), event: audit::event::JOB_RUN_AGAIN, detail: Some(detail.clone()), ..Default::default() }).await?;
    let appended = match job.trace_id {
        Some(trace_id) => Some(traces::append(&mut tx, trace_id, &Step::new("AgentToolRunAgain", "owner", "OK", detail)).await?),
        None => None,
    };
    queue.commit(tx).await?;
    queue.telemetry().appended(appended);
    tracing::info!(owner.id = by.owner_id, job.id = id, new_job.id = job_id, correlation_id = %row.correlation_id, tool = %job.tool, "an owner ran a tool call again");
    Ok(RunAgain::Queued { job_id, deduplicated: false })
}

#[cfg(test)]
mod tests {
    use super::NotAgain;

    /// Each refusal is answered 409 with its own code, which the console's error type knows.
    #[test]
    fn every_refusal_is_a_conflict_with_its_code() {
        let all = [
            NotAgain::NotACall,
            NotAgain::Unfinished,
            NotAgain::Answered,
            NotAgain::RanAgain(2),
            NotAgain::Approved,
            NotAgain::Unreadable,
            NotAgain::ToolGone("t".into()),
            NotAgain::NotAsJob("t".into()),
        ];
        let mut codes: Vec<&str> = all.iter().map(NotAgain::code).collect();
        for why in &all {
            assert_eq!(app::error::AppError::new(why.code(), why.message(1)).status(), 409, "{}", why.code());
        }
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }
}
