//! The console's simulator: a channel beside WhatsApp. An owner's simulated message becomes an
//! [`Inbound`] and passes the same runtime; its reply is "delivered" into the simulated chat and
//! the delivery is the trace's last step, as on WhatsApp. Simulated chats live in their own
//! namespace (`sim-...`), so a simulated chat can never write into a real customer's memory.

use std::sync::Arc;

use app::domain::PhoneNumber;
use serde_json::json;

use super::{Handled, Inbound, InboundHandler, NoPresence};
use crate::{
    db::{self, Db, DbError, simulator as store},
    domain::ChatKind,
    telemetry::Telemetry,
    traces::{self, Step},
};

/// Every simulated chat id starts with this.
pub const CHAT_PREFIX: &str = "sim-";

/// A message typed into the simulator.
#[derive(Debug, Clone, Default)]
pub struct SimMessage {
    /// The sender's number; an owner's number makes the sender an owner.
    pub from: String,
    pub text: String,
    /// Continue this simulated chat; by default each sender (or the group) has its own.
    pub chat_id: Option<String>,
    pub group: bool,
    /// In a group: the message mentions the bot.
    pub mention: bool,
    /// The console owner typing it; an owner command in it acts as them.
    pub operator: Option<i64>,
}

/// What happened to a simulated message.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    pub chat_id: String,
    pub message_id: String,
    pub handled: Handled,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The message cannot be simulated; the text says why, for the owner.
    #[error("{0}")]
    Invalid(String),
    #[error("the runtime failed: {0}")]
    Handler(#[from] super::HandlerError),
    #[error(transparent)]
    Db(#[from] DbError),
}

crate::db::from_sqlx_as_db!(SimError);

pub struct Simulator {
    db: Db,
    handler: Arc<dyn InboundHandler>,
    telemetry: Telemetry,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

impl Simulator {
    pub fn new(db: Db, handler: Arc<dyn InboundHandler>, telemetry: Telemetry) -> Self {
        Self { db, handler, telemetry }
    }

    /// Runs one message through the runtime and records both sides of the exchange.
    pub async fn send(&self, message: SimMessage) -> Result<SimOutcome, SimError> {
        // Without NUL, as the WhatsApp intake stores a text: PostgreSQL refuses it.
        let cleaned = db::clean_text(&message.text);
        let text = cleaned.trim();
        if text.is_empty() || text.chars().count() > 4096 {
            return Err(SimError::Invalid("Write a message of 1 to 4,096 characters.".into()));
        }
        let from = message.from.trim();
        let e164 = if from.starts_with('+') { from.to_string() } else { format!("+{from}") };
        let phone = PhoneNumber::parse(&e164).map_err(|_| SimError::Invalid("The sender must be a phone number such as +15550001111.".into()))?;
        let digits = phone.as_str().trim_start_matches('+').to_string();
        let chat_id = match message.chat_id.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
            Some(c) if c.len() > 100 => return Err(SimError::Invalid("The chat id is too long.".into())),
            Some(c) if c.chars().any(char::is_control) => return Err(SimError::Invalid("The chat id cannot hold control characters.".into())),
            Some(c) if c.starts_with(CHAT_PREFIX) => c.to_string(),
            Some(c) => format!("{CHAT_PREFIX}{c}"),
            None if message.group => format!("{CHAT_PREFIX}group"),
            None => format!("{CHAT_PREFIX}{digits}"),
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let inbound = Inbound {
            channel: super::SIMULATOR.into(),
            message_id: format!("sim_{id}"),
            chat_id: chat_id.clone(),
            chat_kind: if message.group { ChatKind::Group } else { ChatKind::Direct },
            sender: digits.clone(),
            text: text.to_string(),
            mentions_bot: message.group && message.mention,
            correlation_id: format!("sim-{id}"),
            operator: message.operator,
            ..Inbound::default()
        };
        let handled = self.handler.handle(&inbound, &NoPresence).await?;
        let now = db::now_ms();
        let mut tx = self.db.begin_write().await?;
        let incoming = store::NewSimMessage {
            chat_id: &chat_id,
            direction: "in",
            sender: &digits,
            text,
            message_id: &inbound.message_id,
            state: "received",
            trace_id: handled.trace_id,
            at: now,
            group: message.group,
        };
        store::insert(&mut tx, &incoming).await?;
        let mut appended = None;
        if let Some(reply) = &handled.reply {
            let reply_id = format!("{}_reply", inbound.message_id);
            let out = store::NewSimMessage { direction: "out", sender: "bot", text: reply, message_id: &reply_id, state: "delivered", at: now + 1, ..incoming };
            store::insert(&mut tx, &out).await?;
            if let Some(trace_id) = handled.trace_id {
                appended = Some(traces::append(&mut tx, trace_id, &Step::new("delivery", "delivered", "SIMULATOR", json!({}))).await?);
            }
        }
        tx.commit().await?;
        self.telemetry.appended(appended);
        Ok(SimOutcome { chat_id, message_id: inbound.message_id, handled })
    }
}
