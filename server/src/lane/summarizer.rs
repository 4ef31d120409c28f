//! The result summarizer (seed §10): one tool result into a short WhatsApp reply, by
//! `models.summarizer` with `lane.summarizer_prompt`, or without a model when that fails.
//!
//! What the model is given is cleaned first: fields Gatehouse fills (managed and secret ones),
//! fields whose names look secret, and values that identify the chat are removed, and the rest
//! goes in as untrusted data ([`super::data`]); the call's arguments are never sent. What comes
//! back is made plain text and bounded; a partial result always gets `lane.partial_note`, and
//! when the summary keeps none of the result's sources (its URLs), the first few are added under
//! `lane.sources_label`. A
//! failed or timed-out call never reaches a model: its reply is the configured one, so nothing
//! is claimed that did not happen.

use std::{collections::BTreeSet, sync::Arc};

use serde::Serialize;
use serde_json::{Value, json};

use super::data;
use crate::{
    config::{LaneSettings, Settings},
    llm::{ChatModel, ChatRequest, Message, Purpose, StopReason},
    redact,
    tools::ToolDef,
};

/// What became of the call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolResult {
    Complete(Value),
    /// Known to be incomplete (cut to size, some sources missing). A result whose top level
    /// says `"truncated": true` counts as partial even when given as complete.
    Partial(Value),
    TimedOut,
    Failed { code: String },
}

#[derive(Debug, Clone)]
pub struct SummaryInput {
    pub correlation_id: String,
    /// The person's message: untrusted data, so the summary answers what was asked.
    pub request: String,
    /// The tool's name, as the data block's label; never shown to the person.
    pub tool: String,
    pub result: ToolResult,
    /// Result fields never shown (at any depth): the tool's managed and secret fields.
    pub hidden_fields: Vec<String>,
    /// Values never shown wherever they appear (the chat id, the sender).
    pub hidden_values: Vec<String>,
    /// The tool's own answer for a complete result (`answer_template`), sent instead of a
    /// summary when every value it names is there.
    pub answer_template: Option<String>,
}

impl SummaryInput {
    /// An input for `tool`'s result, hiding its managed and secret fields.
    pub fn new(correlation_id: &str, request: &str, tool: &ToolDef, result: ToolResult) -> Self {
        let spec = &tool.spec;
        let hidden_fields = spec.hidden_fields();
        Self { correlation_id: correlation_id.into(), request: request.into(), tool: spec.name.clone(), result, hidden_fields, hidden_values: Vec::new(), answer_template: spec.answer_template.clone() }
    }
}

/// What wrote a reply to a call's result: the trace says it, so that an answer written
/// without the model is not read as the model's failure, nor a fallback as the model's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Writer {
    /// `models.summarizer`.
    Model,
    /// The tool's `answer_template`: the owner's words, no model call.
    AnswerTemplate,
    /// The kept fields listed without a model, when the model's summary could not be used
    /// (`Summary::fallback_code` says why).
    Fallback,
    /// The lane's configured text for a call that failed, timed out or was not run.
    LaneText,
}

impl Writer {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub text: String,
    pub by: Writer,
    /// Why no model summary was used (an `LLM_*` or `SUMMARY_*` code), when one was tried.
    pub fallback_code: Option<String>,
}

/// Most items the summary made without a model lists.
const MAX_FALLBACK_ITEMS: usize = 5;
/// Most characters of one value in the summary made without a model.
const MAX_FALLBACK_VALUE_CHARS: usize = 300;

pub struct Summarizer {
    model: Arc<dyn ChatModel>,
    settings: Arc<Settings>,
}

impl std::fmt::Debug for Summarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Summarizer").field("provider", &self.model.provider()).finish_non_exhaustive()
    }
}

impl Summarizer {
    pub fn new(model: Arc<dyn ChatModel>, settings: Arc<Settings>) -> Self {
        Self { model, settings }
    }

    /// The reply for a call that failed or timed out, which needs neither the tool nor a model.
    pub fn without_tool(&self, result: &ToolResult) -> String {
        let lane = &self.settings.lane;
        let text = if matches!(result, ToolResult::TimedOut) { &lane.timed_out_reply } else { &lane.failed_reply };
        data::plain_text(text, lane.summary_max_chars as usize)
    }

