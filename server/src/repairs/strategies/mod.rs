//! Deterministic repair strategies: edits of `tools.toml` that may make a failing case pass.
//! Each yields candidate edits; the proposer replays every case over each and keeps the best.
//!
//! - `adjust_threshold`: the detector found the right tool as its best candidate but was not
//!   confident enough to plan (or found a tool for a message that needed none, just confident
//!   enough): the tool gets its own `plan_threshold`, just at (or just above) the confidence it
//!   had, within `[evals] plan_threshold_range`. Tried first, since it is exactly the diagnosis;
//! - `add_alias`: a tool that should have been a candidate, named by the person in other words
//!   (a phrase of the message sharing a word with the tool's name or title), gets the phrase as
//!   an alias;
//! - `add_trigger`: otherwise the phrase becomes a trigger (the shortest phrase first, up to
//!   `evals.max_phrase_words` words);
//! - `add_when_not_to_use`: a tool that was a candidate (or was called) where it should not
//!   have been gets the message's phrase as a when_not_to_use example, which lowers its score.
//!
//! Only tools declared in `tools.toml` are edited; MCP tools are described by their servers.

use toml_edit::{Array, DocumentMut, Item, value};

use crate::{
    config::EvalSettings,
    evals::{Case, CaseResult, Expect},
    lane::detector::ReasonCode,
};

/// One edit of one tool's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// `adjust_threshold`, `add_alias`, `add_trigger`, `add_when_not_to_use` or `model`.
    pub strategy: &'static str,
    pub tool: String,
    /// One of [`KEYS`], or [`THRESHOLD`]: triggers and aliases get the phrase added;
    /// when_to_use and when_not_to_use get an example sentence appended (deterministic) or the
    /// text replaced (the repair model); plan_threshold is set to the number in `phrase`.
    pub key: &'static str,
    pub phrase: String,
}

/// The text keys of a tool's entry a repair may touch (the repair model among them); with
/// [`THRESHOLD`], nothing else of a tool (its handler, risk, audience, schema) ever changes
/// through a repair.
pub const KEYS: [&str; 4] = ["triggers", "aliases", "when_to_use", "when_not_to_use"];

/// The tool's own detector threshold, which only the deterministic `adjust_threshold` sets.
pub const THRESHOLD: &str = "plan_threshold";

impl Edit {
    pub fn summary(&self) -> String {
        match (self.strategy, self.key) {
            ("add_trigger", _) => format!("add the trigger {:?} to {}", self.phrase, self.tool),
            ("add_alias", _) => format!("add the alias {:?} to {}", self.phrase, self.tool),
            ("adjust_threshold", _) => format!("set the plan threshold of {} to {}", self.tool, self.phrase),
            ("add_when_not_to_use", _) => format!("tell {} it is not for messages like {:?}", self.tool, self.phrase),
            // The model's sentence is added to what the owner wrote (see [`apply`]).
            _ => format!("add {:?} to the {} of {} (the repair model)", self.phrase, self.key, self.tool),
        }
    }
}

/// Words a phrase does not start or end with (a phrase "for the" matches everything).
const EDGE_WORDS: [&str; 40] = [
    "a", "an", "the", "and", "or", "but", "to", "of", "for", "in", "on", "at", "by", "with", "from", "is", "are", "was", "be", "do", "does", "can", "could", "would", "will", "please", "me", "my",
    "you", "your", "i", "it", "this", "that", "what", "how", "is", "hi", "hey", "just",
];

