//! The WhatsApp Cloud API channel's settings.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// The WhatsApp Cloud API channel: where the Graph API is, how replies are paced, and what
/// the bot says on its own (notes and templates). Tokens are secrets, never settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WhatsAppSettings {
    /// Graph API base URL without the version (tests point it at a local fake).
    pub graph_base_url: String,
    /// Graph API version path segment, such as "v25.0".
    pub graph_version: String,
    /// The business phone number's id (not the number itself). Empty: nothing is sent, and
    /// inbound messages wait until it is set.
    pub phone_number_id: String,
    /// Deadline of one Graph API request.
    #[serde(with = "duration_str")]
    pub request_timeout: Duration,
    /// Mark each handled inbound message as read.
    pub mark_read: bool,
    /// Show the typing indicator while a reply is prepared.
    pub typing_indicator: bool,
    /// Said to a chat that sends a message type the bot cannot read yet. Empty: say nothing.
    pub unknown_type_reply: String,
    /// The note above goes to one chat at most once per this period.
    #[serde(with = "duration_str")]
    pub unknown_type_reply_every: Duration,
    /// Message types that get no note at all (by WhatsApp's type name): a reaction to a reply
    /// is not a message to answer.
    pub silent_types: Vec<String>,
    /// Approved template sent when a reply falls outside the 24-hour window (error 131047).
    /// Empty: the reply is only marked failed.
    pub window_template: String,
    pub window_template_language: String,
    /// Messages to one recipient: a burst of this many, then one per `pair_interval`.
    pub pair_burst: u32,
    #[serde(with = "duration_str")]
    pub pair_interval: Duration,
    /// Messages per second across all recipients (the business number's throughput).
    pub global_rate_per_second: u32,
    /// Longest a send waits for pacing before the job is retried later instead.
    #[serde(with = "duration_str")]
    pub max_pacing_wait: Duration,
    /// Tries per message on rate limits (130429, 131056) and 5xx before the job is retried later.
    pub send_attempts: u32,
    /// Backoff between those tries: this, times 4 per further try.
    #[serde(with = "duration_str")]
    pub send_retry_base: Duration,
    /// Largest inbound message object kept verbatim, in bytes; larger ones keep only the parsed fields.
    pub raw_max_bytes: u64,
    /// What the owners are told when a message to a person is undelivered for good (Meta
    /// refused the send, or reported it failed): `{chat}` the number or group, `{code}` the
    /// error, `{link}` its trace (or its chat) in the console. Empty: no notice.
    pub undelivered_notice: String,
    /// What the owners are told when a person's message is dropped unanswered (its job failed
    /// for good): `{chat}` the number or group, `{code}` the job's error, `{link}` the job in the
    /// console, where an owner can retry it. Empty: no notice.
    pub unhandled_notice: String,
    /// One chat's owners hear of an undelivered reply or an unhandled message at most once per
    /// this period (either notice counts: both say a person may be waiting): in the console,
    /// and on WhatsApp only the first of its cause (notice and code) in the period.
    #[serde(with = "duration_str")]
    pub undelivered_notice_every: Duration,
}

impl Default for WhatsAppSettings {
    fn default() -> Self {
        Self {
            graph_base_url: "https://graph.facebook.com".into(),
            graph_version: "v25.0".into(),
            phone_number_id: String::new(),
            request_timeout: Duration::from_secs(15),
            mark_read: true,
            typing_indicator: true,
            unknown_type_reply: "Sorry, I can only read text messages. Please send your question as text.".into(),
            unknown_type_reply_every: Duration::from_secs(24 * 3600),
            undelivered_notice: "A message to {chat} could not be delivered ({code}); they may be waiting for an answer. {link}".into(),
            unhandled_notice: "A message from {chat} was not answered: handling it failed ({code}). Retry it, or answer them yourself: {link}".into(),
            undelivered_notice_every: Duration::from_secs(6 * 3600),
            silent_types: vec!["reaction".into(), "system".into()],
            window_template: String::new(),
            window_template_language: "en_US".into(),
            pair_burst: 5,
            pair_interval: Duration::from_secs(6),
            global_rate_per_second: 80,
            max_pacing_wait: Duration::from_secs(20),
            send_attempts: 3,
            send_retry_base: Duration::from_secs(2),
            raw_max_bytes: 65_536,
        }
    }
}

impl WhatsAppSettings {
    /// The longest one reply's sends can take: every try of a part at the request deadline,
    /// plus the longest pacing wait. A job that sends must keep this much of its budget.
    pub fn send_reserve(&self) -> Duration {
        self.request_timeout.saturating_mul(self.send_attempts.max(1)).saturating_add(self.max_pacing_wait)
    }
}
