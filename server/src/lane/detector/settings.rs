//! `[lane.detector]` settings. The numbers tune the scoring; the word and phrase lists are
//! language data, so they live in config and only their defaults are here.

use serde::Deserialize;

use super::text::Language;

/// How the detector scores and decides. Every key is optional; unknown keys are an error.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
}

/// Weight of each tool field in the score; `when_not_to_use` subtracts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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

fn list(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

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
            stopwords: list(DEFAULT_STOPWORDS),
            chat_phrases: list(DEFAULT_CHAT_PHRASES),
            memory_phrases: list(DEFAULT_MEMORY_PHRASES),
            followup_phrases: list(DEFAULT_FOLLOWUP_PHRASES),
            followup_answer_phrases: list(DEFAULT_FOLLOWUP_ANSWER_PHRASES),
            followup_max_age_secs: 1800,
        }
    }
}

const DEFAULT_STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as",
    "at", "be", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "done", "down", "during", "each", "else", "etc", "even", "ever",
    "every", "few", "for", "from", "further", "get", "gets", "getting", "give", "given", "gives",
    "go", "going", "got", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his",
    "how", "i", "id", "if", "im", "in", "into", "is", "it", "its", "ive", "just", "kindly", "let",
    "lets", "like", "ll", "may", "me", "might", "mine", "more", "most", "much", "must", "my",
    "myself", "need", "needs", "no", "nor", "not", "now", "of", "off", "on", "once", "one", "only",
    "or", "other", "our", "ours", "out", "over", "own", "please", "pls", "quite", "rather", "really",
    "same", "shall", "she", "should", "so", "some", "such", "tell", "than", "that", "thats", "the",
    "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to",
    "too", "under", "until", "up", "upon", "us", "use", "used", "using", "ve", "very", "via", "want",
    "wanna", "was", "we", "were", "what", "whats", "when", "where", "which", "while", "who", "whom",
    "whose", "why", "will", "with", "within", "would", "yes", "yet", "you", "your", "yours",
    "yourself", "hi", "hello", "hey", "thanks", "thank", "ok", "okay",
];

const DEFAULT_CHAT_PHRASES: &[&str] = &[
    "hi", "hello", "hey", "hiya", "yo", "good morning", "good afternoon", "good evening",
    "good night", "morning", "evening", "greetings", "thanks", "thank you", "thank u", "thx", "ty",
    "cheers", "much appreciated", "appreciate it", "ok", "okay", "okey", "k", "kk", "alright",
    "all right", "sure", "fine", "cool", "great", "nice", "perfect", "awesome", "got it",
    "understood", "noted", "sounds good", "yes", "yeah", "yep", "no", "nope", "nah", "lol", "haha",
    "bye", "goodbye", "see you", "see ya", "take care", "how are you", "how are you doing",
    "hows it going", "how is it going", "whats up", "sup", "how have you been", "nice to meet you",
    "who are you", "what are you", "what can you do", "continue", "go on", "keep going", "carry on",
    "more", "tell me more", "rewrite", "rephrase", "reword", "paraphrase", "shorten", "make it shorter",
    "make it longer", "explain", "clarify", "elaborate", "simplify", "summarize", "summarise",
    "translate", "proofread", "correct", "fix", "improve", "polish", "expand", "again", "repeat",
    "sorry", "my bad", "never mind", "nevermind", "wait", "hmm", "hm", "oh", "ah", "wow", "please",
];

const DEFAULT_MEMORY_PHRASES: &[&str] = &[
    "do you remember", "you remember", "remember when", "remember what", "remember my",
    "what did i tell you", "what did i say", "what did i just say", "did i tell you",
    "did i mention", "what did i ask", "what was i saying", "what were we talking about",
    "what did we talk about", "what did we discuss", "as i said", "as i told you", "i told you",
    "you told me", "you said", "what did you say", "earlier in this chat", "earlier in our chat",
    "in our conversation", "our last conversation", "last time we talked", "do you recall",
    "can you recall", "what do you know about me", "my name",
];

const DEFAULT_FOLLOWUP_PHRASES: &[&str] = &[
    "what about", "how about", "and what about", "and for", "and in", "and on", "same for",
    "same thing for", "the same for", "instead", "it", "that", "this", "those", "these", "them",
    "that one", "this one", "the first one", "the second one", "the third one", "the last one",
    "the other one", "the first", "the second", "the third", "the last", "the link", "that link",
    "that page", "the page", "that result", "the results", "open it", "compare", "compare them",
    "compare those", "is that still true", "there", "again", "more details", "more about",
];

const DEFAULT_FOLLOWUP_ANSWER_PHRASES: &[&str] = &[
    "summarize", "summarise", "summary", "explain", "compare", "tell me more", "more details",
    "is that still true", "which one", "which is", "what does it say", "what did it say",
];

