//! The Graph API's `/{phone-number-id}/messages` endpoint: one POST per message, mark-as-read or
//! typing indicator, and Meta's error format turned into codes the sender can act on. The access
//! token travels only in the Authorization header; errors never carry it or the request.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::config::WhatsAppSettings;

/// Graph API error codes the sender treats specially.
pub mod code {
    /// Outside the 24-hour customer service window: a template is required.
    pub const OUTSIDE_WINDOW: i64 = 131_047;
    /// Pair rate limit: too many messages to one recipient.
    pub const PAIR_RATE_LIMIT: i64 = 131_056;
    /// Throughput of the business number exceeded.
    pub const THROUGHPUT: i64 = 130_429;
    /// The number's throughput is being upgraded: sends are limited meanwhile.
    pub const THROUGHPUT_UPGRADE: i64 = 131_057;
    /// The app's own Graph API call rate.
    pub const APP_RATE_LIMIT: i64 = 4;
    /// The business account's Graph API call rate.
    pub const ACCOUNT_RATE_LIMIT: i64 = 80_007;
    /// The access token is invalid, expired or revoked (`OAuthException`).
    pub const ACCESS_TOKEN: i64 = 190;
    /// The business account is temporarily blocked for a policy violation (HTTP 403).
    pub const POLICY_BLOCK: i64 = 368;
    /// The business account is locked (HTTP 403).
    pub const ACCOUNT_LOCKED: i64 = 131_031;
    /// The business account has a payment issue.
    pub const PAYMENT_ISSUE: i64 = 131_042;
    /// Too many of the number's messages were blocked or flagged as spam: sends are limited.
    pub const SPAM_RATE_LIMIT: i64 = 131_048;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("WhatsApp sending is not configured: {0}")]
    NotConfigured(&'static str),
    #[error("Graph API error {code} (HTTP {status}): {message}")]
    Api { status: u16, code: i64, message: String },
    #[error("Graph API unreachable: {0}")]
    Transport(String),
    #[error("Graph API answer not understood (HTTP {0})")]
    Malformed(u16),
}

impl GraphError {
    /// A stable code for the ledger and job errors: Meta's number, or ours.
    pub fn code(&self) -> String {
        match self {
            Self::NotConfigured(_) => "WHATSAPP_NOT_CONFIGURED".into(),
            Self::Api { code, .. } => code.to_string(),
            Self::Transport(_) => "WHATSAPP_UNREACHABLE".into(),
            Self::Malformed(_) => "WHATSAPP_BAD_ANSWER".into(),
        }
    }

    /// Worth trying again later: rate limits (of the pair, the number, the app and the account,
    /// and any HTTP 429), Meta's server errors and network trouble.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { status, code, .. } => {
                *status >= 500
                    || *status == 429
                    || matches!(*code, code::THROUGHPUT | code::PAIR_RATE_LIMIT | code::THROUGHPUT_UPGRADE | code::APP_RATE_LIMIT | code::ACCOUNT_RATE_LIMIT | code::SPAM_RATE_LIMIT)
            }
            Self::Transport(_) => true,
            Self::Malformed(status) => *status >= 500,
            Self::NotConfigured(_) => false,
        }
    }

    /// A failure after which Meta may still have accepted the message: the request or its answer
    /// was lost on the way (network trouble), or Meta's side failed while handling it (HTTP 5xx,
    /// or a proxy's page in its place). A refusal (4xx, a rate limit) surely sent nothing.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Transport(_) => true,
            Self::Api { status, .. } | Self::Malformed(status) => *status >= 500,
            Self::NotConfigured(_) => false,
        }
    }

    /// Meta refused the access token (HTTP 401, or code 190): nothing can be sent until an
    /// operator sets a working one.
    pub fn is_token_rejected(&self) -> bool {
        matches!(self, Self::Api { status: 401, .. } | Self::Api { code: code::ACCESS_TOKEN, .. })
    }

    /// Meta refuses every send of the business account for now (a policy block, a locked
    /// account, a payment issue): not this reply's failure, and an operator settles it with Meta.
    pub fn is_account_blocked(&self) -> bool {
        matches!(self, Self::Api { code: code::POLICY_BLOCK | code::ACCOUNT_LOCKED | code::PAYMENT_ISSUE, .. })
    }

    pub fn is_outside_window(&self) -> bool {
        matches!(self, Self::Api { code: code::OUTSIDE_WINDOW, .. })
    }
}

#[derive(Debug, Clone)]
pub struct GraphClient {
    http: reqwest::Client,
    /// `None` when the phone number id is not configured.
    messages_url: Option<String>,
    token: Option<SecretString>,
}

impl GraphClient {
    pub fn new(settings: &WhatsAppSettings, token: Option<SecretString>) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(settings.request_timeout.max(Duration::from_millis(100)))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let messages_url = (!settings.phone_number_id.is_empty()).then(|| {
            format!("{}/{}/{}/messages", settings.graph_base_url.trim_end_matches('/'), settings.graph_version.trim_matches('/'), settings.phone_number_id)
        });
        Ok(Self { http, messages_url, token })
    }

    /// The access token's SHA-256 (hex), to tell whether a refusal recorded by any process was
    /// of this token; `None` without one.
    pub fn token_fingerprint(&self) -> Option<String> {
        self.token.as_ref().map(|t| crate::db::sha256_hex(t.expose_secret()))
    }

    /// Whether a phone number id and an access token are set.
    pub fn is_configured(&self) -> bool {
        self.messages_url.is_some() && self.token.is_some()
    }

    /// POSTs one message object; returns the wamid Meta assigned (empty for mark-as-read, and
    /// for a message Meta accepted with an answer that names none).
    pub async fn post(&self, body: &serde_json::Value) -> Result<String, GraphError> {
        let url = self.messages_url.as_deref().ok_or(GraphError::NotConfigured("whatsapp.phone_number_id is empty"))?;
        let token = self.token.as_ref().ok_or(GraphError::NotConfigured("WHATSAPP_ACCESS_TOKEN is not set"))?;
        let res = self
            .http
            .post(url)
            .bearer_auth(token.expose_secret())
            .json(body)
            .send()
            .await
            .map_err(|e| GraphError::Transport(e.without_url().to_string()))?;
        let status = res.status().as_u16();
        let bytes = res.bytes().await;
        if (200..300).contains(&status) {
            // Meta accepted the message, whatever its answer's body says: one that cannot be
            // read (cut off, or naming no wamid) is still sent, never failed or sent again. Its
            // wamid comes with its status callback, by the key the send carries.
            let answer: serde_json::Value = bytes.ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
            let wamid = answer["messages"][0]["id"].as_str().unwrap_or_default().to_string();
            if wamid.is_empty() && answer["success"] != serde_json::Value::Bool(true) {
                tracing::warn!(status, "Meta accepted a message but its answer names no wamid; counted as sent");
            }
            return Ok(wamid);
        }
        let bytes = bytes.map_err(|e| GraphError::Transport(e.without_url().to_string()))?;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| GraphError::Malformed(status))?;
        let error = &answer["error"];
        let code = error["code"].as_i64().ok_or(GraphError::Malformed(status))?;
        let message = error["message"].as_str().unwrap_or_default().chars().take(300).collect();
        Err(GraphError::Api { status, code, message })
    }
}
