//! The durable job queue's settings.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// The durable job queue's worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobSettings {
    /// Run a worker inside `gatehouse serve`; `gatehouse worker` runs one alone.
    pub worker_in_serve: bool,
    pub queue: String,
    pub concurrency: u32,
    #[serde(with = "duration_str")]
    pub poll_interval: Duration,
    #[serde(with = "duration_str")]
    pub lease: Duration,
    #[serde(with = "duration_str")]
    pub job_timeout: Duration,
    #[serde(with = "duration_str")]
    pub shutdown_grace: Duration,
    #[serde(with = "duration_str")]
    pub retry_base: Duration,
    #[serde(with = "duration_str")]
    pub retry_max: Duration,
    pub default_max_attempts: u32,
    #[serde(with = "duration_str")]
    pub maintenance_interval: Duration,
    /// Budgets of the job kinds whose work is longer than `job_timeout` allows.
    pub timeouts: JobTimeouts,
    /// Attempts of the job kinds that must outlast an outage of the WhatsApp Cloud API.
    pub attempts: JobAttempts,
}

/// How many runs a job kind gets before it is discarded, for the kinds that send on WhatsApp:
/// with the backoff doubling from `retry_base` up to `retry_max`, these ride out an outage of
/// the Cloud API (or of this machine's network) instead of dropping the reply after
/// `default_max_attempts`. A retried reply is not asked of the model again: the runtime gives
/// back the reply it made, and the delivery ledger skips what already went out.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobAttempts {
    /// `whatsapp.inbound`: the reply to a customer's or an owner's message.
    pub whatsapp_inbound: u32,
    /// `owner.notify`, `approval.ask`, `approval.settle`, `whatsapp.window_template` and
    /// `tool.stopped`: what owners are told and asked on WhatsApp, what a customer is told of an
    /// owner's decision or of a call an owner stopped, and the template sent for a message
    /// refused outside the 24-hour window.
    pub owner_notify: u32,
    /// `tool.call`: a tool call and the answer it owes the chat. The call itself is tried at
    /// most `default_max_attempts` times; the runs after that only send its kept answer.
    pub tool_call: u32,
}

impl Default for JobAttempts {
    fn default() -> Self {
        Self { whatsapp_inbound: 14, owner_notify: 14, tool_call: 14 }
    }
}

/// How long one run of a job kind may take before it is stopped and retried. Work inside a run
/// takes its deadlines from what is left, so a run ends on its own terms (a fallback reply
/// sent, a send finished) before its budget does.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JobTimeouts {
    /// `whatsapp.inbound`: the model calls for one message (compaction and chat), then the
    /// reply's sends with their retries and pacing. Must fit one model call (the provider's
    /// `timeout`) plus the sends (`whatsapp.request_timeout` × `send_attempts` +
    /// `max_pacing_wait`).
    #[serde(with = "duration_str")]
    pub whatsapp_inbound: Duration,
    /// `owner.notify`: one notice's sends. Must fit the sends as above. Also the budget of
    /// `approval.ask`, `approval.settle`, `whatsapp.window_template`, `tool.stopped` and the
    /// undelivered and unhandled notices.
    #[serde(with = "duration_str")]
    pub owner_notify: Duration,
    /// `tool.call`: one tool call through the checkpoint (its timeout and retries), the
    /// summary (one model call) and the answer's sends.
    #[serde(with = "duration_str")]
    pub tool_call: Duration,
    /// `evals.cycle`: the self-improvement cycle's replays and its questions to the repair
    /// model (`models.repair`), each up to the provider's `timeout`. It asks no question once
    /// less than that is left, and keeps every proposal it found.
    #[serde(with = "duration_str")]
    pub evals_cycle: Duration,
}

impl Default for JobTimeouts {
    fn default() -> Self {
        Self { whatsapp_inbound: Duration::from_secs(240), owner_notify: Duration::from_secs(120), tool_call: Duration::from_secs(240), evals_cycle: Duration::from_secs(600) }
    }
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            worker_in_serve: true,
            queue: "default".into(),
            concurrency: 8,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            job_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(3600),
            default_max_attempts: 5,
            maintenance_interval: Duration::from_secs(5),
            timeouts: JobTimeouts::default(),
            attempts: JobAttempts::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{load_text, problems_at};

    /// A lease renewed every quarter of it must outlast a renewal's wait for the database, or a
    /// job still running is handed to a second worker: 30 ms passed the old check (non-zero).
    #[test]
    fn a_lease_too_short_to_renew_is_refused() {
        let err = problems_at("[jobs]\nlease = \"30ms\"\n", &["jobs.lease"]);
        assert!(err.to_string().contains("at least 1s"), "{err}");
        load_text("[jobs]\nlease = \"1s\"\n").expect("a second is enough");
    }
}
