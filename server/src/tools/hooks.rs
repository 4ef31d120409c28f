//! Hooks declared in `config/tools.toml`, run by the checkpoint in priority order (lower first):
//!
//! - `before_tool_call`, after the policy decision and before the circuit breaker:
//!   `deny_pattern` aborts the call when its pattern matches the arguments (their JSON, and each
//!   URL among them as it will be fetched, decoded);
//!   `require_approval_if` makes the call wait for an owner when it matches;
//!   `redact` replaces matches inside string arguments (the changed arguments are validated
//!   against the schema again).
//! - `after_tool_call`: `redact` replaces matches inside string values of the result.
//! - `on_error`, when a call is denied or fails: matched against `CODE: message`.
//!
//! `notify_owner` works at every point: when its pattern matches (the arguments, the result or
//! the error), owners get a notice naming the hook, the tool and the outcome (never the
//! arguments), or the hook's message as written when it names `{tool}` or `{code}`; the call
//! goes on unchanged.
//!
//! A hook that aborts gives a reason code that reaches the audit.

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    BeforeToolCall,
    AfterToolCall,
    OnError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookKind {
    DenyPattern,
    RequireApprovalIf,
    Redact,
    NotifyOwner,
}

/// A hook as written in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    pub name: String,
    pub point: HookPoint,
    pub kind: HookKind,
    #[serde(default)]
    pub priority: i64,
    /// Tool names it applies to; `["*"]` for all.
    pub tools: Vec<String>,
    /// A regular expression.
    pub pattern: String,
    /// For `redact`: the replacement text.
    #[serde(default = "default_replacement")]
    pub replacement: String,
    /// For `notify_owner`: what the owner is told, before the tool and outcome; or the whole
    /// notice when it names `{tool}` or `{code}` ([`HookSpec::notice`]).
    #[serde(default)]
    pub message: String,
}

/// What a `notify_owner` message may name: the tool, and the call's code (`OK`, or why it was
/// refused or failed).
const NOTICE_PLACEHOLDERS: [&str; 2] = ["{tool}", "{code}"];

impl HookSpec {
    /// Why this hook cannot work as written, if it cannot.
    pub fn problem(&self) -> Option<&'static str> {
        match (self.point, self.kind) {
            (HookPoint::OnError, HookKind::NotifyOwner) | (HookPoint::BeforeToolCall, _) | (HookPoint::AfterToolCall, HookKind::Redact | HookKind::NotifyOwner) => None,
            (HookPoint::OnError, _) => Some("on_error hooks can only be notify_owner"),
            (HookPoint::AfterToolCall, _) => Some("after_tool_call hooks can only be redact or notify_owner"),
        }
    }

    /// Why this hook's `message` cannot work as written: it names a placeholder (a word in
    /// braces) other than `{tool}` and `{code}`, which would reach owners as typed. Other braces
    /// ("Order {#}") are text.
    pub fn message_problem(&self) -> Option<&'static str> {
        static PLACEHOLDER: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| Regex::new(r"\{[A-Za-z_][A-Za-z0-9_]*\}").expect("a valid pattern"));
        let unknown = PLACEHOLDER.find_iter(&self.message).any(|m| !NOTICE_PLACEHOLDERS.contains(&m.as_str()));
        (self.kind == HookKind::NotifyOwner && unknown).then_some("may name {tool} and {code} only")
    }

    /// The owners' notice for a call of `tool` that ended with `code` (`OK` when it succeeded).
    /// A message naming `{tool}` or `{code}` is the whole notice, in the deployment's words;
    /// another leads (or the hook's name does), and the tool and its outcome follow.
    pub fn notice(&self, tool: &str, code: &str) -> String {
        let message = self.message.trim();
        if NOTICE_PLACEHOLDERS.iter().any(|p| message.contains(p)) {
            return message.replace("{code}", code).replace("{tool}", tool);
        }
        let lead = if message.is_empty() { format!("Hook {}", self.name) } else { message.to_string() };
        if code == "OK" { format!("{lead}: {tool} succeeded.") } else { format!("{lead}: {tool} ended with {code}.") }
    }
}

fn default_replacement() -> String {
    "[REDACTED]".into()
}

#[derive(Debug, Clone)]
pub struct Hook {
    pub spec: HookSpec,
    pub regex: Regex,
}

impl Hook {
    pub fn applies_to(&self, tool: &str) -> bool {
        self.spec.tools.iter().any(|t| t == "*" || t == tool)
    }
}

