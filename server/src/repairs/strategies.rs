//! Deterministic repair strategies: edits of `tools.toml` that may make a failing case pass.
//! Each yields candidate edits; the proposer replays every case over each and keeps the best.
//!
//! - `add_trigger`: a tool that should have been a candidate gets a trigger phrase taken from
//!   the message (the shortest phrase first, up to `evals.max_phrase_words` words);
//! - `add_when_not_to_use`: a tool that was a candidate (or was called) where it should not
//!   have been gets the message's phrase as a when_not_to_use example, which lowers its score.
//!
//! Only tools declared in `tools.toml` are edited; MCP tools are described by their servers.

use toml_edit::{Array, DocumentMut, Item, value};

use crate::evals::{Case, CaseResult, Expect};

/// One edit of one tool's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// `add_trigger`, `add_when_not_to_use` or `model`.
    pub strategy: &'static str,
    pub tool: String,
    /// One of [`KEYS`]: triggers and aliases get the phrase added; when_to_use and
    /// when_not_to_use get an example sentence appended (deterministic) or the text replaced
    /// (the repair model).
    pub key: &'static str,
    pub phrase: String,
}

/// The keys of a tool's entry a repair may touch; nothing else of a tool (its handler, risk,
/// audience, schema) ever changes through a repair.
pub const KEYS: [&str; 4] = ["triggers", "aliases", "when_to_use", "when_not_to_use"];

impl Edit {
    pub fn summary(&self) -> String {
        match (self.strategy, self.key) {
            ("add_trigger", _) => format!("add the trigger {:?} to {}", self.phrase, self.tool),
            ("add_when_not_to_use", _) => format!("tell {} it is not for messages like {:?}", self.tool, self.phrase),
            (_, "triggers" | "aliases") => format!("add {:?} to the {} of {} (the repair model)", self.phrase, self.key, self.tool),
            _ => format!("set the {} of {} to {:?} (the repair model)", self.key, self.tool, self.phrase),
        }
    }
}

/// Words a phrase does not start or end with (a phrase "for the" matches everything).
const EDGE_WORDS: [&str; 40] = [
    "a", "an", "the", "and", "or", "but", "to", "of", "for", "in", "on", "at", "by", "with", "from", "is", "are", "was", "be", "do", "does", "can", "could", "would", "will", "please", "me", "my",
    "you", "your", "i", "it", "this", "that", "what", "how", "is", "hi", "hey", "just",
];

/// The message's words, lowercase; a word keeps inner dots, hyphens and apostrophes
/// (`bistro-example.com`, `don't`).
fn words(message: &str) -> Vec<String> {
    message
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-' || c == '.'))
        .map(|w| w.trim_matches(|c| c == '\'' || c == '-' || c == '.').to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Phrases of the message a repair may add, shortest first, each once: spans of 2 to
/// `max_words` words that neither start nor end with a filler word, then single words of five
/// letters or more.
pub fn phrases(message: &str, max_words: usize) -> Vec<String> {
    let words = words(message);
    let edge = |w: &String| EDGE_WORDS.contains(&w.as_str());
    let mut out: Vec<String> = Vec::new();
    for len in 2..=max_words.max(2).min(words.len()) {
        for span in words.windows(len) {
            if edge(&span[0]) || edge(&span[len - 1]) {
                continue;
            }
            let phrase = span.join(" ");
            if !out.contains(&phrase) {
                out.push(phrase);
            }
        }
    }
    for w in words.iter().filter(|w| w.chars().count() >= 5 && !edge(w)) {
        if !out.contains(w) {
            out.push(w.clone());
        }
    }
    out
}

/// The edits worth replaying for a failing case, given the tools `tools.toml` declares.
pub fn edits_for(case: &Case, result: &CaseResult, declared: &[String], max_words: usize) -> Vec<Edit> {
    let phrases = phrases(&case.message, max_words);
    let mut edits = Vec::new();
    let mut add = |strategy: &'static str, tool: &str| {
        if declared.iter().any(|d| d == tool) {
            let key = if strategy == "add_trigger" { "triggers" } else { "when_not_to_use" };
            edits.extend(phrases.iter().map(|p| Edit { strategy, tool: tool.to_string(), key, phrase: p.clone() }));
        }
    };
    match &case.expect {
        Expect::Tool { tools, .. } => {
            // Not planned at all, not a candidate, or not called: a trigger may bring it in.
            let missed = |t: &String| !result.detector.observed.should_plan || !result.detector.observed.candidates.contains(t) || result.plan.as_ref().is_some_and(|p| !p.observed.tools.contains(t));
            for tool in tools.iter().filter(|t| missed(t)) {
                add("add_trigger", tool);
            }
            // A wrong tool was called in its place.
            if let Some(plan) = &result.plan {
                for wrong in plan.observed.tools.iter().filter(|t| !tools.contains(t)) {
                    add("add_when_not_to_use", wrong);
                }
            }
        }
        Expect::NormalChat | Expect::Guard | Expect::Clarify => {
            let called = result.plan.as_ref().map(|p| p.observed.tools.clone()).unwrap_or_default();
            let top = result.detector.observed.candidates.first().cloned();
            for tool in called.iter().chain(top.iter()) {
                add("add_when_not_to_use", tool);
            }
        }
    }
    edits
}

/// Why an edit cannot be made to the file as it is.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("REPAIR_FILE_INVALID: tools.toml does not parse: {0}")]
    Parse(String),
    #[error("REPAIR_TOOL_NOT_DECLARED: tools.toml declares no tool {0:?}")]
    NoTool(String),
    #[error("REPAIR_NOTHING_TO_CHANGE: {0}")]
    Unchanged(String),
    #[error("REPAIR_KEY_NOT_ALLOWED: a repair may change only triggers, aliases, when_to_use and when_not_to_use, not {0:?}")]
    KeyNotAllowed(String),
}

