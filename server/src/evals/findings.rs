//! Findings: traces that show one of seed 000 §18's failure patterns, found by the periodic scan
//! or marked wrong by an owner (the Traces page, or `/wrong` on WhatsApp), and the eval cases
//! made from them.
//!
//! The scan finds what a trace shows by itself: a provider error behind a generic reply, an
//! owner-only tool among a customer's candidates, a connector URL refused, a follow-up without
//! its context, a plan naming a tool it was not offered, and a reply promising work with no job
//! behind it. The other patterns (wrong tool where the plan was valid, a tool needed but not
//! called, a tool called for normal chat, private data the guard let through, an MCP result
//! steering the planner, a normal-memory regression) need someone to know what should have
//! happened: an owner's mark, which names the pattern or lets it follow from the expectation.

use serde_json::Value;
use sqlx::AnyConnection;

use super::case::{Case, Expect, Origin};
use crate::{
    config::EvalSettings,
    db::{self, DbError, evals as store, evals::FindingRow, traces::TraceRow},
    domain::{ChatKind, Role},
    lane::detector::RecentContext,
    tools::{Catalog, catalog::Audience},
    traces::Step,
};

/// The failure patterns of seed 000 §18, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, strum::IntoStaticStr, strum::EnumString, strum::Display, strum::EnumIter)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Pattern {
    WrongTool,
    ToolNotCalled,
    ToolForNormalChat,
    FollowupMissed,
    PrivateDataBypass,
    OwnerToolOffered,
    PromiseWithoutJob,
    ConnectorUrlMishandled,
    McpResultInfluence,
    ProviderErrorHidden,
    MemoryRegression,
}

impl Pattern {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The pattern an owner's expectation implies for a trace that routed as it did.
    pub fn implied(expect: &Expect, trace: &TraceRow, called: &[String]) -> Self {
        match expect {
            Expect::Tool { .. } if called.is_empty() => Self::ToolNotCalled,
            Expect::Tool { .. } => Self::WrongTool,
            Expect::NormalChat if !called.is_empty() || trace.route == "tool_lane" => Self::ToolForNormalChat,
            Expect::NormalChat => Self::MemoryRegression,
            Expect::Guard => Self::PrivateDataBypass,
            Expect::Clarify => Self::FollowupMissed,
        }
    }
}

fn detail(step: &Step) -> Value {
    serde_json::from_str(&step.detail).unwrap_or(Value::Null)
}

/// The tools a trace's accepted plans called.
pub fn called_tools(steps: &[Step]) -> Vec<String> {
    let mut tools = Vec::new();
    for step in steps.iter().filter(|s| s.step == "AgentToolPlanAccepted" || s.step == "AgentToolPolicyDenied") {
        for call in detail(step).get("calls").and_then(Value::as_array).into_iter().flatten() {
            if let Some(tool) = call.get("tool").and_then(Value::as_str) {
                tools.push(tool.to_string());
            }
        }
    }
    tools
}

/// What the scan sees in one finished trace: each pattern with what it saw.
pub fn scan_trace(trace: &TraceRow, steps: &[Step], reply: Option<&str>, catalog: &Catalog, settings: &EvalSettings) -> Vec<(Pattern, String)> {
    let mut found = Vec::new();
    // A model failure is recorded as the trace's error; the person still got the fallback reply.
    // No key at all (degraded mode) is a setting the console already shows, not a hidden error.
    let llm_error = trace.error_code.as_deref().filter(|c| c.starts_with("LLM_") && *c != "LLM_NOT_CONFIGURED");
    if let Some(code) = llm_error.filter(|_| reply.is_some()) {
        found.push((Pattern::ProviderErrorHidden, format!("the model failed with {code} and the person got the fallback reply")));
    } else if let Some(step) = steps.iter().find(|s| s.step == "AgentToolPlannerResult" && s.reason_code.starts_with("LLM_") && s.reason_code != "LLM_NOT_CONFIGURED") {
        found.push((Pattern::ProviderErrorHidden, format!("the planner failed with {} and the message went on to normal chat", step.reason_code)));
    }
    if trace.actor == Role::Customer.as_str() {
        let offered: Vec<String> = steps
            .iter()
            .filter(|s| s.step == "AgentToolCandidate")
            .flat_map(|s| detail(s).get("candidates").and_then(Value::as_array).cloned().unwrap_or_default())
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
            .filter(|name| catalog.get(name).is_some_and(|t| t.spec.audience == Audience::OwnerOnly))
            .collect();
        if let Some(name) = offered.first() {
            found.push((Pattern::OwnerToolOffered, format!("the owner-only tool {name} was a candidate for a customer")));
        } else if steps.iter().any(|s| s.reason_code == "TOOL_NOT_ALLOWED_FOR_ACTOR") {
            found.push((Pattern::OwnerToolOffered, "the planner proposed a tool the customer may not use".into()));
        }
    }
    if steps.iter().any(|s| s.reason_code == "CONNECTOR_UNSUPPORTED_URL" || s.detail.contains("CONNECTOR_UNSUPPORTED_URL")) {
        found.push((Pattern::ConnectorUrlMishandled, "a connector refused the URL it was given".into()));
    }
    // `AgentToolFollowupResolved`, or `AgentToolFollowup` in traces written before it was named so.
    if let Some(step) = steps.iter().find(|s| s.step.starts_with("AgentToolFollowup") && matches!(s.reason_code.as_str(), "FOLLOWUP_CONTEXT_EXPIRED" | "FOLLOWUP_WITHOUT_CONTEXT")) {
        found.push((Pattern::FollowupMissed, format!("a follow-up went on without its context ({})", step.reason_code)));
    }
    if let Some(step) = steps.iter().find(|s| s.step == "AgentToolPlanRejected" && matches!(s.reason_code.as_str(), "TOOL_UNKNOWN" | "LANE_TOOL_NOT_CANDIDATE")) {
        found.push((Pattern::WrongTool, format!("the planner chose a tool it was not offered ({})", step.reason_code)));
    }
    if let Some(reply) = reply.map(str::to_lowercase) {
        let promised = settings.promise_phrases.iter().find(|p| !p.trim().is_empty() && reply.contains(&p.to_lowercase()));
        let has_job = steps.iter().any(|s| detail(s).get("job_id").is_some_and(|j| !j.is_null()));
        if let Some(phrase) = promised.filter(|_| !has_job) {
            found.push((Pattern::PromiseWithoutJob, format!("the reply says {phrase:?} and no job was stored")));
        }
    }
    found
}

