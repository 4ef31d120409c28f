//! Running a connector action: the HTTP request, its idempotency key, and the response
//! trimmed to the fields the action keeps.

use serde_json::{Map, Value};

use super::{
    ConnectorCode, Method,
    template::{build_url, fill, fill_body, secret_values},
};
use crate::tools::{
    Catalog, ToolDef, ToolError, ToolExecutor,
    checkpoint::{HARD_RESULT_LIMIT, SecretSource},
};

/// Keeps only the dotted paths in `keep` (all of `value` when `keep` is empty).
pub fn keep_fields(value: &Value, keep: &[String]) -> Value {
    if keep.is_empty() {
        return value.clone();
    }
    let mut out = Value::Null;
    for path in keep {
        let parts: Vec<&str> = path.split('.').collect();
        merge_path(&mut out, value, &parts);
    }
    out
}

fn merge_path(out: &mut Value, value: &Value, parts: &[&str]) {
    match (parts, value) {
        ([], v) => *out = v.clone(),
        (_, Value::Array(items)) => {
            if !out.is_array() {
                *out = Value::Array(vec![Value::Null; items.len()]);
            }
            if let Value::Array(slots) = out {
                for (slot, item) in slots.iter_mut().zip(items) {
                    merge_path(slot, item, parts);
                }
            }
        }
        ([first, rest @ ..], Value::Object(map)) => {
            let Some(inner) = map.get(*first) else { return };
            if !out.is_object() {
                *out = Value::Object(Map::new());
            }
            if let Value::Object(slot) = out {
                merge_path(slot.entry(first.to_string()).or_insert(Value::Null), inner, rest);
            }
        }
        _ => {}
    }
}

/// The hosts (`host[:port]`) of the enabled connectors in `catalog`, for `web_fetch` to refuse.
pub fn hosts(catalog: &Catalog) -> Vec<String> {
    let mut out: Vec<String> = catalog
        .all()
        .filter_map(|t| t.connector.as_ref())
        .filter_map(|c| url::Url::parse(&c.base_url).ok())
        .filter_map(|u| u.host_str().map(|h| u.port().map_or_else(|| h.to_string(), |p| format!("{h}:{p}"))))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The header a connector write carries its idempotency key in (the IETF draft's name, which
/// Stripe, Adyen and PayPal-style APIs read).
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Runs connector tools. Redirects are not followed: a connector's answer comes from the URL
/// that was checked.
pub struct ConnectorExecutor {
    client: reqwest::Client,
    secrets: SecretSource,
}

impl ConnectorExecutor {
    pub fn new(secrets: SecretSource) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("Gatehouse/", env!("CARGO_PKG_VERSION"), " (connector)"))
            .build()?;
        Ok(Self { client, secrets })
    }
}

#[async_trait::async_trait]
impl ToolExecutor for ConnectorExecutor {
    async fn call(&self, tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        self.send(tool, args, None).await
    }

    /// A write (any method but GET) carries `Idempotency-Key: key`, the same on every attempt
    /// of the call, so a system that deduplicates by key applies it once even when a crash or
    /// a timeout made Gatehouse send it again. An action's own `Idempotency-Key` header wins.
    async fn call_keyed(&self, tool: &ToolDef, args: &Value, key: &str) -> Result<Value, ToolError> {
        self.send(tool, args, Some(key)).await
    }

    /// Every action but a GET carries Gatehouse's key, unless it declares its own header, whose
    /// template may come out empty (from an argument left out) and send none.
    fn sends_key(&self, tool: &ToolDef) -> bool {
        tool.connector.as_deref().is_some_and(|action| action.action.method != Method::Get && !action.headers.keys().any(|h| h.eq_ignore_ascii_case(IDEMPOTENCY_HEADER)))
    }
}

