//! The channels' [`Outbound`]: later messages go out on the channel their chat is on,
//! WhatsApp through the delivery ledger (once per job), the simulator into its chat. A later
//! message that went out is kept in its chat's memory, as the assistant's turn, so that normal
//! chat and the planner read the conversation as the person had it.

use std::sync::Arc;

use serde_json::json;

use super::{DeliverError, Delivered, Outbound, ReplyTo, SIMULATOR, WHATSAPP, whatsapp::WhatsAppSender};
use crate::{
    db::{self, Db, DbError, simulator as sim},
    domain::ChatKind,
    telemetry::Telemetry,
    traces::{self, Step},
};
// Apart from the group above: scripts/module-graph reads a name in a `crate::{..}` group as a
// top-level module, and this is the database's `conversation`, not the runtime's.
use crate::db::conversation;

#[derive(Debug, Clone)]
pub struct Outbox {
    db: Db,
    whatsapp: Arc<WhatsAppSender>,
    telemetry: Telemetry,
}

impl Outbox {
    pub fn new(db: Db, whatsapp: Arc<WhatsAppSender>, telemetry: Telemetry) -> Self {
        Self { db, whatsapp, telemetry }
    }

    async fn trace(&self, trace_id: Option<i64>, step: Step, failed: bool) {
        if let Some(trace_id) = trace_id {
            traces::record_delivery(&self.db, &self.telemetry, trace_id, &step, failed).await;
        }
    }

    /// A simulated chat's later message, stored once per job, with `remembered` as its turn in
    /// the chat's memory.
    async fn simulate(&self, to: &ReplyTo, text: &str, remembered: &str, job_id: i64, trace_id: Option<i64>) -> Result<(), DbError> {
        let message_id = sim_message_id(job_id);
        let mut tx = self.db.begin_write().await?;
        let out = sim::NewSimMessage { chat_id: &to.chat_id, direction: "out", sender: "bot", text, message_id: &message_id, state: "delivered", trace_id, at: db::now_ms(), group: to.chat_kind == ChatKind::Group };
        let new = sim::insert_once(&mut tx, &out).await?;
        if new {
            conversation::insert_turn(&mut tx, &later_turn(to, remembered, &conversation::later_message_id(job_id))).await?;
        }
        let appended = match trace_id {
            Some(trace_id) if new => Some(traces::append(&mut tx, trace_id, &Step::new("later_delivery", "delivered", "SIMULATOR", json!({ "job_id": job_id }))).await?),
            _ => None,
        };
        tx.commit().await?;
        self.telemetry.appended(appended);
        Ok(())
    }

    /// Keeps what memory keeps of job `job_id`'s later message, sent on WhatsApp, in its chat's
    /// memory (once). A failed write is logged: the message went out, and only memory lacks it.
    async fn remember(&self, to: &ReplyTo, text: &str, job_id: i64) {
        let remembered = async {
            let id = conversation::later_message_id(job_id);
            conversation::insert_turn(&mut *self.db.acquire_write().await?, &later_turn(to, text, &id)).await
        };
        if let Err(e) = remembered.await {
            tracing::warn!(job.id = job_id, error = %e, "keeping a later message in its chat's memory failed");
        }
    }
}

/// A later message to `to` as the assistant's turn in its chat's memory, under `message_id`.
fn later_turn<'a>(to: &'a ReplyTo, text: &'a str, message_id: &'a str) -> conversation::NewTurn<'a> {
    conversation::NewTurn {
        chat_id: &to.chat_id,
        channel: &to.channel,
        role: conversation::role::ASSISTANT,
        text,
        message_id,
        at: db::now_ms(),
        tokens: conversation::estimate_tokens(text),
        sender: None,
        sender_label: None,
        origin: Some(conversation::origin::TOOL_LANE),
    }
}

/// The simulator's id of job `job_id`'s later message.
fn sim_message_id(job_id: i64) -> String {
    format!("job_{job_id}")
}

fn retry(code: &str, e: impl std::fmt::Display) -> DeliverError {
    DeliverError::Retry { code: code.into(), message: e.to_string() }
}

#[async_trait::async_trait]
impl Outbound for Outbox {
    async fn deliver(&self, to: &ReplyTo, text: &str, remembered: &str, job_id: i64, trace_id: Option<i64>) -> Result<Delivered, DeliverError> {
        match to.channel.as_str() {
            SIMULATOR => self.simulate(to, text, remembered, job_id, trace_id).await.map(|()| Delivered::Sent).map_err(|e| retry(e.code(), e)),
            WHATSAPP => {
                use super::whatsapp::{Recipient, SendOutcome, sender::SendError};
                let group = to.chat_kind == ChatKind::Group;
                let recipient = Recipient { id: to.chat_id.clone(), group };
                let quote = group.then_some(to.message_id.as_str());
                match self.whatsapp.send_text(job_id, &recipient, text, quote).await {
                    Ok(SendOutcome::Sent { parts, .. }) => {
                        self.remember(to, remembered, job_id).await;
                        self.trace(trace_id, Step::new("later_delivery", "sent", "WHATSAPP_SENT", json!({ "job_id": job_id, "parts": parts })), false).await;
                        Ok(Delivered::Sent)
                    }
                    Ok(other) => {
                        let code = match &other {
                            SendOutcome::Failed { code } => super::whatsapp::trace_code(code),
                            _ => "WHATSAPP_131047".into(),
                        };
                        self.trace(trace_id, Step::new("later_delivery", "failed", &code, json!({ "job_id": job_id })), true).await;
                        Ok(Delivered::Refused { code })
                    }
                    Err(SendError::Retry { code, message }) => Err(DeliverError::Retry { code, message }),
                    Err(SendError::Permanent { code, message }) => {
                        self.trace(trace_id, Step::new("later_delivery", "failed", &super::whatsapp::trace_code(&code), json!({ "job_id": job_id })), true).await;
                        Err(DeliverError::Permanent { code, message })
                    }
                    Err(SendError::Db(e)) => Err(retry(e.code(), e)),
                }
            }
            other => Err(DeliverError::Permanent { code: "CHANNEL_UNKNOWN".into(), message: format!("no channel {other:?}") }),
        }
    }

    async fn went_out(&self, to: &ReplyTo, job_id: i64) -> Result<bool, DbError> {
        let mut conn = self.db.pool.acquire().await?;
        Ok(match to.channel.as_str() {
            SIMULATOR => sim::has_message(&mut conn, &sim_message_id(job_id)).await?,
            WHATSAPP => db::whatsapp::outbound_for_job(&mut conn, job_id).await?.iter().any(db::whatsapp::OutboundRow::went_out),
            _ => false,
        })
    }
}
