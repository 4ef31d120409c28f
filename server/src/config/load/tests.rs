use super::*;
use crate::config::tests::{load_text, problems_at, shipped};

#[test]
fn reports_every_problem_with_key_and_source() {
    let err = problems_at(
        "[server]\naddr = \"not-an-addr\"\nbogus = 1\n[auth]\nsession_idle_timeout = \"soon\"\nlogin_max_failures = \"five\"\n",
        &["server.bogus", "server.addr", "auth.session_idle_timeout", "auth.login_max_failures"],
    );
    assert!(err.0.iter().all(|p| p.source.ends_with("gatehouse.toml")), "{err}");
}

/// An override whose prefix is one underscore short never reaches the settings: it is a
/// problem naming the variable and the name it was meant to have, not a silent start on the
/// shipped value. The other `GATEHOUSE_` variables are not overrides and stay quiet.
#[test]
fn a_mistyped_override_prefix_is_a_problem() {
    let names = ["GATEHOUSE_DATABASE__URL", "GATEHOUSE_SETUP_TOKEN", "GATEHOUSE_STRICT", "GATEHOUSE__SERVER__ADDR", "gatehouse_server__addr", "PATH"];
    let problems = misnamed_overrides(names.iter().map(ToString::to_string));
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "CONFIG_KEY_UNKNOWN not read: an override's name starts with GATEHOUSE__ (did you mean GATEHOUSE__DATABASE__URL?) (environment variable GATEHOUSE_DATABASE__URL)",
            "CONFIG_KEY_UNKNOWN not read: an override's name starts with GATEHOUSE__ (did you mean GATEHOUSE__server__addr?) (environment variable gatehouse_server__addr)",
        ]
    );
}

/// A line that does not parse is not quoted in the problem: it may hold a password.
#[test]
fn a_syntax_problem_does_not_quote_the_line() {
    let err = load_text("[database]\nurl = postgres://gatehouse:S3cret@db/gh\n").expect_err("not TOML");
    let shown = err.to_string();
    assert!(shown.contains("CONFIG_SYNTAX") && shown.contains("line 2"), "{shown}");
    assert!(!shown.contains("S3cret"), "{shown}");
}

#[test]
fn defaults_load() {
    let cfg = load_text("").expect("loads");
    assert_eq!(cfg.settings, Settings::default());
}

#[test]
fn shipped_config_prices_models_and_llm_keys_load() {
    let s = &shipped().settings;
    assert_eq!(s.llm, super::super::LlmSettings { anthropic: s.llm.anthropic.clone(), openai: s.llm.openai.clone(), ..Default::default() }, "documented defaults match the code's");
    assert!(!s.models.chat.is_empty() && !s.models.compaction.is_empty());
    for model in [&s.models.chat, &s.models.planner, &s.models.summarizer, &s.models.compaction] {
        assert!(s.models.price(model).is_some(), "shipped model {model} has a price");
    }
}

#[test]
fn bad_prices_and_retry_settings_are_reported() {
    let err = problems_at(
        "[llm]\nmax_retries = 50\nretry_initial_delay = \"10s\"\nretry_max_delay = \"1s\"\nfallback_reply = \" \"\n\
         [[models.prices]]\nmodel = \"m\"\ninput = -1.0\noutput = 1.0\n[[models.prices]]\nmodel = \"m\"\ninput = 1.0\noutput = 1.0\n",
        &["llm.max_retries", "llm.retry_initial_delay", "llm.fallback_reply", "models.prices"],
    );
    assert!(err.to_string().contains("priced twice") && err.to_string().contains("zero or more"), "{err}");
    problems_at("[[models.prices]]\nmodel = \"m\"\ninput = 1.0\noutput = 1.0\nextra = 2\n", &["models.prices"]);
}

#[test]
fn bad_budget_settings_are_reported_together() {
    problems_at(
        "[budget]\ndaily_usd = -1.0\nwarn_at = [80, 50, 120]\nwarning = \"over budget\"\nlimit_reply = \"\"\n",
        &["budget.daily_usd", "budget.warn_at", "budget.warning", "budget.limit_reply"],
    );
    let err = load_text("[budget]\nat_limit = \"stop\"\n").expect_err("unknown action");
    assert!(err.0.iter().any(|p| p.key.starts_with("budget")), "{err}");
}

