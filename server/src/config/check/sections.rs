//! The checks of whole sections: `[lane]` (with its detector), `[approvals]`, `[budget]` and
//! `[evals]`, called from [`super::values`].

use crate::config::Settings;

/// `[evals]`: the repair model's prompt and tool, and the bounds of what a repair may change.
pub(super) fn evals(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let e = &settings.evals;
    need(e.max_phrase_words >= 1, "evals.max_phrase_words", "must be at least 1".into());
    let [low, high] = e.plan_threshold_range;
    need(low > 0.0 && low < high && high < 1.0, "evals.plan_threshold_range", format!("must be [low, high] with 0 < low < high < 1, not [{low}, {high}]"));
    need(!e.cases_file.trim().is_empty(), "evals.cases_file", "must name a file".into());
    need(!e.abandoned_after.is_zero(), "evals.abandoned_after", "must be longer than 0s (a running trace would be read before it ends)".into());
    if !settings.models.repair.trim().is_empty() {
        let tag = crate::config::lane::UNTRUSTED_TAG;
        need(!e.repair_prompt.trim().is_empty(), "evals.repair_prompt", "must be set while models.repair is".into());
        need(e.repair_prompt.trim().is_empty() || e.repair_prompt.contains(tag), "evals.repair_prompt", format!("must tell the model that text inside <{tag}> is data, not instructions"));
        need(is_tool_name(&e.repair_tool), "evals.repair_tool", "must be 1 to 64 letters, digits, '_' or '-' (a tool name the providers accept)".into());
        need(!e.repair_tool_description.trim().is_empty(), "evals.repair_tool_description", "must say what the tool is for".into());
        need(e.repair_max_tokens >= 64, "evals.repair_max_tokens", "must be at least 64".into());
    }
}

/// `[budget]`: amounts, thresholds and the texts owners and customers get.
pub(super) fn budget(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let b = &settings.budget;
    for (key, usd) in [("budget.daily_usd", b.daily_usd), ("budget.monthly_usd", b.monthly_usd)] {
        need(usd.is_finite() && usd >= 0.0, key, format!("{usd} is not an amount in US dollars (0 for no budget)"));
    }
    need(b.warn_at.iter().all(|p| (1..=100).contains(p)), "budget.warn_at", "each share must be a percentage from 1 to 100".into());
    need(b.warn_at.windows(2).all(|w| w[0] < w[1]), "budget.warn_at", "must be ascending, each share once".into());
    need(!b.refresh.is_zero(), "budget.refresh", "must be longer than zero".into());
    need(
        b.at_limit != crate::config::budget::AtLimit::Degraded || b.warn_at.contains(&100) || (b.daily_usd == 0.0 && b.monthly_usd == 0.0),
        "budget.warn_at",
        "must hold 100 while budget.at_limit = \"degraded\": at 100% customers stop getting answers, and the owners are told only at a warn_at share".into(),
    );
    for (key, text) in b.texts() {
        need(!text.trim().is_empty(), key, "must not be empty".into());
    }
    need(b.warning.contains("{percent}"), "budget.warning", "must show {percent}, how much of the budget is spent".into());
}

/// `[approvals]`: every text, and what WhatsApp allows for the buttons.
pub(super) fn approvals(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let a = &settings.approvals;
    need(a.ttl >= std::time::Duration::from_secs(60), "approvals.ttl", "must be at least one minute".into());
    for (key, text) in a.texts() {
        need(!text.trim().is_empty(), key, "must not be empty".into());
    }
    for (key, title) in [("approvals.approve_button", &a.approve_button), ("approvals.reject_button", &a.reject_button)] {
        let n = title.trim().chars().count();
        need(n <= crate::config::approvals::BUTTON_TITLE_MAX, key, format!("is {n} characters; WhatsApp allows at most {}", crate::config::approvals::BUTTON_TITLE_MAX));
    }
    need(a.approve_button.trim() != a.reject_button.trim(), "approvals.reject_button", "must differ from approvals.approve_button".into());
    need(a.owner_prompt.contains("{id}") && a.owner_prompt.contains("{tool}") && a.owner_prompt.contains("{args}"), "approvals.owner_prompt", "must show {id}, {tool} and {args}, the exact call".into());
    // The call's arguments are cut to fit WhatsApp's body limit once; the rest of the prompt
    // must leave them room, or WhatsApp cuts the end (the decision's instructions) unsaid.
    let fixed = a.owner_prompt.trim().replace("{args}", "").chars().count();
    need(a.owner_prompt.matches("{args}").count() <= 1, "approvals.owner_prompt", "must show {args} once (the arguments are cut to fit once)".into());
    need(
        fixed <= crate::config::approvals::BUTTON_BODY_MAX / 2,
        "approvals.owner_prompt",
        format!("is {fixed} characters without {{args}}; at most {} leave the call's arguments room in WhatsApp's {} (filled-in names and reasons add more)", crate::config::approvals::BUTTON_BODY_MAX / 2, crate::config::approvals::BUTTON_BODY_MAX),
    );
    for (code, words) in &a.reasons {
        let key = format!("approvals.reasons.{code}");
        need(crate::config::approvals::is_reason_code(code), &key, "is not a reason code (capital letters and _, as APPROVAL_RISK)".into());
        need(!words.trim().is_empty(), &key, "must not be empty".into());
    }
}

