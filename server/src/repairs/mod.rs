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
//! change is committed with the owner as its author.

pub mod cycle;
pub mod model;
pub mod strategies;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use sqlx::AnyConnection;

use crate::{
    config::{Problem, SecretSource, Settings},
    db::{self, DbError, evals as store, evals::{RepairRow, RepairState}},
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
    #[error("REPAIR_STALE: {0} changed since the repair was proposed; propose again")]
    Stale(String),
    #[error("REPAIR_REASON_REQUIRED: say why the repair is rejected")]
    ReasonRequired,
    #[error("REPAIR_CONFIG_INVALID: the tool files do not pass check-config:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
    #[error("REPAIR_FILE_ERROR: {0}")]
    File(String),
    #[error(transparent)]
    Cases(#[from] crate::evals::CasesError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl RepairError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "REPAIR_NOT_FOUND",
            Self::Decided { .. } => "REPAIR_ALREADY_DECIDED",
            Self::NeedsConfirmation(_) => "REPAIR_NEEDS_CONFIRMATION",
            Self::Stale(_) => "REPAIR_STALE",
            Self::ReasonRequired => "REPAIR_REASON_REQUIRED",
            Self::Invalid(_) => "REPAIR_CONFIG_INVALID",
            Self::File(_) => "REPAIR_FILE_ERROR",
            Self::Cases(_) => "EVAL_CASE_CORRUPT",
            Self::Db(_) => "DATABASE_ERROR",
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
    let before = run_all(&ws.judge()?, cases).await;
    let Some(tools_toml) = read(&ws.config_dir, EDITED)? else { return Ok(Vec::new()) };
    let declared = strategies::declared_tools(&tools_toml);
    let mut proposals: Vec<Proposal> = Vec::new();
    for (case, result) in cases.iter().zip(&before).filter(|(_, r)| !r.pass()) {
        let mut best: Option<Proposal> = None;
        for edit in strategies::edits_for(case, result, &tools_toml, &ws.settings.evals) {
            let Some(candidate) = try_edit(ws, &tools_toml, &edit, cases, &before, case).await else { continue };
            let better = best.as_ref().is_none_or(|b| (candidate.regressions(), std::cmp::Reverse(candidate.fixes())) < (b.regressions(), std::cmp::Reverse(b.fixes())));
            if better {
                best = Some(candidate);
            }
            // The shortest phrase without a regression is good enough.
            if best.as_ref().is_some_and(|b| b.regressions() == 0) {
                break;
            }
        }
        if best.is_none()
            && let Some(model) = model
            && let Some(edit) = model::suggest(model, &ws.settings, case, result, &tools_toml, &declared).await
        {
            best = try_edit(ws, &tools_toml, &edit, cases, &before, case).await;
        }
        if let Some(p) = best
            && !proposals.iter().any(|q| q.change.after == p.change.after)
        {
            proposals.push(p);
        }
    }
    Ok(proposals)
}

/// Stores `p` (an open proposal with the same diff is kept instead); returns the row and
/// whether it is new.
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

/// Writes `text` to `path` atomically: a temporary file in the same folder, then a rename.
fn write_atomic(path: &Path, text: &str) -> Result<(), RepairError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| RepairError::File(format!("cannot write in {}: {e}", dir.display())))?;
    tmp.write_all(text.as_bytes()).and_then(|()| tmp.as_file().sync_all()).map_err(|e| RepairError::File(format!("cannot write {}: {e}", path.display())))?;
    tmp.persist(path).map_err(|e| RepairError::File(format!("cannot replace {}: {}", path.display(), e.error)))?;
    Ok(())
}

/// Who decides, for the row and the git commit.
#[derive(Debug, Clone)]
pub struct Decider {
    pub name: String,
    pub login: String,
}

/// Brings the files of `changes` to their `after` text (`forward`) or back to `before`,
/// refusing when any file is neither where it should start nor already where it should end. A
/// file already at its target is left alone, so an approval or a rollback interrupted after
/// some files were written completes when it is made again.
fn swap(dir: &Path, changes: &[FileChange], forward: bool) -> Result<(), RepairError> {
    let mut pending = Vec::new();
    for c in changes {
        let (from, to) = if forward { (&c.before, &c.after) } else { (&c.after, &c.before) };
        match read(dir, &c.path)? {
            Some(now) if now == *to => {}
            Some(now) if now == *from => pending.push((c, to)),
            _ => return Err(RepairError::Stale(c.path.clone())),
        }
    }
    for (c, to) in pending {
        write_atomic(&dir.join(&c.path), to)?;
    }
    Ok(())
}

