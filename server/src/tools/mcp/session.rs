//! One connection to one MCP server: start the transport, initialize, and list tools within the
//! discovery bounds. `tools/list_changed` from the server asks its supervisor for a refresh.

use std::{
    collections::HashMap,
    process::Stdio,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    ErrorData,
    model::{
        ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability, FormElicitationCapability, Implementation,
        PaginatedRequestParams, ProtocolVersion,
    },
    service::{NotificationContext, Peer, RequestContext, RunningService},
    transport::{StreamableHttpClientTransport, TokioChildProcess, streamable_http_client::StreamableHttpClientTransportConfig},
};
use tokio::{io::AsyncBufReadExt, sync::mpsc};

use super::{
    config::{ServerConfig, Transport, ValueOrSecret},
    elicitation::Forms,
    normalize::{self, Skipped},
};
use crate::{db::mcp::Found, tools::checkpoint::SecretSource};

/// Variables a stdio server gets from Gatehouse's own environment; everything else it gets is
/// in its config. Gatehouse's environment holds API keys, which a server must not see.
const PASSED_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT"];

/// What a server's supervisor is asked to do while its session lives.
#[derive(Debug)]
pub enum RefreshRequest {
    /// The server sent `notifications/tools/list_changed`.
    ListChanged,
    /// An owner or the CLI asks; answered when the refresh is done.
    Refresh(tokio::sync::oneshot::Sender<Result<DiscoveryReport, String>>),
    /// A call timed out: is the session still alive? A server that does not answer a
    /// `tools/list` either is reconnected (an HTTP session that was lost hangs otherwise).
    Probe,
}

/// Our side of the protocol: announces Gatehouse, turns `tools/list_changed` into a refresh,
/// and answers a server's `elicitation/create` by its policy.
#[derive(Debug, Clone)]
pub struct Handler {
    refresh: mpsc::UnboundedSender<RefreshRequest>,
    /// Set while a `ListChanged` waits for the supervisor: a server that floods notifications
    /// queues one refresh, not one per notification.
    pending: Arc<AtomicBool>,
    /// With `elicitation = "owner"`: the server's forms go to the owners. Without, Gatehouse
    /// does not announce elicitation and declines a request that comes anyway.
    forms: Option<(Arc<Forms>, Arc<ServerConfig>)>,
}

impl Handler {
    pub fn new(refresh: mpsc::UnboundedSender<RefreshRequest>) -> Self {
        Self { refresh, pending: Arc::default(), forms: None }
    }

    /// Forwards this server's forms to the owners.
    pub fn with_owner_forms(mut self, forms: Arc<Forms>, server: &ServerConfig) -> Self {
        self.forms = Some((forms, Arc::new(server.clone())));
        self
    }

    /// The flag the supervisor clears when it takes the waiting `ListChanged` up.
    pub fn pending(&self) -> Arc<AtomicBool> {
        self.pending.clone()
    }
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            let _ = self.refresh.send(RefreshRequest::ListChanged);
        }
    }

    /// Gatehouse speaks the `initialize` handshake, so it offers the newest version that has
    /// one (rmcp's default, 2026-07-28, is stateless and unknown to most servers); a server
    /// answering with an older version it supports is accepted as before.
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.forms.is_some() {
            // Form mode only (Gatehouse checks the owner's values against the schema); a URL
            // elicitation is not offered.
            capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::new().with_schema_validation(true)));
        }
        let mut info = ClientConfig::new(capabilities, Implementation::new("gatehouse", env!("CARGO_PKG_VERSION")));
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }

    /// Only the owners are ever asked, and only when the server's policy forwards its forms; a
    /// customer never is.
    async fn create_elicitation(&self, request: ElicitRequestParams, context: RequestContext<RoleClient>) -> Result<ElicitResult, ErrorData> {
        let decline = ElicitResult::new(ElicitationAction::Decline);
        let Some((forms, server)) = &self.forms else { return Ok(decline) };
        match request {
            ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } => {
                let schema = serde_json::to_value(&requested_schema).unwrap_or_default();
                Ok(forms.ask(server, &message, &schema, context.ct.cancelled()).await)
            }
            _ => Ok(decline),
        }
    }
}

pub type Session = RunningService<RoleClient, Handler>;

/// A failure to connect, with a message that holds no secret.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

/// A successful result with the server's own secrets (its env or header values, and the OAuth
/// access tokens it was sent, `tokens`) blanked in every string: a server that echoes its
/// request's headers or environment does not hand its token to the summarizer, the person or
/// the context store. Unlike [`scrub`], nothing else is touched: a result's ids and hashes stay
/// as they are.
pub fn scrub_result(server: &ServerConfig, secrets: &SecretSource, tokens: Vec<String>, value: &mut serde_json::Value) {
    let mut values = secret_values(server, secrets);
    values.extend(tokens);
    crate::redact::blank_values(value, &values);
}

