//! The `tool.call` job: one validated tool call, stored before anything says the work is
//! underway (seed §8), run by the lane at once or by a worker later (or enqueued once by an
//! owner's approval), its answer summarized and sent to the chat it came from.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::checkpoint::ApprovedCall;
use crate::{
    channel::ReplyTo,
    domain::{ChatKind, Role},
    jobs::JobKind,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallJob {
    pub tool: String,
    /// The definition version the call was validated against.
    pub version: String,
    /// The arguments as validated (never with managed or secret fields).
    pub args: Value,
    pub actor: Role,
    pub chat_kind: ChatKind,
    pub sender: String,
    /// The person's message, for the summary: untrusted data.
    pub request: String,
    pub reply_to: ReplyTo,
    /// The trace of the message that asked for it.
    pub trace_id: Option<i64>,
    /// The owner's approval this run carries: it runs only if the call is still exactly the
    /// one approved. `None` for a call that needs no approval.
    #[serde(default)]
    pub approval: Option<ApprovedCall>,
    /// The job whose failed call an owner runs again with this one: the person was told that
    /// failure, so this one's failure, or its cancel, tells them nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub again_of: Option<i64>,
}

impl JobKind for ToolCallJob {
    const KIND: &'static str = "tool.call";
}

impl ToolCallJob {
    /// One job per chat, tool, arguments and source message: a redelivered or repeated request
    /// finds the unfinished job instead of starting another.
    pub fn dedupe_key(&self, canonical_args: &str) -> String {
        let mut h = Sha256::new();
        for part in [self.reply_to.chat_id.as_str(), self.tool.as_str(), canonical_args, self.reply_to.message_id.as_str()] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("{}:{}", Self::KIND, hex::encode(&h.finalize()[..16]))
    }
}
