//! The self-improvement cycle, as the periodic `evals.cycle` job and the console's "Scan now":
//! scan new traces for failure patterns, make the cases of findings that have an expectation,
//! replay every case, and store a proposal for each failing case some edit fixes. Each new
//! proposal is one owner notice (console and WhatsApp) with its console link. Nothing is
//! applied: proposals wait for an owner.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Proposal, RepairError, Workspace};
use crate::{
    config::Settings,
    conversation::MarkTraceJob,
    db::{self, Db, owner_notifications::Notification},
    evals::{Expect, MarkError, findings},
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
    llm::ChatModel,
    owners::notices,
    tools::Checkpoint,
};

/// How many traces one cycle looks at, at most (the next cycle goes on from there).
const SCAN_BATCH: i64 = 500;

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CycleReport {
    pub traces: usize,
    pub findings: usize,
    pub cases_made: usize,
    pub cases: usize,
    pub failing: usize,
    pub new_proposals: Vec<i64>,
}

impl CycleReport {
    /// What the cycle did, in one line, for the job's preview, the console and the CLI.
    pub fn summary(&self) -> String {
        let ids: Vec<String> = self.new_proposals.iter().map(|id| format!("#{id}")).collect();
        let listed = if ids.is_empty() { String::new() } else { format!(": {}", ids.join(", ")) };
        format!(
            "scanned {} trace(s): {} finding(s), {} new case(s); {} of {} case(s) failing; {} new proposal(s){listed}",
            self.traces,
            self.findings,
            self.cases_made,
            self.failing,
            self.cases,
            ids.len()
        )
    }
}

/// Everything a cycle reads: the database, the queue (notices), the settings, the config
/// folder and the checkpoint's live catalog.
#[derive(Clone)]
pub struct Cycle {
    pub db: Db,
    pub queue: JobQueue,
    pub settings: Arc<Settings>,
    pub workspace: Workspace,
    pub checkpoint: Arc<Checkpoint>,
    /// The configured model; asked as `models.repair` when that is set.
    pub model: Arc<dyn ChatModel>,
}

impl std::fmt::Debug for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cycle").finish_non_exhaustive()
    }
}

impl Cycle {
    /// What a replay reads now: the config folder with the checkpoint's live catalog.
    pub fn workspace(&self) -> Workspace {
        Workspace { live: self.checkpoint.catalog(), ..self.workspace.clone() }
    }

    /// Scans, makes cases and proposes; see the module docs.
    pub async fn run(&self) -> Result<CycleReport, RepairError> {
        self.run_until(None).await
    }

    /// [`Cycle::run`] that asks the repair model nothing once fewer than one model call's time
    /// is left before `deadline` (a job's budget). Each proposal is stored, and announced, as it
    /// is found, so a cycle cut off keeps what it found; the repair model is asked about a case
    /// once per question ([`super::Proposer::question_key`]), whatever came of it, and not about
    /// a case an open or rejected proposal was made for.
    pub async fn run_until(&self, deadline: Option<tokio::time::Instant>) -> Result<CycleReport, RepairError> {
        let mut conn = self.db.pool.acquire().await.map_err(db::DbError::from)?;
        let scanned = findings::scan(&mut conn, &self.checkpoint.catalog(), &self.settings.evals, SCAN_BATCH).await?;
        let cases_made = findings::make_cases(&mut conn, self.settings.lane.planner_recent_turns, &self.checkpoint.catalog().audit.pii_fields).await?;
        let cases = findings::cases(&mut conn).await?;
        let proposed = db::evals::cases_with_open_or_rejected_repairs(&mut conn).await?;
        let questions = db::evals::repair_asked(&mut conn).await?;
        drop(conn);
        let ws = self.workspace();
        let mut report = CycleReport { traces: scanned.traces, findings: scanned.findings, cases_made, cases: cases.len(), ..CycleReport::default() };
        let Some(proposer) = super::Proposer::new(&ws, &cases).await? else {
            report.failing = super::run_all(&ws.judge()?, &cases).await.iter().filter(|r| !r.pass()).count();
            return Ok(report);
        };
        report.failing = proposer.failing().count();
        let model = (!self.settings.models.repair.trim().is_empty()).then_some(self.model.as_ref());
        let model_call = self.settings.llm.endpoint().timeout;
        let mut stored: Vec<String> = Vec::new();
        for (case, result) in proposer.failing() {
            let mut best = proposer.deterministic(case, result).await;
            if best.is_none()
                && let Some(model) = model
                && !proposed.contains(&case.name)
                && deadline.is_none_or(|d| d.saturating_duration_since(tokio::time::Instant::now()) > model_call)
            {
                let question = proposer.question_key(case);
                if questions.get(&case.name) != Some(&question) {
                    best = proposer.ask_model(model, case, result).await;
                    let mut conn = self.db.acquire_write().await.map_err(db::DbError::from)?;
                    db::evals::set_repair_asked(&mut conn, &case.name, &question).await?;
                }
            }
            if let Some(p) = best
                && !stored.contains(&p.change.after)
            {
                stored.push(p.change.after.clone());
                if let Some(id) = self.store_and_notify(&p).await? {
                    report.new_proposals.push(id);
                }
            }
        }
        Ok(report)
    }

