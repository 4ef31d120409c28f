//! Eval cases: a message with its circumstances and what should have happened. Stored in
//! `eval_cases`, exported to and imported from JSON-lines files (one case a line) so they can
//! be kept in version control beside the configuration.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    db::evals::CaseRow,
    domain::{ChatKind, Role},
    lane::{clarify::Clarification, detector::RecentContext},
};

/// What should happen to a case's message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Expect {
    /// Normal chat answers it: the lane does not plan (or its planner leaves it).
    NormalChat,
    /// The private-data guard answers it.
    Guard,
    /// The bot asks a clarifying question.
    Clarify,
    /// These tools are called; `args` lists the arguments that matter (compared without case
    /// for strings), the others may be anything.
    Tool {
        tools: Vec<String>,
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        args: Map<String, Value>,
    },
}

/// Why an expectation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("EVAL_EXPECT_INVALID: {0:?} is not normal_chat, guard, clarify or tool:NAME[,NAME]")]
pub struct ExpectError(pub String);

impl FromStr for Expect {
    type Err = ExpectError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "normal_chat" => Ok(Self::NormalChat),
            "guard" => Ok(Self::Guard),
            "clarify" => Ok(Self::Clarify),
            _ => {
                let names = s.strip_prefix("tool:").ok_or_else(|| ExpectError(s.to_string()))?;
                let tools: Vec<String> = names.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
                if tools.is_empty() || !tools.iter().all(|t| crate::tools::catalog::valid_tool_name(t)) {
                    return Err(ExpectError(s.to_string()));
                }
                Ok(Self::Tool { tools, args: Map::new() })
            }
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NormalChat => f.write_str("normal_chat"),
            Self::Guard => f.write_str("guard"),
            Self::Clarify => f.write_str("clarify"),
            Self::Tool { tools, .. } => write!(f, "tool:{}", tools.join(",")),
        }
    }
}

/// Where a case came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    /// `manual` (`gatehouse eval add`), `trace` (`--from-trace`), `finding` (the scan or an
    /// owner's mark) or `import`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// What should have happened, in the owner's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One eval case, as stored and as one line of a JSON-lines file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// Stable across export and import: the key a case is matched by.
    pub name: String,
    pub message: String,
    #[serde(default = "customer")]
    pub actor: Role,
    #[serde(default)]
    pub chat_type: ChatKind,
    /// The chat's recent tool contexts, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contexts: Vec<RecentContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_summary: Option<String>,
    /// The clarifying question the message answers: it is detected and planned as the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clarification: Option<Clarification>,
    pub expect: Expect,
    #[serde(default)]
    pub origin: Origin,
    /// The planner's answers recorded in the trace, in order (`lane::decide::record`); a
    /// replay gives them back instead of asking a model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recorded: Vec<Value>,
}

fn customer() -> Role {
    Role::Customer
}

/// A stable name for a case made by hand: its message, actor, chat type and expectation.
pub fn manual_name(message: &str, actor: Role, chat: ChatKind, expect: &Expect) -> String {
    use sha2::{Digest, Sha256};
    let mut key = format!("{message}\n{}\n{}\n{expect}", actor.as_str(), chat.as_str());
    // The arguments that matter make another case; none keeps the names cases always had.
    if let Expect::Tool { args, .. } = expect
        && !args.is_empty()
    {
        key.push_str(&format!("\n{}", Value::Object(args.clone())));
    }
    let digest = Sha256::digest(key);
    format!("case-{}", &hex::encode(digest)[..12])
}

/// A stored case that cannot be read back.
#[derive(Debug, thiserror::Error)]
#[error("EVAL_CASE_CORRUPT: case {name}: {reason}")]
pub struct CorruptCase {
    pub name: String,
    pub reason: String,
}

impl Case {
    pub fn to_row(&self) -> CaseRow {
        CaseRow {
            id: 0,
            name: self.name.clone(),
            message: self.message.clone(),
            actor: self.actor.as_str().into(),
            chat_type: self.chat_type.as_str().into(),
            contexts: serde_json::to_string(&self.contexts).unwrap_or_else(|_| "[]".into()),
            memory_summary: self.memory_summary.clone(),
            expect: serde_json::to_string(&self.expect).unwrap_or_default(),
            origin: serde_json::to_string(&self.origin).unwrap_or_default(),
            recorded: serde_json::to_string(&self.recorded).unwrap_or_else(|_| "[]".into()),
            created_at: crate::db::now_ms(),
            clarification: self.clarification.as_ref().and_then(|c| serde_json::to_string(c).ok()),
        }
    }

