//! The inverted index behind the detector: a BM25F score over the fields of each tool, a bonus
//! for message word pairs that stand together in a tool's text, a penalty from `when_not_to_use`,
//! and exact matches of configured trigger phrases and aliases.

use std::collections::HashMap;

use crate::config::DetectorSettings;

use super::text::{Word, is_content};

mod build;

/// Fields of a tool, in the order of their weights.
#[derive(Debug, Clone, Copy)]
enum Field {
    Name,
    Title,
    Aliases,
    Triggers,
    Tags,
    Description,
    WhenToUse,
    ParamNames,
    ParamDescriptions,
}

const FIELDS: usize = 9;

/// One indexed tool: what the decision needs besides its postings.
#[derive(Debug)]
pub(super) struct Entry {
    pub name: String,
    pub owner_only: bool,
    pub chat_types: Vec<super::ChatKind>,
    /// The tool's own plan threshold, if it has one.
    pub plan_threshold: Option<f32>,
    /// Sum of the idf of the tool's distinct name words: how much a message can match its name.
    pub name_mass: f32,
    /// Distinct term ids of the name.
    pub name_terms: Vec<u32>,
}

/// What a message matched in one tool.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Hit {
    pub score: f32,
    /// idf mass of this tool's name words that the message contains.
    pub name_matched: f32,
    /// Configured trigger phrases and aliases of this tool in the message, 0..1: a phrase of two
    /// words or more counts 1, a single word 2/3 ("today" says less than "search for").
    pub phrase: f32,
}

#[derive(Debug)]
pub(super) struct Scored {
    pub doc: u32,
    pub hit: Hit,
}

/// One distinct content word of a message.
#[derive(Debug)]
pub(super) struct QueryTerm {
    pub term: Option<u32>,
    pub prefix: Option<u32>,
    /// idf, lowered for value-like words.
    pub weight: f32,
    /// The same for the prefix match.
    pub prefix_weight: f32,
}

/// The message as the index sees it: its distinct content words.
#[derive(Debug)]
pub(super) struct Query {
    pub terms: Vec<QueryTerm>,
}

#[derive(Debug)]
pub(super) struct Inverted {
    pub entries: Vec<Entry>,
    vocab: HashMap<String, u32>,
    idf: Vec<f32>,
    /// term -> (doc, saturated weighted term frequency)
    postings: Vec<Vec<(u32, f32)>>,
    /// term -> (doc, saturated term frequency in when_not_to_use)
    negative: Vec<Vec<(u32, f32)>>,
    /// Word prefixes: the same over the first `prefix_len` letters of each term.
    prefixes: HashMap<String, u32>,
    prefix_idf: Vec<f32>,
    prefix_postings: Vec<Vec<(u32, f32)>>,
    /// (term, next term) -> docs in which they stand together
    bigrams: HashMap<(u32, u32), Vec<u32>>,
    /// Trigger phrases and aliases as stem sequences (stop words kept), by their first stem.
    phrases: HashMap<String, Vec<(u32, Vec<String>)>>,
    pub max_idf: f32,
}

impl Inverted {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn query(&self, words: &[Word], settings: &DetectorSettings) -> Query {
        let mut terms: Vec<QueryTerm> = Vec::new();
        let mut stems: Vec<&str> = Vec::new();
        for word in words.iter().filter(|w| is_content(w)) {
            let factor = if word.value {
                settings.value_weight
            } else {
                1.0
            };
            if let Some(i) = stems.iter().position(|s| *s == word.stem) {
                // A repeated word counts once, at its strongest.
                let t = &mut terms[i];
                let idf = t.term.map_or(self.max_idf, |t| self.idf[t as usize]);
                if factor == 1.0 && t.weight < idf {
                    t.prefix_weight = t.prefix.map_or(0.0, |p| self.prefix_idf[p as usize])
                        * settings.prefix_weight;
                    t.weight = idf;
                }
                continue;
            }
            stems.push(&word.stem);
            let term = self.vocab.get(&word.stem).copied();
            let prefix =
                prefix(&word.stem, settings.prefix_len).and_then(|p| self.prefixes.get(p).copied());
            let idf = term.map_or(self.max_idf, |t| self.idf[t as usize]);
            let weight = idf * factor;
            let prefix_weight = prefix.map_or(0.0, |p| self.prefix_idf[p as usize])
                * settings.prefix_weight
                * factor;
            terms.push(QueryTerm {
                term,
                prefix,
                weight,
                prefix_weight,
            });
        }
        // Two words a tool writes as one ("look up" and `lookup`, "sign in" and `signin`).
        for pair in words.windows(2) {
            let joined = format!("{}{}", pair[0].raw, pair[1].raw);
            if let Some(&t) = self.vocab.get(&joined)
                && !terms.iter().any(|q| q.term == Some(t))
            {
                terms.push(QueryTerm {
                    term: Some(t),
                    prefix: None,
                    weight: self.idf[t as usize],
                    prefix_weight: 0.0,
                });
            }
        }
        Query { terms }
    }

