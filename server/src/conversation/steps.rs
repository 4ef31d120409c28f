//! The runtime's decisions that need no I/O, each a separate, tested unit. The order in which
//! they run is in [`super::Runtime::handle`].

use regex::{Regex, RegexBuilder};

use super::Inbound;
use crate::{
    config::conversation::{GroupReply, PrivateDataSettings},
    domain::{ChatKind, Role},
};

/// Group rules: in groups the bot answers only when the config allows it.
pub fn group_allows(inbound: &Inbound, mode: GroupReply, mention_names: &[String]) -> Result<&'static str, &'static str> {
    if inbound.chat_kind == ChatKind::Direct {
        return Ok("DIRECT_CHAT");
    }
    match mode {
        GroupReply::Always => Ok("GROUP_ALWAYS"),
        GroupReply::Never => Err("GROUP_NEVER"),
        GroupReply::MentionedOrReplied => {
            let lower = inbound.text.to_lowercase();
            if inbound.mentions_bot || mention_names.iter().any(|n| !n.is_empty() && lower.contains(&n.to_lowercase())) {
                Ok("GROUP_MENTIONED")
            } else if inbound.replies_to_bot {
                Ok("GROUP_REPLIED_TO")
            } else {
                Err("GROUP_NOT_ADDRESSED")
            }
        }
    }
}

/// An owner command, parsed from a message that starts with '/'. Its trace step names it
/// ([`Command::name`]) without its words: a reason or a note is the owner's text.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Command {
    Help,
    Status,
    Jobs,
    Approve(String),
    Reject(String),
    /// `/wrong EXPECTATION [what should have happened]`: the answer replied to (or else the
    /// chat's previous one) was wrong.
    Wrong(String),
    Unknown(String),
}

impl Command {
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// The command in `text`, if it is one (a leading '/' and a word).
pub fn command(text: &str) -> Option<Command> {
    let rest = text.trim().strip_prefix('/')?;
    let mut words = rest.split_whitespace();
    let name = words.next()?.to_ascii_lowercase();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    // Everything after the name: `/reject 12 too expensive` keeps its reason.
    let arg = words.collect::<Vec<_>>().join(" ");
    Some(match name.as_str() {
        "help" => Command::Help,
        "status" => Command::Status,
        "jobs" => Command::Jobs,
        "approve" => Command::Approve(arg),
        "reject" => Command::Reject(arg),
        "wrong" => Command::Wrong(arg),
        other => Command::Unknown(other.to_string()),
    })
}

/// The slash boundary: owners reach commands in their direct chats; a customer's
/// command-looking message gets the configured reply and never reaches an owner command or a
/// tool control. An owner's command in a group is refused too: its answer (jobs, approvals,
/// status) would be posted to everyone there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slash {
    NotACommand,
    Owner(Command),
    CustomerRefused,
    OwnerInGroup,
}

pub fn slash(actor: Role, chat: ChatKind, text: &str) -> Slash {
    match (command(text), actor, chat) {
        (None, _, _) => Slash::NotACommand,
        (Some(_), Role::Owner, ChatKind::Group) => Slash::OwnerInGroup,
        (Some(c), Role::Owner, ChatKind::Direct) => Slash::Owner(c),
        (Some(_), Role::Customer, _) => Slash::CustomerRefused,
    }
}

/// Compiled private-data categories.
#[derive(Debug, Clone)]
pub struct PrivateGuard {
    categories: Vec<(String, Vec<Regex>)>,
}

impl PrivateGuard {
    /// Patterns were checked when the config loaded; one that no longer compiles is skipped.
    pub fn new(settings: &PrivateDataSettings) -> Self {
        let categories = settings
            .categories
            .iter()
            .map(|c| (c.name.clone(), c.patterns.iter().filter_map(|p| RegexBuilder::new(p).case_insensitive(true).build().ok()).collect()))
            .collect();
        Self { categories }
    }

