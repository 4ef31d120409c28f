//! The Streamable HTTP client of an OAuth server: rmcp's reqwest client with the server's token
//! on every request. A 401 gets one refresh and one retry; a 403 `insufficient_scope` records
//! the scope the server asked for and sends the server to "needs login" (a step-up needs the
//! owner, so nothing loops).

use std::{collections::HashMap, sync::Arc};

use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::{
        auth::AuthError,
        streamable_http_client::{SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits},
    },
};
use sse_stream::Sse;

use super::tokens::{TokenError, TokenSource};

type HttpError = StreamableHttpError<reqwest::Error>;

#[derive(Clone)]
pub struct OAuthHttp {
    pub(crate) http: reqwest::Client,
    pub(crate) tokens: Arc<TokenSource>,
    /// Called with the login and the scope a 403 asked for.
    pub(crate) step_up: super::StepUpHook,
    /// The tokens this client has sent, so a result that echoes one is scrubbed.
    pub(crate) sent: Arc<SentTokens>,
}

/// The access tokens a server was last sent (a few: a refresh replaces one while calls that
/// carried the old one are still answering). A tool result that echoes one has it blanked
/// before the summarizer, the person or the context store sees it.
#[derive(Debug, Default)]
pub struct SentTokens(std::sync::Mutex<std::collections::VecDeque<String>>);

impl SentTokens {
    const KEPT: usize = 4;

    pub fn remember(&self, token: &str) {
        let mut kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !kept.iter().any(|t| t == token) {
            if kept.len() == Self::KEPT {
                kept.pop_front();
            }
            kept.push_back(token.to_string());
        }
    }

    pub fn values(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect()
    }
}

impl std::fmt::Debug for OAuthHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthHttp").field("server", &self.tokens.server()).finish_non_exhaustive()
    }
}

fn token_failure(e: TokenError) -> HttpError {
    match e {
        TokenError::NeedsLogin(_) => StreamableHttpError::Auth(AuthError::AuthorizationRequired),
        TokenError::Transient(m) => StreamableHttpError::Auth(AuthError::TokenRefreshFailed(m)),
        TokenError::Key(e) => StreamableHttpError::Auth(AuthError::TokenRefreshFailed(e.to_string())),
    }
}

impl OAuthHttp {
    async fn with_token<T, F, Fut>(&self, call: F) -> Result<T, HttpError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let token = self.tokens.access_token().await.map_err(token_failure)?;
        self.sent.remember(&token);
        let outcome = match call(token.clone()).await {
            Err(StreamableHttpError::AuthRequired(_)) => {
                let fresh = self.tokens.rejected(&token).await.map_err(token_failure)?;
                self.sent.remember(&fresh);
                call(fresh).await
            }
            other => other,
        };
        match outcome {
            Err(StreamableHttpError::AuthRequired(challenge)) => {
                self.tokens.needs_login("the server refuses the token even after a refresh; log in again").await;
                Err(StreamableHttpError::AuthRequired(challenge))
            }
            Err(StreamableHttpError::InsufficientScope(e)) => {
                (self.step_up)(Some(self.tokens.login()), e.required_scope.clone()).await;
                Err(StreamableHttpError::InsufficientScope(e))
            }
            other => other,
        }
    }
}

impl StreamableHttpClient for OAuthHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.with_token(|token| self.http.post_message(uri.clone(), message.clone(), session_id.clone(), Some(token), custom_headers.clone())).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.with_token(|token| {
            self.http.post_message_with_response_limits(uri.clone(), message.clone(), session_id.clone(), Some(token), custom_headers.clone(), limits)
        })
        .await
    }

    async fn delete_session(&self, uri: Arc<str>, session_id: Arc<str>, _auth_header: Option<String>, custom_headers: HashMap<HeaderName, HeaderValue>) -> Result<(), HttpError> {
        self.with_token(|token| self.http.delete_session(uri.clone(), session_id.clone(), Some(token), custom_headers.clone())).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.with_token(|token| self.http.get_stream(uri.clone(), session_id.clone(), last_event_id.clone(), Some(token), custom_headers.clone())).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.with_token(|token| {
            self.http.get_stream_with_max_sse_event_size(uri.clone(), session_id.clone(), last_event_id.clone(), Some(token), custom_headers.clone(), max_sse_event_size)
        })
        .await
    }
}
