//! `web_fetch`: GET an http(s) URL and return readable text, with title and final URL. Limits on
//! size, time, redirects and content type. Redirects are followed here, one request per hop, and
//! every hop is checked before it is requested: denied hosts (with their subdomains and their
//! addresses), the connectors' hosts (reached only through their connector), and every address
//! after DNS resolution (see [`super::net_guard`]). `allowed_hosts` entries exempt a host from the
//! address check, on the listed port only when the entry names one.

use std::{collections::HashSet, net::IpAddr, net::SocketAddr, sync::Arc};

use reqwest::{dns::Resolve, redirect};
use serde_json::{Value, json};

use super::{
    host_rules::{HostRules, Target, normal_name, target},
    html::html_to_text,
    net_guard,
};
use crate::tools::{ToolDef, ToolError, ToolExecutor};

pub const HANDLER: &str = "web_fetch";

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum FetchCode {
    #[strum(serialize = "FETCH_URL_INVALID")]
    UrlInvalid,
    #[strum(serialize = "FETCH_ADDRESS_FORBIDDEN")]
    AddressForbidden,
    #[strum(serialize = "FETCH_HOST_DENIED")]
    HostDenied,
    /// The host belongs to a configured connector: its data is reached through the connector's
    /// own tools (with their checks and credentials), never through the public web tools.
    #[strum(serialize = "FETCH_CONNECTOR_HOST")]
    ConnectorHost,
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

/// The fetcher's limits are the `[web_fetch]` settings themselves.
pub use crate::config::WebFetchSettings as FetchLimits;

/// Which client a checked hop goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Names resolve only to public addresses, unless allowed on every port.
    Strict,
    /// The hop's host is allowed on exactly this port: its name may resolve anywhere.
    AllowedPort,
}

/// The lists a hop is checked against, parsed once; the connectors' hosts again whenever the
/// catalog changes (a reload can add or remove a connector).
#[derive(Debug)]
struct Rules {
    allowed: HostRules,
    denied: HostRules,
    connectors: std::sync::RwLock<Arc<HostRules>>,
}

impl Rules {
    fn connectors(&self) -> Arc<HostRules> {
        self.connectors.read().map(|c| c.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Checks a URL before it is requested. Names of denied and connector hosts are resolved
    /// when the URL names an address, so the address of a refused host is refused too.
    async fn check(&self, url: &url::Url) -> Result<Route, ToolError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("only http and https URLs can be fetched, not {}:", url.scheme())));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), "URLs with credentials are refused"));
        }
        let (host, port) = target(url).ok_or_else(|| ToolError::refused(FetchCode::UrlInvalid.as_str(), "the URL has no host"))?;
        let connectors = self.connectors();
        if connectors.find(&host, port, false).is_some() {
            return Err(connector_host());
        }
        if self.denied.find(&host, port, true).is_some() {
            return Err(denied());
        }
        if let Target::Addr(ip) = host {
            if lookup_all(connectors.names()).await.contains(&ip) {
                return Err(connector_host());
            }
            if lookup_all(self.denied.names()).await.contains(&ip) {
                return Err(denied());
            }
        }
        match (self.allowed.find(&host, port, false), &host) {
            (Some(super::host_rules::HostEntry::Name { port: Some(_), .. }), _) => Ok(Route::AllowedPort),
            (Some(_), _) => Ok(Route::Strict),
            (None, Target::Addr(ip)) => match net_guard::forbidden(*ip) {
                Some(why) => Err(ToolError::refused(FetchCode::AddressForbidden.as_str(), format!("the address is {why}"))),
                None => Ok(Route::Strict),
            },
            (None, Target::Name(_)) => Ok(Route::Strict),
        }
    }
}

fn denied() -> ToolError {
    ToolError::refused(FetchCode::HostDenied.as_str(), "this host is on the deny list")
}

/// The connectors' hosts (`host[:port]` each) as rules: a connector's host is refused on every
/// port.
fn connector_rules(connector_hosts: &[String]) -> HostRules {
    let names: Vec<String> = connector_hosts.iter().map(|h| h.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(h.clone(), |(n, _)| n.to_string())).collect();
    HostRules::new(&names)
}

