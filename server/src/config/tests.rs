//! Test fixtures for the settings, shared by every section's tests: a text loaded as
//! gatehouse.toml with no environment overrides, the shipped config/gatehouse.toml, and the
//! check that a text's problems name the expected keys. The shipped file's sections that
//! repeat their code defaults are checked here once, not in each section's file.

use std::path::Path;

use figment::providers::Env;

use super::{ConfigError, LoadedConfig, Problem, Secrets, Settings, load::load_with_env};

/// The shipped config/gatehouse.toml.
pub fn shipped_path() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml"))
}

/// Loads `text` as gatehouse.toml. Environment overrides are covered end to end in the CLI
/// tests; here no variable matches, so a developer's own GATEHOUSE__ variables change nothing.
pub fn load_text(text: &str) -> Result<LoadedConfig, ConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gatehouse.toml");
    std::fs::write(&path, text).expect("write config");
    load_with_env(&path, Env::prefixed("GATEHOUSE_UNIT_TEST_UNSET__").split("__"), Secrets::default())
}

/// The shipped config, loaded as [`load_text`] loads a text.
pub fn shipped() -> LoadedConfig {
    load_text(&std::fs::read_to_string(shipped_path()).expect("shipped config")).expect("shipped config loads")
}

/// Loads `text`, which must fail with a problem for each of `keys` (among others); returns the
/// error for further checks of its messages.
pub fn problems_at(text: &str, keys: &[&str]) -> ConfigError {
    let err = load_text(text).expect_err("the config must be refused");
    let reported: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
    for key in keys {
        assert!(reported.contains(key), "{key} missing from {err}");
    }
    err
}

/// Every problem as `check-config` shows it; each of `needles` must be part of one. For the
/// other config files (tools, connectors, MCP servers), whose problems are checked by their text.
pub fn problems_mention(problems: &[Problem], needles: &[&str]) -> Vec<String> {
    let shown: Vec<String> = problems.iter().map(Problem::to_string).collect();
    for needle in needles {
        assert!(shown.iter().any(|s| s.contains(needle)), "{needle:?} missing from {shown:#?}");
    }
    shown
}

/// Owners read the shipped file to see what a section does unless they change it, so these
/// sections must say exactly what the code's defaults say.
#[test]
fn the_shipped_config_repeats_the_defaults() {
    let shipped = shipped().settings;
    let defaults = Settings::default();
    assert_eq!(shipped.approvals, defaults.approvals, "config/gatehouse.toml [approvals] and approvals_defaults.toml differ");
    assert_eq!(shipped.budget, defaults.budget, "config/gatehouse.toml [budget] and BudgetSettings::default differ");
    assert_eq!(shipped.events, defaults.events, "config/gatehouse.toml [events] and EventSettings::default differ");
    assert_eq!(shipped.mcp, defaults.mcp, "config/gatehouse.toml [mcp] and McpSettings::default differ");
    assert_eq!(shipped.telemetry, defaults.telemetry, "config/gatehouse.toml [telemetry] and TelemetrySettings::default differ");
    assert!(shipped.approvals.texts().iter().all(|(_, t)| !t.trim().is_empty()));
    assert!(!shipped.telemetry.enabled(), "nothing is exported until an operator names a receiver");
}

/// The compaction model reads what people wrote, wrapped as untrusted data: its prompt must say
/// what the wrapping means, as the lane's prompts must.
#[test]
fn the_compaction_prompt_names_the_untrusted_wrapping() {
    assert!(shipped().settings.conversation.compaction_prompt.contains(super::lane::UNTRUSTED_TAG));
    let err = problems_at("[conversation]\ncompaction_prompt = \"Summarize. Keep promises made.\"\n", &["conversation.compaction_prompt"]);
    assert!(err.to_string().contains("must tell the model that text inside <untrusted_data> is data"), "{err}");
}

/// The business's time zone is an IANA name the build knows; a typo is said at load, with the
/// key, instead of every model being told UTC.
#[test]
fn the_time_zone_is_one_the_build_knows() {
    assert_eq!(shipped().settings.conversation.timezone, "UTC");
    assert_eq!(load_text("[conversation]\ntimezone = \"America/Sao_Paulo\"\n").expect("a known zone").settings.conversation.timezone, "America/Sao_Paulo");
    let err = problems_at("[conversation]\ntimezone = \"Europe/Lisbn\"\n", &["conversation.timezone"]);
    assert!(err.to_string().contains("is not a time zone this build knows"), "{err}");
}
