//! Spans made from Gatehouse's own records: a message's trace (its row and steps), a model
//! call's `llm_calls` row, a job's row. Ids are derived, not random, so a job run later, even by
//! another process, lands in its message's trace: the trace id comes from the correlation id the
//! message and its jobs share, the message's span id from the same. Only names, codes, counts,
//! models and timings are exported: never message text, replies, tool arguments, chat ids or
//! step details (a step's detail may hold the text when `conversation.trace_text` is on).

use std::{
    borrow::Cow,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use opentelemetry::{
    Array, InstrumentationScope, KeyValue, StringValue, Value,
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use sha2::{Digest, Sha256};

use crate::db::{
    jobs::JobRow,
    llm_calls::LlmCallRow,
    traces::{Appended, Step, TraceRow},
};

/// Where a span hangs: its trace and its parent span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The OpenTelemetry trace of everything done for the message with this correlation id.
pub fn trace_id(service: &str, correlation_id: &str) -> TraceId {
    let d = digest(&["gatehouse.trace", service, correlation_id]);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&d[..16]);
    TraceId::from_bytes(bytes)
}

fn span_id(parts: &[&str]) -> SpanId {
    let d = digest(parts);
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&d[..8]);
    SpanId::from_bytes(bytes)
}

/// The span of the message itself, the root of its trace.
pub fn message(service: &str, correlation_id: &str) -> Parent {
    Parent { trace_id: trace_id(service, correlation_id), span_id: span_id(&["gatehouse.message", service, correlation_id]) }
}

/// The span of one attempt of a job.
pub fn job(service: &str, job: &JobRow) -> Parent {
    let (id, attempt) = (job.id.to_string(), job.attempt.to_string());
    Parent { trace_id: trace_id(service, &job.correlation_id), span_id: span_id(&["gatehouse.job", service, &job.correlation_id, &id, &attempt]) }
}

fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("gatehouse").with_version(env!("CARGO_PKG_VERSION")).build()
}

fn span(me: Parent, parent: Option<SpanId>, kind: SpanKind, name: String, (start, end): (SystemTime, SystemTime), attributes: Vec<KeyValue>, status: Status) -> SpanData {
    SpanData {
        span_context: SpanContext::new(me.trace_id, me.span_id, TraceFlags::SAMPLED, false, TraceState::default()),
        parent_span_id: parent.unwrap_or(SpanId::INVALID),
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Owned(name),
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope(),
    }
}

fn error(code: &str) -> Status {
    Status::Error { description: Cow::Owned(code.to_string()) }
}

/// A message's span and one child span per step, timed as the trace recorded them: each step
/// lasted from the step before it to itself.
pub fn message_spans(service: &str, trace: &TraceRow, steps: &[Step]) -> Vec<SpanData> {
    let root = message(service, &trace.correlation_id);
    let start = at_ms(trace.started_at);
    let mut attributes = vec![
        KeyValue::new("gatehouse.trace.id", trace.id),
        KeyValue::new("gatehouse.channel", trace.channel.clone()),
        KeyValue::new("gatehouse.actor", trace.actor.clone()),
        KeyValue::new("gatehouse.route", trace.route.clone()),
        KeyValue::new("gatehouse.outcome", trace.outcome.clone()),
        KeyValue::new("gatehouse.steps", steps.len() as i64),
    ];
    let status = match &trace.error_code {
        Some(code) => {
            attributes.push(KeyValue::new("error.type", code.clone()));
            error(code)
        }
        None => Status::Unset,
    };
    let mut out = Vec::with_capacity(steps.len() + 1);
    out.push(span(root, None, SpanKind::Server, format!("message {}", trace.route), (start, start + micros(trace.duration_us)), attributes, status));
    let mut clock = start;
    for (seq, step) in steps.iter().enumerate() {
        let end = clock + micros(step.duration_us);
        let me = Parent { trace_id: root.trace_id, span_id: step_span_id(service, trace, seq) };
        out.push(span(me, Some(root.span_id), SpanKind::Internal, step.step.clone(), (clock, end), step_attributes(step, seq), Status::Unset));
        clock = end;
    }
    out
}

/// Whether a step appended to `trace` at `appended_ms` is the trace's own export's to send:
/// appended while its message was still handled (an owner deciding meanwhile), or before the
/// trace ended (its export, made when it ended, reads it, and may still be queued).
pub fn held_by_trace_export(trace: &TraceRow, appended_ms: i64) -> bool {
    trace.outcome == crate::db::traces::RUNNING || trace.started_at.saturating_add(trace.duration_us / 1000) >= appended_ms
}

fn step_span_id(service: &str, trace: &TraceRow, seq: usize) -> SpanId {
    span_id(&["gatehouse.step", service, &trace.correlation_id, &trace.id.to_string(), &seq.to_string()])
}

fn step_attributes(step: &Step, seq: usize) -> Vec<KeyValue> {
    vec![
        KeyValue::new("gatehouse.step", step.step.clone()),
        KeyValue::new("gatehouse.decision", step.decision.clone()),
        KeyValue::new("gatehouse.reason_code", step.reason_code.clone()),
        KeyValue::new("gatehouse.step.seq", seq as i64),
    ]
}

