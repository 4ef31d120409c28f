//! Whole-word matching of configured phrases, and of a tool context's entities, in a message's
//! words.

use super::{RecentContext, text::split_words};

/// Whether the message names one of the context's entities (whole words, any case).
pub(super) fn names_entity(raw: &[&str], context: &RecentContext) -> bool {
    context.entities.iter().any(|entity| {
        let entity = split_words(entity);
        !entity.is_empty()
            && raw
                .windows(entity.len())
                .any(|w| w.iter().zip(&entity).all(|(a, b)| a == b))
    })
}

/// A list of configured phrases, folded to words, matched on whole words.
#[derive(Debug)]
pub(super) struct Phrases(Vec<Vec<String>>);

impl Phrases {
    pub(super) fn new(phrases: &[String]) -> Self {
        Self(
            phrases
                .iter()
                .map(|p| split_words(p))
                .filter(|p| !p.is_empty())
                .collect(),
        )
    }

    pub(super) fn any_in(&self, words: &[&str]) -> bool {
        self.0.iter().any(|p| {
            words
                .windows(p.len())
                .any(|w| w.iter().zip(p).all(|(a, b)| a == b))
        })
    }

    /// Whether word `i` is part of one of the phrases.
    pub(super) fn covers(&self, words: &[&str], i: usize) -> bool {
        self.0.iter().any(|p| {
            let n = p.len();
            (i.saturating_sub(n - 1)..=i)
                .filter(|&start| start + n <= words.len())
                .any(|start| words[start..start + n].iter().zip(p).all(|(a, b)| a == b))
        })
    }
}
