//! What loading the tool files (tools.toml, connectors.toml, mcp.toml) shares: problems named by
//! the file and the key, and the entries of a `[[section]]` array read one at a time, so that
//! one bad entry does not hide the problems of the others.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::config::{Problem, ProblemCode};

/// Names a problem in the file at `path`: the file, then the key.
pub(crate) fn problem_at(path: &Path) -> impl Fn(String, String) -> Problem + use<> {
    let source = path.display().to_string();
    move |key, message| Problem::new(key, source.clone(), message)
}

/// The text of the file at `path`; `what` names it in the problem when it cannot be read.
pub(crate) fn read(path: &Path, what: &str, problem: &impl Fn(String, String) -> Problem) -> Result<String, Vec<Problem>> {
    std::fs::read_to_string(path).map_err(|e| vec![problem(String::new(), format!("cannot read {what}: {e}")).coded(ProblemCode::ConfigFileUnreadable)])
}

/// The file's `text` as `T`. Its problem is `what` and the parser's message without the line it
/// quotes (which may hold a secret; see [`crate::config::load::without_quoted_lines`]).
pub(crate) fn parse<T: DeserializeOwned>(text: &str, what: &str, problem: &impl Fn(String, String) -> Problem) -> Result<T, Vec<Problem>> {
    toml::from_str(text).map_err(|e| vec![problem(String::new(), format!("{what}: {}", crate::config::load::without_quoted_lines(&e.to_string()))).coded(ProblemCode::of_toml(&e))])
}

/// The entries of a `[[section]]` array as `T`, each with its label for problems: `tool[3]`, or
/// `tool[3] (lookup_order)` when it has a `name_key`. An entry that does not parse is the
/// problem under its label.
pub(crate) fn entries<'a, T: DeserializeOwned>(
    raw: Vec<toml::Value>,
    section: &'a str,
    name_key: &'a str,
    problem: &'a impl Fn(String, String) -> Problem,
) -> impl Iterator<Item = Result<(String, T), Problem>> + 'a {
    raw.into_iter().enumerate().map(move |(i, raw)| {
        let label = raw.get(name_key).and_then(|n| n.as_str()).map_or_else(|| format!("{section}[{i}]"), |n| format!("{section}[{i}] ({n})"));
        match raw.try_into() {
            Ok(entry) => Ok((label, entry)),
            Err(e) => Err(problem(label, e.to_string().trim().to_string()).coded(ProblemCode::of_toml(&e))),
        }
    })
}
