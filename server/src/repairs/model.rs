//! The repair model (`models.repair`): for a failing case that no deterministic edit fixes, the
//! model is shown the case and the entries of the tools involved and may propose one edit of a
//! key a repair may touch ([`KEYS`]). Its answer is a proposal like any other: the key and the
//! tool are checked here, the file is checked as `check-config` checks it, every case is
//! replayed, and only an owner applies it. The person's message is untrusted data in the prompt.

use serde_json::{Value, json};
use toml_edit::{DocumentMut, Item};

use super::strategies::{Edit, KEYS};
use crate::{
    config::Settings,
    evals::{Case, CaseResult},
    lane::data,
    llm::{ChatModel, ChatRequest, ContentBlock, Message, Purpose, ToolChoice, ToolSpec},
};

/// Longest value the model may propose.
const MAX_VALUE_CHARS: usize = 300;

/// A tool's entry as the model is shown it: only the keys that describe it.
fn entry(doc: &DocumentMut, tool: &str) -> Option<Value> {
    let table = doc.get("tool")?.as_array_of_tables()?.iter().find(|t| t.get("name").and_then(Item::as_str) == Some(tool))?;
    let text = |k: &str| table.get(k).and_then(Item::as_str).unwrap_or_default().to_string();
    let list = |k: &str| table.get(k).and_then(Item::as_array).map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect::<Vec<_>>()).unwrap_or_default();
    Some(json!({
        "name": tool,
        "description": text("description"),
        "when_to_use": text("when_to_use"),
        "when_not_to_use": text("when_not_to_use"),
        "aliases": list("aliases"),
        "triggers": list("triggers"),
    }))
}

/// The tools the case is about: those expected, then those the replay saw, declared in the file.
fn involved(case: &Case, result: &CaseResult, declared: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let crate::evals::Expect::Tool { tools, .. } = &case.expect {
        names.extend(tools.iter().cloned());
    }
    names.extend(result.detector.observed.candidates.iter().take(3).cloned());
    if let Some(plan) = &result.plan {
        names.extend(plan.observed.tools.iter().cloned());
    }
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if declared.contains(&n) && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// Asks the repair model for one edit for `case`; `None` when it has none, answers with
/// something else, or names a tool or key it may not touch (logged, never applied).
pub async fn suggest(model: &dyn ChatModel, settings: &Settings, case: &Case, result: &CaseResult, tools_toml: &str, declared: &[String]) -> Option<Edit> {
    let doc = tools_toml.parse::<DocumentMut>().ok()?;
    let tools = involved(case, result, declared);
    if tools.is_empty() {
        return None;
    }
    let entries: Vec<Value> = tools.iter().filter_map(|t| entry(&doc, t)).collect();
    let level = result.plan.as_ref().unwrap_or(&result.detector);
    let facts = json!({ "expect": case.expect.to_string(), "actor": case.actor.as_str(), "chat": case.chat_type.as_str(), "what_happened": level.observed.brief(), "why_it_failed": level.why });
    let user = [data::untrusted("message", &case.message), data::untrusted("tool_entries", &serde_json::to_string_pretty(&entries).unwrap_or_default())].join("\n\n");
    let schema = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["tool", "key", "value"],
        "properties": {
            "tool": { "type": "string", "enum": tools },
            "key": { "type": "string", "enum": KEYS },
            "value": { "type": "string", "maxLength": MAX_VALUE_CHARS },
        },
    });
    // The tool the model answers through is named in config (`evals.repair_tool`).
    let evals = &settings.evals;
    let spec = ToolSpec { name: evals.repair_tool.clone(), description: evals.repair_tool_description.trim().to_string(), input_schema: schema, strict: model.supports_strict_tools() };
    let system = evals.repair_prompt.replace("{repair_tool}", &evals.repair_tool);
    let mut req = ChatRequest::new(&settings.models, Purpose::Repair, format!("repair-{}", case.name), vec![Message::user(user)])
        .with_system(data::with_facts(&system, &facts))
        .with_tools(vec![spec], ToolChoice::Tool(evals.repair_tool.clone()));
    req.max_tokens = Some(evals.repair_max_tokens);
    let response = match model.chat(&req).await {
        Ok(r) => r,
        Err(e) if e.code == crate::llm::ErrorCode::NotConfigured => return None,
        Err(e) => {
            tracing::warn!(case = %case.name, code = e.code.as_str(), "the repair model failed; no model proposal for this case");
            return None;
        }
    };
    let input = response.content.iter().find_map(|b| match b {
        ContentBlock::ToolUse { name, input, .. } if *name == evals.repair_tool => Some(input.clone()),
        _ => None,
    })?;
    let field = |k: &str| input.get(k).and_then(Value::as_str).map(str::trim).unwrap_or_default().to_string();
    let (tool, key, value) = (field("tool"), field("key"), field("value"));
    let Some(key) = KEYS.iter().find(|k| **k == key) else {
        tracing::warn!(case = %case.name, key = %data::cut(&key, 40), "the repair model named a key a repair may not touch; ignored");
        return None;
    };
    if !tools.contains(&tool) || value.is_empty() || value.chars().count() > MAX_VALUE_CHARS {
        tracing::warn!(case = %case.name, "the repair model named a tool it was not shown, or no value; ignored");
        return None;
    }
    let phrase = data::plain_text(&value, MAX_VALUE_CHARS);
    if matches!(*key, "triggers" | "aliases") && !super::strategies::fits_as_trigger(&phrase) {
        tracing::warn!(case = %case.name, "the repair model's trigger is not words of a request (a filler word, a number or an address); ignored");
        return None;
    }
    Some(Edit { strategy: "model", tool, key, phrase })
}
