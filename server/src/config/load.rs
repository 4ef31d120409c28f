//! Loading and checking: every problem is collected, each naming its key and where the value
//! came from, so `check-config` can report them all at once.

use std::{
    collections::BTreeSet,
    fmt,
    path::{Path, PathBuf},
};

use figment::{
    Figment, Metadata, Source,
    providers::{Env, Format, Serialized, Toml},
    value::{Dict, Value},
};

use super::{Settings, secrets::Secrets};

const ENV_PREFIX: &str = "GATEHOUSE__";

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key, such as `server.addr`; empty for whole-file problems.
    pub key: String,
    /// Where the value came from: a file path or an environment variable.
    pub source: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{} ({})", self.message, self.source)
        } else {
            write!(f, "{}: {} (from {})", self.key, self.message, self.source)
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{} configuration problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<Problem>);

/// Settings plus where they came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub settings: Settings,
    pub secrets: Secrets,
    /// The main config file that was read.
    pub path: PathBuf,
    /// The folder holding the other config files (tools, connectors, MCP servers).
    pub dir: PathBuf,
}

/// Loads `path` (must exist) with environment overrides from the process environment.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    load_with_env(path, Env::prefixed(ENV_PREFIX).split("__"), Secrets::from_env())
}

pub(crate) fn load_with_env(path: &Path, env: Env, secrets: Secrets) -> Result<LoadedConfig, ConfigError> {
    if !path.is_file() {
        return Err(ConfigError(vec![Problem {
            key: String::new(),
            source: path.display().to_string(),
            message: "config file not found; pass --config PATH or run from the repository root".into(),
        }]));
    }
    let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::file_exact(path)).merge(env);
    let settings = check(&figment)?;
    let mut problems = Vec::new();
    if settings.auth.min_password_length < 12 {
        problems.push(problem_at(&figment, "auth.min_password_length", "must be at least 12".into()));
    }
    if settings.auth.login_max_failures == 0 {
        problems.push(problem_at(&figment, "auth.login_max_failures", "must be at least 1".into()));
    }
    if settings.database.max_connections == 0 {
        problems.push(problem_at(&figment, "database.max_connections", "must be at least 1".into()));
    }
    let db = &settings.database.url;
    if !(db.starts_with("sqlite:") || db.starts_with("postgres://") || db.starts_with("postgresql://")) {
        problems.push(problem_at(
            &figment,
            "database.url",
            format!("unsupported database URL scheme in {:?}; use sqlite://... or postgres://...", redact_url(db)),
        ));
    }
    if !settings.server.public_url.is_empty() {
        match url::Url::parse(&settings.server.public_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => problems.push(problem_at(
                &figment,
                "server.public_url",
                format!("{:?} is not an http(s) URL", settings.server.public_url),
            )),
        }
    }
    for (key, value) in [("llm.anthropic.base_url", &settings.llm.anthropic.base_url), ("llm.openai.base_url", &settings.llm.openai.base_url)] {
        if !value.is_empty() && url::Url::parse(value).is_err() {
            problems.push(problem_at(&figment, key, format!("{value:?} is not a URL")));
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError(problems));
    }
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    Ok(LoadedConfig { settings, secrets, path: path.to_path_buf(), dir })
}