impl ConnectorExecutor {
    async fn send(&self, tool: &ToolDef, args: &Value, key: Option<&str>) -> Result<Value, ToolError> {
        let action = tool.connector.as_deref().ok_or_else(|| ToolError::refused(ConnectorCode::UnsupportedUrl.as_str(), format!("no connector action runs {}", tool.spec.name)))?;
        let empty = Map::new();
        let args = args.as_object().unwrap_or(&empty);
        let url = build_url(action, args, &self.secrets)?;
        let mut request = self.client.request(action.action.method.as_reqwest(), url).timeout(tool.spec.timeout);
        for (name, template) in &action.headers {
            if let Some(value) = fill(template, args, &self.secrets)? {
                // HTTP drops a header value's surrounding whitespace: refuse rather than send an
                // argument (a file reference, say) other than exactly as given.
                if value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']) {
                    return Err(ToolError::refused(ConnectorCode::ParamInvalid.as_str(), format!("header {name} would begin or end with whitespace, which HTTP would strip")));
                }
                let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| ToolError::refused(ConnectorCode::ParamInvalid.as_str(), format!("header {name} would not be a valid header value")))?;
                value.set_sensitive(true);
                request = request.header(name.as_str(), value);
            }
        }
        if let Some(key) = key
            && self.sends_key(tool)
        {
            request = request.header(IDEMPOTENCY_HEADER, key);
        }
        if let Some(template) = &action.action.body {
            request = request.json(&fill_body(template, args, &self.secrets)?.unwrap_or(Value::Null));
        }
        let mut response = request.send().await.map_err(|e| {
            let (connect, timeout) = (e.is_connect(), e.is_timeout());
            let message = format!("{} did not answer: {}", action.connector, e.without_url());
            // No connection: the request never left.
            if connect { ToolError::unsent(ConnectorCode::Network.as_str(), message, true) } else { ToolError::new(ConnectorCode::Network.as_str(), message, timeout) }
        })?;
        let status = response.status();
        let body = crate::tools::read_capped(&mut response, HARD_RESULT_LIMIT).await.map_err(|e| match e {
            crate::tools::CappedRead::Read(e) => ToolError::new(ConnectorCode::Network.as_str(), format!("reading {}'s answer failed: {}", action.connector, e.without_url()), true),
            crate::tools::CappedRead::TooLarge => ToolError::new(ConnectorCode::TooLarge.as_str(), format!("{}'s answer is over {HARD_RESULT_LIMIT} bytes", action.connector), false),
        })?;
        if !status.is_success() {
            let retryable = status.is_server_error() || matches!(status.as_u16(), 408 | 429);
            let error = format!("{} answered {status}", action.connector);
            // A 404 for an order number that does not exist, or a 422 for a date the system
            // refuses, says the system works: it is the request's failure, and does not count
            // against the tool's circuit breaker (a customer asking for made-up order numbers
            // would otherwise close the tool for every chat). Rejected credentials, timeouts,
            // rate limits and server errors do count.
            let of_request = status.is_client_error() && !matches!(status.as_u16(), 401 | 403 | 408 | 429);
            return Err(if of_request { ToolError::of_target(ConnectorCode::HttpStatus.as_str(), error, retryable) } else { ToolError::new(ConnectorCode::HttpStatus.as_str(), error, retryable) });
        }
        // JSON may start with a byte-order mark, which serde_json does not take.
        let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&body);
        let data = match serde_json::from_slice::<Value>(body) {
            Ok(json) => keep_fields(&json, &action.action.keep),
            Err(_) if body.is_empty() => Value::Null,
            Err(_) if !action.action.keep.is_empty() => {
                return Err(ToolError::new(ConnectorCode::NotJson.as_str(), format!("{} answered {status} with a body that is not JSON; the fields to keep cannot be picked from it", action.connector), false));
            }
            Err(_) => Value::String(String::from_utf8_lossy(body).into_owned()),
        };
        let mut out = serde_json::json!({ "status": status.as_u16(), "data": data });
        // A system that echoes the request (its headers, a key in a message) does not hand the
        // connector's credentials to the model, the person or the context store.
        crate::redact::blank_values(&mut out, &secret_values(action, &self.secrets));
        Ok(out)
    }
}
