//! Sending replies through the delivery ledger.
//!
//! Each part of a reply has an idempotency key (`job:{id}:part:{n}`) reserved in the ledger
//! before anything goes out. The row is marked "sending" just before the POST and "sent" with
//! Meta's wamid just after, so a retried job skips every part already sent.
//!
//! # The at-least-once edge
//!
//! If the process dies after Meta accepted a part but before "sent" was recorded, the retry
//! finds the row still marked as sending and cannot know whether the part went out. Every send
//! carries its key as `biz_opaque_callback_data`, and Meta's "sent" status callback brings it
//! back: when that callback arrived in the meantime, the row has its wamid and the part is not
//! sent again. Otherwise the part is sent again (logged as a warning): a customer may then see
//! that one part twice, which we prefer to a reply that silently never arrives. The same holds
//! for a POST that ends without Meta's answer, or with a server error (HTTP 5xx): Meta may have
//! accepted the part while it failed, so the row stays marked as sending for the callback to
//! settle. Only a refusal (4xx, a rate limit) clears the mark: nothing went out.
//!
//! # Two runs at once
//!
//! A job can run twice at the same time: its lease was rescued while the first run still sends,
//! or two processes share the database. Marking a part "sending" takes a lease on that part
//! (a compare-and-set in the ledger, see [`store::mark_sending`]); the run that does not get it
//! sends nothing and retries the job later (`WHATSAPP_SEND_IN_PROGRESS`), by when the part is
//! recorded as sent. The lease outlives one Graph API request, so only a sender that died
//! mid-request leaves it to run out.

use std::{sync::Arc, time::Duration};

use crate::{
    config::WhatsAppSettings,
    db::{
        self, Db, DbError,
        whatsapp::{self as store, DeliveryState, NewOutbound, OutboundRow},
    },
    jobs::{JobCode, JobError, JobQueue},
};

use super::{
    graph::{GraphClient, GraphError},
    pacing::{Pacer, PacingLimits},
    split,
};

/// Who gets the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// A WhatsApp id (phone number digits) or a group id.
    pub id: String,
    pub group: bool,
}

/// How a reply went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// Every part is out; `resent_skipped` of them were already sent by an earlier attempt.
    Sent { parts: usize, already_sent: usize },
    /// Meta refused with 131047 (outside the 24-hour window). The part is marked failed; the
    /// configured template went instead when `template_sent`.
    OutsideWindow { template_sent: bool },
    /// A part was marked failed earlier (by a send or a status callback); nothing more is sent.
    Failed { code: String },
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Try the whole job again later; the ledger keeps what already went out.
    #[error("{code}: {message}")]
    Retry { code: String, message: String },
    /// Retrying cannot help (bad token, unknown recipient, not configured).
    #[error("{code}: {message}")]
    Permanent { code: String, message: String },
    #[error(transparent)]
    Db(#[from] DbError),
}

impl SendError {
    /// The stable code of a refused or failed send; `None` for a database failure of our own.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Retry { code, .. } | Self::Permanent { code, .. } => Some(code),
            Self::Db(_) => None,
        }
    }
}

impl From<SendError> for JobError {
    fn from(e: SendError) -> Self {
        match e {
            SendError::Retry { code, message } => JobError::retryable(&code, message),
            SendError::Permanent { code, message } => JobError::permanent(&code, message),
            SendError::Db(e) => e.into(),
        }
    }
}

/// Another run of the same job holds this part's send lease.
pub const SEND_IN_PROGRESS: &str = "WHATSAPP_SEND_IN_PROGRESS";

/// How long a part's send lease lasts past the request's own deadline: the ledger write after
/// the answer, on a busy database.
const SEND_LEASE_MARGIN: Duration = Duration::from_secs(30);

enum Delivery {
    Sent,
    AlreadySent,
    OutsideWindow,
    Failed(String),
}

#[derive(Debug)]
pub struct WhatsAppSender {
    db: Db,
    graph: GraphClient,
    pacer: Arc<Pacer>,
    settings: WhatsAppSettings,
    /// Where a part refused for good queues the owners' notice ([`super::undelivered`]).
    notices: Option<JobQueue>,
}

