//! Errors with stable codes. A message may quote the provider's own words, but never a key:
//! every message passes through [`Redactor`] before it is stored in an error.

use std::{fmt, sync::LazyLock, time::Duration};

use regex::Regex;

use super::Usage;

/// Stable codes, shown to owners and recorded with each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE", prefix = "LLM_")]
pub enum ErrorCode {
    /// No key for the provider, no base URL, or no model for the purpose.
    NotConfigured,
    /// The key was refused (401) or lacks permission (403).
    Auth,
    RateLimited,
    /// The provider is overloaded (529).
    Overloaded,
    /// The request's deadline passed (or the provider timed out, 408 / 504).
    Timeout,
    /// The request was refused as malformed, too large or naming an unknown model.
    BadRequest,
    /// The organisation's spend limit or the account's credit is exhausted. Never retried.
    SpendLimit,
    /// A server error, conflict or connection failure at the provider.
    ProviderError,
    /// A 2xx answer that is not the expected JSON.
    InvalidResponse,
}

impl ErrorCode {
    pub const ALL: [Self; 9] = [
        Self::NotConfigured,
        Self::Auth,
        Self::RateLimited,
        Self::Overloaded,
        Self::Timeout,
        Self::BadRequest,
        Self::SpendLimit,
        Self::ProviderError,
        Self::InvalidResponse,
    ];

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The code for an HTTP error status, before the body is looked at.
    pub fn for_status(status: u16) -> Self {
        match status {
            401 | 403 => Self::Auth,
            402 => Self::SpendLimit,
            408 | 504 => Self::Timeout,
            429 => Self::RateLimited,
            529 => Self::Overloaded,
            400 | 404 | 405 | 413 | 415 | 422 => Self::BadRequest,
            _ => Self::ProviderError,
        }
    }
}


#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct LlmError {
    pub code: ErrorCode,
    /// What went wrong, with the provider's message when there is one. Never holds a key.
    pub message: String,
    /// Whether trying again later may succeed (the client already retried within its budget).
    pub retryable: bool,
    /// The provider's HTTP status, when it answered.
    pub status: Option<u16>,
    pub request_id: Option<String>,
    /// HTTP attempts made (0 when the call never reached the network).
    pub attempts: u32,
    /// From the first attempt to giving up.
    pub latency: Duration,
    /// Tokens the provider reported with an answer that could not be used: the call happened,
    /// may be billed, and is counted.
    pub usage: Usage,
}

impl LlmError {
    pub fn new(code: ErrorCode, message: impl Into<String>, retryable: bool) -> Self {
        Self { code, message: message.into(), retryable, status: None, request_id: None, attempts: 0, latency: Duration::ZERO, usage: Usage::default() }
    }

    pub fn not_configured(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotConfigured, message, false)
    }
}

/// Removes a key from text that is about to become an error message. Providers sometimes quote
/// (part of) the key they were given, e.g. OpenAI's "Incorrect API key provided: sk-ab***yz".
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    key: Option<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Redactor([REDACTED])")
    }
}

/// Longest provider message kept in an error.
const MAX_MESSAGE_CHARS: usize = 500;

static KEY_LIKE: LazyLock<Regex> = LazyLock::new(|| {
    // The `sk-` prefix of Anthropic, OpenAI and OpenRouter keys, masked or not.
    #[expect(clippy::unwrap_used, reason = "a constant pattern")]
    Regex::new(r"\bsk-[A-Za-z0-9_\-\*\.]{3,}").unwrap()
});

impl Redactor {
    pub(crate) fn new(key: Option<&str>) -> Self {
        Self { key: key.filter(|k| !k.is_empty()).map(str::to_string) }
    }

    pub(crate) fn clean(&self, text: &str) -> String {
        let mut out = text.to_string();
        if let Some(key) = &self.key {
            out = out.replace(key.as_str(), "[REDACTED]");
            // A quoted prefix or suffix of the key (masked keys keep a few characters each side).
            for part in [key.get(..8), key.get(key.len().saturating_sub(8)..)].into_iter().flatten() {
                if part.len() == 8 {
                    out = out.replace(part, "[REDACTED]");
                }
            }
        }
        let out = KEY_LIKE.replace_all(&out, "[REDACTED]");
        let mut clipped: String = out.chars().take(MAX_MESSAGE_CHARS).collect();
        if out.chars().count() > MAX_MESSAGE_CHARS {
            clipped.push('…');
        }
        clipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_whole_masked_or_partial_are_removed() {
        let r = Redactor::new(Some("sk-ant-api03-SECRETSECRETSECRET-tail1234"));
        for text in [
            "bad key sk-ant-api03-SECRETSECRETSECRET-tail1234 given",
            "Incorrect API key provided: sk-ant-a*********************1234",
            "prefix sk-ant-a only",
            "suffix -tail1234 only",
        ] {
            let cleaned = r.clean(text);
            assert!(!cleaned.contains("SECRET") && !cleaned.contains("sk-ant-a") && !cleaned.contains("tail1234"), "{cleaned}");
        }
        assert_eq!(Redactor::new(None).clean("invalid x-api-key"), "invalid x-api-key");
        assert!(Redactor::new(None).clean(&"x".repeat(2000)).chars().count() <= MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn codes_are_stable_and_distinct() {
        let codes: std::collections::BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes.len(), ErrorCode::ALL.len());
        assert!(codes.iter().all(|c| c.starts_with("LLM_")));
        assert_eq!(ErrorCode::for_status(529), ErrorCode::Overloaded);
        assert_eq!(ErrorCode::for_status(401), ErrorCode::Auth);
        assert_eq!(ErrorCode::for_status(400), ErrorCode::BadRequest);
        assert_eq!(ErrorCode::for_status(503), ErrorCode::ProviderError);
    }
}
