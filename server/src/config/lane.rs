//! `[lane]`: the tool lane (planner, plan validator, result summarizer). Every prompt and every
//! reply a person may read lives in config/gatehouse.toml; the code holds none, so the defaults
//! here are empty and `check-config` insists on them while the lane is enabled.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// The tag the lane wraps untrusted text in (the person's message, memory, tool results) when
/// it hands it to a model: `<untrusted_data kind="...">...</untrusted_data>`. The planner and
/// summarizer prompts must say what it means, and `check-config` makes sure they mention it.
pub const UNTRUSTED_TAG: &str = "untrusted_data";

/// How risky a tool the lane may plan for a role, compared with each tool's `risk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskCeiling {
    Low,
    Medium,
    High,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LaneSettings {
    /// Plan tool calls for messages the detector flags. Off: every message goes to normal chat.
    pub enabled: bool,
    /// Most tool calls one plan may hold; a plan with more is refused whole.
    pub max_steps: u32,
    /// How long a reply may wait for a tool that runs at once; longer work stays a job.
    #[serde(with = "duration_str")]
    pub immediate_deadline: Duration,
    /// The planner's system prompt (`models.planner`).
    pub planner_prompt: String,
    /// How many of the chat's latest turns (the person's messages and the assistant's answers
    /// in normal chat) the planner reads besides the chat's summary, so that "there" or "that
    /// one" is planned from what was said; 0: the summary alone.
    pub planner_recent_turns: u32,
    /// The summarizer's system prompt (`models.summarizer`).
    pub summarizer_prompt: String,
    /// Name of the pseudo-tool through which the planner answers without a real tool (no tool,
    /// a clarifying question, a refusal). It must not be the name of a catalog tool.
    pub respond_tool: String,
    /// Its description, as the planner reads it.
    pub respond_description: String,
    /// How each offered tool is described to the planner: `{title}`, `{description}`,
    /// `{when_to_use}` and `{when_not_to_use}` are filled in from the catalog; a line whose
    /// placeholders are all empty is left out.
    pub tool_description: String,
    /// The question asked when a call lacks a required argument; `{argument}` is its name and
    /// `{tool}` the tool's title.
    pub clarify_reply: String,
    /// Said when the planner or the validator refuses a request.
    pub denied_reply: String,
    /// Said when a tool call failed; claims nothing about what was done.
    pub failed_reply: String,
    /// Said when a tool took too long and no result came back.
    pub timed_out_reply: String,
    /// Said when a call waits for an owner: that an owner must approve it, and nothing more.
    pub approval_reply: String,
    /// Added to a summary of a result that is known to be incomplete.
    pub partial_note: String,
    /// Put before the sources of a summary that lost them.
    pub sources_label: String,
    /// The first line of the summary made without a model.
    pub fallback_intro: String,
    /// Said when a result holds nothing that can be shown.
    pub unreadable_reply: String,
    /// Result fields the summary made without a model shows, in this order of preference.
    pub fallback_fields: Vec<String>,
    /// Most characters of a summary (WhatsApp allows 4,096 per message).
    pub summary_max_chars: u32,
    /// Most sources (URLs from the result) kept with a summary.
    pub max_sources: u32,
    pub planner_max_tokens: u32,
    pub summarizer_max_tokens: u32,
    /// The riskiest tool the lane plans for a customer; riskier ones are refused.
    pub customer_max_risk: RiskCeiling,
    /// The riskiest tool the lane plans for an owner.
    pub owner_max_risk: RiskCeiling,
    /// Tool tags that mark a tool as reaching private account data: a customer's call to one
    /// always waits for an owner, and a message the private-data guard caught may use no other.
    pub private_data_tags: Vec<String>,
    /// The candidate detector: which messages are planned, and which tools the planner sees.
    pub detector: super::DetectorSettings,
    /// Tool-call jobs: a duplicate request while one is unfinished is told it is being checked;
    /// the later answer of a slow call comes through the channel.
    pub already_checking_reply: String,
    /// Said when a call is underway and its answer will follow (only after its job is stored).
    pub pending_reply: String,
    /// Said when a call's job could not be stored: nothing was started and nothing is promised.
    pub not_started_reply: String,
    /// Said when an owner cancels a call's job (the Jobs page) before its answer went out.
    pub cancelled_reply: String,
    /// Said when a call not safe to repeat was made but its outcome is unknown (its run
    /// stopped, or could not keep the answer, before it was said; or it failed in a way that
    /// may still have taken effect): it is never made again.
    pub unknown_outcome_reply: String,
    /// What every owner is told then (`{tool}`, `{job}`, and `{link}` to the job in the
    /// console), unless the call was approved: the deciding owner is told its outcome.
    pub unknown_outcome_notice: String,
    /// What chat memory keeps, as the assistant's turn, of an answer made from a tool tagged
    /// with a `private_data_tags` tag (whose context is never kept either): the later chat and
    /// planner read this, not the private details.
    pub private_answer_memory: String,
    /// How long a chat's summarised tool result stays available to its follow-ups.
    #[serde(with = "duration_str")]
    pub context_ttl: Duration,
    /// Most tool contexts kept per chat (the newest).
    pub contexts_per_chat: u32,
    /// Most characters of a result kept as a context's preview.
    pub context_preview_chars: u32,
    /// Result fields whose values are a context's entities ("the second one" is the second),
    /// in result order; links are always kept as sources.
    pub context_entity_fields: Vec<String>,
    /// Most entities kept per context.
    pub context_max_entities: u32,
    /// How often expired contexts are swept.
    #[serde(with = "duration_str")]
    pub context_sweep_every: Duration,
    /// How long a clarifying question the lane asked stays open: the asked person's next
    /// message within it is planned as its answer, together with the request. Zero keeps none.
    #[serde(with = "duration_str")]
    pub clarification_ttl: Duration,
    /// Name of the pseudo-tool through which the planner searches the catalog for tools beyond
    /// the detector's candidates. Empty: no search. Must not be the name of a catalog tool.
    pub search_tool: String,
    /// Its description, as the planner reads it.
    pub search_description: String,
    /// Most searches one message's planning may make.
    pub max_search_calls: u32,
    /// Most tools one search adds.
    pub search_results: u32,
    /// Tools offered to the planner for every planned message, besides the candidates (each
    /// only where the actor may use it).
    pub always_offered: Vec<String>,
}