    /// Stores a proposal; a new one is announced to the owners in the same transaction. One
    /// made from a file that changed since the cycle read it (an owner approved a repair, or
    /// edited the file, meanwhile) is dropped: stored, it could never be applied as it reads,
    /// and approving it would mark it applied with nothing written, or rolling it back undo the
    /// other change. The next cycle proposes from the file as it is.
    pub async fn store_and_notify(&self, p: &Proposal) -> Result<Option<i64>, RepairError> {
        let mut tx = self.db.begin_write().await.map_err(db::DbError::from)?;
        db::evals::lock_repairs(&mut tx).await?;
        if super::read(&self.workspace.config_dir, &p.change.path)?.as_deref() != Some(p.change.before.as_str()) {
            tracing::info!(summary = %p.summary, file = %p.change.path, "a proposal made from a file that changed since is not stored");
            return Ok(None);
        }
        let (row, new) = super::store(&mut tx, p).await?;
        if new {
            let link = format!("{}/repairs#repair-{}", self.settings.server.console_url(), row.id);
            let message = self.settings.evals.proposal_notice.replace("{id}", &row.id.to_string()).replace("{summary}", &row.summary).replace("{link}", &link);
            let notice = Notification { at: db::now_ms(), hook: "repairs".into(), tool: String::new(), reason_code: "REPAIR_PROPOSED".into(), message, correlation_id: format!("repair-{}", row.id) };
            notices::raise(&mut tx, &self.queue, &notice, true).await?;
        }
        self.queue.commit(tx).await?;
        Ok(new.then_some(row.id))
    }

    /// Queues the periodic cycle unless one is queued (its dedupe key) or `evals.scan_every`
    /// is 0.
    pub async fn schedule(&self) -> Result<(), db::DbError> {
        let every = self.settings.evals.scan_every;
        if every.is_zero() {
            return Ok(());
        }
        let mut job = self.queue.job(&CycleJob {});
        job.dedupe_key = Some(CycleJob::DEDUPE_KEY.into());
        job.correlation_id = CycleJob::DEDUPE_KEY.into();
        job.scheduled_at = Some(db::now_ms().saturating_add(db::duration_ms(every)));
        self.queue.enqueue_periodic(&job).await?;
        Ok(())
    }
}

/// Runs the cycle, then again every `evals.scan_every`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleJob {}

impl JobKind for CycleJob {
    const KIND: &'static str = "evals.cycle";
}

impl CycleJob {
    pub const DEDUPE_KEY: &'static str = "evals:cycle";
}

#[async_trait::async_trait]
impl Handler<CycleJob> for Cycle {
    async fn run(&self, _args: CycleJob, ctx: &JobContext) -> Result<JobOutput, JobError> {
        // The next turn, whatever this one did; none when the cycle is off ("0s"), so that a job
        // queued before it was turned off runs once, never in a loop.
        let snooze = (!self.settings.evals.scan_every.is_zero()).then_some(self.settings.evals.scan_every);
        // The rest of the budget, less a moment to store what was found.
        let preview = match Cycle::run_until(self, Some(ctx.deadline_before(std::time::Duration::from_secs(5)))).await {
            Ok(report) => report.summary(),
            Err(RepairError::Db(e)) => return Err(e.into()),
            Err(e) => {
                // A tool file that does not load or a corrupt case: said in the job's preview, and
                // the cycle goes on at its next turn.
                tracing::warn!(code = e.code(), error = %e, "the self-improvement cycle stopped");
                format!("{}: {e}", e.code())
            }
        };
        Ok(JobOutput { preview: Some(preview), snooze })
    }
}

/// An owner's `/wrong` from WhatsApp: the finding and its case, as the console's mark makes
/// them. An expectation that does not parse, or a trace that cannot be replayed, is a permanent
/// failure with its code (retrying would not help).
#[async_trait::async_trait]
impl Handler<MarkTraceJob> for Cycle {
    async fn run(&self, args: MarkTraceJob, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        let expect: Expect = args.expect.parse().map_err(|e: crate::evals::case::ExpectError| JobError::permanent("EVAL_EXPECT_INVALID", e.to_string()))?;
        let mut conn = self.db.pool.acquire().await.map_err(db::DbError::from)?;
        match findings::mark(&mut conn, args.trace_id, expect, None, &args.note, Some(args.owner_id), self.settings.lane.planner_recent_turns, &self.checkpoint.catalog().audit.pii_fields).await {
            Ok((finding, case_id)) => Ok(JobOutput { preview: Some(format!("trace #{} marked {}; eval case #{case_id}", args.trace_id, finding.pattern)), snooze: None }),
            Err(MarkError::Db(e)) => Err(e.into()),
            Err(e) => Err(JobError::permanent(e.code(), e.to_string())),
        }
    }
}
