//! `[conversation]` and `[private_data]`: how the runtime treats messages before the model sees
//! them. The words and replies customers see live in config/gatehouse.toml, not in code.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// When the bot answers in a group chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GroupReply {
    /// Only when the bot is mentioned or a message replies to one of its messages.
    #[default]
    MentionedOrReplied,
    Always,
    Never,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConversationSettings {
    pub group_reply: GroupReply,
    /// Words that count as a mention of the bot in a group (case-insensitive), besides
    /// WhatsApp's own mention of the business number.
    pub mention_names: Vec<String>,
    /// Tokens of history (summary and turns) sent with each chat call; there is no fixed cap
    /// on the number of messages. Roughly four ASCII characters make a token, any other character
    /// one.
    pub history_token_budget: u32,
    /// Turns kept word for word when older ones are compacted into the chat's summary.
    pub keep_recent_turns: u32,
    /// The system prompt of normal chat.
    pub system_prompt: String,
    /// The business's time zone (an IANA name: "Europe/Lisbon"). Normal chat, the planner and
    /// the summarizer are told the date, weekday and time there with their system prompts.
    pub timezone: String,
    /// The system prompt of compaction (`models.compaction`), which folds older turns into the
    /// chat's summary.
    pub compaction_prompt: String,
    /// What a customer gets for a message that looks like a command.
    pub customer_command_reply: String,
    /// What an owner gets for a command written in a group (commands are answered in the
    /// owner's direct chat only).
    pub group_owner_command_reply: String,
    /// How a member's message reads to the model in a group chat, so it can tell the members
    /// apart: `{name}` is their label, `{text}` their words. Empty: members are not told apart.
    pub group_turn_format: String,
    /// The label of a member without a usable profile name; `{n}` is their place in the order
    /// the chat's members first wrote.
    pub group_unnamed_member: String,
    /// The label of an owner's own turns in a group: `{name}` is the name they go by in the
    /// console. A member's profile name holding a word of `reserved_member_names`, or an owner's
    /// name, is not used, so the model can tell the owner from a member posing as one.
    pub group_owner_label: String,
    /// Words no group member's label may hold ("owner", "admin", ...): a member so named is
    /// labelled as an unnamed member.
    pub reserved_member_names: Vec<String>,
    /// The owner's /help text.
    pub owner_help: String,
    /// The owner's `/status`: `{version}` is Gatehouse's, `{jobs}` the jobs by state
    /// ("available 3, running 1") or `status_no_jobs`.
    pub status_reply: String,
    pub status_no_jobs: String,
    /// The owner's `/jobs`: `{jobs}` the latest five, a line each; `jobs_empty_reply` when there
    /// are none.
    pub jobs_reply: String,
    pub jobs_empty_reply: String,
    /// An owner's command Gatehouse does not know: `{name}` is it; `owner_help` follows.
    pub unknown_command_reply: String,
    /// `/wrong` without a known EXPECTED.
    pub wrong_usage_reply: String,
    /// `/wrong` in a chat with no earlier answer to mark.
    pub wrong_no_trace_reply: String,
    /// `/wrong` taken: `{trace}` is the marked trace's number, `{expect}` what it should have been.
    pub wrong_noted_reply: String,
    /// Keep message and reply text in traces (otherwise only lengths and decisions).
    pub trace_text: bool,
    /// Messages one customer chat (in a group, one member) may send per `rate_window` before
    /// the bot stops answering them (no model call, no tool) until the window has room again.
    /// 0: no limit. Owners are never limited.
    pub rate_limit: u32,
    /// In a group each member has `rate_limit`, and the whole group this many messages per
    /// `rate_window` (members together). 0: no limit for the whole group.
    pub group_rate_limit: u32,
    #[serde(with = "duration_str")]
    pub rate_window: Duration,
    /// What a limited chat is told, once per `rate_window`.
    pub rate_limited_reply: String,
    /// The sender the console's simulator starts with.
    pub simulator_customer: String,
}

impl ConversationSettings {
    /// The owner commands' answers, by key, for `check-config`.
    pub fn command_texts(&self) -> [(&'static str, &str); 8] {
        super::texts_by_key!(
            self, "conversation":
            status_reply, status_no_jobs, jobs_reply, jobs_empty_reply, unknown_command_reply,
            wrong_usage_reply, wrong_no_trace_reply, wrong_noted_reply
        )
    }
}

impl Default for ConversationSettings {
    fn default() -> Self {
        Self {
            group_reply: GroupReply::default(),
            mention_names: Vec::new(),
            history_token_budget: 6_000,
            keep_recent_turns: 8,
            system_prompt: String::new(),
            timezone: "UTC".into(),
            compaction_prompt: String::new(),
            customer_command_reply: String::new(),
            group_owner_command_reply: String::new(),
            group_turn_format: "[{name}] {text}".into(),
            group_unnamed_member: "member {n}".into(),
            group_owner_label: "{name} (owner)".into(),
            reserved_member_names: ["owner", "admin", "administrator", "staff", "manager", "support"].map(String::from).to_vec(),
            owner_help: String::new(),
            status_reply: "Gatehouse {version} is running. Jobs: {jobs}.".into(),
            status_no_jobs: "no jobs".into(),
            jobs_reply: "Latest jobs:\n{jobs}".into(),
            jobs_empty_reply: "No jobs yet.".into(),
            unknown_command_reply: "There is no /{name} command.".into(),
            wrong_usage_reply: "Say what it should have been: /wrong tool:NAME [what should have happened], /wrong normal_chat, /wrong guard or /wrong clarify.".into(),
            wrong_no_trace_reply: "There is no earlier answer in this chat to mark.".into(),
            wrong_noted_reply: "Noted: trace #{trace} should have been {expect}. It becomes an eval case, and a proposed fix appears on the console's Repairs page.".into(),
            trace_text: false,
            rate_limit: 20,
            group_rate_limit: 60,
            rate_window: Duration::from_secs(600),
            rate_limited_reply: "You're sending messages faster than I can answer. Please wait a few minutes, then write again.".into(),
            simulator_customer: String::new(),
        }
    }
}

/// A kind of private account data customers may ask about (fees, balances, payments, due
/// dates). A customer message matching any pattern gets the safe reply, never an answer from
/// memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrivateCategory {
    pub name: String,
    pub description: String,
    /// Sample questions; each must match one of `patterns` (checked when the config loads).
    #[serde(default)]
    pub examples: Vec<String>,
    /// Regular expressions, matched case-insensitively against the message.
    pub patterns: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrivateDataSettings {
    /// What a customer gets instead of private data (a handoff to a person).
    pub safe_reply: String,
    /// Tell the owners (WhatsApp and the console) so that a person answers.
    pub handoff: bool,
    /// The owners' notice: `{sender}`, `{chat}`, `{category}`, `{description}` and `{text}` are
    /// filled in.
    pub owner_notice: String,
    /// One chat raises the owners' notice at most once per this period (its later questions
    /// still get `safe_reply` and are in the traces).
    #[serde(with = "duration_str")]
    pub notice_every: Duration,
    pub categories: Vec<PrivateCategory>,
}

impl Default for PrivateDataSettings {
    fn default() -> Self {
        Self { safe_reply: String::new(), handoff: false, owner_notice: String::new(), notice_every: Duration::from_secs(3600), categories: Vec::new() }
    }
}
