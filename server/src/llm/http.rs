//! What both HTTP clients share: the configured endpoint, the key as a sensitive header value,
//! the checks before a call, the retrying send and the parse into a [`ChatResponse`].

use std::time::Duration;

use reqwest::{RequestBuilder, header::HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use tokio::time::Instant;

use super::{
    ChatRequest, ChatResponse, ContentBlock, StopReason, Usage,
    error::{ErrorCode, LlmError, Redactor},
    retry::{self, RetryPolicy},
};
use crate::config::EndpointSettings;

/// What a provider's parser takes from a 2xx body: content, stop reason, stop details, usage
/// and the answering model; or why the body is not usable.
pub(crate) type Parsed = (Vec<ContentBlock>, StopReason, Option<Value>, Usage, String);

/// How a provider reads its answers: one whole, and the tokens one says it used (kept for an
/// answer that cannot be read whole).
pub(crate) struct Reader<'a> {
    pub parse: &'a (dyn Fn(&Value) -> Result<Parsed, String> + Send + Sync),
    pub usage: &'a (dyn Fn(&Value) -> Usage + Send + Sync),
}

pub(crate) struct Endpoint {
    client: reqwest::Client,
    pub base_url: String,
    pub max_tokens: u32,
    timeout: Duration,
    policy: RetryPolicy,
    /// The authorization header value (marked sensitive, so `Debug` never shows it).
    key: Option<HeaderValue>,
    key_var: &'static str,
    redactor: Redactor,
}

impl Endpoint {
    /// `key_prefix` goes before the key in its header, e.g. `"Bearer "`.
    pub(crate) fn new(
        settings: &EndpointSettings,
        policy: RetryPolicy,
        key: Option<&SecretString>,
        key_var: &'static str,
        key_prefix: &str,
    ) -> Result<Self, LlmError> {
        // No redirects: a key in its own header (Anthropic's `x-api-key`) is kept by reqwest on
        // a redirect to another host, so following one would give the key to that host.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| LlmError::not_configured(format!("cannot build the HTTP client: {}", e.without_url())))?;
        let raw = key.map(|k| k.expose_secret().trim().to_string()).filter(|k| !k.is_empty());
        let key = match &raw {
            Some(k) => {
                let mut value = HeaderValue::from_str(&format!("{key_prefix}{k}"))
                    .map_err(|_| LlmError::not_configured(format!("{key_var} holds characters not allowed in an HTTP header")))?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        Ok(Self {
            client,
            base_url: settings.base_url.trim_end_matches('/').to_string(),
            max_tokens: settings.max_tokens,
            timeout: settings.timeout,
            policy,
            key,
            key_var,
            redactor: Redactor::new(raw.as_deref()),
        })
    }

    pub(crate) fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Checks the configuration, sends with retries, and parses the answer.
    pub(crate) async fn call(
        &self,
        req: &ChatRequest,
        url: &str,
        request_id_header: &str,
        authorize: &(dyn Fn(RequestBuilder, &HeaderValue) -> RequestBuilder + Send + Sync),
        classify: retry::Classify<'_>,
        reader: &Reader<'_>,
    ) -> Result<ChatResponse, LlmError> {
        let Some(key) = &self.key else {
            return Err(LlmError::not_configured(format!("{} is not set", self.key_var)));
        };
        if req.model.trim().is_empty() {
            return Err(LlmError::not_configured(format!("no model is configured for {0} (models.{0})", req.purpose.as_str())));
        }
        if self.base_url.is_empty() {
            return Err(LlmError::not_configured("the provider's base_url is empty"));
        }
        let started = Instant::now();
        let build = || authorize(self.client.post(url), key);
        let ok = retry::send(&self.policy, self.timeout, request_id_header, &self.redactor, &build, classify).await?;
        let invalid = |why: String| {
            let mut e = LlmError::new(ErrorCode::InvalidResponse, self.redactor.clean(&format!("the provider's answer is not usable: {why}")), false);
            e.status = Some(200);
            e.request_id.clone_from(&ok.request_id);
            e.attempts = ok.attempts;
            e.latency = started.elapsed();
            e
        };
        let body: Value = serde_json::from_slice(&ok.body).map_err(|e| invalid(format!("not JSON ({e})")))?;
        // An answer that cannot be used still counts the tokens it says were used.
        let (content, stop_reason, stop_details, usage, model) = (reader.parse)(&body).map_err(|why| LlmError { usage: (reader.usage)(&body), ..invalid(why) })?;
        Ok(ChatResponse {
            content,
            stop_reason,
            stop_details,
            usage,
            model: if model.is_empty() { req.model.clone() } else { model },
            request_id: ok.request_id,
            latency: started.elapsed(),
            attempts: ok.attempts,
        })
    }
}

/// A spend limit or exhausted credit: retrying cannot help until an owner acts. Anthropic marks
/// the enforced limit with `error.details.error_code = "enforced_spend_limit_reached"` (on a
/// 429); OpenAI uses the code `insufficient_quota`. The two messages matched below are the
/// providers' wording for an exhausted credit balance and a reached usage limit on a 400.
pub(crate) fn is_spend_limit(error: &Value, message: Option<&str>) -> bool {
    let codes = [
        error.pointer("/details/error_code"),
        error.get("code"),
        error.get("type"),
    ];
    let coded = codes.iter().flatten().filter_map(|v| v.as_str()).any(|c| matches!(c, "enforced_spend_limit_reached" | "insufficient_quota"));
    let lower = message.unwrap_or_default().to_ascii_lowercase();
    coded || lower.contains("credit balance is too low") || lower.contains("reached your specified api usage limits")
}
