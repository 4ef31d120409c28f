//! A tool's own answer (`answer_template` in tools.toml): the reply to a complete result,
//! written by the owner, sent as written with the result's values in it, instead of a
//! summary the summarizer model writes. An order's status or a booking's confirmation so
//! reads the same every time, and costs no model call.
//!
//! `{field}` is that value of the result, `{a.b}` one inside it and `{items.0.title}` one in a
//! list; `{{` and `}}` are braces. A value must be a plain one (text, a number, true or
//! false): one missing, empty, not plain, or redacted leaves the reply to the summarizer. A
//! value is the result's, untrusted: it is shown on one line, at most `max_value_chars`
//! long, so it cannot start a paragraph of its own in the owner's voice. The values are
//! read from the result as cleaned for the summarizer (no managed or secret fields, no
//! secret-looking ones, nor the chat's or sender's number), and shown as plain text. A
//! connector's result is its HTTP status and, under `data`, the JSON it answered.

use serde_json::Value;

/// One piece of a template: text as written, or the path of a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Value(Vec<String>),
}

/// `template` in pieces, or what is wrong with it: an unclosed `{`, a lone `}`, an empty
/// `{}`, or a path with an empty step.
pub fn parse(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut path = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some('{') => return Err(format!("a {{ inside {{{path}: write {{{{ for a brace")),
                        Some(c) => path.push(c),
                        None => return Err(format!("{{{path} is not closed with }}")),
                    }
                }
                let steps: Vec<String> = path.trim().split('.').map(|s| s.trim().to_string()).collect();
                if steps.iter().any(String::is_empty) {
                    return Err(format!("{{{path}}} is not a field: write {{name}}, {{a.b}} or {{items.0.title}}"));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Value(steps));
            }
            '}' => return Err("a lone } : write }} for a brace".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The paths a template names (`["order", "id"]` of `{order.id}`).
pub fn paths(template: &str) -> Vec<Vec<String>> {
    parse(template).unwrap_or_default().into_iter().filter_map(|p| if let Piece::Value(steps) = p { Some(steps) } else { None }).collect()
}

/// `template` with `result`'s values in it, each on one line and at most `max_value_chars`
/// long; `None` when it does not parse, or a value it names is missing, empty, not plain, or
/// holds a redaction (a credential was cut out of it: a link so left would not work).
pub fn render(template: &str, result: &Value, max_value_chars: usize) -> Option<String> {
    let mut out = String::new();
    for piece in parse(template).ok()? {
        match piece {
            Piece::Text(t) => out.push_str(&t),
            Piece::Value(steps) => {
                let mut at = result;
                for step in &steps {
                    at = match at {
                        Value::Object(map) => map.get(step)?,
                        Value::Array(items) => items.get(step.parse::<usize>().ok()?)?,
                        _ => return None,
                    };
                }
                let shown = match at {
                    Value::String(s) => one_line(s, max_value_chars),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => return None,
                };
                if shown.is_empty() || shown.contains(crate::redact::REDACTED) {
                    return None;
                }
                out.push_str(&shown);
            }
        }
    }
    Some(out)
}

/// `text` on one line (every kind of line break a space, runs of white space one), at most
/// `max` characters, cut with an ellipsis.
fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        return line;
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_fill_the_template_and_braces_can_be_written() {
        let result = json!({ "id": "4821", "status": "shipped", "eta": { "days": 2 }, "items": [{ "title": "Mug" }], "paid": true });
        assert_eq!(render("Order {id}: {status}, {eta.days} days. {items.0.title}; paid: {paid} {{ok}}", &result, 300).as_deref(), Some("Order 4821: shipped, 2 days. Mug; paid: true {ok}"));
        assert_eq!(paths("Order {id} {eta.days} {{x}}"), vec![vec!["id".to_string()], vec!["eta".to_string(), "days".to_string()]]);
    }

    /// A value is the result's: it cannot open a paragraph of its own in the owner's words, nor
    /// run on for ever.
    #[test]
    fn a_value_stays_on_its_line_and_within_its_length() {
        let result = json!({ "status": "shipped\n\nGatehouse: verify your card at https://evil.example\u{2028}now", "long": "x".repeat(50) });
        assert_eq!(render("Status: {status}.", &result, 300).as_deref(), Some("Status: shipped Gatehouse: verify your card at https://evil.example now."));
        assert_eq!(render("{long}", &result, 10).as_deref(), Some("xxxxxxxxx…"));
    }

    #[test]
    fn a_missing_empty_or_composite_value_leaves_it_to_the_summarizer() {
        let result = json!({ "id": "4821", "note": " ", "eta": { "days": 2 }, "gone": null, "items": [], "link": "https://u:[REDACTED]@shop.example/t" });
        for template in ["{missing}", "{note}", "{eta}", "{gone}", "{items.0}", "{id.x}", "{items.x}", "{link}"] {
            assert_eq!(render(template, &result, 300), None, "{template}");
        }
    }

    #[test]
    fn a_malformed_template_is_refused_with_its_reason() {
        for (template, says) in [("Order {id", "is not closed"), ("{}", "is not a field"), ("{a..b}", "is not a field"), ("a } b", "lone }"), ("{a{b}}", "inside")] {
            let err = parse(template).expect_err(template);
            assert!(err.contains(says), "{template}: {err}");
        }
    }
}
