//! Loading and checking: every problem is collected, each naming its key and where the value
//! came from, so `check-config` can report them all at once.

use std::{
    collections::BTreeSet,
    fmt,
    path::{Path, PathBuf},
};

use figment::{
    Figment, Metadata, Profile, Provider, Source,
    providers::{Env, Format, Serialized, Toml},
    value::{Dict, Map, Value},
};

use super::{Settings, secrets::Secrets};

const ENV_PREFIX: &str = "GATEHOUSE__";
/// Sets `server.strict`.
pub const STRICT_VAR: &str = "GATEHOUSE_STRICT";

/// What kind of thing is wrong: a stable code, printed before each problem, for scripts and
/// for searching the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ProblemCode {
    /// The config file is not there.
    ConfigFileMissing,
    /// A config file is there but cannot be read.
    ConfigFileUnreadable,
    /// A config file is not valid TOML.
    ConfigSyntax,
    /// A key no setting has.
    ConfigKeyUnknown,
    /// A value of the wrong type, out of range, or at odds with another.
    ConfigValueInvalid,
}

impl ProblemCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The code of a TOML file's error, from what serde or the parser says: an unknown field
    /// is a key no setting has, a wrong type or value or a missing field is a value problem,
    /// anything else is TOML that does not parse.
    pub fn of_toml(error: &toml::de::Error) -> Self {
        let message = error.message();
        if message.starts_with("unknown field") {
            Self::ConfigKeyUnknown
        } else if ["invalid type", "invalid value", "invalid length", "missing field", "unknown variant", "duplicate field"].iter().any(|m| message.starts_with(m)) {
            Self::ConfigValueInvalid
        } else {
            Self::ConfigSyntax
        }
    }
}

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub code: ProblemCode,
    /// Dotted key, such as `server.addr`; empty for whole-file problems.
    pub key: String,
    /// Where the value came from: a file path or an environment variable.
    pub source: String,
    pub message: String,
}

impl Problem {
    /// A value problem (`CONFIG_VALUE_INVALID`); see [`Problem::coded`] for the others.
    pub fn new(key: impl Into<String>, source: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: ProblemCode::ConfigValueInvalid, key: key.into(), source: source.into(), message: message.into() }
    }

    /// The same problem under another code.
    #[must_use]
    pub fn coded(self, code: ProblemCode) -> Self {
        Self { code, ..self }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{} {} ({})", self.code.as_str(), self.message, self.source)
        } else {
            write!(f, "{} {}: {} (from {})", self.code.as_str(), self.key, self.message, self.source)
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
    /// The folder holding the other config files (tools, connectors, MCP servers), which the
    /// `tools` module reads.
    pub dir: PathBuf,
}

impl LoadedConfig {
    /// Settings and secrets as given, for tests and benchmarks that build one in code.
    pub fn new(settings: Settings, secrets: Secrets, path: PathBuf) -> Self {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        Self { settings, secrets, path, dir }
    }
}

/// Loads `path` (must exist) with environment overrides from the process environment.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let (loaded, problems) = read_from_process(path)?;
    if !problems.is_empty() {
        return Err(ConfigError(problems));
    }
    Ok(loaded)
}

/// The settings from `path` and this process's environment, with every problem found, the
/// misnamed override variables among them (also beside a file that cannot be read).
fn read_from_process(path: &Path) -> Result<(LoadedConfig, Vec<Problem>), ConfigError> {
    let misnamed = misnamed_overrides(std::env::vars_os().filter_map(|(name, _)| name.into_string().ok()));
    match read_with_env(path, Env::prefixed(ENV_PREFIX).split("__"), Secrets::from_env()) {
        Ok((loaded, mut problems)) => {
            problems.extend(misnamed);
            Ok((loaded, problems))
        }
        Err(ConfigError(mut problems)) => {
            problems.extend(misnamed);
            Err(ConfigError(problems))
        }
    }
}

/// Variables meant as overrides whose prefix is mistyped (`GATEHOUSE_DATABASE__URL`, one
/// underscore short): the environment never reaches the settings through them, so without this
/// such a typo would start the server silently on the shipped value (another database). The
/// other `GATEHOUSE_` variables (strict mode, tokens, keys) hold no `__`.
fn misnamed_overrides(names: impl Iterator<Item = String>) -> Vec<Problem> {
    let mut problems: Vec<Problem> = names
        .filter(|name| {
            let upper = name.to_ascii_uppercase();
            upper.starts_with("GATEHOUSE") && !upper.starts_with(ENV_PREFIX) && name.contains("__")
        })
        .map(|name| {
            let meant = format!("{ENV_PREFIX}{}", name["GATEHOUSE".len()..].trim_start_matches('_'));
            Problem::new("", format!("environment variable {name}"), format!("not read: an override's name starts with {ENV_PREFIX} (did you mean {meant}?)")).coded(ProblemCode::ConfigKeyUnknown)
        })
        .collect();
    problems.sort_by(|a, b| a.source.cmp(&b.source));
    problems
}

