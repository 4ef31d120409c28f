//! Connector tools: HTTP actions on a business system, declared in `config/connectors.toml`.
//!
//! A connector fixes the base URL and the URL patterns its requests may reach; each action
//! binds one catalog tool (provider "connector") to a method, a path template, query
//! parameters, headers and a JSON body mapping, and names the response fields to keep.
//! Arguments fill templates as data: each one is percent-encoded into a single path segment or
//! query value, so no argument can change the scheme, host, port or path structure, and the
//! finished URL must still match an allowed pattern (`CONNECTOR_UNSUPPORTED_URL` otherwise).
//! Connector URLs come from configuration only; nothing is guessed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    ToolDef, ToolError, ToolExecutor,
    checkpoint::{HARD_RESULT_LIMIT, SecretSource},
};
use crate::config::Problem;

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum ConnectorCode {
    /// The request URL left the connector's base or matches no allowed pattern.
    #[strum(serialize = "CONNECTOR_UNSUPPORTED_URL")]
    UnsupportedUrl,
    /// A template names an argument the call did not supply, or one that cannot be placed there.
    #[strum(serialize = "CONNECTOR_PARAM_INVALID")]
    ParamInvalid,
    /// A header secret named by an environment variable is not set.
    #[strum(serialize = "CONNECTOR_SECRET_MISSING")]
    SecretMissing,
    /// The system answered with an error status.
    #[strum(serialize = "CONNECTOR_HTTP_STATUS")]
    HttpStatus,
    /// The system could not be reached, or did not answer in time.
    #[strum(serialize = "CONNECTOR_NETWORK_ERROR")]
    Network,
    /// The answer was larger than Gatehouse accepts.
    #[strum(serialize = "CONNECTOR_RESPONSE_TOO_LARGE")]
    TooLarge,
    /// A tool's secret field is templated into an action's URL (refused when the files load):
    /// URLs reach logs, errors and the other side's access logs.
    #[strum(serialize = "CONNECTOR_SECRET_IN_URL")]
    SecretInUrl,
}

impl ConnectorCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What the connectors file needs to know of a tools.toml tool.
#[derive(Debug, Clone, Default)]
pub struct DeclaredTool {
    pub is_connector: bool,
    /// Properties of its input schema.
    pub properties: BTreeSet<String>,
    /// Fields Gatehouse fills from a secret (`secret_fields`).
    pub secret_fields: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    fn as_reqwest(self) -> reqwest::Method {
        match self {
            Self::Get => reqwest::Method::GET,
            Self::Post => reqwest::Method::POST,
            Self::Put => reqwest::Method::PUT,
            Self::Patch => reqwest::Method::PATCH,
            Self::Delete => reqwest::Method::DELETE,
        }
    }
}

/// One HTTP action as written in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionSpec {
    /// The catalog tool this action runs.
    pub tool: String,
    pub method: Method,
    /// Appended to the connector's base URL; `{arg}` fills one whole or partial path segment.
    pub path: String,
    /// Query parameter -> template; a parameter whose arguments are all absent is left out.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Extra headers for this action (templates, like the connector's).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// JSON body template: a string that is exactly `"{arg}"` takes the argument's JSON value
    /// (and its key is dropped when the argument is absent); other strings interpolate.
    #[serde(default)]
    pub body: Option<Value>,
    /// Response fields to keep, as dotted paths (`order.status`); through an array they apply
    /// to each element. Empty keeps the whole response.
    #[serde(default)]
    pub keep: Vec<String>,
}

/// One connector as written in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorSpec {
    pub id: String,
    #[serde(default)]
    pub title: String,
    /// Scheme, host, optional port and base path of every request.
    pub base_url: String,
    /// URL patterns (without query) requests may reach: `*` matches within one path segment,
    /// `**` matches anything.
    pub allowed_urls: Vec<String>,
    /// Header -> template. `${VAR}` is the value of the environment variable VAR (a secret;
    /// never shown to the model, never audited); `{arg}` is an argument.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default)]
    pub action: Vec<ActionSpec>,
}

