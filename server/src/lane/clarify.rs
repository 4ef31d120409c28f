//! A clarifying question the lane asked (the planner's `clarify`, or a required argument the
//! plan left out), kept so that the answer is planned with the request it answers. Without it,
//! "Porto" after "Which city do you mean?" would be detected alone, and stay in normal chat.
//!
//! The question stays open for the person asked in the chat (in a group, that member) for
//! `lane.clarification_ttl` (the lane's [`super::context::ContextStore`] keeps it). Their next
//! message to the assistant takes their newest open question, once, and is planned as its
//! answer: the detector offers the question's tools first, beside the message's own
//! candidates, and the planner reads the request, the questions and the answers so far as
//! untrusted data.

use serde::{Deserialize, Serialize};

/// Most turns kept: the request and its question, and the latest answers and questions.
const MAX_TURNS: usize = 8;
/// Most characters of one turn.
const TURN_CHARS: usize = 500;

/// Who said a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    Person,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub who: Who,
    pub text: String,
}

/// An open question: what led to it, and the tools it was about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clarification {
    /// The stored question's id (for traces, and the eval cases made from them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Oldest first: the request, then each question and each answer; the last is a question.
    pub turns: Vec<Turn>,
    /// The tools offered when the question was asked, besides the always-offered ones.
    #[serde(default)]
    pub tools: Vec<String>,
}

impl Clarification {
    /// The question asked about `message`: the turns of the question `message` answered, if
    /// any, then `message` and `question`. Bounded: the request and its question stay, then
    /// the newest answers and questions.
    pub fn asked(answered: Option<&Clarification>, message: &str, question: &str, tools: Vec<String>) -> Self {
        let mut turns = answered.map(|c| c.turns.clone()).unwrap_or_default();
        turns.push(Turn { who: Who::Person, text: bounded(message) });
        turns.push(Turn { who: Who::Assistant, text: bounded(question) });
        if turns.len() > MAX_TURNS {
            turns.drain(2..turns.len() - (MAX_TURNS - 2));
        }
        Self { id: None, turns, tools }
    }

    /// The turns as the planner reads them, one a line.
    pub fn render(&self) -> String {
        self.turns
            .iter()
            .map(|t| format!("{}: {}", if t.who == Who::Person { "person" } else { "assistant" }, t.text))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn bounded(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = text.chars().take(TURN_CHARS).collect();
    if cut.len() < text.len() { format!("{cut}…") } else { cut }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{ChatKind, Role},
        lane::detector::{DetectorSettings, Index, ReasonCode, ToolDoc},
    };

    fn tool(name: &str, description: &str, owner_only: bool) -> ToolDoc {
        ToolDoc { name: name.into(), description: description.into(), owner_only, enabled: true, ..ToolDoc::default() }
    }

    /// An answer alone says too little to plan ("Porto", "yes"); as an answer it is planned
    /// with the question's tools first, and never with one the actor may not use.
    #[test]
    fn an_answer_plans_with_the_questions_tools_the_actor_may_use() {
        let docs = vec![
            tool("forecast", "The weather forecast for a city on a day.", false),
            tool("refund", "Refunds an order to the customer.", true),
            tool("store_hours", "The opening hours of a store in a city.", false),
        ];
        let index = Index::build_with(docs, DetectorSettings::default(), None);
        let asked = ["forecast".to_string(), "refund".to_string()];
        for answer in ["Porto", "yes", "👍"] {
            let alone = index.detect(answer, Role::Customer, ChatKind::Direct, &[]);
            assert!(!alone.should_plan, "{answer:?} alone: {alone:?}");
            let answered = index.detect_answering(answer, Role::Customer, ChatKind::Direct, &[], Some(&asked[..]));
            assert!(answered.should_plan && answered.reason == ReasonCode::ClarificationAnswer, "{answer:?}: {answered:?}");
            let names: Vec<&str> = answered.candidates.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["forecast"], "{answer:?}: owner-only tools stay out for a customer");
        }
        // The message's own candidates come after the question's.
        let answered = index.detect_answering("the store hours in Porto", Role::Owner, ChatKind::Direct, &[], Some(&asked[..]));
        let names: Vec<&str> = answered.candidates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names[..2], ["forecast", "refund"], "{answered:?}");
        assert!(names.contains(&"store_hours"), "{answered:?}");
        // A question about the chat itself is normal chat's, question or not.
        let memory = index.detect("what did I say?", Role::Customer, ChatKind::Direct, &[]);
        assert_eq!(index.detect_answering("what did I say?", Role::Customer, ChatKind::Direct, &[], Some(&asked[..])), memory);
        // Nothing to answer with: as detected.
        let empty = index.detect("  ", Role::Customer, ChatKind::Direct, &[]);
        assert_eq!(index.detect_answering("  ", Role::Customer, ChatKind::Direct, &[], Some(&asked[..])), empty);
        let only_owner = ["refund".to_string()];
        let alone = index.detect("yes", Role::Customer, ChatKind::Direct, &[]);
        assert_eq!(index.detect_answering("yes", Role::Customer, ChatKind::Direct, &[], Some(&only_owner[..])), alone);
    }

    #[test]
    fn each_question_adds_the_answer_and_itself_and_the_request_always_stays() {
        let first = Clarification::asked(None, "Book a table\nfor us", "For which day?", vec!["book".into()]);
        assert_eq!(first.render(), "person: Book a table for us\nassistant: For which day?");
        let second = Clarification::asked(Some(&first), "Tuesday", "For how many people?", vec!["book".into()]);
        assert_eq!(second.render(), "person: Book a table for us\nassistant: For which day?\nperson: Tuesday\nassistant: For how many people?");
        let mut many = second;
        for i in 0..5 {
            many = Clarification::asked(Some(&many), &format!("answer {i}"), &format!("question {i}"), Vec::new());
        }
        assert_eq!(many.turns.len(), MAX_TURNS);
        assert_eq!((many.turns[0].text.as_str(), many.turns[1].text.as_str()), ("Book a table for us", "For which day?"), "the request and its question are kept");
        assert_eq!(many.turns[2].who, Who::Person, "then answers and questions, in turn");
        assert_eq!(many.turns[MAX_TURNS - 1].text, "question 4", "then the newest turns");
        assert_eq!(many.turns[MAX_TURNS - 2].text, "answer 4");
        let long = Clarification::asked(None, &"word ".repeat(200), "?", Vec::new());
        assert_eq!(long.turns[0].text.chars().count(), TURN_CHARS + 1);
    }
}