/// [`load`] with the environment given (tests).
#[cfg(test)]
pub(crate) fn load_with_env(path: &Path, env: Env, secrets: Secrets) -> Result<LoadedConfig, ConfigError> {
    let (loaded, problems) = read_with_env(path, env, secrets)?;
    if !problems.is_empty() {
        return Err(ConfigError(problems));
    }
    Ok(loaded)
}

/// [`load`] for a command that needs only part of the settings (`tools reload` needs the
/// database): the settings whose values are fine, the defaults for the others, and the problems
/// of the others beside them. Only a wrong value outside `[database]` is let pass: a file that is
/// missing, unreadable or not TOML, a key no setting has and any problem in `[database]` are
/// still errors, since the command could reach another database.
pub fn load_lenient(path: &Path) -> Result<(LoadedConfig, Vec<Problem>), ConfigError> {
    let (loaded, problems) = read_from_process(path)?;
    // Only a value that is wrong outside [database] is let pass: a key it does not know may be
    // [database]'s own, misplaced or misspelled (`[databse]`, GATEHOUSE__DATABSE__URL).
    if problems.iter().any(|p| p.code != ProblemCode::ConfigValueInvalid || p.key.is_empty() || p.key == "database" || p.key.starts_with("database.")) {
        return Err(ConfigError(problems));
    }
    Ok((loaded, problems))
}

fn read_with_env(path: &Path, env: Env, secrets: Secrets) -> Result<(LoadedConfig, Vec<Problem>), ConfigError> {
    if let Err(e) = std::fs::read_to_string(path).map(drop)
        && path.is_file()
    {
        return Err(ConfigError(vec![Problem::new("", path.display().to_string(), format!("cannot read it: {e}")).coded(ProblemCode::ConfigFileUnreadable)]));
    }
    if !path.is_file() {
        let message = "config file not found; pass --config PATH or run from the repository root";
        return Err(ConfigError(vec![Problem::new("", path.display().to_string(), message).coded(ProblemCode::ConfigFileMissing)]));
    }
    let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::file_exact(path)).merge(EnvOverrides(env));
    let (mut settings, mut problems) = check(&figment);
    problems.extend(super::check::values(&figment, &settings));
    // The seed's name for strict mode, beside `server.strict` (GATEHOUSE__SERVER__STRICT).
    match std::env::var(STRICT_VAR).map(|v| v.trim().to_ascii_lowercase()) {
        Ok(v) if v == "true" || v == "1" => settings.server.strict = true,
        Ok(v) if v == "false" || v == "0" || v.is_empty() => {}
        Ok(v) => problems.push(Problem::new("server.strict", format!("environment variable {STRICT_VAR}"), format!("must be true or false (got {v:?})"))),
        Err(_) => {}
    }
    Ok((LoadedConfig::new(settings, secrets, path.to_path_buf()), problems))
}

/// `GATEHOUSE__SECTION__KEY` overrides. Figment's `Env` turns `106540352242922` into a number
/// and `true` into a bool, which a text setting (a phone number id, a model name) then refuses.
/// Here such values stay text; settings are extracted lossily, so a number or bool setting
/// still reads them. Arrays and tables in a variable are parsed as `Env` parses them. `Env`
/// lower-cases every key; the tables whose keys are codes ([`CODE_KEYED`]) get them back in
/// capitals, as the variable's name has them.
struct EnvOverrides(Env);

/// Tables whose keys are stable codes in capitals (`[approvals.reasons] APPROVAL_RISK = ...`).
const CODE_KEYED: [&str; 1] = ["approvals.reasons."];

