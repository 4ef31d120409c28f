//! The WhatsApp Cloud API channel.
//!
//! - [`webhook`]: `/webhooks/whatsapp`, the GET handshake and signed POSTs.
//! - [`intake`]: each message stored with its processing job in one transaction (unique wamid,
//!   so redeliveries are recognised); status callbacks update the delivery ledger.
//! - [`job`]: the `whatsapp.inbound` job hands messages to the [`InboundHandler`] and delivers
//!   its reply.
//! - [`sender`]: replies through the Graph API and the delivery ledger, split, paced, retried.
//! - [`undelivered`]: the owners are told when Meta reports a message to a person failed.

pub mod graph;
pub mod intake;
pub mod job;
pub mod notify;
pub mod pacing;
pub mod payload;
pub mod sender;
pub mod signature;
pub mod split;
pub mod undelivered;
pub mod unhandled;
pub mod webhook;
pub mod window;

use std::sync::Arc;

use crate::{
    config::{JobTimeouts, Secrets, WhatsAppSettings},
    db::{Db, jobs::Waiting},
    events::Events,
    jobs::{JobKind, JobQueue, Registry},
    telemetry::Telemetry,
};

use super::InboundHandler;

pub use intake::{Intake, ProcessInbound};
pub use sender::{Recipient, SendOutcome, WhatsAppSender};

/// The channel's parts: the webhook's intake and the sender, each built once.
#[derive(Debug, Clone)]
pub struct WhatsApp {
    pub intake: Arc<Intake>,
    pub sender: Arc<WhatsAppSender>,
    pub webhook: webhook::WebhookState,
    /// Where the deliveries its jobs add to a message's trace are exported (the queue's).
    telemetry: Telemetry,
}

impl WhatsApp {
    /// Fails only when the Graph API's HTTP client cannot be set up.
    pub fn new(settings: &WhatsAppSettings, secrets: &Secrets, db: &Db, queue: &JobQueue, events: &Events) -> Result<Self, reqwest::Error> {
        let graph = graph::GraphClient::new(settings, secrets.whatsapp_access_token.clone())?;
        let sender = Arc::new(WhatsAppSender::new(db.clone(), graph, settings.clone()).with_notices(queue.clone()));
        let intake = Arc::new(Intake::new(db.clone(), queue.clone()).with_events(events.clone()));
        let webhook = webhook::WebhookState {
            verify_token: secrets.whatsapp_verify_token.clone(),
            app_secret: secrets.whatsapp_app_secret.clone(),
            raw_max_bytes: usize::try_from(settings.raw_max_bytes).unwrap_or(usize::MAX),
            intake: intake.clone(),
        };
        Ok(Self { intake, sender, webhook, telemetry: queue.telemetry().clone() })
    }

    /// Its messages waiting for a send setting, when this process has every one: they are due
    /// as soon as it starts (see `bootstrap::Gatehouse::release_waiting`), not at the next minute.
    pub fn waiting_for_a_setting(&self) -> Option<Waiting<'static>> {
        self.sender.missing_setting().is_none().then_some(Waiting::Previewed { kind: ProcessInbound::KIND, prefix: job::WAITING_FOR_A_SETTING })
    }

    /// The channel's jobs, each within its budget: each stored message goes to `handler`;
    /// owner notices go out.
    pub fn register(&self, registry: &mut Registry, db: &Db, handler: Arc<dyn InboundHandler>, budgets: &JobTimeouts) {
        registry.handle_within::<ProcessInbound>(Arc::new(job::InboundJob::new(db.clone(), self.telemetry.clone(), self.sender.clone(), handler)), budgets.whatsapp_inbound);
        registry.handle_within::<crate::owners::notices::DeliverNotice>(Arc::new(notify::OwnerNotify::new(db.clone(), self.sender.clone())), budgets.owner_notify);
        registry.handle_within::<window::SendWindowTemplate>(Arc::new(window::WindowTemplate::new(self.sender.clone())), budgets.owner_notify);
    }
}

/// A Graph API error number as a trace's reason code (`131026` becomes `WHATSAPP_131026`);
/// Gatehouse's own codes are already named.
pub(crate) fn trace_code(code: &str) -> String {
    if !code.is_empty() && code.chars().all(|c| c.is_ascii_digit()) { format!("WHATSAPP_{code}") } else { code.to_string() }
}
