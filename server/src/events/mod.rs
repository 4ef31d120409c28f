//! Typed events: the live view of what happens to a message and a call. Traces and job events
//! are the durable record; each event here describes one of their rows (and carries its id), or,
//! for the few facts kept elsewhere (a WhatsApp delivery receipt, an MCP server's health), says
//! what changed without an id.
//!
//! [`Events`] publishes them on a bounded broadcast that never blocks the work: one reader per
//! process (`tail`) follows the rows as writers commit them and sends each as an event. A
//! subscriber that falls behind loses the oldest and gets a [`Event::Resync`] instead, then
//! reloads from the database. On PostgreSQL the processes wake each other through
//! LISTEN/NOTIFY. The console follows events over server-sent events (`web::live`), resuming
//! after a reconnect from the rows after its [`EventId`].

mod bus;
mod classify;
mod late;
mod tail;

use serde::{Deserialize, Serialize};

pub use bus::{Events, Replay, Subscription};
pub use classify::{from_job_event, from_step};

/// A position in the durable record: the newest trace step and job event an event stream has
/// passed. It orders events (both parts only grow) and is the SSE `id` a page resumes after.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventId {
    pub step: i64,
    pub job: i64,
}

impl EventId {
    /// Whether `self` is past `other` in either record, i.e. not yet seen at `other`.
    pub fn is_after(self, other: EventId) -> bool {
        self.step > other.step || self.job > other.job
    }

    /// Both records' newest positions.
    pub fn max(self, other: EventId) -> EventId {
        EventId { step: self.step.max(other.step), job: self.job.max(other.job) }
    }

    /// `"{step}-{job}"`, the SSE id.
    pub fn to_sse(self) -> String {
        format!("{}-{}", self.step, self.job)
    }

    /// Reads an SSE id written by [`EventId::to_sse`].
    pub fn parse(text: &str) -> Option<EventId> {
        let (step, job) = text.trim().split_once('-')?;
        let (step, job) = (step.parse().ok()?, job.parse().ok()?);
        (step >= 0 && job >= 0).then_some(EventId { step, job })
    }
}

/// A trace step's decision, as the event describing it carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFacts {
    pub trace_id: i64,
    pub seq: i64,
    pub step: String,
    pub decision: String,
    pub reason_code: String,
}

/// A job state change, as the event describing it carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFacts {
    pub job_id: i64,
    pub job_kind: String,
    pub tool: Option<String>,
    pub state: String,
    pub attempt: i64,
    pub error_code: Option<String>,
}

/// What happened. The kind (`kind` in JSON, [`Event::kind`]) is a stable snake_case name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumDiscriminants)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[strum_discriminants(name(Kind), derive(strum::IntoStaticStr, strum::EnumIter), strum(serialize_all = "snake_case"))]
pub enum Event {
    /// A message passed dedupe and its trace began (the trace's first step).
    Received(StepFacts),
    /// One of the runtime's routing decisions (actor, group rules, rate limit, command, private
    /// data, budget, tool lane or chat) with its reason code.
    Routed(StepFacts),
    /// A tool-lane stage (detector, planner, validator, chain, follow-up) with its reason code.
    LaneStage(StepFacts),
    ApprovalRequested(StepFacts),
    ApprovalDecided(StepFacts),
    /// The runtime's answer is ready to go out (or it decided to send none).
    ReplyQueued(StepFacts),
    /// A channel handed the reply over (WhatsApp accepted it).
    ReplySent(Delivery),
    /// Delivered to the person (the simulator's delivery, or a WhatsApp receipt).
    ReplyDelivered(Delivery),
    ReplyRead(Delivery),
    /// The reply could not be delivered; the reason code says why.
    ReplyFailed(Delivery),
    ToolCallStarted(JobFacts),
    ToolCallFinished(JobFacts),
    /// Any other job state change.
    JobChanged(JobFacts),
    /// An MCP server's health changed (`connected`, `degraded`, `down`).
    McpHealth {
        server: String,
        health: String,
    },
    /// This subscriber missed events (it fell behind, or has just connected): reload from the
    /// database.
    Resync {
        reason: String,
        missed: u64,
    },
}

/// A reply's delivery: from a trace step (`trace_id`, `seq`), or a WhatsApp receipt for the
/// message Meta knows as `wamid`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub trace_id: Option<i64>,
    pub seq: Option<i64>,
    pub reason_code: String,
    pub wamid: Option<String>,
}

/// Which pages an event concerns; a stream follows some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumString, strum::EnumIter)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Topic {
    /// Messages and replies: Conversations, Traces.
    Message,
    /// Approvals asked and decided: Approvals, Traces.
    Approval,
    /// Jobs and tool calls: Jobs, Approvals.
    Job,
    /// MCP servers.
    Mcp,
}

impl Event {
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// The topic an event belongs to; `None` for a resync, which every stream gets.
    pub fn topic(&self) -> Option<Topic> {
        Some(match self {
            Self::Received(_)
            | Self::Routed(_)
            | Self::LaneStage(_)
            | Self::ReplyQueued(_)
            | Self::ReplySent(_)
            | Self::ReplyDelivered(_)
            | Self::ReplyRead(_)
            | Self::ReplyFailed(_) => Topic::Message,
            Self::ApprovalRequested(_) | Self::ApprovalDecided(_) => Topic::Approval,
            Self::ToolCallStarted(_) | Self::ToolCallFinished(_) | Self::JobChanged(_) => Topic::Job,
            Self::McpHealth { .. } => Topic::Mcp,
            Self::Resync { .. } => return None,
        })
    }

    /// The kind of the job a job event is about (`tool.call`, `evals.cycle`, ...).
    pub fn job_kind(&self) -> Option<&str> {
        match self {
            Self::ToolCallStarted(j) | Self::ToolCallFinished(j) | Self::JobChanged(j) => Some(&j.job_kind),
            _ => None,
        }
    }
}

/// An event as published: with the chat it concerns and, when it describes a durable row, the
/// position after that row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// `None` for an event without a durable row (a receipt, a health change, a resync).
    pub id: Option<EventId>,
    pub channel: Option<String>,
    pub chat_id: Option<String>,
    #[serde(flatten)]
    pub event: Event,
}

impl Envelope {
    pub fn resync(reason: &str, missed: u64, id: Option<EventId>) -> Self {
        Self { id, channel: None, chat_id: None, event: Event::Resync { reason: reason.into(), missed } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_order() {
        let id = EventId { step: 12, job: 7 };
        assert_eq!(EventId::parse(&id.to_sse()), Some(id));
        assert_eq!(EventId::parse("x-1"), None);
        assert_eq!(EventId::parse("-1-2"), None);
        assert!(EventId { step: 13, job: 7 }.is_after(id));
        assert!(!EventId { step: 12, job: 6 }.is_after(id));
    }

    #[test]
    fn kinds_are_stable_snake_case() {
        let e = Event::McpHealth { server: "files".into(), health: "down".into() };
        assert_eq!(e.kind(), "mcp_health");
        let json = serde_json::to_value(Envelope { id: None, channel: None, chat_id: None, event: e }).expect("json");
        assert_eq!(json["kind"], "mcp_health");
        assert_eq!(json["server"], "files");
    }
}