impl WhatsAppSender {
    pub fn new(db: Db, graph: GraphClient, settings: WhatsAppSettings) -> Self {
        let pacer = Arc::new(Pacer::new(PacingLimits {
            pair_burst: settings.pair_burst,
            pair_interval: settings.pair_interval,
            global_per_second: settings.global_rate_per_second,
        }));
        Self { db, graph, pacer, settings, notices: None }
    }

    /// A part Meta refuses for good queues the owners' undelivered notice on `queue`.
    pub fn with_notices(mut self, queue: JobQueue) -> Self {
        self.notices = Some(queue);
        self
    }

    /// Queues the owners' notice for a part refused for good; a part that cannot queue it is
    /// still failed (its job's failure shows on the Jobs page).
    async fn undelivered(&self, key: &str) {
        let Some(queue) = &self.notices else { return };
        let notice = super::undelivered::UndeliveredNotice { wamid: String::new(), key: Some(key.to_string()), trace_id: None };
        if let Err(e) = queue.enqueue(&notice.job(queue)).await {
            tracing::warn!(key, error = %e, "the owners' undelivered notice could not be queued");
        }
    }

    /// Since when Meta refuses this process's access token, as the last sends of any process on
    /// this database found; `None` once Meta took one, and for a refusal of another token (a
    /// process started with a new one).
    pub async fn token_rejected_since(&self) -> Result<Option<i64>, DbError> {
        let Some(token) = self.graph.token_fingerprint() else { return Ok(None) };
        let mut conn = self.db.pool.acquire().await?;
        store::token_rejected_since(&mut conn, &token).await
    }

    /// Meta took a request with the access token (a message sent, or refused only for the
    /// person's 24-hour window): a recorded refusal ends. Never fails the send.
    async fn token_taken(&self, conn: &mut sqlx::AnyConnection) {
        // Read first, so that a send writes nothing more while all is well.
        let accepted = async { Ok::<_, DbError>(store::token_refusal_recorded(conn).await? && store::token_accepted(conn).await?) };
        match accepted.await {
            Ok(true) => tracing::info!("Meta accepts the access token again"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "recording that Meta accepts the access token failed; the console's banner stays until the next send"),
        }
    }