fn default_true() -> bool {
    true
}

/// A checked action with its connector, attached to the tool it runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectorAction {
    pub connector: String,
    pub base_url: String,
    pub allowed_urls: Vec<String>,
    /// `allowed_urls` compiled: `**` matches anything, `*` anything but '/'.
    #[serde(skip)]
    allowed: globset::GlobSet,
    /// Connector headers, then the action's own (which win).
    pub headers: BTreeMap<String, String>,
    pub action: ActionSpec,
}

/// `allowed_urls` as one matcher; a pattern that is not a glob is named in the error.
fn compile_allowed(patterns: &[String]) -> Result<globset::GlobSet, String> {
    let mut set = globset::GlobSetBuilder::new();
    for p in patterns {
        set.add(globset::GlobBuilder::new(p).literal_separator(true).build().map_err(|e| format!("{p:?} is not a URL pattern: {e}"))?);
    }
    set.build().map_err(|e| e.to_string())
}

impl ConnectorAction {
    pub fn new(connector: String, base_url: String, allowed_urls: Vec<String>, headers: BTreeMap<String, String>, action: ActionSpec) -> Result<Self, String> {
        let allowed = compile_allowed(&allowed_urls)?;
        Ok(Self { connector, base_url, allowed_urls, allowed, headers, action })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectorsFile {
    #[serde(default)]
    connector: Vec<toml::Value>,
}

/// A template piece: literal text, an argument or an environment secret.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Arg(&'a str),
    Secret(&'a str),
}

/// Splits `a{b}c${D}` into pieces. `{{` and `}}` are literal braces.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
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

fn args_in(template: &str) -> Result<Vec<&str>, String> {
    Ok(pieces(template)?.into_iter().filter_map(|p| if let Piece::Arg(a) = p { Some(a) } else { None }).collect())
}

fn secrets_in(template: &str) -> Result<Vec<&str>, String> {
    Ok(pieces(template)?.into_iter().filter_map(|p| if let Piece::Secret(s) = p { Some(s) } else { None }).collect())
}

/// Every string inside a body template.
fn body_strings(body: &Value, out: &mut Vec<String>) {
    match body {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| body_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| body_strings(v, out)),
        _ => {}
    }
}

/// Loads `path` and binds each action to its tool in `tools`. Returns the actions by tool name.
pub fn load(
    path: &Path,
    tools: &BTreeMap<String, DeclaredTool>,
    secret_is_set: &dyn Fn(&str) -> bool,
) -> Result<BTreeMap<String, Arc<ConnectorAction>>, Vec<Problem>> {
    let source = path.display().to_string();
    let problem = |key: String, message: String| Problem { key, source: source.clone(), message };
    let text = std::fs::read_to_string(path).map_err(|e| vec![problem(String::new(), format!("cannot read the connectors file: {e}"))])?;
    let file: ConnectorsFile = toml::from_str(&text).map_err(|e| vec![problem(String::new(), format!("not valid TOML for a connectors file: {e}"))])?;
    let mut problems = Vec::new();
    let mut actions = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for (i, raw) in file.connector.into_iter().enumerate() {
        let label = raw.get("id").and_then(|n| n.as_str()).map_or_else(|| format!("connector[{i}]"), |n| format!("connector[{i}] ({n})"));
        let spec: ConnectorSpec = match raw.try_into() {
            Ok(spec) => spec,
            Err(e) => {
                problems.push(problem(label, e.to_string().trim().to_string()));
                continue;
            }
        };
        let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
        if !ids.insert(spec.id.clone()) {
            bad("id", format!("{:?} is defined more than once", spec.id));
        }
        match url::Url::parse(&spec.base_url) {
            Ok(u) if !matches!(u.scheme(), "http" | "https") => bad("base_url", "must be an http or https URL".into()),
            Ok(u) if u.host_str().is_none() => bad("base_url", "must name a host".into()),
            Ok(u) if !u.username().is_empty() || u.password().is_some() => bad("base_url", "must not hold credentials; use a header with ${VAR}".into()),
            Ok(u) if u.query().is_some() || u.fragment().is_some() => bad("base_url", "must not have a query or fragment".into()),
            Ok(_) => {}
            Err(e) => bad("base_url", format!("not a URL: {e}")),
        }
        if spec.allowed_urls.is_empty() {
            bad("allowed_urls", "must list at least one URL pattern requests may reach".into());
        }
        for pattern in &spec.allowed_urls {
            if !same_origin_prefix(pattern, &spec.base_url) {
                bad("allowed_urls", format!("{pattern:?} must start with the base URL's scheme and host ({})", origin_of(&spec.base_url)));
            }
        }
        if let Err(e) = compile_allowed(&spec.allowed_urls) {
            bad("allowed_urls", e);
        }
        for (name, template) in &spec.headers {
            match secrets_in(template) {
                Ok(vars) => {
                    for var in vars {
                        if spec.enabled && !secret_is_set(var) {
                            bad(&format!("headers.{name}"), format!("needs the environment variable {var}, which is not set"));
                        }
                    }
                }
                Err(e) => bad(&format!("headers.{name}"), e),
            }
        }
        if spec.action.is_empty() {
            bad("action", "declares no actions".into());
        }
        for (j, action) in spec.action.iter().enumerate() {
            let at = format!("action[{j}] ({})", action.tool);
            let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{at}.{field}"), message));
            let Some(DeclaredTool { is_connector, properties: props, secret_fields }) = tools.get(&action.tool) else {
                bad("tool", format!("there is no tool named {:?} in tools.toml", action.tool));
                continue;
            };
            if !is_connector {
                bad("tool", format!("{:?} must have provider = \"connector\" to be run by a connector", action.tool));
            }
            if actions.contains_key(&action.tool) {
                bad("tool", format!("{:?} is already run by another action", action.tool));
            }
            if action.path.contains("://") || action.path.starts_with("//") {
                bad("path", "must be a path below base_url, not a URL".into());
            }
            if action.path.contains(['?', '#']) {
                bad("path", "must not contain '?' or '#'; use query".into());
            }
            if action.body.is_some() && action.method == Method::Get {
                bad("body", "a GET request has no body".into());
            }
            let mut templates: Vec<(String, String)> = vec![("path".into(), action.path.clone())];
            templates.extend(action.query.iter().map(|(k, v)| (format!("query.{k}"), v.clone())));
            templates.extend(action.headers.iter().map(|(k, v)| (format!("headers.{k}"), v.clone())));
            let mut strings = Vec::new();
            if let Some(body) = &action.body {
                body_strings(body, &mut strings);
            }
            templates.extend(strings.into_iter().map(|s| ("body".to_string(), s)));
            for (field, template) in &templates {
                match args_in(template) {
                    Ok(args) => {
                        for arg in &args {
                            if !props.contains(*arg) {
                                bad(field, format!("{{{arg}}} is not a property of {}'s input_schema", action.tool));
                            }
                            let in_url = field == "path" || field.starts_with("query.");
                            if in_url && secret_fields.contains(*arg) {
                                bad(
                                    field,
                                    format!("{{{arg}}} is a secret field of {} and cannot be placed in the URL ({}); send it in a header", action.tool, ConnectorCode::SecretInUrl.as_str()),
                                );
                            }
                        }
                    }
                    Err(e) => bad(field, e),
                }
                if let Ok(vars) = secrets_in(template) {
                    for var in vars {
                        if field.starts_with("headers.") {
                            if spec.enabled && !secret_is_set(var) {
                                bad(field, format!("needs the environment variable {var}, which is not set"));
                            }
                        } else {
                            bad(field, format!("${{{var}}} secrets may only appear in headers"));
                        }
                    }
                }
            }
            if spec.enabled {
                let mut headers = spec.headers.clone();
                headers.extend(action.headers.clone());
                // A pattern that does not compile was reported above with the connector's key.
                if let Ok(built) = ConnectorAction::new(spec.id.clone(), spec.base_url.clone(), spec.allowed_urls.clone(), headers, action.clone()) {
                    actions.insert(action.tool.clone(), Arc::new(built));
                }
            }
        }
    }
    if problems.is_empty() { Ok(actions) } else { Err(problems) }
}

fn origin_of(url: &str) -> String {
    url::Url::parse(url).map(|u| u.origin().ascii_serialization()).unwrap_or_default()
}

fn same_origin_prefix(pattern: &str, base: &str) -> bool {
    let origin = origin_of(base);
    !origin.is_empty() && (pattern == origin || pattern.starts_with(&format!("{origin}/")))
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
fn fill(template: &str, args: &Map<String, Value>, secrets: &SecretSource) -> Result<Option<String>, ToolError> {
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

fn fill_body(template: &Value, args: &Map<String, Value>, secrets: &SecretSource) -> Result<Option<Value>, ToolError> {
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
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(unsupported(format!("an argument of the path {:?} is empty, '.' or '..', which cannot be a path segment", action.action.path)));
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
pub fn hosts(catalog: &super::Catalog) -> Vec<String> {
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
            && action.action.method != Method::Get
            && !action.headers.keys().any(|h| h.eq_ignore_ascii_case(IDEMPOTENCY_HEADER))
        {
            request = request.header(IDEMPOTENCY_HEADER, key);
        }
        if let Some(template) = &action.action.body {
            request = request.json(&fill_body(template, args, &self.secrets)?.unwrap_or(Value::Null));
        }
        let mut response = request.send().await.map_err(|e| {
            let retryable = e.is_timeout() || e.is_connect();
            ToolError::new(ConnectorCode::Network.as_str(), format!("{} did not answer: {}", action.connector, e.without_url()), retryable)
        })?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| ToolError::new(ConnectorCode::Network.as_str(), format!("reading {}'s answer failed: {}", action.connector, e.without_url()), true))? {
            if body.len() + chunk.len() > HARD_RESULT_LIMIT {
                return Err(ToolError::new(ConnectorCode::TooLarge.as_str(), format!("{}'s answer is over {HARD_RESULT_LIMIT} bytes", action.connector), false));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let retryable = status.is_server_error() || matches!(status.as_u16(), 408 | 429);
            return Err(ToolError::new(ConnectorCode::HttpStatus.as_str(), format!("{} answered {status}", action.connector), retryable));
        }
        let data = match serde_json::from_slice::<Value>(&body) {
            Ok(json) => keep_fields(&json, &action.action.keep),
            Err(_) if body.is_empty() => Value::Null,
            Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
        };
        Ok(serde_json::json!({ "status": status.as_u16(), "data": data }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(path: &str, allowed: &[&str]) -> ConnectorAction {
        ConnectorAction::new(
            "shop".into(),
            "https://shop.example.com/api/".into(),
            allowed.iter().map(|s| s.to_string()).collect(),
            BTreeMap::new(),
            ActionSpec { tool: "t".into(), method: Method::Get, path: path.into(), query: BTreeMap::from([("q".into(), "{q}".into())]), headers: BTreeMap::new(), body: None, keep: vec![] },
        )
        .expect("valid patterns")
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    fn no_secrets() -> SecretSource {
        SecretSource::empty()
    }

    #[test]
    fn arguments_stay_inside_one_segment_and_the_allowed_patterns() {
        let a = action("orders/{id}", &["https://shop.example.com/api/orders/*"]);
        let ok = build_url(&a, &args(serde_json::json!({"id": "A 1", "q": "x&y=z"})), &no_secrets()).expect("allowed");
        assert_eq!(ok.as_str(), "https://shop.example.com/api/orders/A%201?q=x%26y%3Dz");
        for hostile in ["../admin", "..", "%2e%2e", "a/../../b", "x?y", "@evil.example", "//evil.example/x"] {
            match build_url(&a, &args(serde_json::json!({"id": hostile})), &no_secrets()) {
                Ok(url) => {
                    assert_eq!(url.host_str(), Some("shop.example.com"), "{hostile}");
                    assert!(url.path().starts_with("/api/orders/") && url.path().matches('/').count() == 3, "{hostile} -> {url}");
                }
                Err(e) => assert_eq!(e.code, ConnectorCode::UnsupportedUrl.as_str(), "{hostile}: {e}"),
            }
        }
        let narrow = action("orders/{id}/{sub}", &["https://shop.example.com/api/orders/*"]);
        let err = build_url(&narrow, &args(serde_json::json!({"id": "1", "sub": "refund"})), &no_secrets()).expect_err("not allowed");
        assert_eq!(err.code, ConnectorCode::UnsupportedUrl.as_str());
        let missing = build_url(&a, &args(serde_json::json!({})), &no_secrets()).expect_err("missing");
        assert_eq!(missing.code, ConnectorCode::ParamInvalid.as_str());
    }

    /// The checkpoint adds a tool's secret fields to the arguments before the connector runs.
    /// A refused URL's error must not carry such a value (or any argument) back to the caller.
    #[test]
    fn refused_urls_do_not_echo_their_arguments() {
        let secret = "sk_live_never_in_errors_77";
        let a = action("orders/{id}/{key}", &["https://shop.example.com/api/orders/*"]);
        let err = build_url(&a, &args(serde_json::json!({"id": "A1", "key": secret})), &no_secrets()).expect_err("outside the patterns");
        assert_eq!(err.code, ConnectorCode::UnsupportedUrl.as_str());
        assert!(!err.message.contains(secret) && !err.message.contains("A1"), "{err}");
        let dots = build_url(&a, &args(serde_json::json!({"id": "..", "key": secret})), &no_secrets()).expect_err("dot segment");
        assert!(!dots.message.contains(secret), "{dots}");
    }

    #[test]
    fn templates_parse_arguments_secrets_and_braces() {
        assert_eq!(pieces("Bearer ${KEY}").expect("ok"), vec![Piece::Text("Bearer "), Piece::Secret("KEY")]);
        assert_eq!(pieces("a{b}c").expect("ok"), vec![Piece::Text("a"), Piece::Arg("b"), Piece::Text("c")]);
        assert_eq!(pieces("{{x}}").expect("ok"), vec![Piece::Text("{"), Piece::Text("x"), Piece::Text("}")]);
        assert!(pieces("{a b}").is_err());
        assert!(pieces("{open").is_err());
    }

    #[test]
    fn keeps_only_the_named_fields() {
        let v = serde_json::json!({"status": "shipped", "secret": "x", "items": [{"name": "a", "cost": 1}, {"name": "b", "cost": 2}], "eta": {"day": "Mon", "internal": 1}});
        let kept = keep_fields(&v, &["status".into(), "items.name".into(), "eta.day".into()]);
        assert_eq!(kept, serde_json::json!({"status": "shipped", "items": [{"name": "a"}, {"name": "b"}], "eta": {"day": "Mon"}}));
    }

    #[test]
    fn body_takes_typed_values_and_drops_absent_ones() {
        let template = serde_json::json!({"qty": "{qty}", "note": "order {id}", "gift": "{gift}", "fixed": true});
        let body = fill_body(&template, &args(serde_json::json!({"qty": 3, "id": "A1"})), &no_secrets()).expect("ok");
        assert_eq!(body, Some(serde_json::json!({"qty": 3, "note": "order A1", "fixed": true})));
    }

    fn glob(pattern: &str, text: &str) -> bool {
        compile_allowed(&[pattern.to_string()]).expect("pattern").is_match(text)
    }

    #[test]
    fn glob_patterns() {
        assert!(glob("https://h/api/orders/*", "https://h/api/orders/1"));
        assert!(!glob("https://h/api/orders/*", "https://h/api/orders/1/x"));
        assert!(glob("https://h/api/**", "https://h/api/orders/1/x"));
        assert!(!glob("https://h/api/**", "https://h/other"));
    }
}