/// What one scan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub traces: usize,
    pub findings: usize,
    /// Traces up to this id have been looked at.
    pub cursor: i64,
}

/// Looks at the traces after the scan's cursor (at most `limit`), stopping at one still
/// running (unless it began `abandoned_after` ago: its message gave up, and it would stop every
/// scan for good), and stores what it finds. A finding is stored once per trace and pattern.
pub async fn scan(conn: &mut AnyConnection, catalog: &Catalog, settings: &EvalSettings, limit: i64) -> Result<ScanReport, DbError> {
    let mut report = ScanReport { cursor: store::scan_cursor(conn).await?, ..ScanReport::default() };
    let abandoned = db::now_ms().saturating_sub(db::duration_ms(settings.abandoned_after));
    for trace in db::traces::after(conn, report.cursor, limit).await? {
        if trace.outcome == db::traces::RUNNING && trace.started_at > abandoned {
            break;
        }
        let Some((trace, steps)) = db::traces::get(conn, trace.id).await? else {
            continue;
        };
        let reply = db::conversation::earlier_reply(conn, &trace.message_id).await?.and_then(|r| r.reply);
        for (pattern, note) in scan_trace(&trace, &steps, reply.as_deref(), catalog, settings) {
            let new = store::NewFinding { trace_id: trace.id, pattern: pattern.as_str(), source: "scan", note: &note, expect: "", owner_id: None, created_at: db::now_ms() };
            if store::insert_finding(conn, &new).await?.1 {
                report.findings += 1;
            }
        }
        report.traces += 1;
        report.cursor = trace.id;
    }
    store::set_scan_cursor(conn, report.cursor).await?;
    Ok(report)
}

/// Why a trace cannot be marked or made into a case.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    #[error("EVAL_TRACE_NOT_FOUND: there is no trace {0}")]
    NoTrace(i64),
    #[error("EVAL_TRACE_UNREADABLE: trace {0} has no message text to replay (an unreadable message type, or its chat was deleted)")]
    NoMessage(i64),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl MarkError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoTrace(_) => "EVAL_TRACE_NOT_FOUND",
            Self::NoMessage(_) => "EVAL_TRACE_UNREADABLE",
            Self::Db(e) => e.code(),
        }
    }
}