/// Finds unknown keys and every key whose value does not deserialize, then extracts.
fn check(figment: &Figment) -> Result<Settings, ConfigError> {
    let defaults = Figment::from(Serialized::defaults(Settings::default()))
        .find_value("")
        .map_err(|e| ConfigError(from_figment(figment, e)))?;
    let mut known = BTreeSet::new();
    collect_leaves(&defaults, "", &mut known);

    let mut problems = Vec::new();
    let merged = match figment.find_value("") {
        Ok(v) => v,
        Err(e) => return Err(ConfigError(from_figment(figment, e))),
    };
    let mut present = BTreeSet::new();
    collect_leaves(&merged, "", &mut present);
    for key in &present {
        if !known.contains(key) {
            let near = known.iter().filter(|k| edit_distance(k, key) <= 2).min_by_key(|k| edit_distance(k, key));
            let hint = near.map(|k| format!("; did you mean `{k}`?")).unwrap_or_default();
            problems.push(problem_at(figment, key, format!("unknown key{hint}")));
        }
    }

    // Probe each known key alone on top of the defaults, so one bad value cannot hide another.
    for key in known.intersection(&present) {
        let Ok(value) = figment.find_value(key) else { continue };
        let probe = Figment::from(Serialized::defaults(Settings::default())).merge(Serialized::default(key, value.clone()));
        if let Err(e) = probe.extract::<Settings>() {
            let shown = match &value {
                Value::String(_, s) => format!("{s:?}"),
                Value::Num(_, n) => format!("{n:?}"),
                Value::Bool(_, b) => b.to_string(),
                _ => "the given value".into(),
            };
            problems.push(problem_at(figment, key, format!("{} (got {shown})", e.kind)));
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError(problems));
    }
    figment.extract().map_err(|e| ConfigError(from_figment(figment, e)))
}

fn collect_leaves(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Dict(_, dict) => collect_dict(dict, prefix, out),
        _ if !prefix.is_empty() => {
            out.insert(prefix.to_string());
        }
        _ => {}
    }
}

fn collect_dict(dict: &Dict, prefix: &str, out: &mut BTreeSet<String>) {
    for (k, v) in dict {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        collect_leaves(v, &key, out);
    }
}

/// Levenshtein distance, for "did you mean" hints on misspelt keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn problem_at(figment: &Figment, key: &str, message: String) -> Problem {
    Problem { key: key.to_string(), source: describe_source(figment.find_metadata(key), key), message }
}

fn describe_source(meta: Option<&Metadata>, key: &str) -> String {
    let Some(meta) = meta else { return "built-in default".into() };
    match &meta.source {
        Some(Source::File(path)) => path.display().to_string(),
        Some(Source::Code(_)) => "built-in default".into(),
        _ if meta.name.contains("environment") => {
            format!("environment variable {ENV_PREFIX}{}", key.split('.').collect::<Vec<_>>().join("__").to_uppercase())
        }
        _ => meta.name.to_string(),
    }
}

fn from_figment(figment: &Figment, err: figment::Error) -> Vec<Problem> {
    err.into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let source = describe_source(e.metadata.as_ref().or_else(|| figment.find_metadata(&key)), &key);
            Problem { key, source, message: e.kind.to_string() }
        })
        .collect()
}

/// Removes a password from a database URL so it can be shown.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("****"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("gatehouse.toml");
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// Environment overrides are covered end to end in the CLI tests; here no variable matches.
    fn no_env() -> Env {
        Env::prefixed("GATEHOUSE_UNIT_TEST_UNSET__").split("__")
    }

    #[test]
    fn reports_every_problem_with_key_and_source() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(
            dir.path(),
            "[server]\naddr = \"not-an-addr\"\nbogus = 1\n[auth]\nsession_idle_timeout = \"soon\"\nlogin_max_failures = \"five\"\n",
        );
        let err = load_with_env(&path, no_env(), Secrets::default()).expect_err("must fail");
        let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
        assert!(keys.contains(&"server.bogus"), "{err}");
        assert!(keys.contains(&"server.addr"), "{err}");
        assert!(keys.contains(&"auth.session_idle_timeout"), "{err}");
        assert!(keys.contains(&"auth.login_max_failures"), "{err}");
        assert!(err.0.iter().all(|p| p.source.ends_with("gatehouse.toml")), "{err}");
    }

    #[test]
    fn defaults_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), "");
        let cfg = load_with_env(&path, no_env(), Secrets::default()).expect("loads");
        assert_eq!(cfg.settings, Settings::default());
    }

    #[test]
    fn redacts_database_password() {
        assert_eq!(redact_url("postgres://u:secret@h/db"), "postgres://u:****@h/db");
    }
}
