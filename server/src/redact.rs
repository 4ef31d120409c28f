//! Redaction: what is shown or stored of arguments (job arguments on the console, tool-call
//! arguments in the audit) has its secrets and personal data replaced, at any depth. Fields
//! whose names look secret are always replaced; a tool's declared secret fields and the
//! catalog's personal-data fields are replaced by name.

use serde_json::Value;

const SECRET_WORDS: [&str; 14] = [
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "token",
    "api_key",
    "apikey",
    "access_key",
    "private_key",
    "auth",
    "cookie",
    "credential",
    "signature",
];

pub const REDACTED: &str = "[REDACTED]";

pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('-', "_");
    SECRET_WORDS.iter().any(|w| lower.contains(w))
}

/// Replaces secret-named fields at any depth and a URL's password. For tool results, which a
/// customer's answer is written from: a signed link in a result stays usable.
pub fn redact(value: &mut Value) {
    redact_in(value, Urls::PasswordOnly);
}

/// [`redact`], and in URLs also a token given as the only user part and the values of
/// secret-named query parameters. For arguments kept on record or shown (the audit, a trace's
/// planner step, an approval's display, a job's arguments), where nothing needs the link to work.
pub fn redact_args(value: &mut Value) {
    redact_in(value, Urls::AllCredentials);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Urls {
    PasswordOnly,
    AllCredentials,
}

fn redact_in(value: &mut Value, urls: Urls) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_secret_name(k) {
                    *v = Value::String(REDACTED.into());
                } else {
                    redact_in(v, urls);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_in(v, urls)),
        Value::String(s) => {
            if let Some(url) = redacted_url(s, urls) {
                *s = url;
            }
        }
        _ => {}
    }
}

/// Whether a query parameter's name looks secret. `auth` alone is too short a word here:
/// `author` and `authuser` are not credentials.
fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('-', "_");
    SECRET_WORDS.iter().filter(|w| **w != "auth").any(|w| lower.contains(w)) || lower == "auth" || lower.ends_with("_auth") || lower == "authorization"
}

/// `text` without the credentials it carries when it is a URL: a password
/// (`https://user:pass@host/`), and with [`Urls::AllCredentials`] a token as the only user part
/// of a web URL (`https://ghp_x@github.com/`) and the values of query parameters whose names look
/// secret (`?api_key=...`, `&access_token=...`). `None` when there is nothing to replace.
fn redacted_url(text: &str, urls: Urls) -> Option<String> {
    let mut url = url::Url::parse(text).ok()?;
    if !url.has_host() {
        return None;
    }
    let mut changed = false;
    if url.password().is_some() {
        let _ = url.set_password(Some(REDACTED));
        changed = true;
    }
    if urls == Urls::PasswordOnly {
        return changed.then(|| url.to_string());
    }
    // `ssh://git@host/` names an account, not a secret; a web URL's lone user part is a token.
    if !changed && !url.username().is_empty() && matches!(url.scheme(), "http" | "https") {
        let _ = url.set_username(REDACTED);
        changed = true;
    }
    if url.query_pairs().any(|(k, _)| is_secret_param(&k)) {
        let pairs: Vec<(String, String)> = url.query_pairs().map(|(k, v)| if is_secret_param(&k) { (k.into_owned(), REDACTED.to_string()) } else { (k.into_owned(), v.into_owned()) }).collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
        changed = true;
    }
    changed.then(|| url.to_string())
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
            redact_args(&mut v);
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

    /// In arguments on record, a URL's credentials are replaced however they are carried: a
    /// password, a token as the only user part, a secret-named query parameter; the rest of the
    /// URL stays readable. In a result, a signed link stays usable.
    #[test]
    fn credentials_in_urls_are_replaced() {
        let mut v = serde_json::json!({
            "a": "https://api.example.com/v1/items?q=shoes&api_key=k_live_1&page=2",
            "b": "https://ghp_tok3n@github.com/acme/repo.git",
            "c": "https://shop.example/orders?access_token=at_9&X-Amz-Signature=s1g",
            "d": "https://shop.example/orders?order=4821",
            "e": "not a url ?api_key=x",
            "f": "https://blog.example/posts?author=ana&authuser=1",
            "g": "ssh://git@github.com/acme/repo.git",
            "passphrase": "open sesame",
        });
        let mut result = v.clone();
        redact_args(&mut v);
        let out = v.to_string();
        for secret in ["k_live_1", "ghp_tok3n", "at_9", "s1g", "open sesame"] {
            assert!(!out.contains(secret), "{secret} kept: {out}");
        }
        assert!(out.contains("q=shoes") && out.contains("page=2") && out.contains("github.com/acme/repo.git"), "{out}");
        assert_eq!(v["d"], "https://shop.example/orders?order=4821", "a URL without credentials is left as written");
        assert_eq!(v["e"], "not a url ?api_key=x");
        assert_eq!(v["f"], "https://blog.example/posts?author=ana&authuser=1", "an author is not a credential");
        assert_eq!(v["g"], "ssh://git@github.com/acme/repo.git", "an ssh account name is not a secret");

        redact(&mut result);
        assert_eq!(result["c"], "https://shop.example/orders?access_token=at_9&X-Amz-Signature=s1g", "a result's signed link keeps working");
        assert_eq!(result["passphrase"], REDACTED);
    }
}
