//! Traces of messages, with their steps and the tool calls made for them.

use app::{
    backend::TracesBackend,
    dto::{CandidateView, TraceDetail, TraceQuery, TraceStepView, TraceSummary, TracesPage},
    error::{AppError, code},
};

use super::{ConsoleBackend, call_view, internal};
use crate::db;

#[async_trait::async_trait]
impl TracesBackend for ConsoleBackend {
    async fn traces_page(&self, q: &TraceQuery) -> Result<TracesPage, AppError> {
        const PAGE: i64 = 50;
        let filter = db::traces::TraceFilter {
            chat_id: q.chat.trim().to_string(),
            route: q.route.clone(),
            outcome: q.outcome.clone(),
            error_code: q.error_code.trim().to_string(),
            since_ms: if q.since_minutes > 0 { db::now_ms().saturating_sub(q.since_minutes.saturating_mul(60_000)) } else { 0 },
            before_id: q.before.max(0),
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let mut rows = db::traces::list(&mut conn, &filter, PAGE + 1).await.map_err(internal)?;
        let next_before = (rows.len() as i64 > PAGE).then(|| rows[PAGE as usize - 1].trace.id);
        rows.truncate(PAGE as usize);
        let traces = rows
            .into_iter()
            .map(|r| trace_summary(r.trace, r.text.as_deref()))
            .collect();
        Ok(TracesPage { traces, next_before })
    }

    async fn trace_detail(&self, id: i64) -> Result<TraceDetail, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let (trace, steps) = db::traces::get(&mut conn, id).await.map_err(internal)?.ok_or_else(|| AppError::new(code::NOT_FOUND, format!("There is no trace #{id}.")))?;
        let steps = steps
            .into_iter()
            .map(|s| {
                let value = serde_json::from_str::<serde_json::Value>(&s.detail).ok();
                let job_id = value.as_ref().and_then(|v| v.get("job_id")).and_then(serde_json::Value::as_i64);
                let candidates = value
                    .as_ref()
                    .and_then(|v| v.get("candidates"))
                    .and_then(serde_json::Value::as_array)
                    .map(|c| c.iter().filter_map(|c| Some(CandidateView { name: c.get("name")?.as_str()?.to_string(), score: c.get("score")?.as_f64()? })).collect())
                    .unwrap_or_default();
                let detail = value.map(|v| serde_json::to_string_pretty(&v).unwrap_or_default()).unwrap_or(s.detail);
                TraceStepView { step: s.step, decision: s.decision, reason_code: s.reason_code, duration_us: s.duration_us, detail: if detail == "{}" { "{}".into() } else { detail }, job_id, candidates }
            })
            .collect();
        let tool_calls = db::tool_audit::of_trace(&mut conn, id).await.map_err(internal)?.iter().map(call_view).collect();
        let findings = db::evals::findings_of_trace(&mut conn, id).await.map_err(internal)?.iter().map(super::repairs::finding_view).collect();
        let patterns = <crate::evals::Pattern as strum::IntoEnumIterator>::iter().map(|p| p.as_str().to_string()).collect();
        let tools = self.state.tools.catalog().all().map(|t| t.spec.name.clone()).collect();
        let text = db::traces::inbound_text(&mut conn, &trace.message_id).await.map_err(internal)?;
        let summary = trace_summary(trace, text.as_deref());
        Ok(TraceDetail { summary, text, steps, tool_calls, findings, patterns, tools })
    }
}

/// A trace as the console lists it, with the start of its message's `text`.
fn trace_summary(t: db::traces::TraceRow, text: Option<&str>) -> TraceSummary {
    TraceSummary {
        id: t.id,
        correlation_id: t.correlation_id,
        channel: t.channel,
        chat_id: t.chat_id,
        message_id: t.message_id,
        actor: t.actor,
        route: t.route,
        outcome: t.outcome,
        error_code: t.error_code,
        started_at: t.started_at,
        duration_us: t.duration_us,
        preview: text.map(preview),
    }
}

/// How much of a message's text the trace list shows.
const PREVIEW_CHARS: usize = 80;

/// The start of a message's text on one line, cut at [`PREVIEW_CHARS`] with an ellipsis.
fn preview(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(PREVIEW_CHARS) {
        Some((cut, _)) => format!("{}\u{2026}", line[..cut].trim_end()),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::preview;

    #[test]
    fn a_preview_is_one_line_cut_at_a_character() {
        assert_eq!(preview("Hello!\n\n  Are you open\ton Sunday?"), "Hello! Are you open on Sunday?");
        let long = "é".repeat(100);
        assert_eq!(preview(&long), format!("{}\u{2026}", "é".repeat(80)));
        assert_eq!(preview(&"é".repeat(80)), "é".repeat(80));
    }
}
