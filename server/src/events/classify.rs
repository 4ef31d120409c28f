//! The one mapping from durable rows to typed events, used both for live events and for a
//! page that resumes from the database, so the two never disagree.

use super::{Delivery, Envelope, Event, EventId, JobFacts, StepFacts};
use crate::db::events::{JobEventRow, StepRow};

/// The job kind of a tool call (`tools::job::ToolCallJob::KIND`; a test keeps them equal).
pub(crate) const TOOL_CALL_KIND: &str = "tool.call";

/// Steps the channels record for a reply's delivery.
const DELIVERY_STEPS: [&str; 3] = ["delivery", "later_delivery", "delivery_status"];

/// The event describing trace step `row`; `id` is the position just after it.
pub fn from_step(row: &StepRow, id: EventId) -> Envelope {
    let facts =
        StepFacts { trace_id: row.trace_id, seq: row.seq, step: row.step.clone(), decision: row.decision.clone(), reason_code: row.reason_code.clone() };
    // A message's trace begins with its dedupe step (or, for a type the bot cannot read, its
    // message type); a trace of its own for a console request begins otherwise.
    let event = if row.seq == 0 && matches!(row.step.as_str(), "dedupe" | "message_type") {
        Event::Received(facts)
    } else if DELIVERY_STEPS.contains(&row.step.as_str()) {
        let delivery = Delivery { trace_id: Some(row.trace_id), seq: Some(row.seq), reason_code: row.reason_code.clone(), wamid: None };
        match row.decision.as_str() {
            "failed" => Event::ReplyFailed(delivery),
            "delivered" => Event::ReplyDelivered(delivery),
            "read" => Event::ReplyRead(delivery),
            // A send the job tries again: the reply is still on its way, not sent.
            "retry" => Event::ReplyQueued(facts),
            // A reply overtaken by a later message about its request: not sent at all.
            "skipped" => Event::Routed(facts),
            _ => Event::ReplySent(delivery),
        }
    } else {
        match row.step.as_str() {
            "reply" => Event::ReplyQueued(facts),
            "ApprovalRequested" => Event::ApprovalRequested(facts),
            "ApprovalDecided" | "ApprovalExpired" | "ApprovalExecuted" => Event::ApprovalDecided(facts),
            step if step.starts_with("AgentTool") => Event::LaneStage(facts),
            _ => Event::Routed(facts),
        }
    };
    Envelope { id: Some(id), channel: Some(row.channel.clone()), chat_id: Some(row.chat_id.clone()), event }
}

/// The event describing job event `row`; `id` is the position just after it.
pub fn from_job_event(row: &JobEventRow, id: EventId) -> Envelope {
    let facts = JobFacts {
        job_id: row.job_id,
        job_kind: row.kind.clone(),
        tool: row.tool_name.clone(),
        state: row.state.clone(),
        attempt: row.attempt,
        error_code: row.error_code.clone(),
    };
    let event = match (row.kind.as_str(), row.state.as_str()) {
        (TOOL_CALL_KIND, "running") => Event::ToolCallStarted(facts),
        (TOOL_CALL_KIND, "completed" | "retryable" | "discarded" | "cancelled") => Event::ToolCallFinished(facts),
        _ => Event::JobChanged(facts),
    };
    Envelope { id: Some(id), channel: None, chat_id: row.chat_id.clone(), event }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: i64, step: &str, decision: &str) -> StepRow {
        StepRow {
            id: 10 + seq,
            trace_id: 3,
            seq,
            step: step.into(),
            decision: decision.into(),
            reason_code: "OK".into(),
            channel: "simulator".into(),
            chat_id: "c".into(),
        }
    }

    #[test]
    fn steps_become_the_events_they_describe() {
        let id = EventId::default();
        let kind = |s: StepRow| from_step(&s, id).event.kind();
        assert_eq!(kind(step(0, "dedupe", "new")), "received");
        assert_eq!(kind(step(0, "message_type", "not_read")), "received");
        assert_eq!(kind(step(0, "ApprovalRequested", "pending")), "approval_requested", "a console request's own trace");
        assert_eq!(kind(step(1, "actor", "customer")), "routed");
        assert_eq!(kind(step(2, "AgentToolCandidate", "plan")), "lane_stage");
        assert_eq!(kind(step(3, "ApprovalRequested", "pending")), "approval_requested");
        assert_eq!(kind(step(4, "reply", "send")), "reply_queued");
        assert_eq!(kind(step(5, "delivery", "delivered")), "reply_delivered");
        assert_eq!(kind(step(6, "delivery_status", "failed")), "reply_failed");
        assert_eq!(kind(step(7, "later_delivery", "sent")), "reply_sent");
        assert_eq!(kind(step(8, "delivery", "retry")), "reply_queued", "a send to be tried again was not sent");
        assert_eq!(kind(step(9, "delivery", "skipped")), "routed", "a reply overtaken by a later one was not sent");
    }

    #[test]
    fn tool_call_jobs_start_and_finish() {
        let row = |state: &str, kind: &str| JobEventRow {
            id: 1,
            job_id: 2,
            state: state.into(),
            attempt: 1,
            error_code: None,
            kind: kind.into(),
            tool_name: None,
            chat_id: None,
        };
        let kind = |r: JobEventRow| from_job_event(&r, EventId::default()).event.kind();
        assert_eq!(kind(row("running", TOOL_CALL_KIND)), "tool_call_started");
        assert_eq!(kind(row("completed", TOOL_CALL_KIND)), "tool_call_finished");
        assert_eq!(kind(row("available", TOOL_CALL_KIND)), "job_changed");
        assert_eq!(kind(row("running", "whatsapp.inbound")), "job_changed");
    }
}
