//! The webhook's JSON: the envelope Meta posts (entries, changes, messages, statuses) and its
//! translation into rows to store. Parsing is lenient about fields we do not use, strict about
//! the ones we need (a message without an id or sender is skipped and counted).

use serde::Deserialize;

use crate::{
    channel::MessageKind,
    db::whatsapp::{DeliveryState, NewInbound, StatusUpdate},
};

/// The notification. Each entry and each change is read on its own as well, so `null` or a wrong
/// type in one costs only that one, never the messages of the others.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default, deserialize_with = "lenient")]
    object: String,
    #[serde(default, deserialize_with = "lenient_list")]
    entry: Vec<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default, deserialize_with = "lenient_list")]
    changes: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct Change {
    #[serde(default, deserialize_with = "lenient")]
    field: String,
    #[serde(default)]
    value: serde_json::Value,
}

/// A change's value. Each message, status and contact is read on its own, so one that lacks a
/// field (or has `null` where an object belongs) is skipped alone, never the messages beside it.
#[derive(Debug, Default, Deserialize)]
struct Value {
    #[serde(default, deserialize_with = "lenient")]
    metadata: Metadata,
    #[serde(default, deserialize_with = "lenient_list")]
    messages: Vec<serde_json::Value>,
    #[serde(default, deserialize_with = "lenient_list")]
    statuses: Vec<serde_json::Value>,
    #[serde(default, deserialize_with = "lenient_list")]
    contacts: Vec<serde_json::Value>,
}

/// A field as `T` when it reads as one, else `T::default()` (for `null`, a wrong type, a
/// missing part): what it holds is checked item by item later.
fn lenient<'de, D: serde::Deserializer<'de>, T: Default + serde::de::DeserializeOwned>(d: D) -> Result<T, D::Error> {
    let raw = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(raw).unwrap_or_default())
}

/// A list's items as they are, each read on its own later; anything but a list (`null`, a wrong
/// type) is an empty one. (Read through [`lenient`], each item would be built twice.)
fn lenient_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<serde_json::Value>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Array(items) => items,
        _ => Vec::new(),
    })
}

/// Who sent the change's messages: a WhatsApp id and the profile name its owner chose.
#[derive(Debug, Default, Deserialize)]
struct Contact {
    #[serde(default, deserialize_with = "lenient")]
    wa_id: String,
    #[serde(default, deserialize_with = "lenient")]
    profile: Profile,
}

#[derive(Debug, Default, Deserialize)]
struct Profile {
    #[serde(default, deserialize_with = "lenient")]
    name: String,
}

/// A profile name is the sender's own text: kept to this many characters.
const NAME_MAX_CHARS: usize = 100;

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    phone_number_id: String,
}

#[derive(Debug, Deserialize)]
struct Message {
    from: String,
    id: String,
    #[serde(default)]
    timestamp: String,
    #[serde(rename = "type", default)]
    kind: String,
    text: Option<Text>,
    interactive: Option<Interactive>,
    button: Option<Button>,
    context: Option<Context>,
    group_id: Option<String>,
}

impl Message {
    /// What a message that does not read as documented still says: its sender, id, time and
    /// group; its kind is `malformed`.
    fn malformed(raw: &serde_json::Value) -> Option<Self> {
        let text = |key: &str| raw.get(key).and_then(serde_json::Value::as_str).map(String::from);
        // A group it names, unread, would have its reply go to the member alone.
        if raw.get("group_id").is_some_and(|g| !g.is_null() && !g.is_string()) {
            return None;
        }
        Some(Self {
            from: text("from")?,
            id: text("id")?,
            timestamp: text("timestamp").unwrap_or_default(),
            kind: MALFORMED.into(),
            text: None,
            interactive: None,
            button: None,
            context: None,
            group_id: text("group_id"),
        })
    }
}

/// The kind of a message that does not read as Meta documents it.
const MALFORMED: &str = "malformed";

#[derive(Debug, Deserialize)]
struct Text {
    #[serde(default)]
    body: String,
}

#[derive(Debug, Deserialize)]
struct Interactive {
    #[serde(rename = "type", default)]
    kind: String,
    button_reply: Option<Choice>,
    list_reply: Option<Choice>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    id: String,
    #[serde(default)]
    title: String,
}

#[derive(Debug, Deserialize)]
struct Button {
    #[serde(default)]
    text: String,
    #[serde(default)]
    payload: String,
}

#[derive(Debug, Deserialize)]
struct Context {
    id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Status {
    id: String,
    status: String,
    #[serde(default)]
    timestamp: String,
    biz_opaque_callback_data: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    errors: Vec<StatusError>,
}

#[derive(Debug, Deserialize)]
struct StatusError {
    code: Option<i64>,
    #[serde(default)]
    title: String,
}

/// Everything one POST carried.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Batch {
    pub messages: Vec<NewInbound>,
    pub statuses: Vec<StatusUpdate>,
    /// Messages or statuses without the fields we need, and changes of other fields.
    pub skipped: usize,
    /// Of those, entries, changes and messages that could not be read at all (not objects, or a
    /// message without its id or sender): what a customer sent may be among them, so the
    /// webhook logs them (`WEBHOOK_ITEM_UNREADABLE`). Changes of other fields and statuses of
    /// other states are not counted here.
    pub unreadable: usize,
    /// The `object` of a notification for another Meta product, which is ignored.
    pub other_object: Option<String>,
}

