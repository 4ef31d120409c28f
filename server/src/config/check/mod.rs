//! Checks that need more than a type: ranges, URLs, combinations. Each problem names its key
//! and where the value came from.

use std::collections::BTreeSet;

use figment::Figment;

use super::{
    Settings,
    load::{Problem, display_url, problem_at},
};

mod sections;

use sections::{approvals, budget, evals, lane};

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