    /// Never fails: without a usable model answer the reply is made from the result itself.
    pub async fn summarize(&self, input: &SummaryInput) -> Summary {
        let lane = &self.settings.lane;
        let max = lane.summary_max_chars as usize;
        let (value, partial) = match &input.result {
            ToolResult::Failed { .. } => return Summary { text: data::plain_text(&lane.failed_reply, max), by: Writer::LaneText, fallback_code: None },
            ToolResult::TimedOut => return Summary { text: data::plain_text(&lane.timed_out_reply, max), by: Writer::LaneText, fallback_code: None },
            ToolResult::Complete(v) => (v, v.get("truncated") == Some(&Value::Bool(true))),
            ToolResult::Partial(v) => (v, true),
        };
        let cleaned = clean(value, input);
        // The tool's own answer, written by the owner, for a complete result: no model call.
        // Its values are the cleaned result's, and the chat's and sender's numbers are taken out
        // of the whole (a number value is not text `clean` reads). One longer than a reply may
        // be is the summarizer's to write: cut, it could lose the link it ends with.
        if let Some(template) = input.answer_template.as_deref().filter(|_| !partial) {
            let text = crate::tools::answer::render(template, &cleaned, MAX_FALLBACK_VALUE_CHARS).map(|t| data::plain_text(&scrub(&t, &input.hidden_values), usize::MAX));
            match text {
                Some(text) if text.chars().count() <= max => return Summary { text, by: Writer::AnswerTemplate, fallback_code: None },
                _ => tracing::info!(event = "AgentToolAnswerTemplateMissed", correlation_id = %input.correlation_id, tool = %input.tool, "a value the tool's answer_template names is not in the result, or the answer is too long; the summarizer writes the reply"),
            }
        }
        let sources = urls(&cleaned, lane.max_sources as usize);
        let req = self.request(input, &cleaned, partial);
        let answer = match self.model.chat(&req).await {
            Ok(r) if r.stop_reason == StopReason::Refusal => Err("SUMMARY_REFUSED".to_string()),
            Ok(r) => usable(&r.text()).ok_or_else(|| "SUMMARY_UNUSABLE".to_string()),
            Err(e) => Err(e.code.as_str().to_string()),
        };
        let summary = match answer {
            Ok(text) => Summary { text: finish(lane, &text, partial, &sources), by: Writer::Model, fallback_code: None },
            Err(code) => {
                tracing::warn!(event = "AgentToolSummaryFallback", correlation_id = %input.correlation_id, tool = %input.tool, code = %code, "summarized without a model");
                Summary { text: fallback(lane, &cleaned, partial), by: Writer::Fallback, fallback_code: Some(code) }
            }
        };
        Summary { text: scrub(&summary.text, &input.hidden_values), ..summary }
    }

    /// The request [`Summarizer::summarize`] sends: the prompt with the result's status as
    /// runtime facts, and the request and the cleaned result as untrusted data.
    pub fn request(&self, input: &SummaryInput, cleaned: &Value, partial: bool) -> ChatRequest {
        let lane = &self.settings.lane;
        let facts = json!({ "status": if partial { "partial" } else { "complete" }, "now": crate::conversation::clock::facts(&self.settings.conversation.timezone) });
        let user = format!("{}\n\n{}", data::untrusted("request", &input.request), data::untrusted("tool_result", &cleaned.to_string()));
        let mut req = ChatRequest::new(&self.settings.models, Purpose::Summarizer, input.correlation_id.clone(), vec![Message::user(user)])
            .with_system(data::with_facts(&lane.summarizer_prompt, &facts));
        req.max_tokens = Some(lane.summarizer_max_tokens);
        req
    }
}

/// `value` without hidden and secret-looking fields, hidden values, or credentials in URLs.
pub fn clean(value: &Value, input: &SummaryInput) -> Value {
    clean_with(value, &input.hidden_fields, &input.hidden_values)
}

/// [`clean`] for a result read by a model other than the summarizer (a chain's planner):
/// without `hidden_fields` (the tool's managed and secret fields), secret-looking fields,
/// `hidden_values` (the chat id, the sender) or credentials in URLs.
pub fn clean_with(value: &Value, hidden_fields: &[String], hidden_values: &[String]) -> Value {
    fn strip(value: &mut Value, fields: &[String], values: &[String]) {
        match value {
            Value::Object(map) => {
                map.retain(|k, _| !redact::is_secret_name(k) && !fields.iter().any(|h| h.eq_ignore_ascii_case(k)));
                map.values_mut().for_each(|v| strip(v, fields, values));
            }
            Value::Array(items) => {
                items.retain(|v| !v.as_str().is_some_and(|s| values.iter().any(|h| h == s)));
                items.iter_mut().for_each(|v| strip(v, fields, values));
            }
            Value::String(s) => *s = scrub(s, values),
            _ => {}
        }
    }
    let mut value = value.clone();
    strip(&mut value, hidden_fields, hidden_values);
    redact::redact(&mut value);
    value
}

