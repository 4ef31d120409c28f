//! An owner runs a failed call again: a `tool.call` job whose call gave no result (it failed,
//! its runs were used up, an owner cancelled it) is run again as a new job of the same call, for
//! the same message and chat, with attempts of its own. Retrying the job itself never makes its
//! call a second time (it sends again what its kept answer did not get out), so the call runs
//! again as a job of its own: its answer, delivery and trace steps are its own, and the first
//! job's history stays as it was. The job, the owner's audit row and the step on the message's
//! trace commit together with the first job marked as done again (`JOB_RUN_AGAIN`), its row
//! locked meanwhile: it is not retried from then on, and a run of it makes no call and says
//! nothing.
//!
//! A run again that succeeds sends the person its answer. One that fails, or that an owner
//! cancels, tells them only if they heard nothing of the first job (its answer, or that it was
//! stopped, went out); else they were told already. A connector write carries the same
//! `Idempotency-Key` as the first run (the key is the request's, not the job's), so a system that
//! deduplicates by key applies it once.
//!
//! Not run again: an approved call (an owner's decision runs its call once; the person asks
//! again), a call whose answer was a result (retrying its job sends that again), a job still
//! unfinished, or cancelled and still stopping, one run again already, a tool gone from the
//! catalog, or one that may not run as a job.

use serde_json::json;

use sqlx::AnyConnection;

use super::processor::stopped::CallStopped;
use crate::{
    db::{
        self, DbError,
        audit::{self, AuditEntry},
        jobs::{self as store, JobRow, JobState, NewJob},
        tool_answers::{self, KeptAnswer},
    },
    jobs::{JobKind, JobQueue, actions::ByOwner, follow_up_rows_of},
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
    /// Cancelled while it ran, and still stopping, or the person is still being told it stopped.
    #[strum(serialize = "RUN_AGAIN_STOPPING")]
    Stopping,
    /// Asked with no chat to answer (in the console).
    #[strum(serialize = "RUN_AGAIN_NO_CHAT")]
    NoChat,
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
            Self::Stopping => format!("Job #{id} was cancelled and is still stopping (or the person is being told it stopped): try again in a moment."),
            Self::NoChat => format!("Job #{id} was asked with no chat to answer."),
            Self::Answered => format!("Job #{id}'s call gave its result: use Retry now to send that answer again."),
            Self::RanAgain(other) => format!("Job #{id}'s call was run again already, as job #{other}: open that job to run it again."),
            Self::Approved => format!("Job #{id} ran a call an owner approved, and an approval runs its call once: the person asks again for a new approval."),
            Self::Unreadable => format!("Job #{id}'s stored call cannot be read, so it is not run again."),
            Self::ToolGone(tool) => format!("The tool {tool} is no longer in the catalog."),
            Self::NotAsJob(tool) => format!("The tool {tool} may not run as a job (async_policy = \"never\"): the person asks again."),
        }
    }
}

/// What decides whether job `row`'s call may run again, and what the owner is warned of.
#[derive(Debug, Default)]
pub struct Facts {
    pub kept: Option<KeptAnswer>,
    /// The job that ran it again, if one did.
    pub ran_again: Option<JobRow>,
    /// Its cancelled run still holds its lease, or its `tool.stopped` job has not finished.
    pub stopping: bool,
    /// Its call is marked as made and nothing was kept: its outcome is unknown.
    pub started: bool,
}

impl Facts {
    /// Reads them for tool call `row`.
    pub async fn read(conn: &mut AnyConnection, row: &JobRow) -> Result<Self, DbError> {
        let kept = tool_answers::get(&mut *conn, row.id).await?;
        let started = kept.is_none() && tool_answers::started(&mut *conn, row.id).await?;
        // A cancelled run keeps its lease until it has stopped (or maintenance, once it ran
        // out, lets it go): compared with no clock, as the database's may not be this host's.
        let mut stopping = row.lease_expires_at.is_some();
        if let Some(chat_id) = &row.chat_id
            && !stopping
        {
            stopping = follow_up_rows_of::<CallStopped>(&mut *conn, chat_id, row.id).await?.iter().any(|stop| !stop.state.is_finished());
        }
        // Only a job marked as done again was run again (the mark and the run again commit
        // together).
        let ran_again = if row.last_error_code.as_deref() == Some(store::DONE_AGAIN) { latest(&mut *conn, row).await? } else { None };
        Ok(Self { kept, ran_again, stopping, started })
    }

