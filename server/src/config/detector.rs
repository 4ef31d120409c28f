//! `[lane.detector]`: the tool lane's candidate detector. The numbers tune the scoring; the word and phrase lists are
//! language data, so they live in config and only their defaults are here.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// Stemming language; `none` only folds case and accents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    None,
    English,
    French,
    German,
    Spanish,
    Portuguese,
    Italian,
    Dutch,
}

/// How the detector scores and decides. Every key is optional; unknown keys are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectorSettings {
    /// Most candidate tools handed to the planner.
    pub max_candidates: usize,
    /// Confidence (0..1) from which a message is planned; below it the message stays in normal chat.
    pub plan_threshold: f32,
    /// Evidence (see `confidence`) at which the confidence is 0.5. Evidence is the best tool's
    /// score in units of the rarest word's weight, times (1 + the share of its name the message
    /// names) / 2, plus `phrase_evidence` for a trigger phrase or alias: roughly, how many
    /// distinctive words of the message the tool matches strongly.
    pub evidence_half: f32,
    /// Evidence a configured trigger phrase or alias adds on its own.
    pub phrase_evidence: f32,
    /// A catalog smaller than this is weighted as if it had this many tools (see the index).
    pub idf_min_docs: usize,
    /// A candidate whose score is below this share of the best one is not handed on.
    pub candidate_ratio: f32,
    /// BM25 term-frequency saturation.
    pub k1: f32,
    /// BM25 length normalisation (0 none, 1 full).
    pub b: f32,
    /// Field weights of the BM25F score.
    pub weights: FieldWeights,
    /// Extra weight of two message words that also stand next to each other in a tool's text.
    pub bigram_weight: f32,
    /// Weight of message words that look like values (quoted, or capitalised inside a sentence):
    /// names and titles say less about the tool wanted than the words around them.
    pub value_weight: f32,
    /// Words sharing their first `prefix_len` letters also match, at `prefix_weight` ("conversion"
    /// and "convert", "analysis" and "analyze"); 0 turns this off.
    pub prefix_len: usize,
    pub prefix_weight: f32,
    /// Stemming language of tools and messages.
    pub language: Language,
    /// Words that carry no meaning for tool choice.
    pub stopwords: Vec<String>,
    /// Greetings, thanks, acknowledgements, small talk and requests about the conversation itself
    /// ("rewrite this", "continue"): a message made only of these and stop words never plans.
    pub chat_phrases: Vec<String>,
    /// Questions about what was said before: a message with one of these never plans.
    pub memory_phrases: Vec<String>,
    /// Words that point back at something already said ("it", "that one", "what about"): with a
    /// recent tool context they make a follow-up; without one, a vague follow-up stays in chat.
    pub followup_phrases: Vec<String>,
    /// Follow-up cues that ask about the result already shown (answer from context).
    pub followup_answer_phrases: Vec<String>,
    /// Tool contexts older than this do not make follow-ups.
    pub followup_max_age_secs: u64,
    /// A table of static wordpiece vectors (made by `scripts/detector-vectors`, which
    /// `scripts/build` runs): a second, semantic signal for ranking candidates, so that a tool
    /// sharing no word with the message can be offered. Relative to the working directory. Empty,
    /// or a file that cannot be loaded (one warning at start), leaves the detector lexical-only.
    pub vectors: String,
    /// Weight of the cosine of message and tool vectors in the ranking, next to the lexical score
    /// in units of twice the rarest word's weight. The plan decision never reads it.
    pub vector_weight: f32,
}

/// Weight of each tool field in the score; `when_not_to_use` subtracts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FieldWeights {
    pub name: f32,
    pub title: f32,
    pub aliases: f32,
    pub triggers: f32,
    pub tags: f32,
    pub description: f32,
    pub when_to_use: f32,
    pub param_names: f32,
    pub param_descriptions: f32,
    pub when_not_to_use: f32,
}

impl Default for FieldWeights {
    fn default() -> Self {
        Self {
            name: 3.0,
            title: 2.0,
            aliases: 2.5,
            triggers: 2.5,
            tags: 1.0,
            description: 1.0,
            when_to_use: 0.8,
            param_names: 0.6,
            param_descriptions: 0.4,
            when_not_to_use: 1.0,
        }
    }
}

/// The shipped defaults. The word and phrase lists are read from them (they are language data,
/// not code); the numbers are repeated in [`DetectorSettings::default`] and a test keeps both
/// equal.
pub const SHIPPED_DEFAULTS: &str = include_str!("detector_defaults.toml");

#[derive(Deserialize)]
struct Lists {
    stopwords: Vec<String>,
    chat_phrases: Vec<String>,
    memory_phrases: Vec<String>,
    followup_phrases: Vec<String>,
    followup_answer_phrases: Vec<String>,
}

static LISTS: LazyLock<Lists> = LazyLock::new(|| {
    // Compiled in, and parsed by a test: this cannot fail at run time.
    toml::from_str(SHIPPED_DEFAULTS).expect("defaults.toml holds the detector's lists")
});

impl Default for DetectorSettings {
    fn default() -> Self {
        Self {
            max_candidates: 8,
            plan_threshold: 0.5,
            evidence_half: 2.2,
            phrase_evidence: 2.5,
            idf_min_docs: 50,
            candidate_ratio: 0.25,
            k1: 1.2,
            b: 0.75,
            weights: FieldWeights::default(),
            bigram_weight: 0.5,
            value_weight: 0.5,
            prefix_len: 5,
            prefix_weight: 0.5,
            language: Language::English,
            stopwords: LISTS.stopwords.clone(),
            chat_phrases: LISTS.chat_phrases.clone(),
            memory_phrases: LISTS.memory_phrases.clone(),
            followup_phrases: LISTS.followup_phrases.clone(),
            followup_answer_phrases: LISTS.followup_answer_phrases.clone(),
            followup_max_age_secs: 1800,
            vectors: "data/detector/word-vectors.bin".to_owned(),
            vector_weight: 0.5,
        }
    }
}