fn scrub_values(text: &str, values: &[String]) -> String {
    let mut out = text.to_string();
    for value in values {
        out = out.replace(value.as_str(), "[REDACTED]");
    }
    out
}

/// The values of the secrets in the server's config (env for stdio, headers for HTTP).
fn secret_values(server: &ServerConfig, secrets: &SecretSource) -> Vec<String> {
    let values: Vec<&ValueOrSecret> = match &server.transport {
        Transport::Stdio { env, .. } => env.values().collect(),
        Transport::Http { headers, .. } => headers.values().collect(),
    };
    let mut out: Vec<String> = values
        .into_iter()
        .filter_map(|v| if let ValueOrSecret::Secret { secret, .. } = v { secrets.get(secret) } else { None })
        .filter(|v| v.chars().count() >= crate::redact::MIN_SECRET_VALUE_CHARS)
        .collect();
    // Longest first, so a secret containing another is replaced whole.
    out.sort_by_key(|v| std::cmp::Reverse(v.len()));
    out
}

/// Token-like text: credentials after `Bearer`/`Basic`, values of password/secret/token/key
/// assignments, well-known key formats, JWTs, and long random-looking strings.
static TOKEN_LIKE: LazyLock<Vec<(regex::Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{6,}", "${1}${2}[REDACTED]"),
        (
            r#"(?i)\b([a-z0-9_-]*(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credential|auth)[a-z0-9_-]*)(["']?\s*[:=]\s*["']?)[^\s"',;&]+"#,
            "${1}${2}[REDACTED]",
        ),
        (r"\b(?:sk|pk|rk)[-_](?:live[-_]|test[-_]|proj[-_]|ant[-_])?[A-Za-z0-9_-]{12,}", "[REDACTED]"),
        (r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,})", "[REDACTED]"),
        (r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "[REDACTED]"),
        (r"[A-Za-z0-9+_=-]{32,}", ""),
    ]
    .into_iter()
    .filter_map(|(pattern, with)| regex::Regex::new(pattern).ok().map(|r| (r, with)))
    .collect()
});

/// Replaces `values` and anything token-like in `text`.
pub fn scrub_text(text: &str, values: &[String]) -> String {
    let mut out = scrub_values(text, values);
    for (pattern, with) in TOKEN_LIKE.iter() {
        out = if with.is_empty() {
            // Long random-looking words (32+ characters mixing letters and digits) are keys more
            // often than not; shorter ones (ids, versions) stay readable.
            pattern
                .replace_all(&out, |c: &regex::Captures<'_>| {
                    let word = &c[0];
                    let random = word.bytes().any(|b| b.is_ascii_digit()) && word.bytes().any(|b| b.is_ascii_alphabetic());
                    if random { "[REDACTED]".to_string() } else { word.to_string() }
                })
                .into_owned()
        } else {
            pattern.replace_all(&out, *with).into_owned()
        };
    }
    out
}

/// Replaces every secret value of the server's config, and anything token-like, in `text`, and
/// bounds it.
pub fn scrub(server: &ServerConfig, secrets: &SecretSource, text: &str) -> String {
    normalize::bound_text(&scrub_text(text, &secret_values(server, secrets)), 500)
}

fn resolve(server: &ServerConfig, secrets: &SecretSource, value: &ValueOrSecret) -> Result<String, ConnectError> {
    value.resolve(&|var| secrets.get(var)).ok_or_else(|| match value {
        ValueOrSecret::Secret { secret, .. } => ConnectError(format!("the environment variable {secret} is not set (server {})", server.id)),
        ValueOrSecret::Plain(_) => ConnectError("unreachable".into()),
    })
}

/// Starts the transport and runs the initialize handshake. An OAuth server's requests go through
/// `oauth`, which adds and refreshes its token.
pub async fn connect(server: &ServerConfig, secrets: &SecretSource, handler: Handler, oauth: Option<super::oauth::OAuthHttp>) -> Result<Session, ConnectError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| ConnectError(scrub(server, secrets, &format!("{what}: {e}")));
    match &server.transport {
        Transport::Stdio { command, args, env, cwd } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear();
            for var in PASSED_THROUGH {
                if let Ok(v) = std::env::var(var) {
                    cmd.env(var, v);
                }
            }
            for (name, value) in env {
                cmd.env(name, resolve(server, secrets, value)?);
            }
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            let (transport, stderr) =
                TokioChildProcess::builder(cmd).stderr(Stdio::piped()).spawn().map_err(|e| failed(&format!("cannot start {command}"), &e))?;
            if let Some(stderr) = stderr {
                // A server's stderr is its log, not an error; kept at debug level, bounded per
                // line, without the secrets it was given or anything else that looks like one
                // (servers print their config and request headers when they fail).
                let id = server.id.clone();
                let values = secret_values(server, secrets);
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let line = normalize::bound_text(&scrub_text(&line, &values), 300);
                        tracing::debug!(mcp.server = %id, line = %line, "mcp server stderr");
                    }
                });
            }
            handler.serve(transport).await.map_err(|e| failed("initialize failed", &e))
        }
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let name = http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| failed("bad header name", &e))?;
                let mut value = http::HeaderValue::from_str(&resolve(server, secrets, value)?).map_err(|_| ConnectError(format!("the value of header {name} is not valid")))?;
                value.set_sensitive(true);
                custom.insert(name, value);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom).reinit_on_expired_session(true);
            match oauth {
                Some(client) => {
                    let transport = StreamableHttpClientTransport::with_client(client, config);
                    handler.serve(transport).await.map_err(|e| failed("initialize failed", &e))
                }
                None => handler.serve(StreamableHttpClientTransport::from_config(config)).await.map_err(|e| failed("initialize failed", &e)),
            }
        }
    }
}