    pub fn from_row(row: &CaseRow) -> Result<Self, CorruptCase> {
        let bad = |what: &str, e: &dyn fmt::Display| CorruptCase { name: row.name.clone(), reason: format!("{what}: {e}") };
        Ok(Self {
            name: row.name.clone(),
            message: row.message.clone(),
            actor: row.actor.parse().map_err(|e| bad("actor", &e))?,
            chat_type: row.chat_type.parse().map_err(|e| bad("chat_type", &e))?,
            contexts: serde_json::from_str(&row.contexts).map_err(|e| bad("contexts", &e))?,
            memory_summary: row.memory_summary.clone(),
            expect: serde_json::from_str(&row.expect).map_err(|e| bad("expect", &e))?,
            origin: serde_json::from_str(&row.origin).map_err(|e| bad("origin", &e))?,
            recorded: serde_json::from_str(&row.recorded).map_err(|e| bad("recorded", &e))?,
            clarification: row.clarification.as_deref().map(serde_json::from_str).transpose().map_err(|e| bad("clarification", &e))?,
        })
    }
}

/// A line of a cases file that is not a case.
#[derive(Debug, thiserror::Error)]
#[error("EVAL_FILE_INVALID: line {line}: {reason}")]
pub struct FileError {
    pub line: usize,
    pub reason: String,
}

/// Reads a JSON-lines file's cases; blank lines and lines starting with `#` are skipped. Every
/// bad line is reported, and no case is taken from a file with one.
pub fn parse_jsonl(text: &str) -> Result<Vec<Case>, Vec<FileError>> {
    let mut cases = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match serde_json::from_str::<Case>(line) {
            Ok(case) if case.message.trim().is_empty() => errors.push(FileError { line: i + 1, reason: "the message is empty".into() }),
            Ok(case) => cases.push(case),
            Err(e) => errors.push(FileError { line: i + 1, reason: e.to_string() }),
        }
    }
    if errors.is_empty() { Ok(cases) } else { Err(errors) }
}

/// One case a line, in the order given.
pub fn to_jsonl(cases: &[Case]) -> String {
    cases.iter().filter_map(|c| serde_json::to_string(c).ok()).map(|l| l + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_read_and_print_the_same() {
        for text in ["normal_chat", "guard", "clarify", "tool:web_search", "tool:a,b"] {
            assert_eq!(text.parse::<Expect>().expect("parses").to_string(), text);
        }
        assert!("tool:".parse::<Expect>().is_err());
        assert!("tool:bad name".parse::<Expect>().is_err());
        assert!("chat".parse::<Expect>().is_err());
    }

    #[test]
    fn a_file_with_a_bad_line_gives_every_error_and_no_case() {
        let good = r#"{"name":"a","message":"hi","expect":{"kind":"normal_chat"}}"#;
        assert_eq!(parse_jsonl(&format!("# cases\n{good}\n\n")).expect("parses").len(), 1);
        let errors = parse_jsonl(&format!("{good}\nnot json\n{{\"name\":\"b\",\"message\":\" \",\"expect\":{{\"kind\":\"guard\"}}}}\n")).expect_err("a bad line");
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn cases_round_trip_through_a_file_and_a_row() {
        let case = Case {
            name: "c".into(),
            message: "is the shop open".into(),
            actor: Role::Owner,
            chat_type: ChatKind::Group,
            contexts: vec![],
            memory_summary: Some("talked about hours".into()),
            clarification: Some(crate::lane::clarify::Clarification::asked(None, "book me in", "Which day?", vec!["a".into()])),
            expect: "tool:a".parse().expect("parses"),
            origin: Origin { kind: "manual".into(), ..Origin::default() },
            recorded: vec![serde_json::json!({"stop_reason": "tool_use", "content": []})],
        };
        assert_eq!(parse_jsonl(&to_jsonl(std::slice::from_ref(&case))).expect("parses"), vec![case.clone()]);
        assert_eq!(Case::from_row(&case.to_row()).expect("parses"), case);
    }
}
