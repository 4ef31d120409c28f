//! Repairs (seed 000 §18): configuration diffs proposed for failing eval cases, replayed over
//! every case, and applied only by an owner. Nothing here runs on its own: a proposal is a row
//! with its diff and its before/after table until an owner approves it.
//!
//! propose: for each failing case, the strategies ([`strategies`]) suggest edits of
//! `tools.toml`; each is written to a scratch copy of the tool files, checked as
//! `check-config` checks them, and every case is replayed over it. The edit that fixes the
//! most cases with the fewest regressions (then the shortest) becomes the proposal.
//!
//! approve: the files must still be as the proposal read them (else `REPAIR_STALE`); each is
//! written atomically (a temporary file beside it, then a rename), the previous text kept in
//! the row for a rollback; the caller reloads the catalog. A proposal that breaks a passing
//! case needs a second, explicit confirmation. If the config folder is a git working tree, the
//! change is committed with the owner as its author, unless the file held uncommitted edits.

pub mod cycle;
mod decide;
pub mod model;
pub mod strategies;

pub use decide::{Decider, approve, fingerprint, reject, rollback};

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use sqlx::AnyConnection;

use crate::{
    config::{Problem, SecretSource, Settings},
    db::{self, DbError, evals as store, evals::RepairRow},
    evals::{Case, CaseResult, Judge},
    llm::ChatModel,
    tools::{Catalog, ToolFiles, catalog::Provider},
};

/// The tool files a repair may read and the one it may change.
const TOOL_FILES: [&str; 3] = ["tools.toml", "connectors.toml", "mcp.toml"];
const EDITED: &str = "tools.toml";

/// One file a repair changes, relative to the config folder, with its whole text before and
/// after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    pub before: String,
    pub after: String,
}

/// One case's line of the before/after table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRow {
    pub case: String,
    pub expect: String,
    pub before: String,
    pub before_pass: bool,
    pub after: String,
    pub after_pass: bool,
}

impl TableRow {
    pub fn fixed(&self) -> bool {
        !self.before_pass && self.after_pass
    }

    pub fn regressed(&self) -> bool {
        self.before_pass && !self.after_pass
    }
}

fn brief(r: &CaseResult) -> String {
    let level = r.plan.as_ref().unwrap_or(&r.detector);
    if level.pass { level.observed.brief() } else { format!("{} ({})", level.observed.brief(), level.why) }
}

/// The before/after table of two runs over the same cases.
pub fn table(before: &[CaseResult], after: &[CaseResult]) -> Vec<TableRow> {
    before.iter().zip(after).map(|(b, a)| TableRow { case: b.name.clone(), expect: b.expect.clone(), before: brief(b), before_pass: b.pass(), after: brief(a), after_pass: a.pass() }).collect()
}

