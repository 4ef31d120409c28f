//! Sending one request with the official SDKs' retry rules, inside one deadline.
//!
//! As in anthropic-sdk-python `_base_client.py` (`_should_retry`, `_calculate_retry_timeout`):
//! an `x-should-retry: true|false` header decides when present; otherwise 408, 409, 429 and
//! every 5xx (529 included) are retried, and so are connection errors and timeouts. The wait is
//! `retry-after-ms` or `retry-after` (seconds or an HTTP date) when it is above zero and at most
//! 60 s, else `initial * 2^retries` capped at `max`, less up to 25 % jitter. Beyond the SDKs, a
//! spend-limit error is never retried, and no retry starts that could not finish before the
//! deadline.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::error::{ErrorCode, LlmError, Redactor};
use crate::config::LlmSettings;

/// Longest `retry-after` honoured; a longer one falls back to exponential backoff (SDK rule).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    pub fn from_settings(llm: &LlmSettings) -> Self {
        Self { max_retries: llm.max_retries, initial_delay: llm.retry_initial_delay, max_delay: llm.retry_max_delay }
    }

    /// The wait before retry number `retries_taken + 1`, without a `retry-after`.
    pub fn backoff(&self, retries_taken: u32) -> Duration {
        let base = self.initial_delay.saturating_mul(2u32.saturating_pow(retries_taken.min(20))).min(self.max_delay);
        let jitter = 1.0 - 0.25 * rand::random::<f64>();
        base.mul_f64(jitter)
    }
}

/// A provider's reading of an error answer: its code and its (already redacted) message.
pub(crate) type Classify<'a> = &'a (dyn Fn(u16, &[u8]) -> (ErrorCode, String) + Send + Sync);

/// A 2xx answer.
#[derive(Debug)]
pub(crate) struct HttpOk {
    pub body: Vec<u8>,
    pub request_id: Option<String>,
    pub attempts: u32,
}

/// Everything a failed attempt tells the loop.
struct Failure {
    error: LlmError,
    retry: bool,
    retry_after: Option<Duration>,
}

/// Sends `build()` until it succeeds, a failure is final, retries run out or the deadline
/// `timeout` from now would pass.
pub(crate) async fn send(
    policy: &RetryPolicy,
    timeout: Duration,
    request_id_header: &str,
    redactor: &Redactor,
    build: &(dyn Fn() -> reqwest::RequestBuilder + Send + Sync),
    classify: Classify<'_>,
) -> Result<HttpOk, LlmError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let sent = tokio::time::timeout_at(deadline, async {
            let res = build().send().await?;
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let body = res.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        })
        .await;
        let failure = match sent {
            Err(_elapsed) => {
                let mut error = LlmError::new(ErrorCode::Timeout, format!("no answer within the {} deadline", humantime::format_duration(timeout)), true);
                error.attempts = attempts;
                error.latency = started.elapsed();
                return Err(error);
            }
            Ok(Err(e)) => {
                let code = if e.is_timeout() { ErrorCode::Timeout } else { ErrorCode::ProviderError };
                let message = redactor.clean(&format!("could not reach the provider: {}", e.without_url()));
                Failure { error: LlmError::new(code, message, true), retry: true, retry_after: None }
            }
            Ok(Ok((status, headers, body))) => {
                let request_id = headers.get(request_id_header).and_then(|v| v.to_str().ok()).map(str::to_string);
                if (200..300).contains(&status) {
                    return Ok(HttpOk { body: body.to_vec(), request_id, attempts });
                }
                let (code, message) = classify(status, &body);
                let retry = code != ErrorCode::SpendLimit
                    && match headers.get("x-should-retry").and_then(|v| v.to_str().ok()) {
                        Some("true") => true,
                        Some("false") => false,
                        _ => matches!(status, 408 | 409 | 429) || status >= 500,
                    };
                let mut error = LlmError::new(code, message, retry);
                error.status = Some(status);
                error.request_id = request_id;
                Failure { error, retry, retry_after: retry_after(&headers) }
            }
        };
        let Failure { mut error, retry, retry_after } = failure;
        error.attempts = attempts;
        if !retry || attempts > policy.max_retries {
            error.latency = started.elapsed();
            return Err(error);
        }
        let wait = retry_after.filter(|d| !d.is_zero() && *d <= MAX_RETRY_AFTER).unwrap_or_else(|| policy.backoff(attempts - 1));
        if Instant::now() + wait >= deadline {
            error.latency = started.elapsed();
            return Err(error);
        }
        tracing::info!(code = %error.code, status = ?error.status, attempt = attempts, wait_ms = wait.as_millis() as u64, "LLM request failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

/// `retry-after-ms` (milliseconds), else `retry-after` (seconds or an HTTP date).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    at.duration_since(SystemTime::now()).ok()
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderMap, HeaderValue};

    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let p = RetryPolicy { max_retries: 5, initial_delay: Duration::from_millis(500), max_delay: Duration::from_secs(8) };
        for (taken, full) in [(0, 500), (1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 8000)] {
            let d = p.backoff(taken).as_millis();
            assert!(d <= full && d >= full * 3 / 4, "retry {taken}: {d} ms");
        }
    }

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)), "the ms header wins");
        let mut h = HeaderMap::new();
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&later).expect("header"));
        let d = retry_after(&h).expect("date");
        assert!(d > Duration::from_secs(25) && d <= Duration::from_secs(30), "{d:?}");
    }
}
