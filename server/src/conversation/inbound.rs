//! The runtime as the channels' [`InboundHandler`]: a stored WhatsApp message becomes an
//! [`Inbound`], passes every step, and its reply goes back through the channel.

use crate::{
    channel::{HandlerError, InboundHandler, InboundMessage, InboundOutcome, Presence},
    db,
};

use super::{ChatKind, Inbound, Runtime};

#[async_trait::async_trait]
impl InboundHandler for Runtime {
    async fn handle(&self, message: &InboundMessage, presence: &dyn Presence) -> Result<InboundOutcome, HandlerError> {
        let storage = |e: &dyn std::fmt::Display| HandlerError { code: "CONVERSATION_STORAGE".into(), message: e.to_string(), retryable: true };
        // A reply to one of the bot's own messages addresses the bot (group rules) and quotes
        // what it said.
        let mut quoted_text = None;
        let mut replies_to_bot = false;
        if let Some(quoted) = &message.quoted_id {
            let mut conn = self.db.pool.acquire().await.map_err(|e| storage(&e))?;
            if let Some(row) = db::whatsapp::outbound_by_wamid(&mut conn, quoted).await.map_err(|e| storage(&e))? {
                replies_to_bot = true;
                quoted_text = Some(row.body);
            }
        }
        let inbound = Inbound {
            channel: super::WHATSAPP_CHANNEL.into(),
            message_id: message.message_id.clone(),
            chat_id: message.chat_id.clone(),
            chat_kind: if message.is_group { ChatKind::Group } else { ChatKind::Direct },
            sender: message.sender.clone(),
            text: message.text.clone().unwrap_or_default(),
            reply_id: message.reply_id.clone(),
            quoted_id: message.quoted_id.clone(),
            quoted_text,
            mentions_bot: false,
            replies_to_bot,
            correlation_id: message.correlation_id.clone(),
        };
        if matches!(inbound.chat_kind, ChatKind::Direct) {
            presence.typing().await;
        }
        let outcome = self.handle(&inbound).await.map_err(|e| storage(&e))?;
        Ok(match (outcome.route, outcome.reply) {
            (_, Some(text)) if !text.trim().is_empty() => InboundOutcome::Reply { text, quote: inbound.chat_kind == ChatKind::Group },
            (route, _) => InboundOutcome::NoReply { reason: route.as_str().to_string() },
        })
    }
}