/// What a proposal is replayed against: the config folder, the secrets (a tool whose secret is
/// unset does not load, before or after), the settings, and the live catalog for its MCP tools.
#[derive(Clone)]
pub struct Workspace {
    pub config_dir: PathBuf,
    pub secrets: SecretSource,
    pub settings: Arc<Settings>,
    pub live: Arc<Catalog>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("config_dir", &self.config_dir).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("REPAIR_NOT_FOUND: there is no repair {0}")]
    NotFound(i64),
    #[error("REPAIR_ALREADY_DECIDED: repair {id} is {state}")]
    Decided { id: i64, state: String },
    #[error("REPAIR_NEEDS_CONFIRMATION: repair {0} breaks a case that passes today; approve it again confirming the regressions")]
    NeedsConfirmation(i64),
    #[error("REPAIR_REPLAY_CHANGED: replayed over today's cases and files, repair {id} breaks {regressions} case(s) that pass, among them one its table did not list; the table is updated: review it, then approve again")]
    ReplayChanged { id: i64, regressions: i64 },
    #[error("REPAIR_CHANGED: repair {0} changed since it was shown (a cycle brought its diff up to date, or a replay its table); look at it again, then approve it")]
    Changed(i64),
    #[error("REPAIR_STALE: {0} changed since the repair was proposed; propose again")]
    Stale(String),
    #[error("REPAIR_REASON_REQUIRED: say why the repair is rejected")]
    ReasonRequired,
    #[error("REPAIR_HALF_APPLIED: the files already hold repair {0} (an approval that did not finish); approve it to finish it, or put the files back before rejecting it")]
    HalfApplied(i64),
    #[error("REPAIR_CONFIG_INVALID: the tool files do not pass check-config:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
    #[error("REPAIR_FILE_ERROR: {0}")]
    File(String),
    #[error(transparent)]
    Cases(crate::evals::CasesError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A case that does not parse is `EVAL_CASE_CORRUPT`; the database failing while the cases are
/// read is a database error like any other (the cycle's job retries it).
impl From<crate::evals::CasesError> for RepairError {
    fn from(e: crate::evals::CasesError) -> Self {
        match e {
            crate::evals::CasesError::Db(e) => Self::Db(e),
            corrupt => Self::Cases(corrupt),
        }
    }
}

impl RepairError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "REPAIR_NOT_FOUND",
            Self::Decided { .. } => "REPAIR_ALREADY_DECIDED",
            Self::NeedsConfirmation(_) => "REPAIR_NEEDS_CONFIRMATION",
            Self::ReplayChanged { .. } => "REPAIR_REPLAY_CHANGED",
            Self::Changed(_) => "REPAIR_CHANGED",
            Self::Stale(_) => "REPAIR_STALE",
            Self::ReasonRequired => "REPAIR_REASON_REQUIRED",
            Self::HalfApplied(_) => "REPAIR_HALF_APPLIED",
            Self::Invalid(_) => "REPAIR_CONFIG_INVALID",
            Self::File(_) => "REPAIR_FILE_ERROR",
            Self::Cases(_) => "EVAL_CASE_CORRUPT",
            Self::Db(e) => e.code(),
        }
    }
}

fn read(dir: &Path, name: &str) -> Result<Option<String>, RepairError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RepairError::File(format!("cannot read {}: {e}", path.display()))),
    }
}

impl Workspace {
    /// A judge over the tool files in `dir` (checked as check-config checks them), with the
    /// live catalog's MCP tools joined.
    fn judge_dir(&self, dir: &Path) -> Result<Judge, RepairError> {
        let files = ToolFiles::load(dir, &self.secrets).map_err(RepairError::Invalid)?;
        let problems = crate::tools::catalog_problems(&files.catalog, dir, &self.settings);
        if !problems.is_empty() {
            return Err(RepairError::Invalid(problems));
        }
        let mcp = self.live.all().filter(|t| t.spec.provider == Provider::Mcp).cloned();
        let (catalog, _) = files.catalog.with_extra(mcp, Default::default());
        Ok(Judge::new(self.settings.clone(), Arc::new(catalog)))
    }

    /// A judge over the config folder's tool files as they are.
    pub fn judge(&self) -> Result<Judge, RepairError> {
        self.judge_dir(&self.config_dir)
    }

    /// A judge over the tool files with `changed` in place of its file.
    fn judge_with(&self, changed: &FileChange) -> Result<Judge, RepairError> {
        let scratch = tempfile::tempdir().map_err(|e| RepairError::File(format!("cannot make a scratch folder: {e}")))?;
        for name in TOOL_FILES {
            let text = if name == changed.path { Some(changed.after.clone()) } else { read(&self.config_dir, name)? };
            if let Some(text) = text {
                std::fs::write(scratch.path().join(name), text).map_err(|e| RepairError::File(format!("cannot write a scratch copy: {e}")))?;
            }
        }
        self.judge_dir(scratch.path())
    }
}

