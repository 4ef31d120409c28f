//! Channels carry messages in and out: WhatsApp now, the console's simulator later. Each one
//! turns what it receives into an [`InboundMessage`] and hands it to an [`InboundHandler`], which
//! the conversation runtime implements. Only the transport differs between channels.

pub mod whatsapp;

/// What a message is, as far as the channel could tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageKind {
    Text,
    /// A reply button of an interactive message was tapped.
    ButtonReply,
    /// A row of an interactive list was chosen.
    ListReply,
    /// A template's quick-reply button was tapped.
    TemplateButton,
    /// Anything the bot cannot read yet (images, voice notes, stickers, reactions, ...), by the
    /// channel's own type name.
    Unknown(String),
}

impl MessageKind {
    /// The name stored with the message.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Text => "text",
            Self::ButtonReply => "interactive.button_reply",
            Self::ListReply => "interactive.list_reply",
            Self::TemplateButton => "button",
            Self::Unknown(name) => name,
        }
    }

    pub fn from_stored(name: &str) -> Self {
        match name {
            "text" => Self::Text,
            "interactive.button_reply" => Self::ButtonReply,
            "interactive.list_reply" => Self::ListReply,
            "button" => Self::TemplateButton,
            other => Self::Unknown(other.to_string()),
        }
    }

    /// Whether the message carries text the runtime can read.
    pub fn is_readable(&self) -> bool {
        !matches!(self, Self::Unknown(_))
    }
}

/// An inbound message after it was stored: the runtime's input, whatever the channel.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundMessage {
    /// The stored row's id.
    pub id: i64,
    /// The channel's own message id (WhatsApp: the wamid).
    pub message_id: String,
    /// The group for group messages, else the sender.
    pub chat_id: String,
    pub sender: String,
    pub is_group: bool,
    pub kind: MessageKind,
    /// The text, button title or list row title.
    pub text: Option<String>,
    /// The id or payload of the button or list row chosen.
    pub reply_id: Option<String>,
    /// The message this one quotes or answers.
    pub quoted_id: Option<String>,
    /// When the sender sent it (unix ms).
    pub sent_at: i64,
    pub received_at: i64,
    pub correlation_id: String,
}

/// What the runtime decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundOutcome {
    /// Answer in the same chat; `quote` shows the answer as a reply to the inbound message.
    Reply { text: String, quote: bool },
    /// No answer, with a short stable reason for the record (`group_not_mentioned`, ...).
    NoReply { reason: String },
}

/// A failure of the runtime, with a stable code. Retryable failures run the message again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct HandlerError {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

/// What a handler may do on the channel before it answers.
#[async_trait::async_trait]
pub trait Presence: Send + Sync {
    /// Shows that an answer is being prepared (WhatsApp: the typing indicator), when the channel
    /// and its configuration allow. Never fails the message.
    async fn typing(&self);
}

/// Where stored inbound messages go. The conversation runtime implements this; until it is
/// plugged in, [`RecordOnly`] keeps the message on record and answers nothing.
#[async_trait::async_trait]
pub trait InboundHandler: Send + Sync {
    async fn handle(&self, message: &InboundMessage, presence: &dyn Presence) -> Result<InboundOutcome, HandlerError>;
}

/// The handler used before a runtime is plugged in: the message stays stored (and is marked
/// processed by the channel), nothing is answered.
#[derive(Debug, Default, Clone, Copy)]
pub struct RecordOnly;

/// The reason [`RecordOnly`] gives.
pub const RECORDED_ONLY: &str = "recorded_only";

#[async_trait::async_trait]
impl InboundHandler for RecordOnly {
    async fn handle(&self, message: &InboundMessage, _presence: &dyn Presence) -> Result<InboundOutcome, HandlerError> {
        tracing::info!(
            message.id = message.id,
            kind = message.kind.as_str(),
            correlation_id = %message.correlation_id,
            "inbound message recorded; no conversation runtime is plugged in"
        );
        Ok(InboundOutcome::NoReply { reason: RECORDED_ONLY.into() })
    }
}