    /// The setting whose absence keeps every reply from going out, if one is missing: the
    /// phone number id, then the access token.
    pub fn missing_setting(&self) -> Option<&'static str> {
        if self.settings.phone_number_id.is_empty() {
            Some("whatsapp.phone_number_id")
        } else if !self.graph.is_configured() {
            Some(crate::config::secrets::WHATSAPP_ACCESS_TOKEN)
        } else {
            None
        }
    }

    pub fn settings(&self) -> &WhatsAppSettings {
        &self.settings
    }

    /// Sends `text` for job `job_id`, split at 4,096 characters; the first part quotes `quote`.
    /// Safe to call again for the same job: parts already sent are skipped.
    pub async fn send_text(&self, job_id: i64, to: &Recipient, text: &str, quote: Option<&str>) -> Result<SendOutcome, SendError> {
        let parts = split::split(text, split::MAX_CHARS);
        let mut already_sent = 0;
        for (n, part) in parts.iter().enumerate() {
            let key = part_key(job_id, n);
            let quote = if n == 0 { quote } else { None };
            let mut body = serde_json::json!({
                "messaging_product": "whatsapp",
                "recipient_type": if to.group { "group" } else { "individual" },
                "to": to.id,
                "type": "text",
                "text": { "body": part, "preview_url": false },
                "biz_opaque_callback_data": key,
            });
            if let Some(q) = quote {
                body["context"] = serde_json::json!({ "message_id": q });
            }
            let new = NewOutbound {
                idempotency_key: &key,
                job_id: Some(job_id),
                part: i64::try_from(n).unwrap_or(i64::MAX),
                recipient: &to.id,
                is_group: to.group,
                kind: "text",
                body: part,
                quoted_id: quote,
            };
            match self.deliver(&new, body).await? {
                Delivery::Sent => {}
                Delivery::AlreadySent => already_sent += 1,
                Delivery::Failed(code) => return Ok(SendOutcome::Failed { code }),
                Delivery::OutsideWindow => {
                    let template_sent = self.send_window_template(job_id, to).await?;
                    return Ok(SendOutcome::OutsideWindow { template_sent });
                }
            }
        }
        Ok(SendOutcome::Sent { parts: parts.len(), already_sent })
    }

    /// Sends `body` with up to three reply buttons (`(id, title)`) for job `job_id`, once per
    /// job like a text. The body is cut to WhatsApp's 1,024 characters.
    pub async fn send_buttons(&self, job_id: i64, to: &Recipient, body: &str, buttons: &[(String, String)]) -> Result<SendOutcome, SendError> {
        let body: String = body.chars().take(crate::config::approvals::BUTTON_BODY_MAX).collect();
        let key = format!("job:{job_id}:part:0");
        let buttons: Vec<_> = buttons
            .iter()
            .take(3)
            .map(|(id, title)| serde_json::json!({ "type": "reply", "reply": { "id": id, "title": title } }))
            .collect();
        let message = serde_json::json!({
            "messaging_product": "whatsapp",
            "recipient_type": if to.group { "group" } else { "individual" },
            "to": to.id,
            "type": "interactive",
            "interactive": { "type": "button", "body": { "text": body }, "action": { "buttons": buttons } },
            "biz_opaque_callback_data": key,
        });
        let new = single_part(&key, job_id, to, "interactive", &body);
        Ok(match self.deliver(&new, message).await? {
            Delivery::Sent => SendOutcome::Sent { parts: 1, already_sent: 0 },
            Delivery::AlreadySent => SendOutcome::Sent { parts: 1, already_sent: 1 },
            Delivery::Failed(code) => SendOutcome::Failed { code },
            Delivery::OutsideWindow => SendOutcome::OutsideWindow { template_sent: self.send_window_template(job_id, to).await? },
        })
    }

    /// The configured template, once per job, when a free-form reply was refused.
    pub(crate) async fn send_window_template(&self, job_id: i64, to: &Recipient) -> Result<bool, SendError> {
        let name = self.settings.window_template.trim();
        if name.is_empty() {
            return Ok(false);
        }
        let key = format!("job:{job_id}:template");
        let body = serde_json::json!({
            "messaging_product": "whatsapp",
            "recipient_type": if to.group { "group" } else { "individual" },
            "to": to.id,
            "type": "template",
            "template": { "name": name, "language": { "code": self.settings.window_template_language } },
            "biz_opaque_callback_data": key,
        });
        let new = single_part(&key, job_id, to, "template", name);
        Ok(matches!(self.deliver(&new, body).await?, Delivery::Sent | Delivery::AlreadySent))
    }

    /// Marks `wamid` read, with the typing indicator when `typing`. Failures are logged only:
    /// they must not stop the reply.
    pub async fn mark_read(&self, wamid: &str, typing: bool) {
        if !self.graph.is_configured() {
            tracing::debug!("WhatsApp sending is not configured; not marking read");
            return;
        }
        let mut body = serde_json::json!({ "messaging_product": "whatsapp", "status": "read", "message_id": wamid });
        if typing {
            body["typing_indicator"] = serde_json::json!({ "type": "text" });
        }
        if let Err(e) = self.graph.post(&body).await {
            tracing::warn!(code = %e.code(), error = %e, "cannot mark a WhatsApp message read");
        }
    }

    async fn deliver(&self, new: &NewOutbound<'_>, body: serde_json::Value) -> Result<Delivery, SendError> {
        let mut conn = self.db.pool.acquire().await.map_err(DbError::from)?;
        let mut row = store::reserve_outbound(&mut conn, new, db::now_ms()).await?;
        // A part Meta refused in an earlier run of this job (nothing went out) is tried again:
        // this run is an owner's retry of the job, or a rerun after a crash before the refusal
        // was recorded. Within one run a refusal ends the delivery, so it is never met here then.
        if row.state == DeliveryState::Failed && row.wamid.is_none() && store::requeue_refused(&mut conn, row.id, db::now_ms()).await? {
            tracing::info!(key = %row.idempotency_key, code = ?row.error_code, "a part refused in an earlier run is sent again");
            row = store::outbound_by_key(&mut conn, &row.idempotency_key).await?.unwrap_or(row);
        }
        drop(conn);
        // This call's claim on the part: its retries below may take the lease again.
        let token = uuid::Uuid::new_v4().simple().to_string();
        let lease = self.settings.request_timeout.saturating_add(SEND_LEASE_MARGIN);
        let attempts = self.settings.send_attempts.max(1);
        for attempt in 1..=attempts {
            if let Some(done) = finished(&row) {
                return Ok(done);
            }
            if row.send_started_at.is_some() {
                tracing::warn!(key = %row.idempotency_key, "an earlier send of this part ended without a result; sending it again (at-least-once)");
            }
            match self.pacer.reserve(&row.recipient, self.settings.max_pacing_wait) {
                Ok(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
                Ok(_) => {}
                Err(needed) => {
                    return Err(SendError::Retry {
                        code: "WHATSAPP_PACED".into(),
                        message: format!("the recipient's pacing needs {} ms more than whatsapp.max_pacing_wait", needed.as_millis()),
                    });
                }
            }
            let mut conn = self.db.pool.acquire().await.map_err(DbError::from)?;
            let now = db::now_ms();
            let lease_until = now.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
            if !store::mark_sending(&mut conn, row.id, &token, now, lease_until).await? {
                // Sent or settled meanwhile, or another run is sending it right now.
                let current = store::outbound_by_key(&mut conn, &row.idempotency_key).await?.unwrap_or(row);
                if let Some(done) = finished(&current) {
                    return Ok(done);
                }
                tracing::info!(key = %current.idempotency_key, "another run is sending this part; this run sends nothing");
                return Err(SendError::Retry { code: SEND_IN_PROGRESS.into(), message: "another run of this job is sending the same part".into() });
            }
            drop(conn);
            let result = self.graph.post(&body).await;
            let mut conn = self.db.pool.acquire().await.map_err(DbError::from)?;
            let now = db::now_ms();
            match result {
                Ok(wamid) => {
                    store::mark_sent(&mut conn, row.id, &wamid, now).await?;
                    self.token_taken(&mut conn).await;
                    metrics::counter!("whatsapp_sent_total", "kind" => new.kind.to_string()).increment(1);
                    return Ok(Delivery::Sent);
                }
                Err(e) if e.is_outside_window() => {
                    store::mark_send_failed(&mut conn, row.id, &e.code(), "outside the 24-hour customer service window (131047)", true, now).await?;
                    self.token_taken(&mut conn).await;
                    tracing::warn!(key = %row.idempotency_key, "reply refused: outside the 24-hour window");
                    // Told only when no window template goes in its place.
                    self.undelivered(&row.idempotency_key).await;
                    metrics::counter!("whatsapp_send_failed_total", "code" => e.code()).increment(1);
                    return Ok(Delivery::OutsideWindow);
                }
                // Not this reply's failure but the deployment's (a refused token, a blocked
                // account): the part stays unsent and the job waits, using no attempt, until an
                // operator has settled it (or the 24-hour window closes, which Meta's 131047 then
                // settles). Before, the part was failed for good, and every reply of the incident
                // lost.
                Err(e) if e.is_token_rejected() || e.is_account_blocked() => {
                    store::mark_send_failed(&mut conn, row.id, &e.code(), &e.to_string(), false, now).await?;
                    let code = if e.is_token_rejected() {
                        // Said once by the process that records it first, and on every console. A
                        // failure to record it must not make the refusal an ordinary error (which
                        // would use the job's attempts).
                        let token = self.graph.token_fingerprint().unwrap_or_default();
                        match store::token_rejected(&mut conn, &token, now).await {
                            Ok(true) => tracing::error!(code = %e.code(), "Meta refuses the WhatsApp access token: replies wait until WHATSAPP_ACCESS_TOKEN holds a working one and Gatehouse restarts"),
                            Ok(false) => {}
                            Err(db) => tracing::error!(code = %e.code(), error = %db, "Meta refuses the WhatsApp access token (recording it for the console failed)"),
                        }
                        JobCode::CredentialsRejected
                    } else {
                        tracing::error!(key = %row.idempotency_key, code = %e.code(), error = %e, "Meta refuses the business account's sends; replies wait until it is settled with Meta");
                        JobCode::AccountBlocked
                    };
                    metrics::counter!("whatsapp_send_retried_total", "code" => e.code()).increment(1);
                    return Err(SendError::Retry { code: code.as_str().into(), message: e.to_string() });
                }
                Err(e) if e.is_retryable() => {
                    if e.outcome_unknown() {
                        // Meta may have accepted it (a lost answer, a server error while it was
                        // handled): leave send_started_at so the next try sees the uncertainty,
                        // and a status callback carrying this part's key can settle it.
                        tracing::warn!(key = %row.idempotency_key, error = %e, "Graph API request failed; outcome unknown");
                        store::release_send(&mut conn, row.id, &token, now).await?;
                    } else {
                        store::mark_send_failed(&mut conn, row.id, &e.code(), &e.to_string(), false, now).await?;
                    }
                    if matches!(&e, GraphError::Api { code: super::graph::code::PAIR_RATE_LIMIT, .. }) {
                        self.pacer.penalize(&row.recipient);
                    }
                    metrics::counter!("whatsapp_send_retried_total", "code" => e.code()).increment(1);
                    if attempt == attempts {
                        return Err(SendError::Retry { code: e.code(), message: e.to_string() });
                    }
                    tokio::time::sleep(backoff(self.settings.send_retry_base, attempt)).await;
                    row = store::outbound_by_key(&mut conn, &row.idempotency_key).await?.unwrap_or(row);
                }
                Err(e) => {
                    store::mark_send_failed(&mut conn, row.id, &e.code(), &e.to_string(), true, now).await?;
                    metrics::counter!("whatsapp_send_failed_total", "code" => e.code()).increment(1);
                    self.undelivered(&row.idempotency_key).await;
                    return Err(SendError::Permanent { code: e.code(), message: e.to_string() });
                }
            }
        }
        Err(SendError::Retry { code: "WHATSAPP_RETRY".into(), message: "send attempts used up".into() })
    }
}