/// Approves and applies repair `id`. The state changes and the files are written inside one
/// transaction, committed only once every file is written: whoever is first decides (a second
/// approval waits for the row, then finds it decided), a file that cannot be written leaves the
/// repair proposed, and a crash between the writes and the commit leaves it proposed with its
/// files in place, which approving again completes. The caller reloads the catalog.
pub async fn approve(conn: &mut AnyConnection, dir: &Path, id: i64, by: &Decider, confirm_regressions: bool) -> Result<RepairRow, RepairError> {
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state != RepairState::Proposed {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    if row.regressions > 0 && !confirm_regressions {
        return Err(RepairError::NeedsConfirmation(id));
    }
    decide_with_files(conn, dir, &row, (RepairState::Proposed, RepairState::Applied), by, &format!("Repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair applied");
    Ok(store::get_repair(conn, id).await?.unwrap_or(row))
}

/// Rejects repair `id` with a reason; its files are never touched.
pub async fn reject(conn: &mut AnyConnection, id: i64, by: &Decider, reason: &str) -> Result<(), RepairError> {
    if reason.trim().is_empty() {
        return Err(RepairError::ReasonRequired);
    }
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if !store::transition(conn, id, RepairState::Proposed, RepairState::Rejected, &by.name, Some(reason.trim()), db::now_ms()).await? {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    tracing::info!(repair = id, by = %by.login, "repair rejected");
    Ok(())
}

/// Rolls an applied repair back: its files go back to their text before it, if they are still
/// as it left them; like an approval, the state and the files change in one transaction. The
/// caller reloads the catalog.
pub async fn rollback(conn: &mut AnyConnection, dir: &Path, id: i64, by: &Decider) -> Result<(), RepairError> {
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state != RepairState::Applied {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    decide_with_files(conn, dir, &row, (RepairState::Applied, RepairState::RolledBack), by, &format!("Roll back repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair rolled back");
    Ok(())
}

/// Moves `row` from one state to the next and its files with it (forward to their text after the
/// repair when it is applied, back otherwise), in one transaction committed only once every file
/// is written; then commits the files to git with `message`. A state changed meanwhile by
/// another decision is `Decided` with that state, and nothing is written.
async fn decide_with_files(conn: &mut AnyConnection, dir: &Path, row: &RepairRow, (from, to): (RepairState, RepairState), by: &Decider, message: &str) -> Result<(), RepairError> {
    let id = row.id;
    let changes = files_of(row);
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(DbError::from)?;
    if !store::transition(&mut tx, id, from, to, &by.name, None, db::now_ms()).await? {
        drop(tx);
        let state = store::get_repair(conn, id).await?.map(|r| r.state.to_string()).unwrap_or_default();
        return Err(RepairError::Decided { id, state });
    }
    swap(dir, &changes, to == RepairState::Applied)?;
    tx.commit().await.map_err(DbError::from)?;
    commit_if_git(dir, &changes, message, by);
    Ok(())
}

/// Commits the changed files when `dir` is inside a git working tree, with the owner as the
/// author. A folder that is not a working tree (or has no git) is left as it is.
fn commit_if_git(dir: &Path, changes: &[FileChange], message: &str, by: &Decider) {
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir).args(args).output();
    let inside = git(&["rev-parse", "--is-inside-work-tree"]).is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "true");
    if !inside {
        return;
    }
    let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
    let mut add = vec!["add", "--"];
    add.extend(&paths);
    let author = format!("{} <{}@gatehouse.invalid>", by.name, by.login);
    let mut commit = vec!["commit", "-q", "--author", author.as_str(), "-m", message, "--"];
    commit.extend(&paths);
    // The committer is Gatehouse (the server may have no git identity); the author is the owner.
    let mut identified = vec!["-c", "user.name=Gatehouse", "-c", "user.email=gatehouse@gatehouse.invalid"];
    identified.extend(&commit);
    let ok = git(&add).is_ok_and(|o| o.status.success()) && git(&identified).is_ok_and(|o| o.status.success());
    if !ok {
        tracing::warn!(dir = %dir.display(), "the config folder is a git working tree, but committing the repair failed");
    }
}