/// What one discovery found, for the console and `gatehouse mcp list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryReport {
    /// Tools the server listed (over the pages read).
    pub listed: usize,
    /// Tools taken into the cache.
    pub taken: usize,
    pub pages: u32,
    /// More tools than `max_tools`, or more pages than `discovery.max_pages`: the rest were ignored.
    pub truncated: bool,
    pub skipped: Vec<Skipped>,
    pub elapsed_ms: u64,
}

/// Lists tools across pages, keeping within the server's bounds (the caller bounds the time).
pub async fn discover(server: &ServerConfig, peer: &Peer<RoleClient>) -> Result<(Vec<Found>, DiscoveryReport), String> {
    let started = Instant::now();
    let limits = &server.discovery;
    let max_tools = server.max_tools as usize;
    let mut report = DiscoveryReport::default();
    let mut found: Vec<Found> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        if report.pages >= limits.max_pages {
            report.truncated = true;
            break;
        }
        report.pages += 1;
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor.take())))
            .await
            .map_err(|e| format!("tools/list failed: {}", normalize::bound_text(&e.to_string(), 300)))?;
        for tool in page.tools {
            report.listed += 1;
            let name = tool.name.to_string();
            if !server.takes(&name) {
                continue;
            }
            if found.len() >= max_tools {
                report.truncated = true;
                continue;
            }
            if found.iter().any(|f| f.name == name) {
                report.skipped.push(Skipped { tool: normalize::bound_text(&name, 100), reason: "listed twice".into() });
                continue;
            }
            let catalog_name = normalize::catalog_name(&server.id, &name);
            if let Some(holder) = found.iter().find(|f| f.catalog_name == catalog_name) {
                // `files.read` and `files_read_<hash>` can map to one name: the first keeps it.
                let reason = format!("its catalog name {catalog_name} is taken by {}", normalize::bound_text(&holder.name, 100));
                report.skipped.push(Skipped { tool: normalize::bound_text(&name, 100), reason });
                continue;
            }
            match normalize::definition(&tool, limits) {
                Ok(def) => found.push(Found { catalog_name, definition_hash: normalize::definition_hash(&def), definition: def.to_string(), name }),
                Err(reason) => report.skipped.push(Skipped { tool: normalize::bound_text(&name, 100), reason }),
            }
        }
        match page.next_cursor {
            Some(next) if found.len() < max_tools => cursor = Some(next),
            Some(_) => {
                report.truncated = true;
                break;
            }
            None => break,
        }
    }
    report.taken = found.len();
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok((found, report))
}

#[cfg(test)]
mod tests {
    use super::scrub_text;

    #[test]
    fn secrets_and_token_like_text_are_scrubbed() {
        let key = "s3cr3t-value-of-the-env".to_string();
        let lines = [
            ("starting with API key s3cr3t-value-of-the-env", "s3cr3t"),
            ("Authorization: Bearer abc.DEF-123_xyz", "abc.DEF"),
            ("password=hunter2 user=ada", "hunter2"),
            ("{\"api_key\": \"k-9f8e7d6c\"}", "k-9f8e7d6c"),
            ("GITHUB_TOKEN ghp_0123456789abcdefghijABCDEFGHIJ", "ghp_0123"),
            ("using sk-ant-api03-abcdefghijklmnopqrstu", "sk-ant"),
            ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXRleHQ", "eyJhbGci"),
            ("key Zx8fQ2mN7pL4vR9sT1wY6bC3dH5jK0aE", "Zx8fQ2mN"),
            ("AWS AKIAIOSFODNN7EXAMPLE rest", "AKIAIOSFODNN7"),
        ];
        for (line, leaked) in lines {
            let out = scrub_text(line, std::slice::from_ref(&key));
            assert!(!out.contains(leaked) && out.contains("[REDACTED]"), "{line:?} -> {out:?}");
        }
        let plain = "listening on port 8080, version 1.2.3, request id 42";
        assert_eq!(scrub_text(plain, &[]), plain, "ordinary log text stays readable");
    }
}
