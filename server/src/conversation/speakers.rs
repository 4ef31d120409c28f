//! Who said what in a group chat. In a direct chat every person's turn is the one customer's;
//! in a group each member's turn reads to the model as `conversation.group_turn_format` (say
//! `[Ana] I'll take two`), so it can tell the members apart: who asked, who is waiting, whose
//! booking. A member is named by their WhatsApp profile name, or, without one, as
//! `conversation.group_unnamed_member` numbered in order of appearance ("member 2"). Phone
//! numbers never reach the model.

use std::collections::HashMap;

use crate::db::conversation::{Turn, role};

/// Most characters of a name as the model reads it.
const NAME_CHARS: usize = 40;

/// The names of a group's members in one model call: each sender's label, fixed for the call.
#[derive(Debug, Clone, Default)]
pub struct Speakers {
    format: String,
    labels: HashMap<String, String>,
}

impl Speakers {
    /// Labels for the senders of `turns` (oldest first) and of the current message
    /// (`current`: its sender and their profile name, if any). A sender's latest name wins;
    /// two members with the same name are numbered apart. `None` when `format` is empty (the
    /// members are not told apart).
    pub fn of_group(format: &str, unnamed: &str, turns: &[Turn], current: (&str, Option<&str>)) -> Option<Self> {
        if format.trim().is_empty() {
            return None;
        }
        Some(Self { format: format.to_string(), labels: labels(unnamed, turns, Some(current)) })
    }

    /// Labels for the senders of stored `turns` alone (the planner's reading of the chat's
    /// memory, live and in a replay alike), `unnamed` for every member without a name on record;
    /// `None` when no turn has a sender on record (a direct chat).
    pub fn of_turns(unnamed: &str, turns: &[Turn]) -> Option<Self> {
        let labels = labels(unnamed, turns, None);
        (!labels.is_empty()).then(|| Self { format: "{name}: {text}".into(), labels })
    }

    /// The label of `sender`, if the group has one for them.
    pub fn label(&self, sender: &str) -> Option<&str> {
        self.labels.get(sender).map(String::as_str)
    }

    /// A member's words as the model reads them. A turn with no sender on record (stored
    /// before senders were kept) is given as it is.
    pub fn say(&self, sender: Option<&str>, text: &str) -> String {
        match sender.and_then(|s| self.label(s)) {
            // The text goes in last, so nothing in it is read as a placeholder.
            Some(label) => self.format.replace("{name}", label).replace("{text}", text),
            None => text.to_string(),
        }
    }

    /// A stored turn as the model reads it: a person's with their label, the assistant's as it is.
    pub fn turn(&self, turn: &Turn) -> String {
        if turn.role == role::USER { self.say(turn.sender.as_deref(), &turn.text) } else { turn.text.clone() }
    }
}

/// Each sender's label, in order of appearance over `turns` (oldest first) and `current`.
fn labels(unnamed: &str, turns: &[Turn], current: Option<(&str, Option<&str>)>) -> HashMap<String, String> {
    let mut order: Vec<&str> = Vec::new();
    let mut names: HashMap<&str, String> = HashMap::new();
    let seen = turns.iter().filter(|t| t.role == role::USER).filter_map(|t| Some((t.sender.as_deref()?, t.sender_name.as_deref())));
    for (sender, name) in seen.chain(current) {
        if !order.contains(&sender) {
            order.push(sender);
        }
        if let Some(name) = name.map(clean).filter(|n| !n.is_empty()) {
            names.insert(sender, name);
        }
    }
    let mut labels: HashMap<String, String> = HashMap::new();
    let mut unnamed_count = 0;
    for (position, sender) in order.iter().enumerate() {
        let label = match names.get(sender) {
            Some(name) if labels.values().any(|l| l == name) => format!("{name} ({})", position + 1),
            Some(name) => name.clone(),
            None => {
                unnamed_count += 1;
                clean(&unnamed.replace("{n}", &unnamed_count.to_string()))
            }
        };
        labels.insert((*sender).to_string(), label);
    }
    labels
}

/// A name on one line, without the characters a format or a label uses, bounded: a profile
/// name is its owner's own text.
fn clean(name: &str) -> String {
    let kept: String = name.chars().map(|c| if c.is_control() { ' ' } else { c }).filter(|c| !matches!(c, '[' | ']' | '{' | '}')).collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(NAME_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(id: i64, sender: &str, name: Option<&str>, text: &str) -> Turn {
        Turn { id, role: role::USER.into(), text: text.into(), message_id: format!("m{id}"), at: id, tokens: 1, sender: Some(sender.into()), sender_name: name.map(Into::into) }
    }

    #[test]
    fn members_are_named_by_their_latest_profile_name_or_numbered() {
        let turns = vec![
            said(1, "111", Some("Ana"), "Two tickets for Friday?"),
            said(2, "222", None, "Same for me"),
            said(3, "111", Some("Ana M."), "Make it three"),
            Turn { role: role::ASSISTANT.into(), sender: None, ..said(4, "", None, "Done.") },
        ];
        let s = Speakers::of_group("[{name}] {text}", "member {n}", &turns, ("333", Some("Bo\n[admin]"))).expect("on");
        assert_eq!(s.turn(&turns[0]), "[Ana M.] Two tickets for Friday?", "the latest name");
        assert_eq!(s.turn(&turns[1]), "[member 1] Same for me");
        assert_eq!(s.turn(&turns[3]), "Done.", "the assistant's turn as it is");
        assert_eq!(s.say(Some("333"), "and {name} me"), "[Bo admin] and {name} me", "a name cannot break the format; the text is not read");
        let legacy = Turn { sender: None, ..said(5, "", None, "old") };
        assert_eq!(s.turn(&legacy), "old", "a turn with no sender on record");
        assert!(Speakers::of_group(" ", "member {n}", &turns, ("333", None)).is_none(), "an empty format: not told apart");
        let stored = Speakers::of_turns("member {n}", &turns).expect("senders on record");
        assert_eq!((stored.label("111"), stored.label("222"), stored.label("333")), (Some("Ana M."), Some("member 1"), None));
        assert!(Speakers::of_turns("member {n}", &[legacy]).is_none(), "no sender on record");
    }

    #[test]
    fn two_members_with_one_name_are_told_apart() {
        let turns = vec![said(1, "111", Some("Ana"), "Hi"), said(2, "222", Some("Ana"), "Hello")];
        let s = Speakers::of_group("{name}: {text}", "member {n}", &turns, ("111", Some("Ana"))).expect("on");
        assert_eq!((s.label("111"), s.label("222")), (Some("Ana"), Some("Ana (2)")));
    }
}
