//! Tool files for unit tests. An entry starts as a builtin read tool for the public at low risk
//! that takes any object, so a test writes only what its tools have of their own.

use std::fmt;

use super::Catalog;

/// One `[[tool]]` entry of a tools file.
#[derive(Debug, Clone)]
pub struct ToolToml {
    /// Keys with their TOML values, in the order written.
    keys: Vec<(&'static str, String)>,
}

impl ToolToml {
    pub fn builtin(name: &str, title: &str, description: &str) -> Self {
        let text = |s: &str| format!("{s:?}");
        let keys = [
            ("name", text(name)),
            ("title", text(title)),
            ("description", text(description)),
            ("provider", text("builtin")),
            ("handler", text("x")),
            ("operation", text("read")),
            ("audience", text("public")),
            ("risk", text("low")),
            ("input_schema", "{ type = \"object\" }".to_string()),
        ];
        Self { keys: keys.into() }
    }

    /// Sets `key` to `value`, written as TOML (`"text"`, `["a"]`, `{ type = "object" }`).
    pub fn with(mut self, key: &'static str, value: &str) -> Self {
        match self.keys.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value.to_string(),
            None => self.keys.push((key, value.to_string())),
        }
        self
    }
}

impl fmt::Display for ToolToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[[tool]]")?;
        self.keys.iter().try_for_each(|(key, value)| writeln!(f, "{key} = {value}"))
    }
}

/// The catalog of these tools, loaded as the server loads tools.toml; `secrets` are the
/// environment variables that are set.
pub fn catalog(tools: &[ToolToml], secrets: &[&str]) -> Catalog {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, tools.iter().map(ToolToml::to_string).collect::<Vec<_>>().join("\n")).expect("write");
    let set: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
    Catalog::load(&path, &move |v| set.iter().any(|s| s == v)).expect("catalog")
}
