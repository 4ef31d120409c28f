//! The WhatsApp Cloud API channel.
//!
//! - [`webhook`]: `/webhooks/whatsapp`, the GET handshake and signed POSTs.
//! - [`intake`]: each message stored with its processing job in one transaction (unique wamid,
//!   so redeliveries are recognised); status callbacks update the delivery ledger.
//! - [`job`]: the `whatsapp.inbound` job hands messages to the [`InboundHandler`].
//! - [`sender`]: replies through the Graph API and the delivery ledger, split, paced, retried.

pub mod graph;
pub mod intake;
pub mod job;
pub mod notify;
pub mod pacing;
pub mod payload;
pub mod sender;
pub mod signature;
pub mod split;
pub mod webhook;

use std::sync::Arc;

use crate::{config::LoadedConfig, db::Db, jobs::Registry};

use super::InboundHandler;

pub use sender::{Recipient, SendOutcome, WhatsAppSender};

/// The job kind that processes one stored inbound message.
pub const INBOUND_KIND: &str = "whatsapp.inbound";

/// Builds the sender from config and secrets. Fails only when the HTTP client cannot be set up.
pub fn sender(config: &LoadedConfig, db: &Db) -> Result<Arc<WhatsAppSender>, reqwest::Error> {
    let settings = config.settings.whatsapp.clone();
    let graph = graph::GraphClient::new(&settings, config.secrets.whatsapp_access_token.clone())?;
    Ok(Arc::new(WhatsAppSender::new(db.clone(), graph, settings)))
}

/// Registers the `whatsapp.inbound` job with `handler` behind it.
pub fn register(registry: &mut Registry, config: &LoadedConfig, db: &Db, handler: Arc<dyn InboundHandler>) -> Result<Arc<WhatsAppSender>, reqwest::Error> {
    let sender = sender(config, db)?;
    registry.register(INBOUND_KIND, Arc::new(job::InboundJob::new(db.clone(), sender.clone(), handler)));
    registry.register(crate::db::owner_notifications::DELIVERY_KIND, Arc::new(notify::OwnerNotify::new(sender.clone())));
    Ok(sender)
}

/// A Graph API error number as a trace's reason code (`131026` becomes `WHATSAPP_131026`);
/// Gatehouse's own codes are already named.
pub(crate) fn trace_code(code: &str) -> String {
    if !code.is_empty() && code.chars().all(|c| c.is_ascii_digit()) { format!("WHATSAPP_{code}") } else { code.to_string() }
}
