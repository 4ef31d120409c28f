//! What the detector is given: the tools as [`ToolDoc`]s, who asks where, and the chat's recent
//! tool contexts.

use serde::{Deserialize, Serialize};

/// A tool as the detector sees it. The caller fills it from the catalog: built-in, connector and
/// MCP tools alike. Tools that are disabled, quarantined or rejected get `enabled: false` (or are
/// left out): they are never indexed.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ToolDoc {
    pub name: String,
    pub title: String,
    pub description: String,
    pub when_to_use: String,
    pub when_not_to_use: String,
    pub aliases: Vec<String>,
    pub triggers: Vec<String>,
    pub tags: Vec<String>,
    pub params: Vec<ParamDoc>,
    /// Owner-only tools are never candidates for customers.
    pub owner_only: bool,
    /// Chats where the tool may be used; empty means every kind.
    pub chat_types: Vec<ChatKind>,
    /// Defaults to true.
    pub enabled: bool,
    /// The tool's own plan threshold (tools.toml `plan_threshold`): when it is the best
    /// candidate, the message plans from this confidence instead of `[lane.detector]
    /// plan_threshold`.
    pub plan_threshold: Option<f32>,
}

impl Default for ToolDoc {
    fn default() -> Self {
        Self {
            name: String::new(),
            title: String::new(),
            description: String::new(),
            when_to_use: String::new(),
            when_not_to_use: String::new(),
            aliases: Vec::new(),
            triggers: Vec::new(),
            tags: Vec::new(),
            params: Vec::new(),
            owner_only: false,
            chat_types: Vec::new(),
            enabled: true,
            plan_threshold: None,
        }
    }
}

/// One input parameter of a tool.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct ParamDoc {
    pub name: String,
    pub description: String,
}

impl ParamDoc {
    /// The parameters of a JSON schema: every property, nested objects and array items included
    /// (as `parent.child`), with its description (or title).
    pub fn from_schema(schema: &serde_json::Value) -> Vec<ParamDoc> {
        let mut params = Vec::new();
        collect_params(schema, "", &mut params, 0);
        params
    }
}

fn collect_params(schema: &serde_json::Value, prefix: &str, out: &mut Vec<ParamDoc>, depth: usize) {
    if depth > 4 {
        return;
    }
    if let Some(items) = schema.get("items") {
        collect_params(items, prefix, out, depth + 1);
    }
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (name, property) in properties {
        let text = |key: &str| {
            property
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
        };
        let description = if text("description").is_empty() {
            text("title")
        } else {
            text("description")
        };
        let mut description = description.to_owned();
        if let Some(values) = property.get("enum").and_then(|v| v.as_array()) {
            for value in values.iter().filter_map(|v| v.as_str()) {
                description.push(' ');
                description.push_str(value);
            }
        }
        let full = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        out.push(ParamDoc {
            name: full.clone(),
            description,
        });
        collect_params(property, &full, out, depth + 1);
    }
}

pub use crate::domain::{ChatKind, Role};

/// A recent tool result of this chat, newest first, as the tool context store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecentContext {
    pub id: Option<String>,
    pub tool: String,
    pub args: serde_json::Value,
    pub summary: String,
    /// Names, places, links and titles in the result that a follow-up may refer to.
    pub entities: Vec<String>,
    pub age_secs: u64,
}
