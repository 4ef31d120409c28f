//! Redaction: what is shown or stored of arguments (job arguments on the console, tool-call
//! arguments in the audit) has its secrets and personal data replaced, at any depth. Fields
//! whose names look secret are always replaced; a tool's declared secret fields and the
//! catalog's personal-data fields are replaced by name.

use serde_json::Value;

const SECRET_WORDS: [&str; 12] =
    ["password", "passwd", "pwd", "secret", "token", "api_key", "apikey", "private_key", "auth", "cookie", "credential", "signature"];

pub const REDACTED: &str = "[REDACTED]";

pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('-', "_");
    SECRET_WORDS.iter().any(|w| lower.contains(w))
}

pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_secret_name(k) {
                    *v = Value::String(REDACTED.into());
                } else {
                    redact(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::String(s) => {
            // Credentials inside URLs: https://user:pass@host/...
            if let Ok(mut url) = url::Url::parse(s)
                && url.password().is_some()
            {
                let _ = url.set_password(Some(REDACTED));
                *s = url.to_string();
            }
        }
        _ => {}
    }
}

/// Marks personal data (the catalog's `[audit] pii_fields`) in stored arguments.
pub const PII_REDACTED: &str = "[PII]";
/// Words for a person that a trace does not keep (`conversation.trace_text` off).
pub const TEXT_NOT_KEPT: &str = "[text not kept]";

/// Replaces the values of fields named in `names` (case-insensitive), at any depth, with
/// `marker`.
pub fn redact_named(value: &mut Value, names: &[String], marker: &str) {
    if names.is_empty() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if names.iter().any(|n| n.eq_ignore_ascii_case(k)) {
                    *v = Value::String(marker.into());
                } else {
                    redact_named(v, names, marker);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_named(v, names, marker)),
        _ => {}
    }
}

/// Pretty JSON of `args` with secrets replaced; text that is not JSON is withheld entirely.
pub fn redacted_pretty(args: &str) -> String {
    match serde_json::from_str::<Value>(args) {
        Ok(mut v) => {
            redact(&mut v);
            serde_json::to_string_pretty(&v).unwrap_or_default()
        }
        Err(_) => "(not JSON; withheld)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_secrets_are_replaced() {
        let text = r#"{"url":"https://x","headers":{"Authorization":"Bearer abc","X-Api-Key":"k2"},"items":[{"api_key":"k1","q":"ok"}],"Password":"p","db":"postgres://u:hunter2@h/d"}"#;
        let out = redacted_pretty(text);
        assert!(!out.contains("Bearer abc") && !out.contains("k1") && !out.contains("k2") && !out.contains("\"p\"") && !out.contains("hunter2"), "{out}");
        assert!(out.contains("https://x") && out.contains("\"ok\""), "{out}");
    }
}