/// The tools `tools.toml` declares, by name.
pub fn declared_tools(text: &str) -> Vec<String> {
    let Ok(doc) = text.parse::<DocumentMut>() else {
        return Vec::new();
    };
    doc.get("tool").and_then(Item::as_array_of_tables).map(|tools| tools.iter().filter_map(|t| t.get("name").and_then(Item::as_str).map(String::from)).collect()).unwrap_or_default()
}

/// `tools.toml` with `edit` made, comments and layout kept.
pub fn apply(text: &str, edit: &Edit) -> Result<String, EditError> {
    let mut doc = text.parse::<DocumentMut>().map_err(|e| EditError::Parse(e.to_string()))?;
    let tools = doc.get_mut("tool").and_then(Item::as_array_of_tables_mut).ok_or_else(|| EditError::NoTool(edit.tool.clone()))?;
    let table = tools.iter_mut().find(|t| t.get("name").and_then(Item::as_str) == Some(edit.tool.as_str())).ok_or_else(|| EditError::NoTool(edit.tool.clone()))?;
    match (edit.strategy, edit.key) {
        (_, key @ ("triggers" | "aliases")) => {
            if table.get(key).and_then(Item::as_array).is_none() {
                table.insert(key, value(Array::new()));
            }
            let list = table.get_mut(key).and_then(Item::as_array_mut).ok_or_else(|| EditError::Parse(format!("{key} is not an array")))?;
            if list.iter().any(|t| t.as_str().is_some_and(|t| t.eq_ignore_ascii_case(&edit.phrase))) {
                return Err(EditError::Unchanged(format!("{} already has {:?} among its {key}", edit.tool, edit.phrase)));
            }
            list.push(edit.phrase.as_str());
        }
        ("model", key @ ("when_to_use" | "when_not_to_use")) => {
            if table.get(key).and_then(Item::as_str) == Some(edit.phrase.as_str()) {
                return Err(EditError::Unchanged(format!("{key} of {} already says that", edit.tool)));
            }
            table.insert(key, value(edit.phrase.as_str()));
        }
        (_, "when_not_to_use") => {
            let current = table.get("when_not_to_use").and_then(Item::as_str).unwrap_or_default().trim().to_string();
            let example = format!("Not for messages like \"{}\".", edit.phrase);
            if current.contains(&example) {
                return Err(EditError::Unchanged(format!("{} already says {example}", edit.tool)));
            }
            let text = if current.is_empty() { example } else { format!("{current} {example}") };
            table.insert("when_not_to_use", value(text));
        }
        (_, key) => return Err(EditError::KeyNotAllowed(key.to_string())),
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# tools\napproval_mode = \"auto\"\n\n[[tool]]\n# the search\nname = \"search\"\ntriggers = [\"look up\"]\n\n[[tool]]\nname = \"fetch\"\n";

    #[test]
    fn phrases_are_shortest_first_and_skip_filler_edges() {
        let p = phrases("Could you check the tide times for Porto?", 3);
        assert_eq!(p, vec!["tide times", "check the tide", "times for porto", "check", "times", "porto"]);
        assert!(phrases("Is it on?", 6).is_empty(), "only filler and short words");
    }

    #[test]
    fn an_edit_keeps_comments_and_changes_one_tool() {
        let out = apply(FILE, &Edit { strategy: "add_trigger", tool: "search".into(), key: "triggers", phrase: "tide times".into() }).unwrap();
        assert!(out.contains("# the search") && out.contains("# tools"));
        assert!(out.contains("triggers = [\"look up\", \"tide times\"]"), "{out}");
        let out = apply(FILE, &Edit { strategy: "add_trigger", tool: "fetch".into(), key: "triggers", phrase: "open it".into() }).unwrap();
        assert!(out.contains("name = \"fetch\"\ntriggers = [\"open it\"]"), "{out}");
        let out = apply(FILE, &Edit { strategy: "add_when_not_to_use", tool: "fetch".into(), key: "when_not_to_use", phrase: "hello there".into() }).unwrap();
        assert!(out.contains(r#"when_not_to_use = 'Not for messages like "hello there".'"#), "{out}");
        assert!(matches!(apply(FILE, &Edit { strategy: "add_trigger", tool: "search".into(), key: "triggers", phrase: "Look Up".into() }), Err(EditError::Unchanged(_))));
        assert!(matches!(apply(FILE, &Edit { strategy: "add_trigger", tool: "nope".into(), key: "triggers", phrase: "x".into() }), Err(EditError::NoTool(_))));
        assert_eq!(declared_tools(FILE), vec!["search", "fetch"]);
        let out = apply(FILE, &Edit { strategy: "model", tool: "fetch".into(), key: "when_to_use", phrase: "A link to open.".into() }).unwrap();
        assert!(out.contains("when_to_use = \"A link to open.\""), "{out}");
        assert!(matches!(apply(FILE, &Edit { strategy: "model", tool: "fetch".into(), key: "handler", phrase: "x".into() }), Err(EditError::KeyNotAllowed(_))));
    }
}
