//! `web_fetch`: GET an http(s) URL and return readable text, with title and final URL. Limits on
//! size, time, redirects and content type. Every address is checked after DNS resolution and on
//! every redirect (see [`super::net_guard`]); allowed and denied hosts come from config.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use reqwest::{dns::Resolve, redirect};
use serde_json::{Value, json};

use super::{html::html_to_text, net_guard};
use crate::tools::{ToolDef, ToolError, ToolExecutor};

pub const HANDLER: &str = "web_fetch";

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
pub enum FetchCode {
    #[strum(serialize = "FETCH_URL_INVALID")]
    UrlInvalid,
    #[strum(serialize = "FETCH_ADDRESS_FORBIDDEN")]
    AddressForbidden,
    #[strum(serialize = "FETCH_HOST_DENIED")]
    HostDenied,
    #[strum(serialize = "FETCH_CONTENT_TYPE_REFUSED")]
    ContentType,
    #[strum(serialize = "FETCH_HTTP_STATUS")]
    HttpStatus,
    #[strum(serialize = "FETCH_NETWORK_ERROR")]
    Network,
}

impl FetchCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for FetchCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct FetchLimits {
    pub max_bytes: usize,
    pub max_redirects: usize,
    pub timeout: Duration,
    /// Hosts (`host` or `host:port`) fetched even if their address is not public.
    pub allowed_hosts: Vec<String>,
    /// Hosts never fetched.
    pub denied_hosts: Vec<String>,
    pub user_agent: String,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            max_bytes: 2_000_000,
            max_redirects: 5,
            timeout: Duration::from_secs(10),
            allowed_hosts: Vec::new(),
            denied_hosts: Vec::new(),
            user_agent: concat!("Gatehouse/", env!("CARGO_PKG_VERSION"), " (web_fetch)").into(),
        }
    }
}

fn host_key(url: &url::Url) -> (String, String) {
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let with_port = url.port_or_known_default().map_or(host.clone(), |p| format!("{host}:{p}"));
    (host, with_port)
}

fn listed(list: &[String], url: &url::Url) -> bool {
    let (host, with_port) = host_key(url);
    list.iter().any(|h| h.eq_ignore_ascii_case(&host) || h.eq_ignore_ascii_case(&with_port))
}

/// Checks a URL before any connection: scheme, denied hosts, and literal IP hosts.
fn check_url(url: &url::Url, limits: &FetchLimits) -> Result<(), ToolError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("only http and https URLs can be fetched, not {}:", url.scheme())));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), "URLs with credentials are refused"));
    }
    if listed(&limits.denied_hosts, url) {
        return Err(ToolError::refused(FetchCode::HostDenied.as_str(), "this host is on the deny list"));
    }
    if listed(&limits.allowed_hosts, url) {
        return Ok(());
    }
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => Some(std::net::IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(std::net::IpAddr::V6(v6)),
        Some(url::Host::Domain(_)) => None,
        None => return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), "the URL has no host")),
    };
    if let Some(why) = ip.and_then(net_guard::forbidden) {
        return Err(ToolError::refused(FetchCode::AddressForbidden.as_str(), format!("the address is {why}")));
    }
    Ok(())
}

/// Resolves names, then refuses the answer if any address is not public (unless the host is
/// explicitly allowed). Checking every address defeats DNS answers that mix public and private.
struct GuardedResolver {
    allowed: Vec<String>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let allowed = self.allowed.iter().any(|h| h.split(':').next() == Some(host.as_str()));
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !allowed
                && let Some(why) = addrs.iter().find_map(|a| net_guard::forbidden(a.ip()))
            {
                return Err(format!("{}: {host} resolves to a {why} address", FetchCode::AddressForbidden.as_str()).into());
            }
            let iter: Box<dyn Iterator<Item = SocketAddr> + Send> = Box::new(addrs.into_iter());
            Ok(iter)
        })
    }
}

pub struct WebFetch {
    client: reqwest::Client,
    limits: Arc<FetchLimits>,
}

impl WebFetch {
    pub fn new(limits: FetchLimits) -> Result<Self, reqwest::Error> {
        let limits = Arc::new(limits);
        let policy_limits = limits.clone();
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= policy_limits.max_redirects {
                return attempt.error(format!("{}: more than {} redirects", FetchCode::UrlInvalid.as_str(), policy_limits.max_redirects));
            }
            match check_url(attempt.url(), &policy_limits) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(format!("{}: redirect to a refused URL: {}", e.code, e.message)),
            }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .dns_resolver(Arc::new(GuardedResolver { allowed: limits.allowed_hosts.clone() }))
            .no_proxy()
            .timeout(limits.timeout)
            .user_agent(limits.user_agent.clone())
            .build()?;
        Ok(Self { client, limits })
    }

    pub async fn fetch(&self, raw: &str) -> Result<Value, ToolError> {
        let url = url::Url::parse(raw.trim()).map_err(|e| ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("not a URL: {e}")))?;
        check_url(&url, &self.limits)?;
        let mut res = self.client.get(url.clone()).send().await.map_err(classify)?;
        let final_url = res.url().to_string();
        let status = res.status();
        if !status.is_success() {
            let retryable = status.is_server_error() || status.as_u16() == 429;
            return Err(ToolError::new(FetchCode::HttpStatus.as_str(), format!("the server answered {status}"), retryable));
        }
        let content_type = res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
        let kind = content_type.split(';').next().unwrap_or("").trim().to_string();
        let readable = kind.starts_with("text/") || kind.ends_with("json") || kind.ends_with("+xml") || kind == "application/xml" || kind.is_empty();
        if !readable {
            return Err(ToolError::new(FetchCode::ContentType.as_str(), format!("{kind} is not readable text"), false));
        }
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = res.chunk().await.map_err(classify)? {
            let room = self.limits.max_bytes.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if chunk.len() > room {
                truncated = true;
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        let (title, text) = if kind.contains("html") || (kind.is_empty() && text.trim_start().starts_with('<')) { html_to_text(&text) } else { (None, text.into_owned()) };
        Ok(json!({
            "url": url.to_string(),
            "final_url": final_url,
            "status": status.as_u16(),
            "content_type": kind,
            "title": title,
            "text": text,
            "truncated": truncated,
        }))
    }
}

fn classify(e: reqwest::Error) -> ToolError {
    let text = format!("{e:#}");
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    let mut chain = String::new();
    while let Some(err) = source {
        chain.push_str(&err.to_string());
        chain.push(' ');
        source = err.source();
    }
    for refused in [FetchCode::AddressForbidden.as_str(), FetchCode::HostDenied.as_str(), FetchCode::UrlInvalid.as_str()] {
        if chain.contains(refused) {
            return ToolError::refused(refused, chain.trim().to_string());
        }
    }
    ToolError::new(FetchCode::Network.as_str(), text, e.is_timeout() || e.is_connect())
}

#[async_trait::async_trait]
impl ToolExecutor for WebFetch {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        let url = args.get("url").and_then(Value::as_str).ok_or_else(|| ToolError::refused(FetchCode::UrlInvalid.as_str(), "the url argument is missing"))?;
        self.fetch(url).await
    }
}