/// Each problem carries its stable code, printed first: a file that is missing or is not
/// TOML, a key no setting has, a value that is wrong (a type, or a check of its own).
#[test]
fn each_problem_carries_its_code() {
    let codes = |err: ConfigError| err.0.into_iter().map(|p| (p.key, p.code)).collect::<Vec<_>>();
    assert_eq!(codes(load_text("[server\n").expect_err("not TOML")), [(String::new(), ProblemCode::ConfigSyntax)]);
    let err = load_text("[surprise]\nkey = 1\n[auth]\nlogin_max_failures = \"many\"\n[budget]\nwarn_at = [120]\n").expect_err("bad");
    assert!(err.to_string().contains("CONFIG_KEY_UNKNOWN surprise.key: unknown key"), "{err}");
    let mut found = codes(err);
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        [
            ("auth.login_max_failures".to_string(), ProblemCode::ConfigValueInvalid),
            ("budget.warn_at".to_string(), ProblemCode::ConfigValueInvalid),
            ("surprise.key".to_string(), ProblemCode::ConfigKeyUnknown),
        ]
    );
    let extra = problems_at("[[models.prices]]\nmodel = \"m\"\ninput = 1.0\noutput = 1.0\nextra = 2\n", &["models.prices"]);
    assert_eq!(extra.0[0].code, ProblemCode::ConfigKeyUnknown, "a key an entry does not have: {extra}");
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = dir.path().join("gatehouse.toml");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).expect("write");
    assert_eq!(super::load(&binary).expect_err("not text").0[0].code, ProblemCode::ConfigFileUnreadable);
    let missing = super::load(Path::new("/nonexistent/gatehouse.toml")).expect_err("no file");
    assert_eq!(missing.0[0].code, ProblemCode::ConfigFileMissing);
    assert!(missing.to_string().contains("CONFIG_FILE_MISSING config file not found"), "{missing}");
}

#[test]
fn model_calls_are_kept_for_the_monthly_budget() {
    problems_at("[retention]\nmodel_calls_days = 31\nevery = \"5s\"\n", &["retention.model_calls_days", "retention.every"]);
    load_text("[retention]\nmodel_calls_days = 0\nfinished_jobs_days = 1\n").expect("0 keeps them for ever");
    load_text("[retention]\nmodel_calls_days = 32\nevery = \"0s\"\n").expect("a month and a day");
    assert!(load_text("[retention]\ntraces_days = 5\n").is_err(), "an unknown key");
}

#[test]
fn a_private_data_example_the_patterns_miss_is_a_problem() {
    let category = "[[private_data.categories]]\nname = \"fees\"\ndescription = \"d\"\n\
                    examples = [\"What are my fees?\", \"What is on my last invoice?\"]\npatterns = ['\\bmy fees\\b']\n";
    let text = load_text(category).expect_err("must fail").to_string();
    assert!(text.contains("\"What is on my last invoice?\" of \"fees\" matches none of its patterns"), "{text}");
    assert!(!text.contains("What are my fees?"), "a caught example is fine: {text}");
}

#[test]
fn shown_urls_hold_no_credentials() {
    assert_eq!(display_url("postgres://u:secret@h:5432/db"), "postgres://h:5432/db");
    assert_eq!(display_url("postgres://u@h/db?password=secret&sslmode=require"), "postgres://h/db");
    assert_eq!(display_url("https://user:key@llm.example/v1"), "https://llm.example/v1");
    assert_eq!(display_url("sqlite://data/gatehouse.db"), "sqlite://data/gatehouse.db");
}

#[test]
fn value_checks_run_even_when_keys_are_unknown() {
    problems_at(
        "[auth]\nmin_password_length = 4\n[nope]\nx = 1\n[log]\nfilter = \"[[[\"\n[server]\naddr = \"0.0.0.0:3000\"\n",
        &["nope.x", "auth.min_password_length", "log.filter", "server.public_url"],
    );
}

#[test]
fn whatsapp_keys_load_and_are_checked() {
    let cfg = load_text("[whatsapp]\ngraph_base_url = \"http://127.0.0.1:9\"\ngraph_version = \"v24.0\"\nphone_number_id = \"1065403522\"\npair_interval = \"3s\"\n")
        .expect("loads");
    let wa = &cfg.settings.whatsapp;
    assert_eq!((wa.graph_base_url.as_str(), wa.graph_version.as_str(), wa.phone_number_id.as_str()), ("http://127.0.0.1:9", "v24.0", "1065403522"));
    assert_eq!(wa.pair_interval, std::time::Duration::from_secs(3));
    assert_eq!(Settings::default().whatsapp.graph_base_url, "https://graph.facebook.com");

    problems_at(
        "[whatsapp]\ngraph_base_url = \"ftp://x\"\ngraph_version = \"\"\nphone_number_id = \"+1 555\"\nsend_attempts = 0\nwindow_template = \"t\"\nwindow_template_language = \"\"\n",
        &["whatsapp.graph_base_url", "whatsapp.graph_version", "whatsapp.phone_number_id", "whatsapp.send_attempts", "whatsapp.window_template_language"],
    );
}
