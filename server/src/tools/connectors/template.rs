//! Templates of paths, query values, headers and bodies: `{arg}` and `${SECRET}` pieces,
//! filled as data, and the finished URL checked against the connector's allowed patterns.

use serde_json::{Map, Value};

use super::{ConnectorAction, ConnectorCode};
use crate::tools::{ToolError, checkpoint::SecretSource};

/// A template piece: literal text, an argument or an environment secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece<'a> {
    Text(&'a str),
    Arg(&'a str),
    Secret(&'a str),
}

/// Splits `a{b}c${D}` into pieces. `{{` and `}}` are literal braces.
pub(super) fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let Some(open) = rest.find(['{', '}']) else {
            out.push(Piece::Text(rest));
            break;
        };
        let is_secret = rest[..open].ends_with('$') && rest.as_bytes()[open] == b'{';
        let text_end = if is_secret { open - 1 } else { open };
        if text_end > 0 {
            out.push(Piece::Text(&rest[..text_end]));
        }
        let after = &rest[open..];
        if after.starts_with("{{") || after.starts_with("}}") {
            out.push(Piece::Text(&after[..1]));
            rest = &after[2..];
            continue;
        }
        if after.starts_with('}') {
            return Err(format!("unmatched '}}' in {template:?}"));
        }
        let close = after.find('}').ok_or_else(|| format!("unclosed '{{' in {template:?}"))?;
        let name = &after[1..close];
        let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(format!("{{{name}}} in {template:?} is not an argument or ${{SECRET}} name"));
        }
        out.push(if is_secret { Piece::Secret(name) } else { Piece::Arg(name) });
        rest = &after[close + 1..];
    }
    Ok(out)
}

pub(super) fn args_in(template: &str) -> Result<Vec<&str>, String> {
    Ok(pieces(template)?.into_iter().filter_map(|p| if let Piece::Arg(a) = p { Some(a) } else { None }).collect())
}

pub(super) fn secrets_in(template: &str) -> Result<Vec<&str>, String> {
    Ok(pieces(template)?.into_iter().filter_map(|p| if let Piece::Secret(s) = p { Some(s) } else { None }).collect())
}

/// Every string inside a body template.
pub(super) fn body_strings(body: &Value, out: &mut Vec<String>) {
    match body {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| body_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| body_strings(v, out)),
        _ => {}
    }
}

/// An argument as text for a URL or header; objects, arrays and null cannot be placed there.
fn scalar(args: &Map<String, Value>, name: &str) -> Result<Option<String>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(_) => Err(ToolError::refused(ConnectorCode::ParamInvalid.as_str(), format!("{name:?} is a list or object and cannot be placed in a URL or header"))),
    }
}

/// Fills a template. `Ok(None)` when it names an argument that is absent.
pub(super) fn fill(template: &str, args: &Map<String, Value>, secrets: &SecretSource) -> Result<Option<String>, ToolError> {
    let parsed = pieces(template).map_err(|e| ToolError::refused(ConnectorCode::ParamInvalid.as_str(), e))?;
    let mut out = String::new();
    for piece in parsed {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Arg(name) => match scalar(args, name)? {
                Some(v) => out.push_str(&v),
                None => return Ok(None),
            },
            Piece::Secret(var) => out.push_str(&secrets.get(var).ok_or_else(|| ToolError::refused(ConnectorCode::SecretMissing.as_str(), format!("the environment variable {var} is not set")))?),
        }
    }
    Ok(Some(out))
}

pub(super) fn fill_body(template: &Value, args: &Map<String, Value>, secrets: &SecretSource) -> Result<Option<Value>, ToolError> {
    Ok(match template {
        Value::String(s) => match pieces(s).map_err(|e| ToolError::refused(ConnectorCode::ParamInvalid.as_str(), e))?.as_slice() {
            [Piece::Arg(name)] => args.get(*name).filter(|v| !v.is_null()).cloned(),
            _ => fill(s, args, secrets)?.map(Value::String),
        },
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if let Some(v) = fill_body(item, args, secrets)? {
                    out.push(v);
                }
            }
            Some(Value::Array(out))
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if let Some(v) = fill_body(v, args, secrets)? {
                    out.insert(k.clone(), v);
                }
            }
            Some(Value::Object(out))
        }
        other => Some(other.clone()),
    })
}