    /// What an owner is warned of before running the call again: its first run may have taken
    /// effect (`TOOL_OUTCOME_UNKNOWN`, or marked as made with nothing kept).
    pub fn warning(&self) -> Option<String> {
        let unknown = ToolCode::OutcomeUnknown.as_str();
        (self.started || self.kept.as_ref().is_some_and(|k| k.failure.as_deref() == Some(unknown))).then(|| {
            format!("Its first run may have taken effect ({unknown}): check the system it reaches before you run it again, or the change may be made twice.")
        })
    }
}

/// Job `row`'s call, if an owner may run it again.
pub fn check(row: &JobRow, facts: &Facts, catalog: &Catalog) -> Result<ToolCallJob, NotAgain> {
    if row.kind != ToolCallJob::KIND {
        return Err(NotAgain::NotACall);
    }
    if !matches!(row.state, JobState::Discarded | JobState::Cancelled) {
        return Err(if row.state == JobState::Completed { NotAgain::Answered } else { NotAgain::Unfinished });
    }
    if facts.kept.as_ref().is_some_and(|k| k.failure.is_none()) {
        return Err(NotAgain::Answered);
    }
    if let Some(other) = &facts.ran_again {
        return Err(NotAgain::RanAgain(other.id));
    }
    if facts.stopping {
        return Err(NotAgain::Stopping);
    }
    if row.chat_id.is_none() {
        return Err(NotAgain::NoChat);
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

/// The dedupe key of the run again of job `id`: two owners running it again at once make one.
pub fn dedupe_key(id: i64) -> String {
    format!("{}:again:{id}", ToolCallJob::KIND)
}

/// The job that last ran tool call `row`'s call again, if one did (read among its chat's jobs:
/// only unfinished jobs' dedupe keys are indexed).
pub async fn latest(conn: &mut AnyConnection, row: &JobRow) -> Result<Option<JobRow>, DbError> {
    let Some(chat_id) = &row.chat_id else { return Ok(None) };
    store::find_by_dedupe_in_chat(conn, chat_id, ToolCallJob::KIND, &dedupe_key(row.id)).await
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
    // Locked: another owner's run again or retry of it waits for this one, and then finds it
    // done again (`db::jobs::done_again`).
    let Some(row) = store::get_for_update(&mut tx, id).await? else { return Ok(RunAgain::NoJob) };
    let facts = Facts::read(&mut tx, &row).await?;
    // A second click (or a second owner) while the run again is underway: that one.
    if let Some(again) = facts.ran_again.as_ref().filter(|again| !again.state.is_finished()) {
        return Ok(RunAgain::Queued { job_id: again.id, deduplicated: true });
    }
    let mut job = match check(&row, &facts, catalog) {
        Ok(job) => job,
        Err(why) => return Ok(RunAgain::Refused(why)),
    };
    job.again_of = Some(id);
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
    store::done_again(&mut tx, id, job_id, db::now_ms()).await?;
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
            NotAgain::Stopping,
            NotAgain::NoChat,
            NotAgain::Answered,
            NotAgain::RanAgain(2),
            NotAgain::Approved,
            NotAgain::Unreadable,
            NotAgain::ToolGone("t".into()),
            NotAgain::NotAsJob("t".into()),
        ];
        for why in &all {
            assert_eq!(app::error::AppError::new(why.code(), why.message(1)).status(), 409, "{}", why.code());
        }
        let codes: std::collections::HashSet<&str> = all.iter().map(NotAgain::code).collect();
        assert_eq!(codes.len(), all.len(), "one code each");
    }
}
