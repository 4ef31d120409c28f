//! Self-improvement records: findings (`findings`), eval cases (`eval_cases`) and repair
//! proposals (`repairs`). A repair's state changes are conditional updates from the state it
//! must be in, so two owners deciding at once change it once.

use sqlx::AnyConnection;

use super::DbError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct FindingRow {
    pub id: i64,
    pub trace_id: i64,
    pub pattern: String,
    pub source: String,
    pub note: String,
    pub expect: String,
    pub owner_id: Option<i64>,
    pub case_id: Option<i64>,
    pub created_at: i64,
}

const FINDING_COLUMNS: &str = "id, trace_id, pattern, source, note, expect, owner_id, case_id, created_at";

/// A new finding.
#[derive(Debug, Clone)]
pub struct NewFinding<'a> {
    pub trace_id: i64,
    pub pattern: &'a str,
    pub source: &'a str,
    pub note: &'a str,
    pub expect: &'a str,
    pub owner_id: Option<i64>,
    pub created_at: i64,
}

/// Stores a finding; a trace already found with the same pattern is not stored twice (the
/// existing row is returned with `false`). An owner's mark of a trace the scan found replaces
/// the scan's note and expectation: the owner's word wins.
pub async fn insert_finding(conn: &mut AnyConnection, f: &NewFinding<'_>) -> Result<(FindingRow, bool), DbError> {
    let inserted = sqlx::query_as::<_, FindingRow>(&format!(
        "INSERT INTO findings (trace_id, pattern, source, note, expect, owner_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT DO NOTHING RETURNING {FINDING_COLUMNS}"
    ))
    .bind(f.trace_id)
    .bind(f.pattern)
    .bind(f.source)
    .bind(f.note)
    .bind(f.expect)
    .bind(f.owner_id)
    .bind(f.created_at)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = inserted {
        return Ok((row, true));
    }
    if f.source == "owner" {
        sqlx::query("UPDATE findings SET source = $1, note = $2, expect = $3, owner_id = $4 WHERE trace_id = $5 AND pattern = $6")
            .bind(f.source)
            .bind(f.note)
            .bind(f.expect)
            .bind(f.owner_id)
            .bind(f.trace_id)
            .bind(f.pattern)
            .execute(&mut *conn)
            .await?;
    }
    let row = sqlx::query_as::<_, FindingRow>(&format!("SELECT {FINDING_COLUMNS} FROM findings WHERE trace_id = $1 AND pattern = $2")).bind(f.trace_id).bind(f.pattern).fetch_one(&mut *conn).await?;
    Ok((row, false))
}

pub async fn set_finding_case(conn: &mut AnyConnection, finding_id: i64, case_id: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE findings SET case_id = $1 WHERE id = $2").bind(case_id).bind(finding_id).execute(&mut *conn).await?;
    Ok(())
}

pub async fn list_findings(conn: &mut AnyConnection, limit: i64) -> Result<Vec<FindingRow>, DbError> {
    Ok(sqlx::query_as::<_, FindingRow>(&format!("SELECT {FINDING_COLUMNS} FROM findings ORDER BY id DESC LIMIT $1")).bind(limit).fetch_all(&mut *conn).await?)
}

pub async fn findings_of_trace(conn: &mut AnyConnection, trace_id: i64) -> Result<Vec<FindingRow>, DbError> {
    Ok(sqlx::query_as::<_, FindingRow>(&format!("SELECT {FINDING_COLUMNS} FROM findings WHERE trace_id = $1 ORDER BY id")).bind(trace_id).fetch_all(&mut *conn).await?)
}