/// The case a trace makes: its message, actor, chat type, the tool contexts its detector saw
/// (their arguments with `pii_fields`, the catalog's personal-data fields, replaced: a case may
/// be exported into version control), the chat's memory summary, and the planner's recorded
/// answers.
pub async fn case_from_trace(conn: &mut AnyConnection, trace_id: i64, expect: Expect, origin: Origin, recent_turns: u32, pii_fields: &[String]) -> Result<Case, MarkError> {
    let (trace, steps) = db::traces::get(conn, trace_id).await?.ok_or(MarkError::NoTrace(trace_id))?;
    // Where the channel stored it, else memory,
    // else the trace's own copy (conversation.trace_text).
    let stored = match db::traces::inbound_text(conn, &trace.message_id).await? {
        Some(text) => Some(text),
        None => db::conversation::text_of(conn, &trace.chat_id, &trace.message_id).await?,
    };
    let message = match stored {
        Some(text) => text,
        None => steps.iter().find(|s| s.step == "dedupe").and_then(|s| detail(s).get("text").and_then(Value::as_str).map(String::from)).ok_or(MarkError::NoMessage(trace_id))?,
    };
    let actor = trace.actor.parse().unwrap_or(Role::Customer);
    let chat_type = match steps.iter().find(|s| s.step == "group") {
        Some(step) if step.reason_code != "DIRECT_CHAT" => ChatKind::Group,
        _ => ChatKind::Direct,
    };
    let mut contexts = Vec::new();
    let candidate = steps.iter().find(|s| s.step == "AgentToolCandidate");
    let ids: Vec<i64> = candidate
        .and_then(|s| detail(s).get("context_ids").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_str().and_then(|s| s.parse().ok()))
        .collect();
    for id in ids {
        if let Some(row) = db::contexts::get(conn, id).await? {
            let mut args = serde_json::from_str(&row.args).unwrap_or(Value::Null);
            crate::redact::redact_named(&mut args, pii_fields, crate::redact::PII_REDACTED);
            contexts.push(RecentContext {
                id: Some(row.id.to_string()),
                tool: row.tool,
                args,
                summary: row.summary,
                entities: serde_json::from_str(&row.entities).unwrap_or_default(),
                age_secs: u64::try_from(trace.started_at.saturating_sub(row.created_at) / 1000).unwrap_or(0),
            });
        }
    }
    let memory_summary = crate::lane::memory::for_planner(conn, &trace.chat_id, trace.started_at, recent_turns).await?;
    // The clarifying question the message answered, while it is kept (it is swept with the
    // tool contexts).
    let clarification_id = candidate.and_then(|s| detail(s).get("clarification_id").and_then(Value::as_str).and_then(|id| id.parse().ok()));
    let clarification = match clarification_id {
        Some(id) => db::clarifications::get(conn, id).await?.as_ref().map(crate::lane::context::clarification_of),
        None => None,
    };
    let recorded = steps.iter().filter(|s| s.step == "AgentToolPlannerResult").filter_map(|s| detail(s).get("response").filter(|r| !r.is_null()).cloned()).collect();
    Ok(Case { name: format!("trace-{trace_id}"), message, actor, chat_type, contexts, memory_summary, clarification, expect, origin: Origin { trace_id: Some(trace_id), ..origin }, recorded })
}

/// An owner's mark: the trace was wrong and `expect` is what should have happened. Stores the
/// finding (the pattern given, or the one the expectation implies) and its eval case.
#[expect(clippy::too_many_arguments, reason = "the mark's parts, and what a case is made with")]
pub async fn mark(conn: &mut AnyConnection, trace_id: i64, expect: Expect, pattern: Option<Pattern>, note: &str, owner_id: Option<i64>, recent_turns: u32, pii_fields: &[String]) -> Result<(FindingRow, i64), MarkError> {
    let (trace, steps) = db::traces::get(conn, trace_id).await?.ok_or(MarkError::NoTrace(trace_id))?;
    let pattern = pattern.unwrap_or_else(|| Pattern::implied(&expect, &trace, &called_tools(&steps)));
    let origin = Origin { kind: "finding".into(), trace_id: Some(trace_id), pattern: Some(pattern.as_str().into()), note: (!note.trim().is_empty()).then(|| note.trim().to_string()) };
    let case = case_from_trace(conn, trace_id, expect.clone(), origin, recent_turns, pii_fields).await?;
    let expect_text = expect.to_string();
    let new = store::NewFinding { trace_id, pattern: pattern.as_str(), source: "owner", note: note.trim(), expect: &expect_text, owner_id, created_at: db::now_ms() };
    let (finding, _) = store::insert_finding(conn, &new).await?;
    let case_id = store::upsert_case(conn, &case.to_row()).await?;
    store::set_finding_case(conn, finding.id, case_id).await?;
    Ok((finding, case_id))
}

/// Makes the cases of findings that have an expectation and no case yet (a `/wrong` from
/// WhatsApp stores only the finding). Returns how many were made; a finding whose trace cannot
/// be replayed is left as it is.
pub async fn make_cases(conn: &mut AnyConnection, recent_turns: u32, pii_fields: &[String]) -> Result<usize, DbError> {
    let mut made = 0;
    for finding in store::findings_without_case(conn).await? {
        let Ok(expect) = finding.expect.parse::<Expect>() else {
            continue;
        };
        let origin = Origin { kind: "finding".into(), trace_id: Some(finding.trace_id), pattern: Some(finding.pattern.clone()), note: (!finding.note.is_empty()).then(|| finding.note.clone()) };
        match case_from_trace(conn, finding.trace_id, expect, origin, recent_turns, pii_fields).await {
            Ok(case) => {
                let id = store::upsert_case(conn, &case.to_row()).await?;
                store::set_finding_case(conn, finding.id, id).await?;
                made += 1;
            }
            Err(MarkError::Db(e)) => return Err(e),
            Err(e) => tracing::warn!(finding = finding.id, code = e.code(), "a finding's trace cannot become a case"),
        }
    }
    Ok(made)
}

/// Every stored case, in order; a row that cannot be read is an error naming it.
pub async fn cases(conn: &mut AnyConnection) -> Result<Vec<Case>, CasesError> {
    store::list_cases(conn).await?.iter().map(|r| Case::from_row(r).map_err(CasesError::Corrupt)).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Corrupt(super::case::CorruptCase),
}