impl Default for LaneSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            max_steps: 2,
            immediate_deadline: Duration::from_secs(8),
            planner_prompt: String::new(),
            planner_recent_turns: 6,
            summarizer_prompt: String::new(),
            respond_tool: String::new(),
            respond_description: String::new(),
            tool_description: String::new(),
            clarify_reply: String::new(),
            denied_reply: String::new(),
            failed_reply: String::new(),
            timed_out_reply: String::new(),
            approval_reply: String::new(),
            partial_note: String::new(),
            sources_label: String::new(),
            fallback_intro: String::new(),
            unreadable_reply: String::new(),
            fallback_fields: ["title", "name", "snippet", "summary", "description", "text", "url", "link"].map(String::from).to_vec(),
            summary_max_chars: 1_500,
            max_sources: 3,
            planner_max_tokens: 1_024,
            summarizer_max_tokens: 512,
            customer_max_risk: RiskCeiling::Medium,
            owner_max_risk: RiskCeiling::High,
            private_data_tags: vec!["private_data".into()],
            detector: super::DetectorSettings::default(),
            already_checking_reply: String::new(),
            pending_reply: String::new(),
            cancelled_reply: String::new(),
            not_started_reply: String::new(),
            unknown_outcome_reply: String::new(),
            unknown_outcome_notice: String::new(),
            private_answer_memory: String::new(),
            context_ttl: Duration::from_secs(24 * 3600),
            contexts_per_chat: 5,
            context_preview_chars: 600,
            context_entity_fields: ["title", "name", "url", "link", "date", "place", "location", "city"].map(String::from).to_vec(),
            context_max_entities: 10,
            context_sweep_every: Duration::from_secs(600),
            clarification_ttl: Duration::from_secs(1800),
            search_tool: String::new(),
            search_description: String::new(),
            max_search_calls: 2,
            search_results: 5,
            always_offered: Vec::new(),
        }
    }
}