/// The values of the secrets (`${VAR}`) that `action`'s path, query, headers and body send,
/// so that an answer echoing them can have them blanked.
pub(super) fn secret_values(action: &ConnectorAction, secrets: &SecretSource) -> Vec<String> {
    fn in_body<'a>(body: &'a Value, out: &mut Vec<&'a str>) {
        match body {
            Value::String(s) => out.push(s),
            Value::Array(items) => items.iter().for_each(|v| in_body(v, out)),
            Value::Object(map) => map.values().for_each(|v| in_body(v, out)),
            _ => {}
        }
    }
    let mut templates: Vec<&str> = vec![&action.action.path];
    templates.extend(action.action.query.values().map(String::as_str));
    templates.extend(action.headers.values().map(String::as_str));
    if let Some(body) = &action.action.body {
        in_body(body, &mut templates);
    }
    templates
        .into_iter()
        .filter_map(|t| pieces(t).ok())
        .flatten()
        .filter_map(|piece| if let Piece::Secret(var) = piece { secrets.get(var) } else { None })
        .collect()
}

/// The request URL for `action` with `args`, checked against the connector's origin and
/// allowed patterns.
pub fn build_url(action: &ConnectorAction, args: &Map<String, Value>, secrets: &SecretSource) -> Result<url::Url, ToolError> {
    let unsupported = |why: String| ToolError::refused(ConnectorCode::UnsupportedUrl.as_str(), why);
    let base = url::Url::parse(&action.base_url).map_err(|e| unsupported(format!("the connector's base_url is not a URL: {e}")))?;
    let mut url = base.clone();
    let mut path = base.path().trim_end_matches('/').to_string();
    for template in action.action.path.split('/').filter(|s| !s.is_empty()) {
        let segment = fill(template, args, secrets)?.ok_or_else(|| ToolError::refused(ConnectorCode::ParamInvalid.as_str(), format!("the path {:?} needs an argument that is missing", action.action.path)))?;
        // Errors name the template, never the value: arguments can be personal data, and the
        // value reaches the connector unchanged or not at all.
        if segment.is_empty() || walks_up(&segment) {
            return Err(unsupported(format!(
                "an argument of the path {:?} is empty, or a dot step ('.', '..') once a server in front decodes it, which cannot be a path segment",
                action.action.path
            )));
        }
        path.push('/');
        path.push_str(&encode_segment(&segment));
    }
    if url.cannot_be_a_base() {
        return Err(unsupported("the connector's base_url cannot take a path".into()));
    }
    url.set_path(&path);
    let mut pairs = Vec::new();
    for (name, template) in &action.action.query {
        if let Some(value) = fill(template, args, secrets)? {
            pairs.push((name.clone(), value));
        }
    }
    if !pairs.is_empty() {
        url.query_pairs_mut().extend_pairs(pairs);
    }
    if url.origin() != base.origin() {
        return Err(unsupported(format!("the request would leave {}", base.origin().ascii_serialization())));
    }
    let mut without_query = url.clone();
    without_query.set_query(None);
    without_query.set_fragment(None);
    let plain = without_query.as_str();
    if !action.allowed.is_match(plain) {
        return Err(unsupported(format!("the path {:?} with these arguments matches none of the connector's allowed_urls", action.action.path)));
    }
    Ok(url)
}

/// Whether a segment's value holds a dot step (`.`, `..`, or only dots) for a server that decodes
/// it: percent-decoded up to three times, and split where a proxy or server may split a path
/// (`/`, `\\`, and `;` as Java servers read `..;`). Sent encoded, such a value is one segment
/// here; a proxy in front of the business system that decodes it (nginx before its
/// `proxy_pass`) would walk up the path with the connector's credentials. Any other value, a
/// slash included, goes through as itself.
pub fn walks_up(value: &str) -> bool {
    let mut forms = vec![value.to_string()];
    for _ in 0..3 {
        let last = forms.last().cloned().unwrap_or_default();
        let decoded = percent_decode(&last);
        if decoded == last {
            break;
        }
        forms.push(decoded);
    }
    forms.iter().any(|form| form.split(['/', '\\', ';']).any(|piece| !piece.is_empty() && piece.bytes().all(|b| b == b'.')))
}

/// A value as one path segment: every byte outside RFC 3986's `pchar` set (unreserved,
/// sub-delimiters, ':' and '@') is percent-encoded, '%' included. So the value stays one segment,
/// decodes back to exactly itself (the URL parser would drop a tab or newline, and `url`'s own
/// segment encoding leaves those to it), and a value like "%2e%2e" is sent as "%252e%252e".
fn encode_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decoding, for tests that check a value arrives as itself.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}