/// Runs every case over `judge` (recorded answers; no live model in a repair's replay).
pub async fn run_all(judge: &Judge, cases: &[Case]) -> Vec<CaseResult> {
    let mut out = Vec::with_capacity(cases.len());
    for case in cases {
        out.push(judge.judge(case, None).await);
    }
    out
}

/// A proposal before it is stored.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub strategy: String,
    pub summary: String,
    pub change: FileChange,
    pub table: Vec<TableRow>,
    pub case_ids: Vec<String>,
}

impl Proposal {
    pub fn fixes(&self) -> usize {
        self.table.iter().filter(|r| r.fixed()).count()
    }

    pub fn regressions(&self) -> usize {
        self.table.iter().filter(|r| r.regressed()).count()
    }

    /// The unified diff of the change, with the file's path on both sides.
    pub fn diff(&self) -> String {
        unified_diff(&self.change)
    }
}

pub fn unified_diff(change: &FileChange) -> String {
    similar::TextDiff::from_lines(&change.before, &change.after).unified_diff().context_radius(3).header(&format!("a/{}", change.path), &format!("b/{}", change.path)).to_string()
}

/// `edit` written to a scratch copy of the tool files and every case replayed over it: the
/// proposal it makes, if it fixes `case` (an edit the files refuse is not proposed).
async fn try_edit(ws: &Workspace, tools_toml: &str, edit: &strategies::Edit, cases: &[Case], before: &[CaseResult], case: &Case) -> Option<Proposal> {
    let after_text = strategies::apply(tools_toml, edit).ok()?;
    let change = FileChange { path: EDITED.into(), before: tools_toml.to_string(), after: after_text };
    let judge = match ws.judge_with(&change) {
        Ok(judge) => judge,
        Err(e) => {
            tracing::debug!(case = %case.name, edit = %edit.summary(), code = e.code(), error = %e, "edit refused");
            return None;
        }
    };
    let after = run_all(&judge, cases).await;
    if !after.iter().zip(cases).any(|(r, c)| c.name == case.name && r.pass()) {
        return None;
    }
    Some(Proposal { strategy: edit.strategy.into(), summary: edit.summary(), change, table: table(before, &after), case_ids: vec![case.name.clone()] })
}

/// The proposals for the failing cases among `cases`: one per failing case that some edit
/// fixes, the best edit for it. The deterministic strategies go first (in [`strategies`]'
/// order, stopping at one with no regression); the repair model, when given, is asked only for a case
/// none of them fixes.
pub async fn propose(ws: &Workspace, cases: &[Case], model: Option<&dyn ChatModel>) -> Result<Vec<Proposal>, RepairError> {
    let Some(proposer) = Proposer::new(ws, cases).await? else { return Ok(Vec::new()) };
    let mut proposals: Vec<Proposal> = Vec::new();
    for (case, result) in proposer.failing() {
        let mut best = proposer.deterministic(case, result).await;
        if best.is_none()
            && let Some(model) = model
        {
            best = proposer.ask_model(model, case, result).await;
        }
        if let Some(p) = best
            && !proposals.iter().any(|q| q.change.after == p.change.after)
        {
            proposals.push(p);
        }
    }
    Ok(proposals)
}

/// Proposes edits for the failing cases among `cases`, one case at a time, over `tools.toml` as
/// it was read once: the caller stores each proposal as it comes (a cycle cut off by its
/// budget keeps what it found), and decides which cases the repair model is asked about.
pub struct Proposer<'a> {
    ws: &'a Workspace,
    cases: &'a [Case],
    before: Vec<CaseResult>,
    tools_toml: String,
    declared: Vec<String>,
}

impl<'a> Proposer<'a> {
    /// `None` when the config folder has no `tools.toml` to edit.
    pub async fn new(ws: &'a Workspace, cases: &'a [Case]) -> Result<Option<Self>, RepairError> {
        let before = run_all(&ws.judge()?, cases).await;
        let Some(tools_toml) = read(&ws.config_dir, EDITED)? else { return Ok(None) };
        let declared = strategies::declared_tools(&tools_toml);
        Ok(Some(Self { ws, cases, before, tools_toml, declared }))
    }