/// What an existing ledger row says about its part, when it needs no send.
fn finished(row: &OutboundRow) -> Option<Delivery> {
    match row.state {
        DeliveryState::Sent | DeliveryState::Delivered | DeliveryState::Read => Some(Delivery::AlreadySent),
        DeliveryState::Failed if row.error_code.as_deref() == Some("131047") => Some(Delivery::OutsideWindow),
        DeliveryState::Failed => Some(Delivery::Failed(row.error_code.clone().unwrap_or_else(|| "WHATSAPP_FAILED".into()))),
        // A status callback recorded the wamid of a send whose result we never stored.
        DeliveryState::Queued if row.wamid.is_some() => Some(Delivery::AlreadySent),
        DeliveryState::Queued => None,
    }
}

/// `base`, then 4 times as long per further try (Meta suggests 4^n for the pair limit).
fn backoff(base: Duration, attempt: u32) -> Duration {
    base.saturating_mul(4u32.saturating_pow(attempt.saturating_sub(1)))
}

/// The ledger row of a message sent as one part (buttons, a template), under `key`.
fn single_part<'a>(key: &'a str, job_id: i64, to: &'a Recipient, kind: &'a str, body: &'a str) -> NewOutbound<'a> {
    NewOutbound { idempotency_key: key, job_id: Some(job_id), part: 0, recipient: &to.id, is_group: to.group, kind, body, quoted_id: None }
}

/// The ledger key of part `n` of job `job_id`'s message.
pub(super) fn part_key(job_id: i64, n: usize) -> String {
    format!("job:{job_id}:part:{n}")
}