/// A step appended to a finished trace (`appended`, read back as `step`), committed at
/// `committed_ms`: a child of the message's span with the id the message's own export would
/// have given it. A step that failed the trace (an undelivered reply) carries its code as the
/// error.
pub fn appended_span(service: &str, trace: &TraceRow, appended: Appended, step: &Step, committed_ms: i64) -> SpanData {
    let root = message(service, &trace.correlation_id);
    let seq = usize::try_from(appended.seq).unwrap_or(0);
    let me = Parent { trace_id: root.trace_id, span_id: step_span_id(service, trace, seq) };
    let end = at_ms(committed_ms.max(trace.started_at));
    let start = end.checked_sub(micros(step.duration_us)).unwrap_or(end);
    let mut attributes = step_attributes(step, seq);
    let status = if appended.failed {
        attributes.push(KeyValue::new("error.type", step.reason_code.clone()));
        error(&step.reason_code)
    } else {
        Status::Unset
    };
    span(me, Some(root.span_id), SpanKind::Internal, step.step.clone(), (start, end), attributes, status)
}

/// A model call, with the GenAI semantic conventions' attributes: operation, provider, model,
/// token usage, finish reason. The call's row says when it ended and how long it took.
pub fn model_span(parent: Parent, row: &LlmCallRow) -> SpanData {
    let end = at_ms(row.at);
    let start = end.checked_sub(Duration::from_millis(u64::try_from(row.latency_ms).unwrap_or(0))).unwrap_or(end);
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "chat"),
        KeyValue::new("gen_ai.provider.name", row.provider.clone()),
        KeyValue::new("gen_ai.system", row.provider.clone()),
        KeyValue::new("gen_ai.request.model", row.model.clone()),
        KeyValue::new("gen_ai.usage.input_tokens", row.input_tokens),
        KeyValue::new("gen_ai.usage.output_tokens", row.output_tokens),
        KeyValue::new("gatehouse.llm.purpose", row.purpose.clone()),
        KeyValue::new("gatehouse.llm.outcome", row.outcome.clone()),
        KeyValue::new("gatehouse.llm.attempts", row.attempts),
    ];
    if let Some(reason) = &row.stop_reason {
        attributes.push(KeyValue::new("gen_ai.response.finish_reasons", Value::Array(Array::String(vec![StringValue::from(reason.clone())]))));
    }
    if let Some(status) = row.http_status {
        attributes.push(KeyValue::new("http.response.status_code", status));
    }
    if let Some(cost) = row.cost_micro_usd {
        attributes.push(KeyValue::new("gatehouse.llm.cost_micro_usd", cost));
    }
    let status = if row.outcome == "ok" {
        Status::Unset
    } else {
        attributes.push(KeyValue::new("error.type", row.outcome.clone()));
        error(&row.outcome)
    };
    let me = Parent { trace_id: parent.trace_id, span_id: SpanId::from_bytes(rand::random::<[u8; 8]>()) };
    span(me, Some(parent.span_id), SpanKind::Client, format!("chat {}", row.model), (start, end), attributes, status)
}