/// The findings of the cases `case_ids`, oldest first, read in one query (through
/// `findings_case`; sorted here, since the database would sort them apart from the index).
pub async fn findings_of_cases(conn: &mut AnyConnection, case_ids: &[i64]) -> Result<Vec<FindingRow>, DbError> {
    if case_ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = findings_of_cases_sql(case_ids.len());
    let mut q = sqlx::query_as::<_, FindingRow>(&sql);
    for id in case_ids {
        q = q.bind(*id);
    }
    let mut rows = q.fetch_all(&mut *conn).await?;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// The query [`findings_of_cases`] runs for `cases` case ids (`$1` ... `$cases`).
pub fn findings_of_cases_sql(cases: usize) -> String {
    format!("SELECT {FINDING_COLUMNS} FROM findings WHERE case_id IN ({})", super::placeholders(1, cases))
}

/// The newest trace id the scan has looked at.
pub async fn scan_cursor(conn: &mut AnyConnection) -> Result<i64, DbError> {
    let at: Option<(i64,)> = sqlx::query_as("SELECT after_trace FROM eval_scan WHERE id = 1").fetch_optional(&mut *conn).await?;
    Ok(at.map_or(0, |(a,)| a))
}

/// Moves the scan's cursor forward (never back: two scans at once keep the larger).
pub async fn set_scan_cursor(conn: &mut AnyConnection, after_trace: i64) -> Result<(), DbError> {
    sqlx::query("INSERT INTO eval_scan (id, after_trace) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET after_trace = $1 WHERE eval_scan.after_trace < $1")
        .bind(after_trace)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Owners' findings (and scan findings an owner gave an expectation) that have no case yet.
pub async fn findings_without_case(conn: &mut AnyConnection) -> Result<Vec<FindingRow>, DbError> {
    Ok(sqlx::query_as::<_, FindingRow>(&format!("SELECT {FINDING_COLUMNS} FROM findings WHERE case_id IS NULL AND expect <> '' ORDER BY id")).fetch_all(&mut *conn).await?)
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CaseRow {
    pub id: i64,
    pub name: String,
    pub message: String,
    pub actor: String,
    pub chat_type: String,
    pub contexts: String,
    pub memory_summary: Option<String>,
    pub expect: String,
    pub origin: String,
    pub recorded: String,
    pub created_at: i64,
    /// JSON: the clarifying question the message answers (`lane::clarify::Clarification`).
    pub clarification: Option<String>,
}

const CASE_COLUMNS: &str = "id, name, message, actor, chat_type, contexts, memory_summary, expect, origin, recorded, created_at, clarification";

/// Stores a case, or replaces the one with the same name (an import of an edited file) in the
/// same statement, so two writers of one name leave one row. Returns its id.
pub async fn upsert_case(conn: &mut AnyConnection, c: &CaseRow) -> Result<i64, DbError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO eval_cases (name, message, actor, chat_type, contexts, memory_summary, expect, origin, recorded, created_at, clarification) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (name) DO UPDATE SET message = excluded.message, actor = excluded.actor, chat_type = excluded.chat_type, \
         contexts = excluded.contexts, memory_summary = excluded.memory_summary, expect = excluded.expect, origin = excluded.origin, \
         recorded = excluded.recorded, clarification = excluded.clarification RETURNING id",
    )
    .bind(&c.name)
    .bind(&c.message)
    .bind(&c.actor)
    .bind(&c.chat_type)
    .bind(&c.contexts)
    .bind(&c.memory_summary)
    .bind(&c.expect)
    .bind(&c.origin)
    .bind(&c.recorded)
    .bind(c.created_at)
    .bind(&c.clarification)
    .fetch_one(&mut *conn)
    .await?;
    Ok(id)
}

pub async fn list_cases(conn: &mut AnyConnection) -> Result<Vec<CaseRow>, DbError> {
    Ok(sqlx::query_as::<_, CaseRow>(&format!("SELECT {CASE_COLUMNS} FROM eval_cases ORDER BY id")).fetch_all(&mut *conn).await?)
}

pub async fn delete_case(conn: &mut AnyConnection, name: &str) -> Result<bool, DbError> {
    Ok(sqlx::query("DELETE FROM eval_cases WHERE name = $1").bind(name).execute(&mut *conn).await?.rows_affected() > 0)
}

/// The states of a repair proposal, as stored: proposed, then applied or rejected by an owner;
/// an applied one may be rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr, strum::EnumString, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum RepairState {
    Proposed,
    Applied,
    Rejected,
    RolledBack,
}

