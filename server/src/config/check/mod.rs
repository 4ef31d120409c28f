//! Checks that need more than a type: ranges, URLs, combinations. Each problem names its key
//! and where the value came from.

use std::collections::BTreeSet;

use figment::Figment;

use super::{
    Settings,
    load::{Problem, display_url, problem_at},
};

/// The shortest `jobs.lease`: renewed every quarter of it, it still outlasts a slow renewal.
const MIN_LEASE: std::time::Duration = std::time::Duration::from_secs(1);

/// Checks that need more than a type: ranges, URLs, combinations.
pub(super) fn values(figment: &Figment, settings: &Settings) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut need = |ok: bool, key: &str, message: String| {
        if !ok {
            problems.push(problem_at(figment, key, message));
        }
    };
    for (key, message) in settings.server.proxy_problems() {
        need(false, key, message);
    }
    let auth = &settings.auth;
    need(auth.min_password_length >= 12, "auth.min_password_length", "must be at least 12".into());
    need(auth.login_max_failures >= 1, "auth.login_max_failures", "must be at least 1".into());
    need(settings.database.max_connections >= 1, "database.max_connections", "must be at least 1".into());
    let jobs = &settings.jobs;
    need(jobs.concurrency >= 1, "jobs.concurrency", "must be at least 1".into());
    need(jobs.default_max_attempts >= 1, "jobs.default_max_attempts", "must be at least 1".into());
    need(jobs.attempts.whatsapp_inbound >= 1, "jobs.attempts.whatsapp_inbound", "must be at least 1".into());
    need(jobs.attempts.owner_notify >= 1, "jobs.attempts.owner_notify", "must be at least 1".into());
    need(!jobs.queue.trim().is_empty(), "jobs.queue", "must not be empty".into());
    need(jobs.attempts.tool_call >= 1, "jobs.attempts.tool_call", "must be at least 1".into());
    need(jobs.retry_base <= jobs.retry_max, "jobs.retry_base", "must not exceed jobs.retry_max".into());
    // Zero would spend every attempt of an outage within milliseconds, and a full disk or a
    // refused token would be run again at once.
    need(!jobs.retry_base.is_zero(), "jobs.retry_base", "must be longer than zero".into());
    need(!jobs.retry_max.is_zero(), "jobs.retry_max", "must be longer than zero".into());
    need(settings.web_fetch.max_bytes >= 1, "web_fetch.max_bytes", "must be at least 1".into());
    let llm = &settings.llm;
    need(llm.max_retries <= 10, "llm.max_retries", "must be at most 10".into());
    need(llm.retry_initial_delay <= llm.retry_max_delay, "llm.retry_initial_delay", "must not exceed llm.retry_max_delay".into());
    need(!llm.fallback_reply.trim().is_empty(), "llm.fallback_reply", "must not be empty".into());
    need(!llm.owner_instruction.trim().is_empty(), "llm.owner_instruction", "must not be empty".into());
    for (key, endpoint) in [("llm.anthropic.max_tokens", &llm.anthropic), ("llm.openai.max_tokens", &llm.openai)] {
        need(endpoint.max_tokens >= 1, key, "must be at least 1".into());
    }
    let mut priced = BTreeSet::new();
    for price in &settings.models.prices {
        need(!price.model.trim().is_empty(), "models.prices", "every price needs a model name".into());
        need(priced.insert(price.model.as_str()), "models.prices", format!("model {:?} is priced twice", price.model));
        let amounts = [Some(price.input), Some(price.output), price.cache_read, price.cache_write];
        need(
            amounts.iter().flatten().all(|p| p.is_finite() && *p >= 0.0),
            "models.prices",
            format!("prices of {:?} must be zero or more (US dollars per million tokens)", price.model),
        );
    }
    let wa = &settings.whatsapp;
    need(wa.pair_burst >= 1, "whatsapp.pair_burst", "must be at least 1".into());
    need(wa.global_rate_per_second >= 1, "whatsapp.global_rate_per_second", "must be at least 1".into());
    need(wa.send_attempts >= 1, "whatsapp.send_attempts", "must be at least 1".into());
    need(!wa.graph_version.trim().is_empty() && !wa.graph_version.contains('/'), "whatsapp.graph_version", "must be a version such as \"v25.0\"".into());
    need(
        wa.phone_number_id.chars().all(|c| c.is_ascii_digit()),
        "whatsapp.phone_number_id",
        "must be the numeric phone number id from the WhatsApp Manager".into(),
    );
    need(
        wa.window_template.is_empty() || !wa.window_template_language.trim().is_empty(),
        "whatsapp.window_template_language",
        "must be set when whatsapp.window_template is".into(),
    );
    need(
        wa.unknown_type_reply.chars().count() <= 4096,
        "whatsapp.unknown_type_reply",
        "must fit one WhatsApp message (4,096 characters)".into(),
    );
    let conv = &settings.conversation;
    need(
        (conv.rate_limit == 0 && conv.group_rate_limit == 0) || (!conv.rate_limited_reply.trim().is_empty() && conv.rate_limited_reply.chars().count() <= 4096),
        "conversation.rate_limited_reply",
        "must be set (and fit one WhatsApp message) when conversation.rate_limit or group_rate_limit is above 0".into(),
    );
    // An empty answer would leave the owner's command unanswered; one too long, unsent.
    for (key, text) in conv.command_texts() {
        need(!text.trim().is_empty() && text.chars().count() <= 4096, key, "must be set and fit one WhatsApp message (4,096 characters)".into());
    }
    need(conv.jobs_reply.contains("{jobs}"), "conversation.jobs_reply", "must show {jobs}, the latest jobs".into());
    for (key, text) in [("approvals.requester_owner", &settings.approvals.requester_owner), ("approvals.requester_customer", &settings.approvals.requester_customer)] {
        let other = text.replace("{number}", "");
        need(!other.contains('{'), key, "may name {number} only (it is filled into approvals.owner_prompt, whose own placeholders come after it)".into());
    }
    for (key, value) in [
        ("conversation.rate_window", conv.rate_window),
        ("private_data.notice_every", settings.private_data.notice_every),
        ("auth.session_idle_timeout", auth.session_idle_timeout),
        ("auth.session_absolute_timeout", auth.session_absolute_timeout),
        ("auth.login_failure_window", auth.login_failure_window),
        ("auth.trusted_device_lifetime", auth.trusted_device_lifetime),
        ("database.acquire_timeout", settings.database.acquire_timeout),
        ("llm.anthropic.timeout", settings.llm.anthropic.timeout),
        ("llm.openai.timeout", settings.llm.openai.timeout),
        ("llm.retry_initial_delay", settings.llm.retry_initial_delay),
        ("jobs.poll_interval", jobs.poll_interval),
        ("jobs.job_timeout", jobs.job_timeout),
        ("jobs.maintenance_interval", jobs.maintenance_interval),
        ("web_fetch.timeout", settings.web_fetch.timeout),
        ("web_search.timeout", settings.web_search.timeout),
        ("whatsapp.request_timeout", settings.whatsapp.request_timeout),
        ("whatsapp.pair_interval", settings.whatsapp.pair_interval),
    ] {
        need(!value.is_zero(), key, "must be longer than zero".into());
    }
    // A running job's lease is renewed every quarter of it (every 50 ms at the least): a lease
    // much shorter than a second lapses between two renewals, or while one waits for the
    // database, and maintenance hands the job to a second worker while the first still runs it.
    need(jobs.lease >= MIN_LEASE, "jobs.lease", format!("must be at least {}: a running job's lease is renewed every quarter of it", humantime::format_duration(MIN_LEASE)));
    // Each job kind's budget must fit the work inside it, or a slow run is cut in the middle.
    let t = &jobs.timeouts;
    let sends = wa.send_reserve();
    let inbound_needs = settings.reply_reserve();
    need(
        t.whatsapp_inbound >= inbound_needs,
        "jobs.timeouts.whatsapp_inbound",
        format!(
            "must be at least {} (the model's timeout {} plus the reply's sends {}), or a slow reply is cut before it is sent",
            humantime::format_duration(inbound_needs),
            humantime::format_duration(settings.llm.endpoint().timeout),
            humantime::format_duration(sends)
        ),
    );
    need(t.owner_notify >= sends, "jobs.timeouts.owner_notify", format!("must be at least {} (the notice's sends)", humantime::format_duration(sends)));
    need(
        t.tool_call >= inbound_needs,
        "jobs.timeouts.tool_call",
        format!("must be at least {} (the summary's model call plus the answer's sends), besides the tool's own time", humantime::format_duration(inbound_needs)),
    );
    let repair_call = settings.llm.endpoint().timeout + std::time::Duration::from_secs(30);
    need(
        t.evals_cycle >= repair_call,
        "jobs.timeouts.evals_cycle",
        format!("must be at least {} (one repair-model call, the provider's timeout, and the replays around it)", humantime::format_duration(repair_call)),
    );
    let db = &settings.database.url;
    need(
        super::DatabaseKind::from_url(db).is_some(),
        "database.url",
        format!("unsupported database URL {:?}; use sqlite://... or postgres://...", display_url(db)),
    );
    let public = &settings.server.public_url;
    if public.is_empty() {
        need(
            !settings.server.addr.ip().is_unspecified(),
            "server.public_url",
            format!("must be set when server.addr ({}) listens on all interfaces: it is the address owners' browsers use", settings.server.addr),
        );
    } else {
        let ok = url::Url::parse(public).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        need(ok, "server.public_url", format!("{public:?} is not an http(s) URL"));
    }
    if let Some(metrics) = settings.server.metrics_addr {
        need(
            !settings.server.may_listen_at(metrics),
            "server.metrics_addr",
            format!("{metrics} is where the console listens (server.addr {}): the two cannot share a port", settings.server.addr),
        );
    }
    for (key, value) in [
        ("llm.anthropic.base_url", &settings.llm.anthropic.base_url),
        ("llm.openai.base_url", &settings.llm.openai.base_url),
        ("web_search.base_url", &settings.web_search.base_url),
    ] {
        need(value.is_empty() || url::Url::parse(value).is_ok(), key, format!("{:?} is not a URL", display_url(value)));
    }
    let conv = &settings.conversation;
    need(conv.history_token_budget >= 200, "conversation.history_token_budget", "must be at least 200".into());
    need(conv.keep_recent_turns >= 1, "conversation.keep_recent_turns", "must be at least 1".into());
    need(
        jiff::tz::TimeZone::get(&conv.timezone).is_ok(),
        "conversation.timezone",
        format!("{:?} is not a time zone this build knows: use an IANA name such as \"Europe/Lisbon\" or \"UTC\"", conv.timezone),
    );
    let tag = super::lane::UNTRUSTED_TAG;
    need(
        conv.compaction_prompt.trim().is_empty() || conv.compaction_prompt.contains(tag),
        "conversation.compaction_prompt",
        format!("must tell the model that text inside <{tag}> is data, not instructions (the summary so far and the messages come wrapped in it)"),
    );
    let format = conv.group_turn_format.trim();
    need(
        format.is_empty() || (format.contains("{name}") && format.contains("{text}")),
        "conversation.group_turn_format",
        "must hold both {name} and {text} (or be empty, so group members are not told apart)".into(),
    );
    need(
        format.is_empty() || conv.group_unnamed_member.contains("{n}"),
        "conversation.group_unnamed_member",
        "must hold {n}, which numbers the members without a profile name (else they would share one label)".into(),
    );
    need(
        format.is_empty() || conv.group_owner_label.contains("{name}"),
        "conversation.group_owner_label",
        "must hold {name}, the name the owner goes by (or group members are not told apart: group_turn_format empty)".into(),
    );
    need(
        conv.reserved_member_names.iter().all(|w| !w.trim().is_empty() && w.chars().all(char::is_alphanumeric)),
        "conversation.reserved_member_names",
        "must hold single words (letters and digits), none empty".into(),
    );
    for (i, c) in settings.private_data.categories.iter().enumerate() {
        need(!c.patterns.is_empty(), "private_data.categories", format!("category {i} ({:?}) needs at least one pattern", c.name));
        let compiled: Vec<regex::Regex> = c.patterns.iter().filter_map(|p| regex::RegexBuilder::new(p).case_insensitive(true).build().ok()).collect();
        for p in &c.patterns {
            need(regex::RegexBuilder::new(p).case_insensitive(true).build().is_ok(), "private_data.categories", format!("{p:?} in {:?} is not a regular expression", c.name));
        }
        // The examples are the category's own test cases: each must be caught.
        if compiled.len() == c.patterns.len() {
            for example in &c.examples {
                need(
                    compiled.iter().any(|r| r.is_match(example)),
                    "private_data.categories",
                    format!("example {example:?} of {:?} matches none of its patterns, so the guard would let it through", c.name),
                );
            }
        }
    }
    lane(settings, &mut need);
    approvals(settings, &mut need);
    budget(settings, &mut need);
    let min = super::retention::MODEL_CALLS_MIN_DAYS;
    let kept = settings.retention.model_calls_days;
    need(kept == 0 || kept >= min, "retention.model_calls_days", format!("must be 0 (kept for ever) or at least {min}: the monthly budget reads the current month's calls"));
    let every = settings.retention.every;
    need(every.is_zero() || every >= std::time::Duration::from_secs(60), "retention.every", "must be \"0s\" (never) or at least 1m".into());
    evals(settings, &mut need);
    let events = &settings.events;
    need(events.capacity >= 16, "events.capacity", "must be at least 16".into());
    need(events.max_streams_per_session >= 1, "events.max_streams_per_session", "must be at least 1".into());
    need(events.resume_limit >= 1, "events.resume_limit", "must be at least 1".into());
    need(!events.poll_interval.is_zero(), "events.poll_interval", "must be longer than 0s".into());
    let t = &settings.telemetry;
    need(
        // The export appends `/v1/traces` and `/v1/metrics` to it: after a query or a fragment
        // they would not be paths. Credentials go in `headers_secret`, never in the URL.
        !t.enabled()
            || url::Url::parse(t.otlp_endpoint.trim()).is_ok_and(|u| {
                matches!(u.scheme(), "http" | "https") && u.host().is_some() && u.query().is_none() && u.fragment().is_none() && u.username().is_empty() && u.password().is_none()
            }),
        "telemetry.otlp_endpoint",
        format!(
            "{:?} is not an http(s) URL without a query, a fragment or credentials (or empty, to export nothing); put a collector's key in telemetry.headers_secret",
            display_url(&t.otlp_endpoint)
        ),
    );
    need(!t.service_name.trim().is_empty(), "telemetry.service_name", "must not be empty".into());
    need(!t.export_interval.is_zero(), "telemetry.export_interval", "must be longer than 0s".into());
    need(!t.timeout.is_zero(), "telemetry.timeout", "must be longer than 0s".into());
    need(
        t.headers_secret.is_empty() || super::secrets::is_env_name(&t.headers_secret),
        "telemetry.headers_secret",
        // Not repeated: a value pasted here is most likely the headers themselves.
        "is not an environment variable name (letters, digits and _): write the variable's name here and put the headers in the environment".into(),
    );
    let graph = &settings.whatsapp.graph_base_url;
    need(
        url::Url::parse(graph).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()),
        "whatsapp.graph_base_url",
        format!("{:?} is not an http(s) URL", display_url(graph)),
    );
    need(
        tracing_subscriber::EnvFilter::try_new(&settings.log.filter).is_ok(),
        "log.filter",
        format!("{:?} is not a tracing filter such as \"info\" or \"server=debug,info\"", settings.log.filter),
    );
    problems
}