    /// Scores every tool that shares a term or phrase with the message, best first.
    pub fn score(&self, query: &Query, words: &[Word], settings: &DetectorSettings) -> Vec<Scored> {
        let mut hits: Vec<Hit> = vec![Hit::default(); self.entries.len()];
        let mut seen = vec![false; self.entries.len()];
        // Which query term last matched a doc exactly, so its prefix does not count twice.
        let mut exact: Vec<u32> = vec![u32::MAX; self.entries.len()];
        let mut touched: Vec<u32> = Vec::new();
        for (i, q) in query.terms.iter().enumerate() {
            if let Some(t) = q.term {
                for &(d, sat) in &self.postings[t as usize] {
                    let hit = &mut hits[d as usize];
                    if !seen[d as usize] {
                        seen[d as usize] = true;
                        touched.push(d);
                    }
                    exact[d as usize] = i as u32;
                    hit.score += q.weight * sat;
                    if self.entries[d as usize]
                        .name_terms
                        .binary_search(&t)
                        .is_ok()
                    {
                        hit.name_matched += self.idf[t as usize];
                    }
                }
                for &(d, sat) in &self.negative[t as usize] {
                    hits[d as usize].score -= q.weight * sat;
                }
            }
            if let Some(p) = q.prefix {
                for &(d, sat) in &self.prefix_postings[p as usize] {
                    if exact[d as usize] == i as u32 {
                        continue;
                    }
                    if !seen[d as usize] {
                        seen[d as usize] = true;
                        touched.push(d);
                    }
                    let hit = &mut hits[d as usize];
                    hit.score += q.prefix_weight * sat;
                }
            }
        }
        // Pairs of message words next to each other (stop words skipped).
        let content: Vec<u32> = words
            .iter()
            .filter(|w| is_content(w))
            .filter_map(|w| self.vocab.get(&w.stem).copied())
            .collect();
        for pair in content.windows(2) {
            if let Some(docs) = self.bigrams.get(&(pair[0], pair[1])) {
                let idf = 0.5 * (self.idf[pair[0] as usize] + self.idf[pair[1] as usize]);
                for &d in docs {
                    hits[d as usize].score += settings.bigram_weight * idf;
                }
            }
        }
        // Configured phrases, matched on whole words in order; each counts as one strong word in
        // the ranking (the decision weighs them apart, see `Hit::phrase`).
        let stems: Vec<&str> = words.iter().map(|w| w.stem.as_str()).collect();
        for start in 0..stems.len() {
            let Some(candidates) = self.phrases.get(stems[start]) else {
                continue;
            };
            for (d, phrase) in candidates {
                let end = start + phrase.len();
                if end <= stems.len() && stems[start..end].iter().zip(phrase).all(|(a, b)| *a == b)
                {
                    let d = *d as usize;
                    if !seen[d] {
                        seen[d] = true;
                        touched.push(d as u32);
                    }
                    let weight = ((phrase.len() as f32 + 1.0) / 3.0).min(1.0);
                    let added = (hits[d].phrase + weight).min(1.0) - hits[d].phrase;
                    hits[d].phrase += added;
                    hits[d].score += added * self.max_idf;
                }
            }
        }
        let mut scored: Vec<Scored> = touched
            .into_iter()
            .map(|d| Scored {
                doc: d,
                hit: hits[d as usize],
            })
            .collect();
        scored.sort_by(|a, b| b.hit.score.total_cmp(&a.hit.score).then(a.doc.cmp(&b.doc)));
        scored
    }
}

/// The first `len` characters of a longer stem.
fn prefix(stem: &str, len: usize) -> Option<&str> {
    if len == 0 {
        return None;
    }
    let (cut, _) = stem.char_indices().nth(len)?;
    Some(&stem[..cut])
}