super::stored_name!(RepairState, "repair state");

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RepairRow {
    pub id: i64,
    #[sqlx(try_from = "String")]
    pub state: RepairState,
    pub strategy: String,
    pub summary: String,
    pub diff: String,
    pub files: String,
    pub results: String,
    pub fixes: i64,
    pub regressions: i64,
    pub case_ids: String,
    pub created_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub reason: Option<String>,
    pub rolled_back_at: Option<i64>,
    pub rolled_back_by: Option<String>,
}

const REPAIR_COLUMNS: &str = "id, state, strategy, summary, diff, files, results, fixes, regressions, case_ids, created_at, decided_at, decided_by, reason, rolled_back_at, rolled_back_by";

/// A proposal as it is stored.
#[derive(Debug, Clone)]
pub struct NewRepair<'a> {
    pub strategy: &'a str,
    pub summary: &'a str,
    pub diff: &'a str,
    pub files: &'a str,
    pub results: &'a str,
    pub fixes: i64,
    pub regressions: i64,
    pub case_ids: &'a str,
    pub created_at: i64,
}

/// What a proposal holds, as `$1`..`$6`: an UPDATE's SET here, and the first six values of the
/// INSERT ([`with_content`] binds them).
const CONTENT: &str = "diff = $1, files = $2, results = $3, fixes = $4, regressions = $5, case_ids = $6";

/// Binds a proposal's content, in [`CONTENT`]'s order, as the first six parameters.
fn with_content<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Any, RepairRow, sqlx::any::AnyArguments<'q>>,
    r: &'q NewRepair<'_>,
) -> sqlx::query::QueryAs<'q, sqlx::Any, RepairRow, sqlx::any::AnyArguments<'q>> {
    query.bind(r.diff).bind(r.files).bind(r.results).bind(r.fixes).bind(r.regressions).bind(r.case_ids)
}

/// A diff as an edit: its lines without the hunk headers, whose line numbers move whenever
/// the file is edited elsewhere.
fn edit_of(diff: &str) -> Vec<&str> {
    diff.lines().filter(|l| !l.starts_with("@@")).collect()
}

/// Stores a proposal unless the same edit is open (proposed) or was rejected (an owner's no
/// stands: it is not proposed again); returns that one or the new one, and whether it is new.
/// The same edit is the same diff wherever in the file it lands, or the same strategy and
/// summary (the same phrase for the same key of the same tool) with other lines around it: an
/// owner's edit near a line, or to the line itself (a trigger added by hand beside the one
/// rejected), does not bring back what they said no to. An open one made from a file that has
/// changed since is brought up to date with this proposal's files and results, so it can be
/// approved.
pub async fn insert_repair(conn: &mut AnyConnection, r: &NewRepair<'_>) -> Result<(RepairRow, bool), DbError> {
    let open: Vec<(i64, String, String, String)> =
        sqlx::query_as("SELECT id, diff, strategy, summary FROM repairs WHERE state IN ('proposed', 'rejected') ORDER BY id DESC").fetch_all(&mut *conn).await?;
    let same = |(_, diff, strategy, summary): &(i64, String, String, String)| edit_of(diff) == edit_of(r.diff) || (strategy == r.strategy && summary == r.summary);
    let earlier = match open.into_iter().find(same) {
        Some((id, ..)) => get_repair(conn, id).await?,
        None => None,
    };
    if let Some(row) = earlier {
        if row.state != RepairState::Proposed || row.files == r.files {
            return Ok((row, false));
        }
        let sql = format!("UPDATE repairs SET {CONTENT} WHERE id = $7 AND state = 'proposed' RETURNING {REPAIR_COLUMNS}");
        let updated = with_content(sqlx::query_as(&sql), r).bind(row.id).fetch_optional(&mut *conn).await?;
        // Decided between the read and the update: that decision stands, as it is now.
        let row = match updated {
            Some(row) => row,
            None => get_repair(conn, row.id).await?.unwrap_or(row),
        };
        return Ok((row, false));
    }
    let sql = format!(
        "INSERT INTO repairs (diff, files, results, fixes, regressions, case_ids, strategy, summary, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {REPAIR_COLUMNS}"
    );
    let row = with_content(sqlx::query_as(&sql), r).bind(r.strategy).bind(r.summary).bind(r.created_at).fetch_one(&mut *conn).await?;
    Ok((row, true))
}

