//! The console's [`RepairsBackend`]: the Repairs page and the Traces page's "Mark wrong" over
//! [`crate::evals`] and [`crate::repairs`], which decide; every owner action is audited with the
//! owner and address.

use app::{
    backend::RepairsBackend,
    dto::{DiffRow, FindingView, RepairView, RepairsPage, ReplayRow, TraceMark},
    error::{AppError, code},
};
use similar::{ChangeTag, TextDiff};

use super::{ConsoleBackend, internal};
use crate::{
    db::{self, audit, evals as store},
    evals::{Expect, MarkError, Pattern, findings},
    repairs::{self, Decider, FileChange, RepairError},
};

/// Proposals and findings the page lists.
const SHOWN: i64 = 50;

pub(super) fn finding_view(f: &store::FindingRow) -> FindingView {
    FindingView {
        id: f.id,
        trace_id: f.trace_id,
        pattern: f.pattern.clone(),
        source: f.source.clone(),
        note: f.note.clone(),
        expect: f.expect.clone(),
        has_case: f.case_id.is_some(),
        created_at: f.created_at,
    }
}

/// A file's change as side-by-side rows: unchanged lines near a change, removed and added lines
/// paired where they replace each other, and a `gap` row between hunks.
pub fn diff_rows(change: &FileChange) -> Vec<DiffRow> {
    let diff = TextDiff::from_lines(&change.before, &change.after);
    let mut rows = Vec::new();
    for (i, group) in diff.grouped_ops(3).iter().enumerate() {
        if i > 0 {
            rows.push(DiffRow { kind: "gap".into(), old_no: None, old: None, new_no: None, new: None });
        }
        let mut removed: Vec<(u32, String)> = Vec::new();
        let mut added: Vec<(u32, String)> = Vec::new();
        let flush = |rows: &mut Vec<DiffRow>, removed: &mut Vec<(u32, String)>, added: &mut Vec<(u32, String)>| {
            let n = removed.len().max(added.len());
            for k in 0..n {
                let old = removed.get(k).cloned();
                let new = added.get(k).cloned();
                let kind = match (&old, &new) {
                    (Some(_), Some(_)) => "changed",
                    (Some(_), None) => "removed",
                    _ => "added",
                };
                rows.push(DiffRow { kind: kind.into(), old_no: old.as_ref().map(|o| o.0), old: old.map(|o| o.1), new_no: new.as_ref().map(|n| n.0), new: new.map(|n| n.1) });
            }
            removed.clear();
            added.clear();
        };
        for op in group {
            for change in diff.iter_changes(op) {
                let text = change.value().trim_end_matches('\n').to_string();
                let line = |n: Option<usize>| n.map_or(0, |n| u32::try_from(n + 1).unwrap_or(u32::MAX));
                match change.tag() {
                    ChangeTag::Delete => removed.push((line(change.old_index()), text)),
                    ChangeTag::Insert => added.push((line(change.new_index()), text)),
                    ChangeTag::Equal => {
                        flush(&mut rows, &mut removed, &mut added);
                        rows.push(DiffRow { kind: "same".into(), old_no: Some(line(change.old_index())), old: Some(text.clone()), new_no: Some(line(change.new_index())), new: Some(text) });
                    }
                }
            }
        }
        flush(&mut rows, &mut removed, &mut added);
    }
    rows
}

impl ConsoleBackend {
    async fn decider(&self, owner_id: i64, ip: &str) -> Result<Decider, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let owner = db::owners::find_by_id(&mut conn, owner_id).await.map_err(internal)?.ok_or_else(AppError::unauthorized)?;
        Ok(Decider { name: owner.display_name, login: owner.login, owner_id: Some(owner_id), ip: Some(ip.to_string()) })
    }

    async fn audit(&self, owner_id: i64, ip: &str, event: &str, detail: serde_json::Value) -> Result<(), AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        audit::record(&mut conn, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event, detail: Some(detail), ..Default::default() }).await.map_err(internal)
    }

    /// The catalog reload after a repair's files changed; a refusal is said, the files stay.
    async fn reload(&self) -> String {
        match self.state.reloads.reload().await {
            Ok(r) => format!("The catalog was reloaded ({} tools).", r.tools),
            Err(e) => {
                tracing::error!(error = %e, "catalog reload after a repair failed");
                format!("The catalog could not be reloaded, so the running bot still uses the previous one: {e}")
            }
        }
    }
}

fn repair_error(e: RepairError) -> AppError {
    match e {
        RepairError::Db(e) => internal(e),
        RepairError::File(_) => {
            tracing::error!(error = %e, "a repair's files could not be written");
            AppError::new(e.code(), e.to_string())
        }
        other => AppError::new(other.code(), other.to_string()),
    }
}