impl Provider for EnvOverrides {
    fn metadata(&self) -> Metadata {
        self.0.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (key, raw) in self.0.iter() {
            let value = match raw.parse::<Value>() {
                Ok(Value::Num(..) | Value::Bool(..)) | Err(_) => Value::from(raw),
                Ok(parsed) => parsed,
            };
            let key = match CODE_KEYED.iter().find(|table| key.as_str().starts_with(*table)) {
                Some(table) => format!("{table}{}", key.as_str()[table.len()..].to_ascii_uppercase()),
                None => key.as_str().to_string(),
            };
            if let Some(nested) = figment::util::nest(&key, value).into_dict() {
                merge_into(&mut dict, nested);
            }
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Adds `from` to `into`, table by table; a later value for the same key wins.
fn merge_into(into: &mut Dict, from: Dict) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Dict(_, existing)), Value::Dict(_, nested)) => merge_into(existing, nested),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// Finds unknown keys and every key whose value does not deserialize. Returns the settings
/// built from the defaults plus every key that was fine, so later checks still run.
fn check(figment: &Figment) -> (Settings, Vec<Problem>) {
    let mut problems = Vec::new();
    let base = || Figment::from(Serialized::defaults(Settings::default()));
    let (Ok(defaults), Ok(merged)) = (base().find_value(""), figment.find_value("")) else {
        return match figment.extract_lossy() {
            Ok(settings) => (settings, problems),
            Err(e) => (Settings::default(), from_figment(figment, e)),
        };
    };
    let mut known = BTreeSet::new();
    collect_leaves(&defaults, "", &mut known);
    let mut present = BTreeSet::new();
    collect_leaves(&merged, "", &mut present);
    for key in present.difference(&known) {
        let near = known.iter().filter(|k| strsim::levenshtein(k, key) <= 2).min_by_key(|k| strsim::levenshtein(k, key));
        let hint = near.map(|k| format!("; did you mean `{k}`?")).unwrap_or_default();
        problems.push(problem_at(figment, key, format!("unknown key{hint}")).coded(ProblemCode::ConfigKeyUnknown));
    }

    // Probe each known key alone on top of the defaults, so one bad value cannot hide another,
    // and keep the good ones.
    let mut good = base();
    for key in known.intersection(&present) {
        let Ok(value) = figment.find_value(key) else { continue };
        let probe = base().merge(Serialized::default(key, value.clone()));
        match probe.extract_lossy::<Settings>() {
            Ok(_) => good = good.merge(Serialized::default(key, value)),
            Err(e) => {
                let shown = match &value {
                    Value::String(_, s) => format!("{s:?}"),
                    Value::Num(_, n) => format!("{n:?}"),
                    Value::Bool(_, b) => b.to_string(),
                    _ => "the given value".into(),
                };
                let code = if matches!(e.kind, figment::error::Kind::UnknownField(..)) { ProblemCode::ConfigKeyUnknown } else { ProblemCode::ConfigValueInvalid };
                problems.push(problem_at(figment, key, format!("{} (got {shown})", e.kind)).coded(code));
            }
        }
    }
    match good.extract_lossy() {
        Ok(settings) => (settings, problems),
        Err(e) => {
            problems.extend(from_figment(figment, e));
            (Settings::default(), problems)
        }
    }
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

pub(super) fn problem_at(figment: &Figment, key: &str, message: String) -> Problem {
    Problem::new(key, describe_source(figment.find_metadata(key), key), message)
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
            // A message with no key is the file's own (TOML that does not parse).
            let code = match &e.kind {
                figment::error::Kind::UnknownField(..) => ProblemCode::ConfigKeyUnknown,
                figment::error::Kind::Message(_) if key.is_empty() => ProblemCode::ConfigSyntax,
                _ => ProblemCode::ConfigValueInvalid,
            };
            Problem::new(key, source, without_quoted_lines(&e.kind.to_string())).coded(code)
        })
        .collect()
}

/// A TOML parser's message without the lines of the file it quotes (`62 | url = …` and the
/// caret under it): a line that does not parse may hold a secret (a database URL with its
/// password, written without quotes), and problems are printed and logged. The line and column
/// stay in the message's first line.
pub fn without_quoted_lines(message: &str) -> String {
    let quoted = |line: &str| line.trim_start().trim_start_matches(|c: char| c.is_ascii_digit()).trim_start().starts_with('|');
    message.lines().map(str::trim_end).filter(|l| !l.is_empty() && !quoted(l)).collect::<Vec<_>>().join("; ")
}

/// A URL safe to show: scheme, host, port and path only. User names, passwords and query
/// strings (where tokens and passwords hide) are dropped.
pub fn display_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.cannot_be_a_base() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Ok(u) => format!("{}:…", u.scheme()),
        Err(_) => "(not a URL)".into(),
    }
}

#[cfg(test)]
mod tests;
