//! Channels carry messages in and out: WhatsApp and the console's simulator. Each one turns what
//! it receives into an [`Inbound`] and hands it to an [`InboundHandler`] (the conversation
//! runtime implements it), then delivers the reply and adds the delivery to the message's trace.
//! Only the transport differs between channels; the channel never decides what to answer.

mod outbox;
pub mod simulator;
pub mod whatsapp;

pub use outbox::Outbox;

use crate::domain::{ChatKind, Role};

/// What a message is, as far as the channel could tell.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MessageKind {
    #[default]
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

/// `Inbound::channel` of messages that came through the WhatsApp webhook.
pub const WHATSAPP: &str = "whatsapp";
/// `Inbound::channel` of messages an owner sent from the console's simulator.
pub const SIMULATOR: &str = "simulator";

/// One message on its way from a channel to the runtime, whatever the channel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inbound {
    /// [`WHATSAPP`] or [`SIMULATOR`].
    pub channel: String,
    /// Unique per message (the WhatsApp wamid, or the simulator's id).
    pub message_id: String,
    /// The group for group messages, else the sender.
    pub chat_id: String,
    pub chat_kind: ChatKind,
    /// The sender's number, digits with or without '+'.
    pub sender: String,
    /// The sender's profile name when the channel has one (WhatsApp's `contacts[].profile.name`):
    /// their own text, used to tell a group's members apart.
    pub sender_name: Option<String>,
    pub kind: MessageKind,
    /// The text; for a button or list reply, the title the person chose. Empty for types the
    /// bot cannot read.
    pub text: String,
    /// For a button or list reply, the id of the choice (the business's own payload).
    pub reply_id: Option<String>,
    /// The id of the message this one replies to (WhatsApp's context.id).
    pub quoted_id: Option<String>,
    /// The quoted message's text when the channel has it (a bot message it sent); otherwise the
    /// runtime looks the id up in the chat's memory.
    pub quoted_text: Option<String>,
    /// WhatsApp's own mention of the business number.
    pub mentions_bot: bool,
    /// It replies to one of the bot's messages.
    pub replies_to_bot: bool,
    pub correlation_id: String,
    /// For a message typed into the console's simulator, the console owner who typed it: an
    /// owner command in it acts as them, not as the owner whose number was typed.
    pub operator: Option<i64>,
    /// When the answer must be ready, so the channel can still deliver it (and the runtime can
    /// still give its fallback reply instead of being cut off). `None`: no limit of the channel's.
    pub deadline: Option<tokio::time::Instant>,
}

/// What the runtime made of a message, with the trace the channel adds its delivery to.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    /// The message's trace (for a duplicate, the first delivery's).
    pub trace_id: Option<i64>,
    pub role: Role,
    /// Where the message went (`chat`, `tool_lane`, `duplicate`, ...).
    pub route: String,
    /// What to send back, if anything.
    pub reply: Option<String>,
    /// Show the reply as an answer to the inbound message (in groups).
    pub quote: bool,
    pub error_code: Option<String>,
    /// The reply only says the work is under way, or that an owner was asked: a later message
    /// about the request that went out first (the answer, an owner's decision) makes it stale.
    pub acknowledgement: Option<Acknowledgement>,
}

/// What a reply that is only an acknowledgement says ([`Handled::acknowledgement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acknowledgement {
    /// The work is under way ("I'm looking that up"): stale once a later message about it went
    /// out.
    Underway,
    /// An owner was asked: stale once a later message about it went out and every request the
    /// message asked is settled (one of two requests decided still leaves the other waiting).
    OwnerAsked,
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

/// A channel without a typing indicator.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPresence;

#[async_trait::async_trait]
impl Presence for NoPresence {
    async fn typing(&self) {}
}

/// The chat a later message goes to: a tool's answer that came after the reply, an owner's
/// decision. Kept with the job that will send it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplyTo {
    /// [`WHATSAPP`] or [`SIMULATOR`].
    pub channel: String,
    pub chat_id: String,
    pub chat_kind: ChatKind,
    /// The message it answers (quoted in groups).
    pub message_id: String,
}

impl ReplyTo {
    pub fn of(inbound: &Inbound) -> Self {
        Self { channel: inbound.channel.clone(), chat_id: inbound.chat_id.clone(), chat_kind: inbound.chat_kind, message_id: inbound.message_id.clone() }
    }
}

/// Why a later message was not sent.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    /// Try again later (the ledger keeps what already went out).
    #[error("{code}: {message}")]
    Retry { code: String, message: String },
    /// Retrying cannot help.
    #[error("{code}: {message}")]
    Permanent { code: String, message: String },
}

/// What became of a later message the channel took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    Sent,
    /// The channel took it and will not deliver it: outside WhatsApp's 24-hour window with no
    /// template, or a refusal Meta reported for this message. Its trace says so.
    Refused { code: String },
}

impl Delivered {
    /// For a job's preview: "" when sent, else why not.
    pub fn note(&self) -> String {
        match self {
            Self::Sent => String::new(),
            Self::Refused { code } => format!("; not delivered ({code})"),
        }
    }
}

/// Sends a message that is not the direct answer to an inbound one, once per `job_id` (a
/// retried job sends nothing twice), and appends its delivery to `trace_id`'s trace. Once it
/// went out, the chat's memory keeps `remembered` as the assistant's turn: the text itself, or
/// a stand-in for private details (`lane.private_answer_memory`).
#[async_trait::async_trait]
pub trait Outbound: Send + Sync {
    async fn deliver(&self, to: &ReplyTo, text: &str, remembered: &str, job_id: i64, trace_id: Option<i64>) -> Result<Delivered, DeliverError>;
    /// Whether job `job_id`'s message to `to` went out (on WhatsApp, a part of it Meta
    /// accepted).
    async fn went_out(&self, to: &ReplyTo, job_id: i64) -> Result<bool, crate::db::DbError>;
}

/// Where inbound messages go: the conversation runtime.
#[async_trait::async_trait]
pub trait InboundHandler: Send + Sync {
    async fn handle(&self, inbound: &Inbound, presence: &dyn Presence) -> Result<Handled, HandlerError>;
}