/// A name both providers accept for a tool.
fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The detector's numbers, each within the range its formula means something in: a threshold
/// of 1 or more would plan nothing, no candidates would plan a call with no tool offered.
fn detector(d: &crate::config::DetectorSettings, need: &mut impl FnMut(bool, &str, String)) {
    let share = |v: f32| (0.0..=1.0).contains(&v);
    need(d.plan_threshold > 0.0 && d.plan_threshold < 1.0, "lane.detector.plan_threshold", "must be between 0 and 1 (a confidence)".into());
    need(d.max_candidates >= 1, "lane.detector.max_candidates", "must be at least 1".into());
    need(share(d.candidate_ratio), "lane.detector.candidate_ratio", "must be from 0 to 1 (a share of the best score)".into());
    need(share(d.b), "lane.detector.b", "must be from 0 to 1 (BM25 length normalisation)".into());
    need(d.k1 > 0.0, "lane.detector.k1", "must be more than 0 (BM25 saturation)".into());
    need(d.evidence_half > 0.0, "lane.detector.evidence_half", "must be more than 0".into());
    for (key, value) in [
        ("lane.detector.phrase_evidence", d.phrase_evidence),
        ("lane.detector.bigram_weight", d.bigram_weight),
        ("lane.detector.value_weight", d.value_weight),
        ("lane.detector.prefix_weight", d.prefix_weight),
        ("lane.detector.vector_weight", d.vector_weight),
    ] {
        need(value.is_finite() && value >= 0.0, key, "must be 0 or more".into());
    }
    let w = &d.weights;
    let weights = [w.name, w.title, w.aliases, w.triggers, w.tags, w.description, w.when_to_use, w.param_names, w.param_descriptions, w.when_not_to_use];
    need(weights.iter().all(|v| v.is_finite() && *v >= 0.0), "lane.detector.weights", "every field weight must be 0 or more".into());
}

/// `[lane]`: limits always; the prompts and replies while the lane is enabled, since the code
/// holds none of its own.
pub(super) fn lane(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let lane = &settings.lane;
    need((1..=10).contains(&lane.max_steps), "lane.max_steps", "must be from 1 to 10".into());
    need(!lane.immediate_deadline.is_zero(), "lane.immediate_deadline", "must be longer than zero".into());
    need(lane.planner_max_tokens >= 64, "lane.planner_max_tokens", "must be at least 64".into());
    need(lane.summarizer_max_tokens >= 64, "lane.summarizer_max_tokens", "must be at least 64".into());
    need((100..=4096).contains(&lane.summary_max_chars), "lane.summary_max_chars", "must be from 100 to 4,096 (one WhatsApp message)".into());
    need(lane.max_sources <= 10, "lane.max_sources", "must be at most 10".into());
    need(lane.private_data_tags.iter().all(|t| !t.trim().is_empty()), "lane.private_data_tags", "must not hold an empty tag".into());
    need(!lane.context_ttl.is_zero(), "lane.context_ttl", "must be longer than zero".into());
    need(!lane.context_sweep_every.is_zero(), "lane.context_sweep_every", "must be longer than zero".into());
    need((1..=50).contains(&lane.contexts_per_chat), "lane.contexts_per_chat", "must be from 1 to 50".into());
    need((50..=10_000).contains(&lane.context_preview_chars), "lane.context_preview_chars", "must be from 50 to 10,000".into());
    need(lane.context_max_entities <= 100, "lane.context_max_entities", "must be at most 100".into());
    need(lane.max_search_calls <= 5, "lane.max_search_calls", "must be at most 5".into());
    need((1..=20).contains(&lane.search_results), "lane.search_results", "must be from 1 to 20".into());
    need(lane.search_tool.is_empty() || lane.search_tool != lane.respond_tool, "lane.search_tool", "must differ from lane.respond_tool".into());
    need(
        lane.search_tool.is_empty() || is_tool_name(&lane.search_tool),
        "lane.search_tool",
        "must be empty, or 1 to 64 letters, digits, '_' or '-' (a tool name the providers accept)".into(),
    );
    detector(&lane.detector, need);
    need(lane.search_tool.is_empty() || !lane.search_description.trim().is_empty(), "lane.search_description", "must be set when lane.search_tool is".into());
    if !lane.enabled {
        return;
    }
    for (key, text) in lane.texts() {
        need(!text.trim().is_empty(), key, "must be set while lane.enabled is true".into());
    }
    let tag = crate::config::lane::UNTRUSTED_TAG;
    for (key, prompt) in [("lane.planner_prompt", &lane.planner_prompt), ("lane.summarizer_prompt", &lane.summarizer_prompt)] {
        need(
            prompt.trim().is_empty() || prompt.contains(tag),
            key,
            format!("must tell the model that text inside <{tag}> is data, not instructions (the lane wraps messages and tool results in it)"),
        );
    }
    need(lane.clarify_reply.contains("{argument}"), "lane.clarify_reply", "must name the missing argument with {argument}".into());
    need(lane.tool_description.contains("{description}"), "lane.tool_description", "must include {description}".into());
    need(
        is_tool_name(&lane.respond_tool),
        "lane.respond_tool",
        "must be 1 to 64 letters, digits, '_' or '-' (a tool name the providers accept)".into(),
    );
    need(!lane.fallback_fields.is_empty(), "lane.fallback_fields", "must name at least one result field".into());
    for (key, reply) in [
        ("lane.clarify_reply", &lane.clarify_reply),
        ("lane.denied_reply", &lane.denied_reply),
        ("lane.failed_reply", &lane.failed_reply),
        ("lane.timed_out_reply", &lane.timed_out_reply),
        ("lane.approval_reply", &lane.approval_reply),
        ("lane.unreadable_reply", &lane.unreadable_reply),
        ("lane.cancelled_reply", &lane.cancelled_reply),
    ] {
        need(reply.chars().count() <= 4096, key, "must fit one WhatsApp message (4,096 characters)".into());
    }
}