impl Batch {
    fn unreadable_item(&mut self) {
        self.skipped += 1;
        self.unreadable += 1;
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the webhook body is not a WhatsApp notification: {0}")]
pub struct PayloadError(String);

/// Seconds as a string (Meta's format) to unix milliseconds; `fallback` when absent or bad.
fn seconds_to_ms(text: &str, fallback: i64) -> i64 {
    text.trim().parse::<i64>().ok().and_then(|s| s.checked_mul(1000)).unwrap_or(fallback)
}

/// Parses a webhook body (after its signature was checked). `raw_max_bytes` bounds the verbatim
/// copy of each message object kept for audits.
pub fn parse(body: &[u8], raw_max_bytes: usize, now: i64) -> Result<Batch, PayloadError> {
    // A notification is an object: serde would read a struct from a list too (`[1, 2]`).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(PayloadError("not a JSON object".into()));
    }
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| PayloadError(format!("invalid JSON at line {} column {}", e.line(), e.column())))?;
    if envelope.object != "whatsapp_business_account" {
        // Signed by Meta for another product of the app (a Page, Instagram) sent to this URL:
        // nothing for WhatsApp, and not an error, or Meta would send it again for days.
        return Ok(Batch { skipped: 1, other_object: Some(clip(&envelope.object, 60)), ..Batch::default() });
    }
    let mut batch = Batch::default();
    let mut changes = Vec::new();
    for entry in envelope.entry {
        match serde_json::from_value::<Entry>(entry) {
            Ok(entry) => changes.extend(entry.changes),
            Err(_) => batch.unreadable_item(),
        }
    }
    for change in changes {
        let Ok(change) = serde_json::from_value::<Change>(change) else {
            batch.unreadable_item();
            continue;
        };
        if change.field != "messages" {
            batch.skipped += 1;
            continue;
        }
        let Ok(value) = serde_json::from_value::<Value>(change.value) else {
            batch.unreadable_item();
            continue;
        };
        let contacts: Vec<Contact> = value.contacts.into_iter().filter_map(|c| serde_json::from_value(c).ok()).collect();
        for raw in value.messages {
            match inbound(&raw, &value.metadata.phone_number_id, raw_max_bytes, now) {
                Some(mut m) => {
                    m.sender_name = contacts.iter().find(|c| c.wa_id == m.sender).map(|c| clip(c.profile.name.trim(), NAME_MAX_CHARS)).filter(|n| !n.is_empty());
                    batch.messages.push(m);
                }
                None => batch.unreadable_item(),
            }
        }
        for s in value.statuses {
            match serde_json::from_value(s).ok().and_then(|s| status(s, now)) {
                Some(s) => batch.statuses.push(s),
                None => batch.skipped += 1,
            }
        }
    }
    Ok(batch)
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn inbound(raw: &serde_json::Value, phone_number_id: &str, raw_max_bytes: usize, now: i64) -> Option<NewInbound> {
    // A message whose parts are not as Meta documents them (a field of another type, `null`
    // for a text's body) but that says who sent it and which it is: kept as a message of an
    // unknown kind, with its raw JSON, so it is traced and answered as one, never dropped.
    let m: Message = serde_json::from_value(raw.clone()).ok().or_else(|| Message::malformed(raw))?;
    if m.id.is_empty() || m.from.is_empty() {
        return None;
    }
    let (kind, text, reply_id) = match m.kind.as_str() {
        "text" => (MessageKind::Text, m.text.map(|t| t.body), None),
        "interactive" => match m.interactive {
            Some(Interactive { kind, button_reply: Some(c), .. }) if kind == "button_reply" => (MessageKind::ButtonReply, Some(c.title), non_empty(c.id)),
            Some(Interactive { kind, list_reply: Some(c), .. }) if kind == "list_reply" => (MessageKind::ListReply, Some(c.title), non_empty(c.id)),
            Some(Interactive { kind, .. }) => (MessageKind::Unknown(format!("interactive.{}", clip(&kind, 40))), None, None),
            None => (MessageKind::Unknown("interactive".into()), None, None),
        },
        "button" => match m.button {
            Some(b) => (MessageKind::TemplateButton, Some(b.text), non_empty(b.payload)),
            None => (MessageKind::Unknown("button".into()), None, None),
        },
        other => (MessageKind::Unknown(if other.is_empty() { "unknown".into() } else { clip(other, 40) }), None, None),
    };
    let raw_text = raw.to_string();
    let raw_truncated = raw_text.len() > raw_max_bytes;
    let group = m.group_id.filter(|g| !g.is_empty());
    Some(NewInbound {
        chat_id: group.clone().unwrap_or_else(|| m.from.clone()),
        is_group: group.is_some(),
        sender: m.from,
        sender_name: None,
        wamid: m.id,
        phone_number_id: phone_number_id.to_string(),
        msg_type: kind.as_str().to_string(),
        text,
        reply_id,
        context_id: m.context.and_then(|c| c.id).filter(|id| !id.is_empty()),
        raw: (!raw_truncated).then_some(raw_text),
        raw_truncated,
        sent_at: seconds_to_ms(&m.timestamp, now),
    })
}

fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn status(s: Status, now: i64) -> Option<StatusUpdate> {
    let state = match s.status.as_str() {
        "sent" => DeliveryState::Sent,
        "delivered" => DeliveryState::Delivered,
        "read" | "played" => DeliveryState::Read,
        "failed" => DeliveryState::Failed,
        _ => return None,
    };
    if s.id.is_empty() {
        return None;
    }
    let first_error = s.errors.into_iter().next();
    Some(StatusUpdate {
        wamid: s.id,
        state,
        at: seconds_to_ms(&s.timestamp, now),
        error_code: first_error.as_ref().and_then(|e| e.code).map(|c| c.to_string()),
        error_message: first_error.map(|e| clip(&e.title, 200)).filter(|t| !t.is_empty()),
        opaque: s.biz_opaque_callback_data.filter(|o| !o.is_empty()),
    })
}

#[cfg(test)]
mod tests;