fn connector_host() -> ToolError {
    ToolError::refused(FetchCode::ConnectorHost.as_str(), "this host belongs to a connector; use that connector's tools")
}

/// Every address the names resolve to; a name that does not resolve adds nothing.
async fn lookup_all<'a>(names: impl Iterator<Item = &'a str>) -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    for name in names {
        if let Ok(addrs) = tokio::net::lookup_host((name, 0)).await {
            out.extend(addrs.map(|a| super::host_rules::canonical(a.ip())));
        }
    }
    out
}

/// Resolves names, then refuses the answer if any address is denied, or is not public and the
/// name is not in `allowed`. Checking every address defeats DNS answers that mix public and
/// private ones. reqwest asks without the port, which is why a client holds the names allowed
/// on the ports its hops use.
struct GuardedResolver {
    allowed: Vec<String>,
    denied: Arc<Rules>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let allowed = self.allowed.contains(&normal_name(&host));
        let rules = self.denied.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let connectors = rules.connectors();
            if addrs.iter().any(|a| rules.denied.has_addr(a.ip()) || connectors.has_addr(a.ip())) {
                return Err(format!("{}: {host} resolves to a denied address", FetchCode::HostDenied.as_str()).into());
            }
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
    strict: reqwest::Client,
    allowed_port: reqwest::Client,
    rules: Arc<Rules>,
    limits: Arc<FetchLimits>,
}

impl WebFetch {
    pub fn new(limits: FetchLimits) -> Result<Self, reqwest::Error> {
        Self::with_connector_hosts(limits, &[])
    }

    /// Like [`WebFetch::new`], refusing `connector_hosts` (each a connector's `host[:port]`) with
    /// `FETCH_CONNECTOR_HOST`: a connector's data is reached through the connector only.
    pub fn with_connector_hosts(limits: FetchLimits, connector_hosts: &[String]) -> Result<Self, reqwest::Error> {
        let rules = Arc::new(Rules {
            allowed: HostRules::new(&limits.allowed_hosts),
            denied: HostRules::new(&limits.denied_hosts),
            connectors: std::sync::RwLock::new(Arc::new(connector_rules(connector_hosts))),
        });
        let any_port = rules.allowed.any_port_names();
        let mut with_ports: Vec<String> = rules.allowed.names().map(str::to_string).collect();
        with_ports.extend(any_port.iter().cloned());
        let client = |allowed: Vec<String>| {
            reqwest::Client::builder()
                .redirect(redirect::Policy::none())
                .dns_resolver(Arc::new(GuardedResolver { allowed, denied: rules.clone() }))
                .no_proxy()
                .timeout(limits.timeout)
                .user_agent(limits.user_agent.clone())
                .build()
        };
        Ok(Self { strict: client(any_port)?, allowed_port: client(with_ports)?, rules: rules.clone(), limits: Arc::new(limits) })
    }

    /// Refuses `connector_hosts` from now on, instead of those given before.
    pub fn set_connector_hosts(&self, connector_hosts: &[String]) {
        let rules = Arc::new(connector_rules(connector_hosts));
        match self.rules.connectors.write() {
            Ok(mut current) => *current = rules,
            Err(poisoned) => *poisoned.into_inner() = rules,
        }
    }