/// `text` with every hidden value removed.
fn scrub(text: &str, hidden: &[String]) -> String {
    hidden.iter().filter(|h| !h.is_empty()).fold(text.to_string(), |acc, h| acc.replace(h.as_str(), ""))
}

/// The model's text, if a person may read it: not empty, and not raw JSON.
fn usable(text: &str) -> Option<String> {
    let trimmed = text.trim();
    let json = (trimmed.starts_with('{') || trimmed.starts_with('[')) && serde_json::from_str::<Value>(trimmed).is_ok();
    (!trimmed.is_empty() && !json).then(|| trimmed.to_string())
}

/// The model's summary, plain and bounded, with the partial note and the sources it left out.
fn finish(lane: &LaneSettings, text: &str, partial: bool, sources: &[String]) -> String {
    let mut tail = String::new();
    if partial && !lane.partial_note.trim().is_empty() {
        tail.push_str("\n\n");
        tail.push_str(lane.partial_note.trim());
    }
    let missing: Vec<&String> = sources.iter().filter(|u| !text.contains(u.as_str())).collect();
    if !sources.is_empty() && missing.len() == sources.len() {
        tail.push_str(&format!("\n\n{}", lane.sources_label.trim()));
        for url in missing {
            tail.push_str(&format!("\n{url}"));
        }
    }
    let max = lane.summary_max_chars as usize;
    let room = max.saturating_sub(tail.chars().count()).max(max / 2);
    data::plain_text(&format!("{}{tail}", data::plain_text(text, room)), max)
}

/// The URLs in `value` (string values that parse as http(s) URLs), in order, once each.
pub fn urls(value: &Value, max: usize) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>, seen: &mut BTreeSet<String>, max: usize) {
        if out.len() >= max {
            return;
        }
        match value {
            Value::String(s) if (s.starts_with("http://") || s.starts_with("https://")) && url::Url::parse(s).is_ok() && seen.insert(s.clone()) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|v| walk(v, out, seen, max)),
            Value::Object(map) => map.values().for_each(|v| walk(v, out, seen, max)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out, &mut BTreeSet::new(), max);
    out
}

/// The summary made without a model: `lane.fallback_intro`, then one line per item (the first
/// array of objects in the result, else the result itself) with the values of
/// `lane.fallback_fields` in that order. Only text, numbers and booleans are shown, each
/// bounded; nothing nested, so no raw JSON.
pub fn fallback(lane: &LaneSettings, cleaned: &Value, partial: bool) -> String {
    let items = items(cleaned);
    let lines: Vec<String> = items
        .iter()
        .take(MAX_FALLBACK_ITEMS)
        .filter_map(|item| {
            let shown: Vec<String> = lane
                .fallback_fields
                .iter()
                .filter_map(|field| item.get(field))
                .filter_map(|v| match v {
                    Value::String(s) => Some(data::plain_text(&s.replace('\n', " "), MAX_FALLBACK_VALUE_CHARS)),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                })
                .filter(|s| !s.is_empty())
                .collect();
            (!shown.is_empty()).then(|| format!("- {}", shown.join(" — ")))
        })
        .collect();
    let mut text = if lines.is_empty() { lane.unreadable_reply.trim().to_string() } else { format!("{}\n{}", lane.fallback_intro.trim(), lines.join("\n")) };
    if partial && !lane.partial_note.trim().is_empty() {
        text.push_str("\n\n");
        text.push_str(lane.partial_note.trim());
    }
    data::plain_text(&text, lane.summary_max_chars as usize)
}

/// The objects a result lists: itself when it is an array, else its first field (depth first,
/// in key order) that holds an array of objects, else the result as one item.
fn items(value: &Value) -> Vec<&serde_json::Map<String, Value>> {
    fn find(value: &Value, depth: usize) -> Option<Vec<&serde_json::Map<String, Value>>> {
        match value {
            Value::Array(items) => {
                let objects: Vec<_> = items.iter().filter_map(Value::as_object).collect();
                (!objects.is_empty()).then_some(objects)
            }
            Value::Object(map) if depth < 4 => map.values().find_map(|v| find(v, depth + 1)),
            _ => None,
        }
    }
    find(value, 0).or_else(|| value.as_object().map(|m| vec![m])).unwrap_or_default()
}
