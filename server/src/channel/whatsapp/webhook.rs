//! `/webhooks/whatsapp`: Meta's GET handshake and its signed POSTs. Outside the console's
//! session guard and CSRF check: the signature is the authentication.

use std::{collections::HashMap, sync::Arc};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, FromRef, Query, State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use secrecy::{ExposeSecret, SecretString};

use crate::db;

use super::{
    intake::{Intake, IntakeError},
    payload, signature,
};

pub const PATH: &str = "/webhooks/whatsapp";

/// Meta's payloads are at most 3 MB; anything over 4 MiB is refused with 413 before reading on.
pub const BODY_LIMIT: usize = 4 << 20;

/// What the webhook needs, and nothing else: its two secrets, the inbound size bound and the
/// intake. The web layer hands it over through axum's `FromRef`.
#[derive(Debug, Clone)]
pub struct WebhookState {
    pub verify_token: Option<SecretString>,
    pub app_secret: Option<SecretString>,
    /// `whatsapp.raw_max_bytes`.
    pub raw_max_bytes: usize,
    pub intake: Arc<Intake>,
}

/// The webhook's routes, for any router state the webhook's own can be taken from.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    WebhookState: FromRef<S>,
{
    Router::new().route(PATH, get(verify).post(receive)).layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// A plain-text answer; a refusal's text starts with its stable code and a colon.
fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// The subscription handshake: echo `hub.challenge` when the mode is `subscribe` and the token
/// is ours.
async fn verify(State(state): State<WebhookState>, Query(query): Query<HashMap<String, String>>) -> Response {
    let expected = state.verify_token.as_ref().map(|t| t.expose_secret().to_string()).unwrap_or_default();
    let mode_ok = query.get("hub.mode").is_some_and(|m| m == "subscribe");
    let token_ok = signature::token_matches(&expected, query.get("hub.verify_token").map_or("", String::as_str));
    match query.get("hub.challenge") {
        Some(challenge) if mode_ok && token_ok && !challenge.is_empty() => {
            tracing::info!("WhatsApp webhook verified");
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], challenge.clone()).into_response()
        }
        _ => {
            if expected.is_empty() {
                tracing::warn!("WhatsApp webhook verification refused: WHATSAPP_VERIFY_TOKEN is not set");
            } else {
                tracing::warn!(mode_ok, token_ok, "WhatsApp webhook verification refused");
            }
            plain(StatusCode::FORBIDDEN, "WEBHOOK_VERIFY_REFUSED: wrong hub.mode or hub.verify_token")
        }
    }
}

/// A notification: signature first, then parse, store with its jobs, and only then 200.
async fn receive(State(state): State<WebhookState>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            tracing::warn!(limit = BODY_LIMIT, "WhatsApp webhook post over the body limit refused");
            metrics::counter!("whatsapp_webhook_total", "outcome" => "too_large").increment(1);
            return plain(StatusCode::PAYLOAD_TOO_LARGE, "WEBHOOK_TOO_LARGE: the body is over 4 MiB");
        }
        Err(rejection) => {
            tracing::warn!(error = %rejection, "WhatsApp webhook post whose body could not be read refused");
            metrics::counter!("whatsapp_webhook_total", "outcome" => "unreadable").increment(1);
            return plain(StatusCode::BAD_REQUEST, "WEBHOOK_BODY_UNREADABLE: the body could not be read whole");
        }
    };
    let Some(secret) = state.app_secret.as_ref() else {
        tracing::error!("WhatsApp webhook post refused: WHATSAPP_APP_SECRET is not set");
        metrics::counter!("whatsapp_webhook_total", "outcome" => "not_configured").increment(1);
        return plain(StatusCode::SERVICE_UNAVAILABLE, "WHATSAPP_NOT_CONFIGURED: this server has no WHATSAPP_APP_SECRET");
    };
    let given = headers.get(signature::SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if let Err(e) = signature::verify(secret.expose_secret().as_bytes(), given, &body) {
        // Never the body: it is unauthenticated and may be anyone's text.
        tracing::warn!(reason = %e, bytes = body.len(), "WhatsApp webhook post with a bad signature refused");
        metrics::counter!("whatsapp_webhook_total", "outcome" => "bad_signature").increment(1);
        return match e {
            signature::SignatureError::Missing => plain(StatusCode::UNAUTHORIZED, "SIGNATURE_MISSING: send X-Hub-Signature-256"),
            _ => plain(StatusCode::FORBIDDEN, "SIGNATURE_INVALID: X-Hub-Signature-256 does not match the body"),
        };
    }
    let batch = match payload::parse(&body, state.raw_max_bytes, db::now_ms()) {
        Ok(batch) => batch,
        Err(e) => {
            tracing::warn!(error = %e, bytes = body.len(), "signed WhatsApp webhook post is not a notification");
            metrics::counter!("whatsapp_webhook_total", "outcome" => "bad_payload").increment(1);
            return plain(StatusCode::BAD_REQUEST, "WEBHOOK_NOT_A_NOTIFICATION: the body is not a WhatsApp webhook notification");
        }
    };
    if let Some(object) = &batch.other_object {
        tracing::info!(object = %object, "a signed webhook post for another Meta product was ignored; subscribe this URL to WhatsApp only");
    }
    let (messages, statuses, skipped) = (batch.messages.len(), batch.statuses.len(), batch.skipped);
    if batch.unreadable > 0 {
        // Signed by Meta, yet not readable: a customer's message may be among them. Answered
        // 200 all the same (Meta would send the same again for days); said here, with a count.
        tracing::warn!(code = "WEBHOOK_ITEM_UNREADABLE", items = batch.unreadable, messages, "a signed WhatsApp webhook post held entries, changes or messages that could not be read (not objects, or messages without an id, a sender or a readable group); they were skipped");
        metrics::counter!("whatsapp_webhook_items_unreadable_total").increment(batch.unreadable as u64);
    }
    match state.intake.store(batch).await {
        Ok(report) => {
            tracing::debug!(
                stored = report.stored,
                duplicates = report.duplicates,
                statuses = report.statuses_applied(),
                statuses_ignored = report.statuses_ignored,
                skipped,
                "WhatsApp webhook stored"
            );
            metrics::counter!("whatsapp_webhook_total", "outcome" => "stored").increment(1);
            metrics::counter!("whatsapp_inbound_duplicates_total").increment(report.duplicates as u64);
            plain(StatusCode::OK, "ok")
        }
        // Nothing of this batch was committed: any answer but 200 makes Meta deliver it again
        // (with backoff, for up to seven days), so nothing is lost.
        Err(e @ IntakeError::StorageFull(_)) => {
            // The storage watch has logged it once; one line a refused post would flood a full disk's logs.
            tracing::debug!(error = %e, messages, statuses, "WhatsApp webhook not stored: no room");
            metrics::counter!("whatsapp_webhook_total", "outcome" => "storage_full").increment(1);
            let mut refused = plain(StatusCode::SERVICE_UNAVAILABLE, "STORAGE_FULL: the server's disk is full; nothing of this post was stored, deliver it again later");
            refused.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("60"));
            refused
        }
        Err(e) => {
            tracing::error!(error = %e, code = e.code(), messages, statuses, "cannot store WhatsApp webhook; answering 500 so Meta retries");
            metrics::counter!("whatsapp_webhook_total", "outcome" => "store_failed").increment(1);
            plain(StatusCode::INTERNAL_SERVER_ERROR, "DATABASE_ERROR: nothing of this post was stored, deliver it again")
        }
    }
}
