//! `web_search`: searches through the configured provider, a SearXNG-compatible JSON endpoint
//! or the Brave Search API, and returns title, URL and snippet for each result, with the
//! provider named as the source. The endpoint is the operator's configuration, not the model's.

use std::time::Duration;

use serde_json::{Value, json};

pub use crate::config::SearchProvider;
use crate::tools::{ToolDef, ToolError, ToolExecutor};

pub const HANDLER: &str = "web_search";
/// Environment variable holding the Brave Search API key.
pub const BRAVE_KEY_VAR: &str = "BRAVE_SEARCH_API_KEY";

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum SearchCode {
    #[strum(serialize = "SEARCH_NOT_CONFIGURED")]
    NotConfigured,
    #[strum(serialize = "SEARCH_PROVIDER_ERROR")]
    Provider,
    #[strum(serialize = "SEARCH_QUERY_INVALID")]
    QueryInvalid,
}

impl SearchCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}


pub struct WebSearch {
    client: reqwest::Client,
    provider: SearchProvider,
    base_url: String,
    max_results: usize,
    brave_key: Option<String>,
}

/// The most a search provider's answer may hold; results are a few kilobytes.
const MAX_ANSWER_BYTES: usize = 2 << 20;

/// The answer as JSON, read up to [`MAX_ANSWER_BYTES`].
async fn read_json(mut res: reqwest::Response) -> Result<Value, ToolError> {
    let body = crate::tools::read_capped(&mut res, MAX_ANSWER_BYTES).await.map_err(|e| match e {
        crate::tools::CappedRead::Read(e) => ToolError::new(SearchCode::Provider.as_str(), format!("reading the search provider's answer failed: {}", e.without_url()), true),
        crate::tools::CappedRead::TooLarge => ToolError::new(SearchCode::Provider.as_str(), format!("the search provider's answer is over {MAX_ANSWER_BYTES} bytes"), false),
    })?;
    serde_json::from_slice(&body).map_err(|_| ToolError::new(SearchCode::Provider.as_str(), "the search provider's answer is not JSON", false))
}

impl WebSearch {
    pub fn new(provider: SearchProvider, base_url: &str, max_results: usize, timeout: Duration, brave_key: Option<String>) -> Result<Self, reqwest::Error> {
        // No redirects: the Brave key travels in its own header, which reqwest does not strip on
        // a redirect to another host (it strips only Authorization, Cookie and the proxy's).
        let client = reqwest::Client::builder().timeout(timeout).no_proxy().redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Self { client, provider, base_url: base_url.trim_end_matches('/').to_string(), max_results: max_results.max(1), brave_key })
    }

    pub async fn search(&self, query: &str) -> Result<Value, ToolError> {
        let query = query.trim();
        if query.is_empty() || query.chars().count() > 400 {
            return Err(ToolError::refused(SearchCode::QueryInvalid.as_str(), "the query must be 1 to 400 characters"));
        }
        if self.base_url.is_empty() {
            return Err(ToolError::new(SearchCode::NotConfigured.as_str(), "no search provider is configured ([web_search] base_url)", false));
        }
        let mut url = url::Url::parse(&self.base_url).map_err(|e| ToolError::new(SearchCode::NotConfigured.as_str(), format!("web_search.base_url is not a URL: {e}"), false))?;
        let request = match self.provider {
            SearchProvider::Searxng => {
                url.path_segments_mut().map_err(|()| ToolError::new(SearchCode::NotConfigured.as_str(), "web_search.base_url cannot take a path", false))?.pop_if_empty().push("search");
                url.query_pairs_mut().append_pair("q", query).append_pair("format", "json");
                self.client.get(url)
            }
            SearchProvider::Brave => {
                let key = self.brave_key.as_deref().ok_or_else(|| ToolError::new(SearchCode::NotConfigured.as_str(), format!("{BRAVE_KEY_VAR} is not set"), false))?;
                url.query_pairs_mut().append_pair("q", query).append_pair("count", &self.max_results.to_string());
                self.client.get(url).header("X-Subscription-Token", key).header("Accept", "application/json")
            }
        };
        let res = request.send().await.map_err(|e| {
            let retryable = e.is_timeout() || e.is_connect();
            ToolError::new(SearchCode::Provider.as_str(), format!("the search provider did not answer: {}", e.without_url()), retryable)
        })?;
        let status = res.status();
        if !status.is_success() {
            return Err(ToolError::new(SearchCode::Provider.as_str(), format!("the search provider answered {status}"), status.is_server_error() || status.as_u16() == 429));
        }
        let body = read_json(res).await?;
        let items = match self.provider {
            SearchProvider::Searxng => body.get("results"),
            SearchProvider::Brave => body.get("web").and_then(|w| w.get("results")),
        };
        let results: Vec<Value> = items
            .and_then(Value::as_array)
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|r| {
                let url = r.get("url")?.as_str()?;
                let title = r.get("title").and_then(Value::as_str).unwrap_or(url);
                let snippet = r.get("content").or_else(|| r.get("description")).and_then(Value::as_str).unwrap_or("");
                Some(json!({ "title": clip(title, 200), "url": url, "snippet": clip(snippet, 500) }))
            })
            .take(self.max_results)
            .collect();
        let source = match self.provider {
            SearchProvider::Searxng => "searxng",
            SearchProvider::Brave => "brave",
        };
        Ok(json!({ "query": query, "source": source, "results": results }))
    }
}

fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[async_trait::async_trait]
impl ToolExecutor for WebSearch {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        let query = args.get("query").and_then(Value::as_str).ok_or_else(|| ToolError::refused(SearchCode::QueryInvalid.as_str(), "the query argument is missing"))?;
        self.search(query).await
    }
}