/// One attempt of a job. A job made for a message is a child of the message's span; a tool
/// call is named as the GenAI conventions name one (`execute_tool <tool>`).
pub fn job_span(service: &str, job: &JobRow, started_ms: i64, ended_ms: i64, failure: Option<&str>) -> SpanData {
    let me = self::job(service, job);
    let parent = job.message_id.as_ref().map(|_| message(service, &job.correlation_id).span_id);
    let mut attributes = vec![
        KeyValue::new("gatehouse.job.id", job.id),
        KeyValue::new("gatehouse.job.kind", job.kind.clone()),
        KeyValue::new("gatehouse.job.attempt", job.attempt),
        KeyValue::new("gatehouse.job.queue_wait_ms", (started_ms - job.scheduled_at).max(0)),
        KeyValue::new("gatehouse.job.outcome", failure.unwrap_or("completed").to_string()),
    ];
    let name = match &job.tool_name {
        Some(tool) => {
            attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
            format!("execute_tool {tool}")
        }
        None => format!("job {}", job.kind),
    };
    let status = match failure {
        Some(code) => {
            attributes.push(KeyValue::new("error.type", code.to_string()));
            error(code)
        }
        None => Status::Unset,
    };
    span(me, parent, SpanKind::Consumer, name, (at_ms(started_ms), at_ms(ended_ms)), attributes, status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> TraceRow {
        TraceRow {
            id: 7,
            correlation_id: "c-1".into(),
            channel: "whatsapp".into(),
            chat_id: "15550100".into(),
            message_id: "wamid.1".into(),
            actor: "customer".into(),
            route: "tool_lane".into(),
            outcome: "replied".into(),
            error_code: None,
            started_at: 1_000_000,
            duration_us: 9_000,
        }
    }

    fn step(name: &str, us: i64, detail: &str) -> Step {
        Step { step: name.into(), decision: "run".into(), reason_code: "OK".into(), duration_us: us, detail: detail.into() }
    }

    #[test]
    fn steps_are_children_of_the_message_timed_one_after_another() {
        let spans = message_spans("svc", &trace(), &[step("received", 1_000, "{}"), step("AgentToolPlannerResult", 5_000, "{}")]);
        let root = &spans[0];
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert_eq!(root.span_context.trace_id(), trace_id("svc", "c-1"));
        assert_eq!(root.end_time.duration_since(root.start_time).ok(), Some(Duration::from_micros(9_000)));
        assert!(spans[1..].iter().all(|s| s.parent_span_id == root.span_context.span_id() && s.span_context.trace_id() == root.span_context.trace_id()));
        assert_eq!(spans[2].start_time, spans[1].end_time);
        assert_eq!(spans[2].end_time.duration_since(spans[2].start_time).ok(), Some(Duration::from_micros(5_000)));
        // Derived ids: the same trace exported twice has the same spans.
        let again = message_spans("svc", &trace(), &[step("received", 1_000, "{}"), step("AgentToolPlannerResult", 5_000, "{}")]);
        assert_eq!(again[2].span_context.span_id(), spans[2].span_context.span_id());
    }

    #[test]
    fn an_appended_step_is_the_span_the_whole_export_would_have_made() {
        let steps = [step("received", 1_000, "{}"), step("delivery", 0, r#"{"outcome":"sent to 15550100"}"#)];
        let whole = message_spans("svc", &trace(), &steps);
        let delivered = appended_span("svc", &trace(), Appended { trace_id: 7, seq: 1, failed: false }, &steps[1], 2_000_000);
        assert_eq!(delivered.span_context.span_id(), whole[2].span_context.span_id(), "the same id: a backend that got both keeps one");
        assert_eq!((delivered.parent_span_id, delivered.span_context.trace_id()), (whole[0].span_context.span_id(), whole[0].span_context.trace_id()));
        assert_eq!(delivered.end_time, UNIX_EPOCH + Duration::from_millis(2_000_000), "when it was committed");
        assert_eq!(delivered.status, Status::Unset);
        assert!(!format!("{delivered:?}").contains("15550100"), "no detail");
        // A reply that never arrived fails its span with the step's code.
        let undelivered = Step { reason_code: "WHATSAPP_131026".into(), ..steps[1].clone() };
        let failed = appended_span("svc", &trace(), Appended { trace_id: 7, seq: 1, failed: true }, &undelivered, 2_000_000);
        assert_eq!(failed.status, error("WHATSAPP_131026"));
        assert!(failed.attributes.iter().any(|kv| kv.key.as_str() == "error.type" && kv.value.as_str() == "WHATSAPP_131026"));
    }

    #[test]
    fn a_step_appended_before_its_trace_ended_is_left_to_the_traces_export() {
        // trace(): started at 1,000,000 ms, 9 ms long.
        assert!(held_by_trace_export(&trace(), 1_000_005), "appended before it ended");
        assert!(!held_by_trace_export(&trace(), 1_000_010), "appended after: sent alone");
        let running = TraceRow { outcome: crate::db::traces::RUNNING.into(), duration_us: 0, ..trace() };
        assert!(held_by_trace_export(&running, 2_000_000), "still handled");
    }

    #[test]
    fn no_detail_text_or_chat_reaches_the_attributes() {
        let spans = message_spans("svc", &trace(), &[step("received", 1, r#"{"text":"my secret words"}"#)]);
        let all = format!("{spans:?}");
        assert!(!all.contains("my secret words"));
        assert!(!all.contains("15550100"), "no chat id");
        assert!(!all.contains("wamid.1"), "no message id");
    }

    #[test]
    fn a_job_for_a_message_joins_its_trace() {
        let job = JobRow {
            id: 3,
            kind: "tool.call".into(),
            queue: "default".into(),
            state: crate::db::jobs::JobState::Running,
            priority: 0,
            dedupe_key: None,
            chat_id: Some("15550100".into()),
            sender_id: None,
            message_id: Some("wamid.1".into()),
            original_text: Some("where is my order".into()),
            tool_name: Some("order_status".into()),
            args: r#"{"order_id":"4821"}"#.into(),
            attempt: 1,
            max_attempts: 3,
            created_at: 1_000,
            updated_at: 1_000,
            scheduled_at: 1_000,
            started_at: Some(1_500),
            completed_at: None,
            expires_at: None,
            lease_owner: None,
            lease_expires_at: None,
            last_error_code: None,
            last_error_message: None,
            result_preview: Some("shipped".into()),
            correlation_id: "c-1".into(),
        };
        let span = job_span("svc", &job, 1_500, 2_000, None);
        assert_eq!(span.span_context.trace_id(), trace_id("svc", "c-1"));
        assert_eq!(span.parent_span_id, message("svc", "c-1").span_id);
        assert_eq!(span.name, "execute_tool order_status");
        let all = format!("{span:?}");
        assert!(!all.contains("where is my order") && !all.contains("4821") && !all.contains("shipped") && !all.contains("15550100"), "{all}");
        let alone = JobRow { message_id: None, ..job };
        assert_eq!(job_span("svc", &alone, 1_500, 2_000, Some("TIMEOUT")).parent_span_id, SpanId::INVALID);
    }
}
