//! What the detector answers, serialisable for traces and `gatehouse lane detect`.

use serde::Serialize;

/// Why the detector decided as it did; stable strings for traces and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReasonCode {
    /// Nothing to score: empty, or only stop words.
    EmptyMessage,
    /// Greetings, thanks, acknowledgements, small talk or a request about the conversation itself.
    Conversational,
    /// A question about what was said before: normal chat memory answers it.
    MemoryQuestion,
    /// No tool the caller may use shares anything with the message (with word vectors, the
    /// candidates are then the tools nearest in meaning, and nothing plans).
    NoCandidate,
    /// Candidates exist but the confidence is below the threshold.
    BelowThreshold,
    /// A vague follow-up without any recent tool context.
    FollowupWithoutContext,
    /// A follow-up of a recent tool context.
    FollowupContext,
    /// Candidates above the threshold.
    CandidatesFound,
    /// The answer to a clarifying question the lane asked: planned with the question's tools.
    ClarificationAnswer,
}

impl ReasonCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EmptyMessage => "EMPTY_MESSAGE",
            Self::Conversational => "CONVERSATIONAL",
            Self::MemoryQuestion => "MEMORY_QUESTION",
            Self::NoCandidate => "NO_CANDIDATE",
            Self::BelowThreshold => "BELOW_THRESHOLD",
            Self::FollowupWithoutContext => "FOLLOWUP_WITHOUT_CONTEXT",
            Self::FollowupContext => "FOLLOWUP_CONTEXT",
            Self::CandidatesFound => "CANDIDATES_FOUND",
            Self::ClarificationAnswer => "CLARIFICATION_ANSWER",
        }
    }
}

/// What a follow-up most likely asks for (seed 000 §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowupKind {
    AnswerFromContext,
    SameTool,
    NewTool,
    Clarify,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FollowupHint {
    pub possible: bool,
    /// Index into the `recent` slice given to [`Index::detect`]; none when it is unclear which.
    pub context_index: Option<usize>,
    pub context_id: Option<String>,
    pub kind: FollowupKind,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub name: String,
    /// The ranking score: the lexical score, or with word vectors the lexical score in units of
    /// twice the rarest word's weight plus `vector_weight` × the cosine.
    pub score: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    pub should_plan: bool,
    /// Best first; at most `max_candidates`. Also filled below the threshold, for traces.
    pub candidates: Vec<Candidate>,
    pub reason: ReasonCode,
    /// 0..1; the message is planned from `plan_threshold` on.
    pub confidence: f32,
    pub followup: Option<FollowupHint>,
}

impl Detection {
    pub(super) fn stay(reason: ReasonCode) -> Self {
        Self {
            should_plan: false,
            candidates: Vec::new(),
            reason,
            confidence: 0.0,
            followup: None,
        }
    }
}
