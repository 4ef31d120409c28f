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

/// Names too short to look for inside others (`passenger`), secret when they are the whole name
/// of an argument on record. Not in a tool's result, where `pass` may be a ticket, and not `pin`,
/// which is also a postal code.
const SECRET_ARG_NAMES: [&str; 2] = ["pass", "otp"];

/// Query parameters that are secret by their whole name: Google's `key=` and Azure's `sig=`. A
/// field named `key` is left alone (a lookup key, a storage object's name).
const SECRET_PARAMS: [&str; 2] = ["key", "sig"];

pub const REDACTED: &str = "[REDACTED]";

/// `name` in snake case: `privateKey`, `Private-Key` and `private key` all read `private_key`.
fn snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        out.push(if matches!(c, '-' | ' ' | '.') { '_' } else { c.to_ascii_lowercase() });
    }
    out
}

pub fn is_secret_name(name: &str) -> bool {
    let lower = snake(name);
    SECRET_WORDS.iter().any(|w| lower.contains(w))
}

/// [`is_secret_name`], or a short name secret as an argument's whole name ([`SECRET_ARG_NAMES`]).
fn is_secret_arg_name(name: &str) -> bool {
    is_secret_name(name) || SECRET_ARG_NAMES.contains(&snake(name).as_str())
}

/// Text that is a credential by its form, whatever field holds it: an HTTP authorization value,
/// a scheme and a credential (`Bearer` and a token of 16 or more token characters; `Basic` and
/// base64 of `user:password`). "Basic Monthly" and "Bearer of good news" are not.
fn is_credential_text(text: &str) -> bool {
    let mut words = text.split_whitespace();
    let (scheme, credential) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    if words.next().is_some() {
        return false;
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        credential.len() >= 16 && credential.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
    } else if scheme.eq_ignore_ascii_case("basic") {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(credential).is_ok_and(|decoded| decoded.contains(&b':'))
    } else {
        false
    }
}

/// A `{"name": "Authorization", "value": "…"}` pair (headers, form fields, settings given as a
/// list): the value is secret when the name is a secret's, read as a query parameter's is
/// (`Author` is not one) and without spaces (a header's or a field's, not a product's).
fn names_a_secret(map: &serde_json::Map<String, Value>) -> bool {
    let secret = |name: &str| {
        // `auth` as a word of its own, or a word that begins authorization or authentication
        // (X-Auth-Key, Proxy-Authorization, authKey), never inside another (`author`).
        let words = snake(name);
        is_secret_param(name) || words.split('_').any(|w| w == "auth" || w.starts_with("authoriz") || w.starts_with("authent"))
    };
    ["name", "key", "header", "field"].iter().any(|k| map.get(*k).and_then(Value::as_str).is_some_and(|n| !n.contains(' ') && secret(n)))
}

/// Replaces secret-named fields at any depth and a URL's password. For tool results, which a
/// customer's answer is written from: a signed link in a result stays usable.
pub fn redact(value: &mut Value) {
    redact_in(value, Urls::PasswordOnly, false);
}

/// [`redact_args`] for arguments kept where a link in them must still work (a chat's tool
/// context, whose follow-ups may fetch it again): only a URL's password is replaced.
pub fn redact_args_keeping_links(value: &mut Value) {
    redact_in(value, Urls::PasswordOnly, true);
}