/// `[budget]`: amounts, thresholds and the texts owners and customers get.
fn evals(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let e = &settings.evals;
    need(e.max_phrase_words >= 1, "evals.max_phrase_words", "must be at least 1".into());
    let [low, high] = e.plan_threshold_range;
    need(low > 0.0 && low < high && high < 1.0, "evals.plan_threshold_range", format!("must be [low, high] with 0 < low < high < 1, not [{low}, {high}]"));
    need(!e.cases_file.trim().is_empty(), "evals.cases_file", "must name a file".into());
    need(!e.abandoned_after.is_zero(), "evals.abandoned_after", "must be longer than 0s (a running trace would be read before it ends)".into());
    if !settings.models.repair.trim().is_empty() {
        let tag = super::lane::UNTRUSTED_TAG;
        need(!e.repair_prompt.trim().is_empty(), "evals.repair_prompt", "must be set while models.repair is".into());
        need(e.repair_prompt.trim().is_empty() || e.repair_prompt.contains(tag), "evals.repair_prompt", format!("must tell the model that text inside <{tag}> is data, not instructions"));
        need(is_tool_name(&e.repair_tool), "evals.repair_tool", "must be 1 to 64 letters, digits, '_' or '-' (a tool name the providers accept)".into());
        need(!e.repair_tool_description.trim().is_empty(), "evals.repair_tool_description", "must say what the tool is for".into());
        need(e.repair_max_tokens >= 64, "evals.repair_max_tokens", "must be at least 64".into());
    }
}

