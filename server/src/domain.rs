//! Values every part of the engine shares: who is speaking and in what kind of chat. They hold
//! no I/O and import nothing else of the crate. (Phone numbers and login names are shared with
//! the console and live in `app::domain`.)

use serde::{Deserialize, Serialize};

/// Who sent a message or asked for a tool call. The role comes from the sender's number (an
/// owner's registered WhatsApp number), never from what the message or the model says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Role {
    Customer,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A one-to-one chat or a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ChatKind {
    #[default]
    Direct,
    Group,
}

impl ChatKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_string_form_each() {
        assert_eq!(Role::Owner.as_str(), "owner");
        assert_eq!("customer".parse::<Role>().ok(), Some(Role::Customer));
        assert_eq!(serde_json::to_value(ChatKind::Group).ok(), Some(serde_json::json!("group")));
        assert_eq!("direct".parse::<ChatKind>().ok(), Some(ChatKind::Direct));
    }
}