/// What the before-call hooks decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Before {
    /// The call may go on with `args` (changed by redaction when `changed`); `approval` names
    /// the first hook that asks for an owner. Every hook is run either way: one that asks for an
    /// owner neither skips a later refusal nor a later redaction.
    Proceed { args: Value, changed: bool, approval: Option<String> },
    Abort { hook: String },
}

fn redact_strings(value: &mut Value, regex: &Regex, replacement: &str) -> bool {
    match value {
        Value::String(s) => {
            let replaced = regex.replace_all(s, replacement);
            if replaced != s.as_str() {
                *s = replaced.into_owned();
                return true;
            }
            false
        }
        // Every element is visited (no short circuit): all matches are replaced.
        Value::Array(items) => items.iter_mut().map(|v| redact_strings(v, regex, replacement)).fold(false, |a, b| a | b),
        Value::Object(map) => map.values_mut().map(|v| redact_strings(v, regex, replacement)).fold(false, |a, b| a | b),
        _ => false,
    }
}

/// What a before-call hook's pattern is matched against: the arguments as JSON, then a line
/// with each URL among them as it will be fetched, decoded (`http://intr%61net.local/` and
/// `http://ＩＮＴＲＡＮＥＴ.local/` are `http://intranet.local/`), so a pattern that refuses a
/// host cannot be passed by spelling the host another way.
fn match_text(args: &Value) -> String {
    fn urls(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => {
                if let Ok(url) = url::Url::parse(s.trim())
                    && url.has_host()
                {
                    out.push(percent_encoding::percent_decode_str(url.as_str()).decode_utf8_lossy().into_owned());
                }
            }
            Value::Array(items) => items.iter().for_each(|v| urls(v, out)),
            Value::Object(map) => map.values().for_each(|v| urls(v, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    urls(args, &mut found);
    let mut text = args.to_string();
    for url in found {
        text.push('\n');
        text.push_str(&url);
    }
    text
}

/// Runs the before-call hooks for `tool` on `args`, in priority order. `notify_owner` hooks
/// that matched are added to `notify`.
pub fn before<'h>(hooks: &'h [Hook], tool: &str, args: &Value, notify: &mut Vec<&'h Hook>) -> Before {
    let mut args = args.clone();
    let mut changed = false;
    let mut approval = None;
    // Made when a pattern is first matched, and again after a redaction changed the arguments.
    let mut text: Option<String> = None;
    for hook in hooks.iter().filter(|h| h.spec.point == HookPoint::BeforeToolCall && h.applies_to(tool)) {
        match hook.spec.kind {
            HookKind::DenyPattern if hook.regex.is_match(text.get_or_insert_with(|| match_text(&args))) => return Before::Abort { hook: hook.spec.name.clone() },
            HookKind::RequireApprovalIf if hook.regex.is_match(text.get_or_insert_with(|| match_text(&args))) => {
                approval.get_or_insert_with(|| hook.spec.name.clone());
            }
            HookKind::Redact if redact_strings(&mut args, &hook.regex, &hook.spec.replacement) => {
                changed = true;
                text = None;
            }
            HookKind::NotifyOwner if hook.regex.is_match(text.get_or_insert_with(|| match_text(&args))) => notify.push(hook),
            _ => {}
        }
    }
    Before::Proceed { args, changed, approval }
}

/// Applies the before-call `redact` hooks for `tool` to `args`, so that what is kept of a call
/// (its audit row) holds no more than the tool was given.
pub fn redact_as_before(hooks: &[Hook], tool: &str, args: &mut Value) {
    for hook in hooks.iter().filter(|h| h.spec.point == HookPoint::BeforeToolCall && h.spec.kind == HookKind::Redact && h.applies_to(tool)) {
        redact_strings(args, &hook.regex, &hook.spec.replacement);
    }
}

/// Runs the after-call hooks for `tool` on its output.
pub fn after<'h>(hooks: &'h [Hook], tool: &str, output: &mut Value, notify: &mut Vec<&'h Hook>) {
    for hook in hooks.iter().filter(|h| h.spec.point == HookPoint::AfterToolCall && h.applies_to(tool)) {
        match hook.spec.kind {
            HookKind::Redact => {
                redact_strings(output, &hook.regex, &hook.spec.replacement);
            }
            HookKind::NotifyOwner if hook.regex.is_match(&output.to_string()) => notify.push(hook),
            _ => {}
        }
    }
}

/// The `on_error` hooks for `tool` whose pattern matches `CODE: message`.
pub fn on_error<'h>(hooks: &'h [Hook], tool: &str, code: &str, message: &str, notify: &mut Vec<&'h Hook>) {
    let text = format!("{code}: {message}");
    notify.extend(hooks.iter().filter(|h| h.spec.point == HookPoint::OnError && h.applies_to(tool) && h.regex.is_match(&text)));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hook(name: &str, point: HookPoint, kind: HookKind, priority: i64, pattern: &str) -> Hook {
        Hook {
            spec: HookSpec { name: name.into(), point, kind, priority, tools: vec!["*".into()], pattern: pattern.into(), replacement: "[CARD]".into(), message: String::new() },
            regex: Regex::new(pattern).expect("regex"),
        }
    }

    #[test]
    fn order_abort_approval_and_redaction() {
        let redact = hook("cards", HookPoint::BeforeToolCall, HookKind::Redact, 1, r"\b\d{4}(?: ?\d{4}){3}\b");
        let deny = hook("no-intranet", HookPoint::BeforeToolCall, HookKind::DenyPattern, 2, r"(?i)intranet");
        let approval = hook("big-refund", HookPoint::BeforeToolCall, HookKind::RequireApprovalIf, 3, r#""amount":\s*\d{4,}"#);
        let notify = hook("tell", HookPoint::BeforeToolCall, HookKind::NotifyOwner, 0, "please");
        let hooks = vec![notify, redact, deny, approval];
        let mut told = Vec::new();
        assert_eq!(before(&hooks, "t", &json!({"url": "http://intranet.local"}), &mut told), Before::Abort { hook: "no-intranet".into() });
        // The host spelled another way is the same host.
        for spelled in ["http://intr%61net.local/", "http://ｉｎｔｒａｎｅｔ.local/", "http://intranet%2Elocal/"] {
            assert_eq!(before(&hooks, "t", &json!({"url": spelled}), &mut told), Before::Abort { hook: "no-intranet".into() }, "{spelled}");
        }
        assert_eq!(before(&hooks, "t", &json!({"amount": 12000}), &mut told), Before::Proceed { args: json!({"amount": 12000}), changed: false, approval: Some("big-refund".into()) });
        assert!(told.is_empty(), "nothing matched the notify pattern yet");
        match before(&hooks, "t", &json!({"note": "card 4111 1111 1111 1111 please"}), &mut told) {
            Before::Proceed { args, changed, approval } => {
                assert!(changed && approval.is_none());
                assert_eq!(args, json!({"note": "card [CARD] please"}));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(told.iter().map(|h| h.spec.name.as_str()).collect::<Vec<_>>(), ["tell"]);
        // A hook that asks for an owner stops no later hook: a later refusal still refuses, and
        // a later redaction still masks what the call will be given once approved.
        let after_approval = vec![
            hook("big-refund", HookPoint::BeforeToolCall, HookKind::RequireApprovalIf, 1, r"\d{6,}"),
            hook("no-intranet", HookPoint::BeforeToolCall, HookKind::DenyPattern, 2, r"(?i)intranet"),
            hook("cards", HookPoint::BeforeToolCall, HookKind::Redact, 3, r"\d"),
        ];
        assert_eq!(before(&after_approval, "t", &json!({"note": "1234567 intranet"}), &mut told), Before::Abort { hook: "no-intranet".into() });
        assert_eq!(
            before(&after_approval, "t", &json!({"note": "order 1234567"}), &mut told),
            Before::Proceed { args: json!({"note": "order [CARD][CARD][CARD][CARD][CARD][CARD][CARD]"}), changed: true, approval: Some("big-refund".into()) }
        );
        let mut out = json!({"text": "call 4111111111111111"});
        after(&[hook("out", HookPoint::AfterToolCall, HookKind::Redact, 0, r"\d{16}")], "t", &mut out, &mut told);
        assert_eq!(out, json!({"text": "call [CARD]"}));
        let mut errors = Vec::new();
        let on_timeout = [hook("timeouts", HookPoint::OnError, HookKind::NotifyOwner, 0, "^TOOL_TIMEOUT")];
        on_error(&on_timeout, "t", "TOOL_SCHEMA_INVALID", "bad", &mut errors);
        assert!(errors.is_empty());
        on_error(&on_timeout, "t", "TOOL_TIMEOUT", "no answer", &mut errors);
        assert_eq!(errors.len(), 1);
    }
}
