//! `[retention]`: how long the records of finished work are kept. The `retention.prune` job
//! removes what is older, in small batches, every `every`; 0 days keeps a kind for ever.
//! Conversation memory, traces, eval cases and repairs are not touched here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// The fewest days `model_calls_days` may keep: the monthly budget reads the calls of the
/// current calendar month.
pub const MODEL_CALLS_MIN_DAYS: u32 = 32;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Completed, cancelled and discarded jobs, with their event trails, this many days after
    /// they finished; and the events older than this of jobs that run again and again.
    pub finished_jobs_days: u32,
    /// Approval requests an owner (or the clock) settled, with the messages that asked, this
    /// many days after they were settled.
    pub decided_approvals_days: u32,
    /// Owner notices, and the budget warnings of periods that ended, this many days after they
    /// were raised.
    pub notices_days: u32,
    /// Recorded model calls (tokens, cost), this many days after they were made: 0, or at
    /// least [`MODEL_CALLS_MIN_DAYS`].
    pub model_calls_days: u32,
    /// How often the prune runs: "0s" (never) or at least a minute.
    #[serde(with = "duration_str")]
    pub every: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self { finished_jobs_days: 30, decided_approvals_days: 90, notices_days: 90, model_calls_days: 400, every: Duration::from_secs(3600) }
    }
}