    /// The category a message asks about, if any. Owners are not guarded in their direct
    /// chats; in a group everyone is, since the answer would be read by all its members.
    pub fn check(&self, actor: Role, chat: ChatKind, text: &str) -> Option<&str> {
        if actor == Role::Owner && chat == ChatKind::Direct {
            return None;
        }
        self.categories.iter().find(|(_, patterns)| patterns.iter().any(|r| r.is_match(text))).map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::conversation::PrivateCategory;

    fn inbound(text: &str, kind: ChatKind) -> Inbound {
        Inbound { text: text.into(), chat_kind: kind, message_id: "m1".into(), chat_id: "c1".into(), sender: "15550001111".into(), ..Inbound::default() }
    }

    #[test]
    fn groups_answer_only_when_addressed() {
        let names = vec!["@assistant".to_string()];
        let m = GroupReply::MentionedOrReplied;
        assert_eq!(group_allows(&inbound("hi", ChatKind::Direct), m, &names), Ok("DIRECT_CHAT"));
        assert_eq!(group_allows(&inbound("hi all", ChatKind::Group), m, &names), Err("GROUP_NOT_ADDRESSED"));
        assert_eq!(group_allows(&inbound("@Assistant what time?", ChatKind::Group), m, &names), Ok("GROUP_MENTIONED"));
        let replied = Inbound { replies_to_bot: true, ..inbound("thanks", ChatKind::Group) };
        assert_eq!(group_allows(&replied, m, &names), Ok("GROUP_REPLIED_TO"));
        assert_eq!(group_allows(&inbound("x", ChatKind::Group), GroupReply::Never, &names), Err("GROUP_NEVER"));
        assert_eq!(group_allows(&inbound("x", ChatKind::Group), GroupReply::Always, &names), Ok("GROUP_ALWAYS"));
    }

    #[test]
    fn commands_and_the_customer_boundary() {
        assert_eq!(command("/approve 42"), Some(Command::Approve("42".into())));
        assert_eq!(command("/reject 7  not   today"), Some(Command::Reject("7 not today".into())));
        assert_eq!(command("  /STATUS "), Some(Command::Status));
        assert_eq!(command("/jobs"), Some(Command::Jobs));
        assert_eq!(command("/what"), Some(Command::Unknown("what".into())));
        assert_eq!(command("and/or"), None);
        assert_eq!(command("/ "), None);
        assert_eq!(command("/path/to"), None);
        assert_eq!(slash(Role::Owner, ChatKind::Direct, "/help"), Slash::Owner(Command::Help));
        assert_eq!(slash(Role::Owner, ChatKind::Group, "/jobs"), Slash::OwnerInGroup, "an owner's command is not answered where a group reads it");
        assert_eq!(slash(Role::Owner, ChatKind::Group, "hello"), Slash::NotACommand);
        assert_eq!(slash(Role::Customer, ChatKind::Direct, "/approve 1"), Slash::CustomerRefused);
        assert_eq!(slash(Role::Customer, ChatKind::Group, "/jobs"), Slash::CustomerRefused);
        assert_eq!(slash(Role::Customer, ChatKind::Direct, "hello"), Slash::NotACommand);
    }

    #[test]
    fn private_data_is_guarded_for_customers_only() {
        let settings = PrivateDataSettings {
            safe_reply: "no".into(),
            categories: vec![PrivateCategory { name: "balances".into(), description: "d".into(), examples: vec![], patterns: vec![r"\bmy balance\b".into()] }],
            ..Default::default()
        };
        let guard = PrivateGuard::new(&settings);
        assert_eq!(guard.check(Role::Customer, ChatKind::Direct, "What's MY BALANCE?"), Some("balances"));
        assert_eq!(guard.check(Role::Customer, ChatKind::Direct, "What are your opening hours?"), None);
        assert_eq!(guard.check(Role::Owner, ChatKind::Direct, "what's my balance"), None);
        assert_eq!(guard.check(Role::Owner, ChatKind::Group, "what's my balance"), Some("balances"), "a group reads the answer");
    }
}
