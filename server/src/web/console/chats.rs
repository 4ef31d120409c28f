//! Conversations on every channel, and the simulator.

use app::{
    backend::ChatsBackend,
    dto::{ChatDetail, ChatMessageView, ChatView, ConversationsPage, SimulateOutcome, SimulateRequest},
    error::{AppError, code},
};

use super::{ConsoleBackend, internal};
use crate::db;

#[async_trait::async_trait]
impl ChatsBackend for ConsoleBackend {
    async fn conversations_page(&self, owner_id: i64) -> Result<ConversationsPage, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let chats = db::simulator::chats(&mut conn, 200)
            .await
            .map_err(internal)?
            .into_iter()
            .map(|c| ChatView { channel: c.channel, chat_id: c.chat_id, name: c.name, messages: c.messages, last_at: c.last_at })
            .collect();
        let owner_numbers = db::owners::phones_of(&mut conn, owner_id).await.map_err(internal)?;
        Ok(ConversationsPage { chats, owner_numbers, simulator_customer: self.state.config.settings.conversation.simulator_customer.clone() })
    }

    async fn chat_detail(&self, channel: &str, chat_id: &str) -> Result<ChatDetail, AppError> {
        if !matches!(channel, "whatsapp" | "simulator") {
            return Err(AppError::invalid("The channel is whatsapp or simulator."));
        }
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let messages: Vec<ChatMessageView> = db::simulator::messages(&mut conn, channel, chat_id, 500)
            .await
            .map_err(internal)?
            .into_iter()
            .map(|m| ChatMessageView { direction: m.direction, sender: m.sender, text: m.text, state: m.state, error_code: m.error_code, trace_id: m.trace_id, at: m.at })
            .collect();
        if messages.is_empty() {
            return Err(AppError::new(code::NOT_FOUND, format!("There is no {channel} chat {chat_id:?}.")));
        }
        let name = if channel == "whatsapp" { db::whatsapp::sender_name(&mut conn, chat_id).await.map_err(internal)? } else { None };
        let group = db::simulator::is_group(&mut conn, channel, chat_id).await.map_err(internal)?;
        Ok(ChatDetail { channel: channel.into(), chat_id: chat_id.into(), name, group, messages })
    }

    async fn simulate(&self, owner_id: i64, request: SimulateRequest) -> Result<SimulateOutcome, AppError> {
        use crate::channel::simulator::{SimError, SimMessage};
        let from = request.from.clone();
        let message = SimMessage { from: request.from, text: request.text, chat_id: request.chat_id, group: request.group, mention: request.mention, operator: Some(owner_id) };
        let sent = self.state.simulator.send(message).await.map_err(|e| match e {
            SimError::Invalid(why) => AppError::invalid(why),
            SimError::Db(e) => internal(e),
            other => internal(other),
        })?;
        let h = sent.handled;
        Ok(SimulateOutcome { from, chat_id: sent.chat_id, message_id: sent.message_id, actor: h.role.as_str().into(), route: h.route, reply: h.reply, trace_id: h.trace_id, error_code: h.error_code })
    }

}