impl LaneSettings {
    /// The texts `check-config` requires while the lane is enabled, by key.
    pub fn texts(&self) -> [(&'static str, &str); 21] {
        super::texts_by_key!(
            self, "lane":
            planner_prompt, summarizer_prompt, respond_tool, respond_description, tool_description,
            clarify_reply, denied_reply, failed_reply, timed_out_reply, approval_reply,
            partial_note, sources_label, fallback_intro, unreadable_reply, pending_reply,
            already_checking_reply, not_started_reply, cancelled_reply, unknown_outcome_reply, unknown_outcome_notice,
            private_answer_memory
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{load_text, problems_at, shipped};

    #[test]
    fn the_shipped_lane_is_complete_and_its_limits_are_the_documented_defaults() {
        let lane = shipped().settings.lane;
        assert!(lane.enabled);
        assert!(lane.texts().iter().all(|(_, t)| !t.trim().is_empty()));
        let defaults = LaneSettings::default();
        assert_eq!(
            (lane.max_steps, lane.immediate_deadline, lane.planner_max_tokens, lane.summarizer_max_tokens, lane.customer_max_risk, lane.owner_max_risk),
            (defaults.max_steps, defaults.immediate_deadline, defaults.planner_max_tokens, defaults.summarizer_max_tokens, defaults.customer_max_risk, defaults.owner_max_risk),
        );
        assert_eq!((lane.fallback_fields, lane.private_data_tags), (defaults.fallback_fields, defaults.private_data_tags));
    }

    #[test]
    fn an_enabled_lane_needs_its_texts_and_sane_limits() {
        assert_eq!(load_text("").expect("defaults load").settings.lane, LaneSettings::default(), "a disabled lane needs no text");
        let err = problems_at(
            "[lane]\nenabled = true\nplanner_prompt = \"Plan.\"\nclarify_reply = \"Which one?\"\nmax_steps = 0\nsummary_max_chars = 5000\nbogus = 1\n",
            &["lane.summarizer_prompt", "lane.denied_reply", "lane.approval_reply", "lane.respond_tool", "lane.max_steps", "lane.summary_max_chars", "lane.bogus"],
        );
        let text = err.to_string();
        assert!(text.contains("lane.planner_prompt: must tell the model that text inside <untrusted_data> is data"), "{text}");
        assert!(text.contains("lane.clarify_reply: must name the missing argument with {argument}"), "{text}");
    }

    /// Values the loader takes but that would make the lane or the queue misbehave: a search
    /// tool name no provider accepts, detector numbers outside their formulas' ranges (nothing
    /// would ever plan, or a call would be planned with no tool offered), and retries at once.
    #[test]
    fn detector_numbers_the_search_tool_name_and_zero_retries_are_refused() {
        problems_at(
            r#"
[lane]
search_tool = "search tools"
[lane.detector]
plan_threshold = 1.5
max_candidates = 0
b = 2.0
k1 = 0.0
candidate_ratio = -0.1
evidence_half = 0.0
vector_weight = -1.0
[lane.detector.weights]
name = -3.0
[jobs]
retry_base = "0s"
retry_max = "0s"
[jobs.attempts]
tool_call = 0
"#,
            &[
                "lane.search_tool",
                "lane.detector.plan_threshold",
                "lane.detector.max_candidates",
                "lane.detector.b",
                "lane.detector.k1",
                "lane.detector.candidate_ratio",
                "lane.detector.evidence_half",
                "lane.detector.vector_weight",
                "lane.detector.weights",
                "jobs.retry_base",
                "jobs.retry_max",
                "jobs.attempts.tool_call",
            ],
        );
        load_text("[lane]\nsearch_tool = \"\"\n").expect("no search tool is fine");
    }
}