/// [`redact`], and in URLs also a token given as the only user part and the values of
/// secret-named query parameters. For arguments kept on record or shown (the audit, a trace's
/// planner step, an approval's display, a job's arguments), where nothing needs the link to work.
pub fn redact_args(value: &mut Value) {
    redact_in(value, Urls::AllCredentials, true);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Urls {
    PasswordOnly,
    AllCredentials,
}

/// `args`: the value is a call's arguments (not a tool's result, which a customer's answer is
/// written from, and where a {name, value} list is more often a product's attributes).
fn redact_in(value: &mut Value, urls: Urls, args: bool) -> bool {
    match value {
        Value::Object(map) => {
            let paired = args && names_a_secret(map);
            let mut changed = false;
            for (k, v) in map.iter_mut() {
                if (if args { is_secret_arg_name(k) } else { is_secret_name(k) }) || (paired && k == "value") {
                    changed |= v.as_str() != Some(REDACTED);
                    *v = Value::String(REDACTED.into());
                } else {
                    changed |= redact_in(v, urls, args);
                }
            }
            changed
        }
        // Every element is visited (no short circuit).
        Value::Array(items) => items.iter_mut().map(|v| redact_in(v, urls, args)).fold(false, |a, b| a | b),
        Value::String(s) => {
            let replaced = if args && is_credential_text(s) { Some(REDACTED.to_string()) } else { redacted_url(s, urls).or_else(|| redacted_json_text(s, urls, args)) };
            match replaced {
                Some(new) if new != *s => {
                    *s = new;
                    true
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Text that is itself a JSON object or list (a request body given as a string), redacted
/// inside; `None` when it is not JSON or holds nothing to replace.
fn redacted_json_text(text: &str, urls: Urls, args: bool) -> Option<String> {
    if !matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'[')) {
        return None;
    }
    let mut inner: Value = serde_json::from_str(text).ok()?;
    redact_in(&mut inner, urls, args).then(|| inner.to_string())
}

/// Whether a query parameter's name looks secret. `auth` alone is too short a word here:
/// `author` and `authuser` are not credentials.
fn is_secret_param(name: &str) -> bool {
    let lower = snake(name);
    SECRET_WORDS.iter().filter(|w| **w != "auth").any(|w| lower.contains(w))
        || SECRET_ARG_NAMES.contains(&lower.as_str())
        || SECRET_PARAMS.contains(&lower.as_str())
        || lower == "auth"
        || lower.ends_with("_auth")
        || lower == "authorization"
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

/// Values shorter than this are not looked for in text: a secret that short would blank
/// ordinary words and numbers.
pub const MIN_SECRET_VALUE_CHARS: usize = 4;

/// Replaces every occurrence of each of `secrets` (the values themselves, not names) in every
/// string of `value`, at any depth, with [`REDACTED`]: a system that echoes the credentials it
/// was sent (its request's headers, a key in an error message) does not hand them on. Values
/// under [`MIN_SECRET_VALUE_CHARS`] are skipped; the longest is replaced first, so a secret that
/// contains another is replaced whole. Ids and hashes are left as they are, unlike a scrub of
/// token-like text.
pub fn blank_values(value: &mut Value, secrets: &[String]) {
    fn walk(value: &mut Value, secrets: &[&str]) {
        match value {
            Value::String(s) if secrets.iter().any(|v| s.contains(v)) => {
                for secret in secrets {
                    *s = s.replace(secret, REDACTED);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, secrets)),
            Value::Object(map) => map.values_mut().for_each(|v| walk(v, secrets)),
            _ => {}
        }
    }
    let mut secrets: Vec<&str> = secrets.iter().map(String::as_str).filter(|v| v.chars().count() >= MIN_SECRET_VALUE_CHARS).collect();
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    if !secrets.is_empty() {
        walk(value, &secrets);
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
    fn secret_values_are_blanked_wherever_they_stand() {
        let mut v = serde_json::json!({ "echo": { "headers": ["X-Key: k3y-abcdef", "Accept: */*"] }, "note": "sent k3y-abcdef-long and k3y-abcdef", "id": 42, "short": "ab" });
        blank_values(&mut v, &["k3y-abcdef".into(), "k3y-abcdef-long".into(), "ab".into()]);
        assert_eq!(v, serde_json::json!({ "echo": { "headers": ["X-Key: [REDACTED]", "Accept: */*"] }, "note": "sent [REDACTED] and [REDACTED]", "id": 42, "short": "ab" }));
    }

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

    /// A secret is found however its field is written (camel case, a short whole name), in a
    /// header list of name and value pairs, by its form (`Bearer …`), inside JSON given as text,
    /// and as a Google-style `key=` or an Azure-style `sig=` query parameter.
    #[test]
    fn secrets_are_found_however_they_are_written() {
        let mut v = serde_json::json!({
            "privateKey": "pk_1", "accessKey": "ak_2", "pass": "hunter2", "OTP": "k_3",
            "headers": [{ "name": "Authorization", "value": "tok_4" }, { "name": "Accept", "value": "text/plain" }, { "name": "X-Auth-Key", "value": "tok_4b" }, { "name": "Proxy-Authorization", "value": "tok_4c" }],
            "header_line": "Bearer tok_5.eyJhbGciOiJIUzI1NiJ9",
            "note": "basic dXNlcjpza182",
            "plan": "Basic plan, two seats", "tier": "Basic Monthly", "motto": "Bearer of good news",
            "attributes": [{ "name": "Author", "value": "Jane Austen" }, { "name": "Oatmeal Cookie", "value": "4.50" }],
            "pin": "560001",
            "body": "{\"password\":\"p_7\",\"item\":\"tea\"}",
            "maps": "https://maps.example/api?key=AIza_8&q=cafe",
            "blob": "https://acct.blob.example/c/f?sv=1&sig=s_9",
            "keyword": "tea", "passenger": "Ana", "sort_key": "name", "key": "orders/42",
        });
        redact_args(&mut v);
        let out = v.to_string();
        for secret in ["pk_1", "ak_2", "hunter2", "k_3", "tok_4", "tok_4b", "tok_4c", "tok_5", "dXNlcjpza182", "p_7", "AIza_8", "s_9"] {
            assert!(!out.contains(secret), "{secret} kept: {out}");
        }
        assert_eq!(v["headers"][1]["value"], "text/plain", "a header that is not secret stays");
        assert!(v["body"].as_str().is_some_and(|b| b.contains("tea")), "the rest of the JSON text stays: {out}");
        assert!(v["maps"].as_str().is_some_and(|m| m.contains("q=cafe")), "{out}");
        for (name, words) in [("plan", "Basic plan, two seats"), ("tier", "Basic Monthly"), ("motto", "Bearer of good news"), ("pin", "560001")] {
            assert_eq!(v[name], words, "words, not a credential");
        }
        assert_eq!((v["attributes"][0]["value"].as_str(), v["attributes"][1]["value"].as_str()), (Some("Jane Austen"), Some("4.50")), "a product's attributes are not headers");
        // A tool's result keeps what an answer is written from: a short name, a {name, value} list.
        let mut result = serde_json::json!({ "pass": "Day pass", "list": [{ "name": "X-Api-Key", "value": "shown" }] });
        redact(&mut result);
        assert_eq!(result, serde_json::json!({ "pass": "Day pass", "list": [{ "name": "X-Api-Key", "value": "shown" }] }));
        // Arguments kept with a working link (a chat's tool context) are arguments all the same.
        let mut kept = serde_json::json!({ "otp": "123456", "url": "https://shop.example/o?token=t_1", "h": [{ "name": "Authorization", "value": "tok_6" }] });
        redact_args_keeping_links(&mut kept);
        assert_eq!(kept, serde_json::json!({ "otp": REDACTED, "url": "https://shop.example/o?token=t_1", "h": [{ "name": "Authorization", "value": REDACTED }] }));
        for (name, value) in [("keyword", "tea"), ("passenger", "Ana"), ("sort_key", "name"), ("key", "orders/42")] {
            assert_eq!(v[name], value, "{name} is not a secret's name");
        }
    }
}