    /// The cases that fail now, with how.
    pub fn failing(&self) -> impl Iterator<Item = (&'a Case, &CaseResult)> {
        self.cases.iter().zip(&self.before).filter(|(_, r)| !r.pass())
    }

    /// The best deterministic edit for `case`: the fewest regressions, then the most fixes;
    /// the shortest phrase without a regression is good enough.
    pub async fn deterministic(&self, case: &Case, result: &CaseResult) -> Option<Proposal> {
        let mut best: Option<Proposal> = None;
        for edit in strategies::edits_for(case, result, &self.tools_toml, &self.ws.settings.evals) {
            let Some(candidate) = try_edit(self.ws, &self.tools_toml, &edit, self.cases, &self.before, case).await else { continue };
            let better = best.as_ref().is_none_or(|b| (candidate.regressions(), std::cmp::Reverse(candidate.fixes())) < (b.regressions(), std::cmp::Reverse(b.fixes())));
            if better {
                best = Some(candidate);
            }
            if best.as_ref().is_some_and(|b| b.regressions() == 0) {
                break;
            }
        }
        best
    }

    /// The repair model's edit for `case`, if it fixes the case.
    pub async fn ask_model(&self, model: &dyn ChatModel, case: &Case, result: &CaseResult) -> Option<Proposal> {
        let edit = model::suggest(model, &self.ws.settings, case, result, &self.tools_toml, &self.declared).await?;
        try_edit(self.ws, &self.tools_toml, &edit, self.cases, &self.before, case).await
    }

    /// What the repair model was asked about `case`: the case and the tool file it read. The
    /// same question again gets no better answer, so it is asked once (see
    /// [`store::set_repair_asked`]); an edited case or `tools.toml` is a new question.
    pub fn question_key(&self, case: &Case) -> String {
        db::sha256_hex(&format!("{}\n{}", serde_json::to_string(case).unwrap_or_default(), self.tools_toml))
    }
}

/// Stores `p` (an open proposal with the same diff is kept instead); returns the row and
/// whether it is new. Run it in a write transaction, so that two cycles storing the same
/// proposal at once make one row (see [`store::lock_repairs`]).
pub async fn store(conn: &mut AnyConnection, p: &Proposal) -> Result<(RepairRow, bool), DbError> {
    let diff = p.diff();
    let files = serde_json::to_string(&[&p.change]).unwrap_or_default();
    let results = serde_json::to_string(&p.table).unwrap_or_default();
    let case_ids = serde_json::to_string(&p.case_ids).unwrap_or_default();
    let new = store::NewRepair {
        strategy: &p.strategy,
        summary: &p.summary,
        diff: &diff,
        files: &files,
        results: &results,
        fixes: p.fixes() as i64,
        regressions: p.regressions() as i64,
        case_ids: &case_ids,
        created_at: db::now_ms(),
    };
    store::lock_repairs(conn).await?;
    store::insert_repair(conn, &new).await
}

/// The files of a stored repair.
pub fn files_of(row: &RepairRow) -> Vec<FileChange> {
    serde_json::from_str(&row.files).unwrap_or_default()
}

/// The table of a stored repair.
pub fn table_of(row: &RepairRow) -> Vec<TableRow> {
    serde_json::from_str(&row.results).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database failing while cases are read is a database error (the cycle's job retries
    /// it), not a corrupt case.
    #[test]
    fn a_database_error_reading_cases_is_not_a_corrupt_case() {
        let e = RepairError::from(crate::evals::CasesError::Db(DbError::UnsupportedUrl));
        assert!(matches!(e, RepairError::Db(_)), "{e:?}");
        assert_eq!(e.code(), "DATABASE_ERROR");
    }
}