#[async_trait::async_trait]
impl RepairsBackend for ConsoleBackend {
    async fn repairs_page(&self) -> Result<RepairsPage, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let rows = store::list_repairs(&mut conn, SHOWN).await.map_err(internal)?;
        let cases = store::list_cases(&mut conn).await.map_err(internal)?;
        let mut repairs_out = Vec::with_capacity(rows.len());
        for row in rows {
            let names: Vec<String> = serde_json::from_str(&row.case_ids).unwrap_or_default();
            let ids: Vec<i64> = cases.iter().filter(|c| names.contains(&c.name)).map(|c| c.id).collect();
            let behind = store::findings_of_cases(&mut conn, &ids).await.map_err(internal)?.iter().map(finding_view).collect();
            let files = repairs::files_of(&row);
            repairs_out.push(RepairView {
                id: row.id,
                state: row.state.to_string(),
                strategy: row.strategy.clone(),
                summary: row.summary.clone(),
                files: files.iter().map(|f| (f.path.clone(), diff_rows(f))).collect(),
                seen: repairs::fingerprint(&row),
                diff: row.diff.clone(),
                table: repairs::table_of(&row)
                    .into_iter()
                    .map(|t| ReplayRow { case: t.case, expect: t.expect, before: t.before, before_pass: t.before_pass, after: t.after, after_pass: t.after_pass })
                    .collect(),
                fixes: row.fixes,
                regressions: row.regressions,
                findings: behind,
                created_at: row.created_at,
                decided_at: row.decided_at,
                decided_by: row.decided_by.clone(),
                reason: row.reason.clone(),
                rolled_back_at: row.rolled_back_at,
                rolled_back_by: row.rolled_back_by.clone(),
            });
        }
        let findings = store::list_findings(&mut conn, SHOWN).await.map_err(internal)?.iter().map(finding_view).collect();
        Ok(RepairsPage { repairs: repairs_out, findings, cases: cases.len(), scan_every: humantime::format_duration(self.state.config.settings.evals.scan_every).to_string() })
    }

    async fn run_cycle(&self, owner_id: i64, ip: &str) -> Result<String, AppError> {
        let report = self.state.cycle.run().await.map_err(repair_error)?;
        self.audit(owner_id, ip, audit::event::REPAIR_CYCLE, serde_json::json!({ "traces": report.traces, "findings": report.findings, "proposals": report.new_proposals })).await?;
        Ok(report.summary())
    }

    async fn decide_repair(&self, owner_id: i64, id: i64, action: &str, confirm: bool, seen: Option<&str>, reason: &str, ip: &str) -> Result<String, AppError> {
        let by = self.decider(owner_id, ip).await?;
        let dir = self.state.config.dir.clone();
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        // Each decision writes its owner-audit row in its own transaction.
        match action {
            "approve" => {
                // The page always names the diff it showed; an approval that names none is
                // not the console's.
                let Some(seen) = seen.filter(|s| !s.is_empty()).map(str::to_string) else { return Err(AppError::invalid("an approval names the diff it was shown (seen)")) };
                drop(conn);
                // In a task of its own: a browser that goes away while the file is committed to
                // git does not stop it before the catalog is reloaded (the repair would stand
                // applied in the file and the table, and the bot run on the old catalog).
                let backend = self.clone();
                let applied = tokio::spawn(async move {
                    let mut conn = backend.state.db.pool.acquire().await.map_err(internal)?;
                    let row = repairs::approve(&mut conn, &backend.state.cycle.workspace(), id, &by, confirm, Some(&seen)).await.map_err(repair_error)?;
                    drop(conn);
                    Ok::<_, AppError>(format!("Repair #{id} applied: {}. {}", row.summary, backend.reload().await))
                });
                applied.await.map_err(internal)?
            }
            "reject" => {
                repairs::reject(&mut conn, &dir, id, &by, reason).await.map_err(repair_error)?;
                Ok(format!("Repair #{id} rejected; nothing was changed."))
            }
            "rollback" => {
                drop(conn);
                let backend = self.clone();
                let rolled_back = tokio::spawn(async move {
                    let mut conn = backend.state.db.pool.acquire().await.map_err(internal)?;
                    repairs::rollback(&mut conn, &dir, id, &by).await.map_err(repair_error)?;
                    drop(conn);
                    Ok::<_, AppError>(format!("Repair #{id} rolled back. {}", backend.reload().await))
                });
                rolled_back.await.map_err(internal)?
            }
            _ => Err(AppError::invalid("action must be approve, reject or rollback")),
        }
    }

    async fn mark_trace(&self, owner_id: i64, mark: TraceMark, ip: &str) -> Result<String, AppError> {
        let expect: Expect = mark.expect.parse().map_err(|e: crate::evals::case::ExpectError| AppError::new("EVAL_EXPECT_INVALID", e.to_string()))?;
        let pattern = match mark.pattern.trim() {
            "" => None,
            p => Some(p.parse::<Pattern>().map_err(|_| AppError::new("EVAL_PATTERN_UNKNOWN", format!("{p:?} is not a failure pattern")))?),
        };
        let note: String = mark.note.chars().take(500).collect();
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let (finding, case_id) = match findings::mark(&mut conn, mark.trace_id, expect.clone(), pattern, &note, Some(owner_id), self.state.config.settings.lane.planner_recent_turns, &self.state.tools.catalog().audit.pii_fields).await {
            Ok(done) => done,
            Err(MarkError::Db(e)) => return Err(internal(e)),
            Err(MarkError::NoTrace(id)) => {
                return Err(AppError::new(code::NOT_FOUND, format!("There is no trace #{id}.")));
            }
            Err(e) => return Err(AppError::new(e.code(), e.to_string())),
        };
        drop(conn);
        self.audit(owner_id, ip, audit::event::TRACE_MARKED, serde_json::json!({ "trace": mark.trace_id, "pattern": finding.pattern, "expect": expect.to_string(), "case": case_id })).await?;
        Ok(format!("Trace #{} marked {} (should have been {expect}); it is eval case #{case_id}. The Repairs page proposes a fix when one is found.", mark.trace_id, finding.pattern))
    }
}