fn budget(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let b = &settings.budget;
    for (key, usd) in [("budget.daily_usd", b.daily_usd), ("budget.monthly_usd", b.monthly_usd)] {
        need(usd.is_finite() && usd >= 0.0, key, format!("{usd} is not an amount in US dollars (0 for no budget)"));
    }
    need(b.warn_at.iter().all(|p| (1..=100).contains(p)), "budget.warn_at", "each share must be a percentage from 1 to 100".into());
    need(b.warn_at.windows(2).all(|w| w[0] < w[1]), "budget.warn_at", "must be ascending, each share once".into());
    need(!b.refresh.is_zero(), "budget.refresh", "must be longer than zero".into());
    need(
        b.at_limit != super::budget::AtLimit::Degraded || b.warn_at.contains(&100) || (b.daily_usd == 0.0 && b.monthly_usd == 0.0),
        "budget.warn_at",
        "must hold 100 while budget.at_limit = \"degraded\": at 100% customers stop getting answers, and the owners are told only at a warn_at share".into(),
    );
    for (key, text) in b.texts() {
        need(!text.trim().is_empty(), key, "must not be empty".into());
    }
    need(b.warning.contains("{percent}"), "budget.warning", "must show {percent}, how much of the budget is spent".into());
}

/// `[approvals]`: every text, and what WhatsApp allows for the buttons.
fn approvals(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
    let a = &settings.approvals;
    need(a.ttl >= std::time::Duration::from_secs(60), "approvals.ttl", "must be at least one minute".into());
    for (key, text) in a.texts() {
        need(!text.trim().is_empty(), key, "must not be empty".into());
    }
    for (key, title) in [("approvals.approve_button", &a.approve_button), ("approvals.reject_button", &a.reject_button)] {
        let n = title.trim().chars().count();
        need(n <= super::approvals::BUTTON_TITLE_MAX, key, format!("is {n} characters; WhatsApp allows at most {}", super::approvals::BUTTON_TITLE_MAX));
    }
    need(a.approve_button.trim() != a.reject_button.trim(), "approvals.reject_button", "must differ from approvals.approve_button".into());
    need(a.owner_prompt.contains("{id}") && a.owner_prompt.contains("{tool}") && a.owner_prompt.contains("{args}"), "approvals.owner_prompt", "must show {id}, {tool} and {args}, the exact call".into());
    // The call's arguments are cut to fit WhatsApp's body limit once; the rest of the prompt
    // must leave them room, or WhatsApp cuts the end (the decision's instructions) unsaid.
    let fixed = a.owner_prompt.trim().replace("{args}", "").chars().count();
    need(a.owner_prompt.matches("{args}").count() <= 1, "approvals.owner_prompt", "must show {args} once (the arguments are cut to fit once)".into());
    need(
        fixed <= super::approvals::BUTTON_BODY_MAX / 2,
        "approvals.owner_prompt",
        format!("is {fixed} characters without {{args}}; at most {} leave the call's arguments room in WhatsApp's {} (filled-in names and reasons add more)", super::approvals::BUTTON_BODY_MAX / 2, super::approvals::BUTTON_BODY_MAX),
    );
    for (code, words) in &a.reasons {
        let key = format!("approvals.reasons.{code}");
        need(super::approvals::is_reason_code(code), &key, "is not a reason code (capital letters and _, as APPROVAL_RISK)".into());
        need(!words.trim().is_empty(), &key, "must not be empty".into());
    }
}

/// A name both providers accept for a tool.
fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The detector's numbers, each within the range its formula means something in: a threshold
/// of 1 or more would plan nothing, no candidates would plan a call with no tool offered.
fn detector(d: &super::DetectorSettings, need: &mut impl FnMut(bool, &str, String)) {
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
fn lane(settings: &Settings, need: &mut impl FnMut(bool, &str, String)) {
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
    let tag = super::lane::UNTRUSTED_TAG;
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