    pub async fn fetch(&self, raw: &str) -> Result<Value, ToolError> {
        let url = url::Url::parse(raw.trim()).map_err(|e| ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("not a URL: {e}")))?;
        let mut hop = url.clone();
        let mut redirects = 0;
        let mut res = loop {
            let client = match self.rules.check(&hop).await {
                Ok(Route::Strict) => &self.strict,
                Ok(Route::AllowedPort) => &self.allowed_port,
                Err(e) if redirects > 0 => return Err(ToolError::refused(&e.code, format!("redirect to a refused URL: {}", e.message))),
                Err(e) => return Err(e),
            };
            let res = client.get(hop.clone()).send().await.map_err(classify)?;
            let location = res.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok());
            match location {
                Some(next) if matches!(res.status().as_u16(), 301 | 302 | 303 | 307 | 308) => {
                    if redirects >= self.limits.max_redirects {
                        return Err(ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("more than {} redirects", self.limits.max_redirects)));
                    }
                    hop = hop.join(next).map_err(|e| ToolError::refused(FetchCode::UrlInvalid.as_str(), format!("redirect to something that is not a URL: {e}")))?;
                    redirects += 1;
                }
                _ => break res,
            }
        };
        let final_url = res.url().to_string();
        let status = res.status();
        if !status.is_success() {
            let retryable = status.is_server_error() || status.as_u16() == 429;
            return Err(ToolError::of_target(FetchCode::HttpStatus.as_str(), format!("the server answered {status}"), retryable));
        }
        let content_type = res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
        let kind = content_type.split(';').next().unwrap_or("").trim().to_string();
        let readable = kind.starts_with("text/") || kind.ends_with("json") || kind.ends_with("+xml") || kind == "application/xml" || kind.is_empty();
        if !readable {
            return Err(ToolError::of_target(FetchCode::ContentType.as_str(), format!("{kind} is not readable text"), false));
        }
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = res.chunk().await.map_err(classify)? {
            let room = usize::try_from(self.limits.max_bytes).unwrap_or(usize::MAX).saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if chunk.len() > room {
                truncated = true;
                break;
            }
        }
        let text = decode(&body, &content_type, truncated);
        let html = kind.contains("html") || (kind.is_empty() && text.trim_start().starts_with('<'));
        // Rendering is synchronous work on a page of up to `max_bytes`: off the async threads,
        // so the tool's timeout still applies.
        let (title, text) = if html {
            tokio::task::spawn_blocking(move || html_to_text(&text)).await.map_err(|e| ToolError::new(FetchCode::Network.as_str(), format!("reading the page failed: {e}"), false))?
        } else {
            (None, text)
        };
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

/// The body as text in its own encoding: its byte-order mark, else the Content-Type's charset,
/// else an HTML page's `<meta charset>` in its first kilobyte, else UTF-8. A character that
/// `max_bytes` cut in two is left out rather than shown as a replacement.
fn decode(body: &[u8], content_type: &str, truncated: bool) -> String {
    static META: std::sync::LazyLock<regex::bytes::Regex> =
        std::sync::LazyLock::new(|| regex::bytes::Regex::new(r#"(?i)<meta[^>]*charset\s*=\s*["']?([a-z0-9_:.-]+)"#).expect("a valid pattern"));
    let declared = content_type.split(';').filter_map(|p| p.trim().strip_prefix("charset=")).next().map(|c| c.trim_matches('"').as_bytes().to_vec());
    let sniffed = || META.captures(&body[..body.len().min(1024)]).map(|c| c[1].to_vec());
    let encoding = declared.or_else(sniffed).and_then(|label| encoding_rs::Encoding::for_label(&label)).unwrap_or(encoding_rs::UTF_8);
    // A BOM wins over any label (the WHATWG decode algorithm).
    let (text, _, _) = encoding.decode(body);
    let mut text = text.into_owned();
    if truncated && text.ends_with('\u{FFFD}') {
        text.pop();
    }
    text
}

/// A request error as a tool error; the URL is left out (its query may hold a token).
fn classify(e: reqwest::Error) -> ToolError {
    let e = e.without_url();
    let text = format!("{e:#}");
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    let mut chain = String::new();
    while let Some(err) = source {
        chain.push_str(&err.to_string());
        chain.push(' ');
        source = err.source();
    }
    for refused in [FetchCode::AddressForbidden.as_str(), FetchCode::HostDenied.as_str(), FetchCode::ConnectorHost.as_str(), FetchCode::UrlInvalid.as_str()] {
        if chain.contains(refused) {
            return ToolError::refused(refused, chain.trim().to_string());
        }
    }
    ToolError::of_target(FetchCode::Network.as_str(), text, e.is_timeout() || e.is_connect())
}

#[async_trait::async_trait]
impl ToolExecutor for WebFetch {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        let url = args.get("url").and_then(Value::as_str).ok_or_else(|| ToolError::refused(FetchCode::UrlInvalid.as_str(), "the url argument is missing"))?;
        self.fetch(url).await
    }

    /// A reload that adds a connector makes its host refused here at once; one that removes a
    /// connector frees its host.
    fn catalog_changed(&self, catalog: &crate::tools::Catalog) {
        self.set_connector_hosts(&crate::tools::connectors::hosts(catalog));
    }
}