/// Each case's last question to the repair model (see `repairs::Proposer::question_key`), by
/// case name.
pub async fn repair_asked(conn: &mut AnyConnection) -> Result<std::collections::BTreeMap<String, String>, DbError> {
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT name, repair_asked FROM eval_cases WHERE repair_asked IS NOT NULL").fetch_all(&mut *conn).await?;
    Ok(rows.into_iter().collect())
}

/// Records that the repair model was asked `question` about case `name`.
pub async fn set_repair_asked(conn: &mut AnyConnection, name: &str, question: &str) -> Result<(), DbError> {
    sqlx::query("UPDATE eval_cases SET repair_asked = $1 WHERE name = $2").bind(question).bind(name).execute(&mut *conn).await?;
    Ok(())
}

/// The eval cases an open or rejected repair was proposed for: the repair model is not asked
/// about them again.
pub async fn cases_with_open_or_rejected_repairs(conn: &mut AnyConnection) -> Result<std::collections::BTreeSet<String>, DbError> {
    let lists: Vec<String> = sqlx::query_scalar("SELECT case_ids FROM repairs WHERE state IN ('proposed', 'rejected')").fetch_all(&mut *conn).await?;
    Ok(lists.iter().flat_map(|list| serde_json::from_str::<Vec<String>>(list).unwrap_or_default()).collect())
}

/// Replaces an open proposal's before/after table and its counts with a newer replay's of `row`,
/// unless a cycle has brought its change up to date since (the table would be another change's).
pub async fn set_results(conn: &mut AnyConnection, row: &RepairRow, results: &str, fixes: i64, regressions: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE repairs SET results = $1, fixes = $2, regressions = $3 WHERE id = $4 AND state = 'proposed' AND files = $5")
        .bind(results)
        .bind(fixes)
        .bind(regressions)
        .bind(row.id)
        .bind(&row.files)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn get_repair(conn: &mut AnyConnection, id: i64) -> Result<Option<RepairRow>, DbError> {
    Ok(sqlx::query_as::<_, RepairRow>(&format!("SELECT {REPAIR_COLUMNS} FROM repairs WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

pub async fn list_repairs(conn: &mut AnyConnection, limit: i64) -> Result<Vec<RepairRow>, DbError> {
    Ok(sqlx::query_as::<_, RepairRow>(&format!("SELECT {REPAIR_COLUMNS} FROM repairs ORDER BY id DESC LIMIT $1")).bind(limit).fetch_all(&mut *conn).await?)
}

/// Makes the writers of repairs and their files wait for each other, across processes, until
/// the transaction ends: a decision (it reads the config files, then writes them) and a stored
/// proposal (it looks for an open one of the same edit, then inserts). SQLite's write
/// transactions already run one at a time; on PostgreSQL two approvals of different repairs
/// would each pass the stale check on the same text, and the second write would undo the first.
pub async fn lock_repairs(conn: &mut AnyConnection) -> Result<(), DbError> {
    super::lock_until_commit(conn, "gatehouse.repairs").await
}

/// Moves a repair from `from` to `to` with who decided and why; false when it was not in
/// `from` (decided already, or by someone else just now).
pub async fn transition(conn: &mut AnyConnection, id: i64, from: RepairState, to: RepairState, by: &str, reason: Option<&str>, at: i64) -> Result<bool, DbError> {
    let sql = if to == RepairState::RolledBack {
        "UPDATE repairs SET state = $1, rolled_back_at = $2, rolled_back_by = $5 WHERE id = $3 AND state = $4"
    } else {
        "UPDATE repairs SET state = $1, decided_at = $2, decided_by = $5, reason = $6 WHERE id = $3 AND state = $4"
    };
    let mut q = sqlx::query(sql).bind(to.as_str()).bind(at).bind(id).bind(from.as_str()).bind(by);
    if to != RepairState::RolledBack {
        q = q.bind(reason);
    }
    Ok(q.execute(&mut *conn).await?.rows_affected() == 1)
}
