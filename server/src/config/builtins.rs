//! Settings of the built-in tools `web_fetch` and `web_search`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// Which search service `web_search` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SearchProvider {
    #[default]
    Searxng,
    Brave,
}

/// The built-in `web_search` provider.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebSearchSettings {
    pub provider: SearchProvider,
    /// SearXNG: the instance's base URL; Brave: the API endpoint.
    pub base_url: String,
    pub max_results: u32,
    #[serde(with = "duration_str")]
    pub timeout: Duration,
}

impl Default for WebSearchSettings {
    fn default() -> Self {
        Self { provider: Default::default(), base_url: String::new(), max_results: 5, timeout: Duration::from_secs(10) }
    }
}

/// Limits of the built-in `web_fetch` implementation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebFetchSettings {
    pub max_bytes: u64,
    pub max_redirects: u32,
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// Hosts (`host` or `host:port`) fetched even when their address is not public.
    pub allowed_hosts: Vec<String>,
    /// Hosts never fetched: a name with its subdomains, an address or a network (CIDR).
    pub denied_hosts: Vec<String>,
    pub user_agent: String,
}

impl Default for WebFetchSettings {
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
