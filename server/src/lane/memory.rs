//! What the planner reads of the chat's normal memory (seed §5.2, "recent normal memory
//! summary"): the chat's compaction summary, if it has one, and its latest turns, so that a
//! message such as "and the weather there tomorrow?" is planned from what was said before it.
//! Tool prompts and raw results are never in that memory (the answers the person was sent are,
//! as sent); the chat's tool results reach the planner as its recent tool contexts.

use sqlx::AnyConnection;

use crate::db::{
    self, DbError,
    conversation::{Turn, role},
};

/// Most characters of one turn the planner reads.
const TURN_CHARS: usize = 300;

/// The chat's memory for the planner: its summary, then up to `turns` of its latest turns
/// before `before` (unix ms), oldest first. A replay of an old message so reads the turns as
/// they were then, with the chat's current summary. `None` when the chat has neither.
/// In a group chat a member's turn is given under the label stored with it (as the chat model
/// reads it), else as the person's, as in a direct chat.
pub async fn for_planner(conn: &mut AnyConnection, chat_id: &str, before: i64, turns: u32) -> Result<Option<String>, DbError> {
    let summary = db::conversation::summary(conn, chat_id).await?.map(|s| s.text).filter(|s| !s.trim().is_empty());
    let recent = if turns == 0 { Vec::new() } else { db::conversation::last_turns(conn, chat_id, before, i64::from(turns)).await? };
    Ok(render(summary.as_deref(), &recent))
}

/// How the planner's memory names a person's turn without a label (one of
/// [`crate::conversation::speakers::RESERVED`], so no member's label reads as it).
const PERSON: &str = "person";

fn render(summary: Option<&str>, recent: &[Turn]) -> Option<String> {
    let mut out = summary.map(|s| s.trim().to_string()).unwrap_or_default();
    if !recent.is_empty() {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str("Latest messages, oldest first:");
        for turn in recent {
            let who = if turn.role == role::ASSISTANT { "assistant" } else { turn.sender_label.as_deref().unwrap_or(PERSON) };
            let text: String = turn.text.split_whitespace().collect::<Vec<_>>().join(" ");
            let cut: String = text.chars().take(TURN_CHARS).collect();
            let more = if cut.len() < text.len() { "…" } else { "" };
            out.push_str(&format!("\n{who}: {cut}{more}"));
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(role: &str, text: &str) -> Turn {
        Turn { id: 0, role: role.into(), text: text.into(), message_id: String::new(), at: 0, tokens: 0, sender_label: None, origin: None }
    }

    #[test]
    fn the_summary_then_the_latest_turns_each_on_one_bounded_line() {
        let long = "word ".repeat(100);
        let recent = [turn(role::USER, "I'm in\nLisbon this week"), turn(role::ASSISTANT, &long)];
        let text = render(Some("They asked about opening hours."), &recent).expect("memory");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..4], ["They asked about opening hours.", "", "Latest messages, oldest first:", "person: I'm in Lisbon this week"]);
        assert!(lines[4].starts_with("assistant: word word") && lines[4].ends_with('…'), "{}", lines[4]);
        assert_eq!(lines[4].chars().count(), "assistant: ".len() + TURN_CHARS + 1);
        assert_eq!(render(None, &recent[..1]).as_deref(), Some("Latest messages, oldest first:\nperson: I'm in Lisbon this week"));
        assert_eq!(render(None, &[]), None);
    }

    /// In a group the planner reads who said what: the label on record, else "person".
    #[test]
    fn group_members_are_named_in_the_planners_memory() {
        let said = |label: &str, text: &str| Turn { sender_label: Some(label.into()), ..turn(role::USER, text) };
        let recent = [said("Ana", "Book Tuesday for me"), said("member 2", "Me too"), turn(role::USER, "(before labels)"), turn(role::ASSISTANT, "Which time?")];
        let text = render(None, &recent).expect("memory");
        assert_eq!(text, "Latest messages, oldest first:\nAna: Book Tuesday for me\nmember 2: Me too\nperson: (before labels)\nassistant: Which time?");
    }
}