/// The message's words, lowercase; a word keeps inner dots, hyphens and apostrophes
/// (`bistro-example.com`, `don't`). An email address or an @-handle stays one word, `@`: the
/// customer's, which no phrase may hold (nor may a phrase join the words around it).
fn words(message: &str) -> Vec<String> {
    message
        .split_whitespace()
        .flat_map(|token| if token.contains('@') { vec!["@"] } else { token.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-' || c == '.')).collect() })
        .map(|w| w.trim_matches(|c| c == '\'' || c == '-' || c == '.').to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Phrases of the message a repair may add, shortest first, each once: spans of 2 to
/// `max_words` words that neither start nor end with a filler word, then single words of five
/// letters or more. No phrase holds a word with a digit: an order or phone number, a date or
/// an address is the customer's, and a repair's phrase goes into the config, its diff and every
/// later planner prompt.
pub fn phrases(message: &str, max_words: usize) -> Vec<String> {
    let words = words(message);
    let edge = |w: &String| EDGE_WORDS.contains(&w.as_str());
    let mut out: Vec<String> = Vec::new();
    for len in 2..=max_words.max(2).min(words.len()) {
        for span in words.windows(len) {
            if edge(&span[0]) || edge(&span[len - 1]) || span.iter().any(|w| private(w)) {
                continue;
            }
            let phrase = span.join(" ");
            if !out.contains(&phrase) {
                out.push(phrase);
            }
        }
    }
    for w in words.iter().filter(|w| lone_word(w)) {
        if !out.contains(w) {
            out.push(w.clone());
        }
    }
    out
}

/// Whether the repair model's trigger or alias may go into the config: two words or more, or one
/// word of five letters or more that is not a filler word (a trigger "the" would match every
/// message), and, as for every phrase, no word with a digit and no email address or @-handle
/// (the customer's, not words of the request). Unlike [`phrases`], it may start or end with a
/// filler word: the model is asked for what the message's own phrases cannot say ("is it up").
pub fn fits_as_trigger(value: &str) -> bool {
    let words = words(value);
    let whole = value.split_whitespace().count() == words.len();
    whole
        && !words.iter().any(|w| private(w))
        && match words.as_slice() {
            [] => false,
            [one] => lone_word(one),
            _ => true,
        }
}

/// A word no phrase may hold: one with a digit (an order or phone number, a date) or an email
/// address or @-handle (`@`, see [`words`]).
fn private(word: &str) -> bool {
    word == "@" || word.chars().any(char::is_numeric)
}

/// A word that may be a phrase alone: five letters or more, not a filler word, not private.
fn lone_word(word: &str) -> bool {
    word.chars().count() >= 5 && !EDGE_WORDS.contains(&word) && !private(word)
}

/// The edits worth replaying for a failing case, given `tools.toml` as it is, in the order to
/// try them.
pub fn edits_for(case: &Case, result: &CaseResult, tools_toml: &str, settings: &EvalSettings) -> Vec<Edit> {
    let declared = declared_tools(tools_toml);
    let is_declared = |tool: &str| declared.iter().any(|d| d == tool);
    let phrases = phrases(&case.message, settings.max_phrase_words as usize);
    let detector = &result.detector.observed;
    let top = detector.candidates.first().filter(|t| is_declared(t));
    let mut edits = Vec::new();
    let phrase_edits = |strategy: &'static str, tool: &str, edits: &mut Vec<Edit>| {
        if !is_declared(tool) {
            return;
        }
        let names = name_words(tools_toml, tool);
        for p in &phrases {
            let (strategy, key) = match strategy {
                "add_trigger" if names_the_tool(p, &names) => ("add_alias", "aliases"),
                "add_trigger" => ("add_trigger", "triggers"),
                _ => (strategy, "when_not_to_use"),
            };
            edits.push(Edit { strategy, tool: tool.to_string(), key, phrase: p.clone() });
        }
    };
    let [low, high] = settings.plan_threshold_range;
    // Thresholds move in hundredths: a tool's own threshold at or just above what it scored.
    let threshold = |tool: &String, value: f32| Edit { strategy: "adjust_threshold", tool: tool.clone(), key: THRESHOLD, phrase: format!("{value:.2}") };
    match &case.expect {
        Expect::Tool { tools, .. } => {
            // The right tool led but fell short of the threshold: lower its own.
            if let Some(top) = top
                && tools.contains(top)
                && detector.code == ReasonCode::BelowThreshold.as_str()
            {
                let at = (detector.confidence * 100.0).floor() / 100.0;
                if at >= low {
                    edits.push(threshold(top, at));
                }
            }
            // Not planned at all, not a candidate, or not called: a trigger may bring it in.
            let missed = |t: &String| !detector.should_plan || !detector.candidates.contains(t) || result.plan.as_ref().is_some_and(|p| !p.observed.tools.contains(t));
            for tool in tools.iter().filter(|t| missed(t)) {
                phrase_edits("add_trigger", tool, &mut edits);
            }
            // A wrong tool was called in its place.
            if let Some(plan) = &result.plan {
                for wrong in plan.observed.tools.iter().filter(|t| !tools.contains(t)) {
                    phrase_edits("add_when_not_to_use", wrong, &mut edits);
                }
            }
        }
        Expect::NormalChat | Expect::Guard | Expect::Clarify => {
            // A tool led just confidently enough to plan a message that needed none: raise its
            // own. (Not planning answers neither the guard nor a clarification.)
            if let Some(top) = top
                && matches!(case.expect, Expect::NormalChat)
                && detector.code == ReasonCode::CandidatesFound.as_str()
            {
                let above = ((detector.confidence * 100.0).floor() + 1.0) / 100.0;
                if above <= high {
                    edits.push(threshold(top, above));
                }
            }
            let called = result.plan.as_ref().map(|p| p.observed.tools.clone()).unwrap_or_default();
            for tool in called.iter().chain(top) {
                phrase_edits("add_when_not_to_use", tool, &mut edits);
            }
        }
    }
    edits
}

/// The words of a tool's name and title, lowercase, of three letters or more.
fn name_words(tools_toml: &str, tool: &str) -> Vec<String> {
    let Ok(doc) = tools_toml.parse::<DocumentMut>() else {
        return Vec::new();
    };
    let Some(table) = doc.get("tool").and_then(Item::as_array_of_tables).and_then(|t| t.iter().find(|t| t.get("name").and_then(Item::as_str) == Some(tool))) else {
        return Vec::new();
    };
    let text = format!("{} {}", tool.replace(['_', '-'], " "), table.get("title").and_then(Item::as_str).unwrap_or_default());
    words(&text).into_iter().filter(|w| w.chars().count() >= 3 && !EDGE_WORDS.contains(&w.as_str())).collect()
}

/// Whether a phrase names the tool in other words: one of its words of four letters or more
/// starts like a word of the tool's name or title ("searching" and "web_search", "tables" and
/// "Tide table").
fn names_the_tool(phrase: &str, names: &[String]) -> bool {
    let stem = |w: &str| (w.chars().count() >= 4).then(|| w.chars().take(4).collect::<String>());
    let names: Vec<String> = names.iter().filter_map(|n| stem(n)).collect();
    words(phrase).iter().filter_map(|w| stem(w)).any(|w| names.contains(&w))
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
    #[error("REPAIR_KEY_NOT_ALLOWED: a repair may change only triggers, aliases, when_to_use, when_not_to_use and plan_threshold, not {0:?}")]
    KeyNotAllowed(String),
    #[error("REPAIR_THRESHOLD_INVALID: a plan threshold must be a number between 0 and 1, not {0:?}")]
    Threshold(String),
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
        // The model's sentence is added to what the owner wrote, never in its place.
        ("model", key @ ("when_to_use" | "when_not_to_use")) => {
            let current = table.get(key).and_then(Item::as_str).unwrap_or_default().trim().to_string();
            if current.contains(edit.phrase.trim()) {
                return Err(EditError::Unchanged(format!("{key} of {} already says that", edit.tool)));
            }
            let text = if current.is_empty() { edit.phrase.trim().to_string() } else { format!("{current} {}", edit.phrase.trim()) };
            table.insert(key, value(text));
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
        ("adjust_threshold", THRESHOLD) => {
            let threshold: f64 = edit.phrase.parse().ok().filter(|t| *t > 0.0 && *t < 1.0).ok_or_else(|| EditError::Threshold(edit.phrase.clone()))?;
            if table.get(THRESHOLD).and_then(Item::as_float).is_some_and(|t| (t - threshold).abs() < 1e-9) {
                return Err(EditError::Unchanged(format!("the plan threshold of {} is already {threshold}", edit.tool)));
            }
            table.insert(THRESHOLD, value(threshold));
        }
        (_, key) => return Err(EditError::KeyNotAllowed(key.to_string())),
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests;
