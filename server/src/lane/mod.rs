//! The tool lane (seed 000 §5-§10): after the runtime's gates, a message the candidate detector
//! flags is planned by a model over the candidate tools only, every proposed call is validated
//! by deterministic code before anything runs or is promised, and results are summarized into a
//! WhatsApp reply.
//!
//! detector -> [`adapter`] (candidate tools as the planner sees them) -> [`planner`] (the
//! model's proposal, never trusted) -> [`validator`] (the seed's fifteen checks, through the
//! checkpoint's own gates) -> bridge and processor (jobs) -> [`summarizer`].
//!
//! Everything a model reads that did not come from Gatehouse (the person's message, chat
//! memory, tool results) is wrapped as untrusted data ([`data`]); every text a person reads
//! comes from `[lane]` in the configuration.
//!
//! Log events follow seed §17 (`AgentToolPlannerStart`, `AgentToolPlanRejected`, ...): one
//! `event` field, the correlation id, codes and counts, never message text or arguments.

pub mod adapter;
pub mod canonical;
pub mod data;
pub mod planner;
pub mod summarizer;
pub mod validator;

use serde::Serialize;

pub use canonical::canonical_json;

/// What the private-data guard found for the message being planned. The guard runs before the
/// lane; the planner is told the state and the validator enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PrivateData {
    /// The guard looked and no private-data category matched.
    #[default]
    Clear,
    /// Owners' messages are not guarded.
    Unguarded,
    /// The message asks for private account data of this category: only a tool tagged as
    /// reaching private data may serve it, and for a customer only with an owner's approval.
    Matched { category: String },
}
