//! The lane's candidate detector (seed 000 §5.1): a cheap, local check, with no model call,
//! of whether a message is worth tool planning, and which tools the planner should see.
//!
//! It knows no tool by name. It indexes whatever tools it is given ([`ToolDoc`]: built-in,
//! connector or MCP, built from the live catalog by the caller and rebuilt on reload) and scores a
//! message against their names, titles, descriptions, guidance, aliases, triggers, tags and
//! parameters. It is conservative: conversation about the conversation (greetings, thanks, memory
//! questions, rewrites) never plans, and below the configured confidence a message stays in normal
//! chat. Vague follow-ups ("what about it?") count only when a recent tool context exists.
//!
//! With a word-vector table ([`WordVectors`], `[lane.detector] vectors`), candidates are ranked
//! by meaning too, so a tool that shares no word with the message can be offered; whether the
//! message plans stays the lexical decision.

mod detection;
mod doc;
mod index;
mod phrases;
mod text;
mod vectors;

pub use detection::{Candidate, Detection, FollowupHint, FollowupKind, ReasonCode};
pub use doc::{Role, ChatKind, ParamDoc, RecentContext, ToolDoc};
pub use crate::config::{DetectorSettings, FieldWeights, detector::SHIPPED_DEFAULTS};
pub use text::Language;
pub use vectors::{VectorsError, WordVectors};

use std::sync::Arc;

use index::Inverted;
use phrases::{Phrases, names_entity};
use text::{Analyzer, Word};
use vectors::ToolVectors;

/// The tools an actor may be offered, indexed. Build a new one when the catalog changes (reload,
/// MCP discovery) and swap it in; detection only reads.
#[derive(Debug)]
pub struct Index {
    settings: DetectorSettings,
    analyzer: Analyzer,
    inverted: Inverted,
    chat: Phrases,
    memory: Phrases,
    followup: Phrases,
    followup_answer: Phrases,
    /// The optional second signal: each tool's word vector.
    semantic: Option<ToolVectors>,
}

impl Index {
    /// Builds the index with the word vectors of `settings.vectors`, loaded once per process
    /// and shared by every index (see [`WordVectors::shared`]); none when the path is empty or the
    /// file cannot be loaded.
    pub fn build(docs: Vec<ToolDoc>, settings: DetectorSettings) -> Self {
        let vectors = WordVectors::shared(&settings.vectors);
        Self::build_with(docs, settings, vectors)
    }

    /// [`Index::build`] with the given word vectors (or none: lexical only).
    pub fn build_with(docs: Vec<ToolDoc>, settings: DetectorSettings, vectors: Option<Arc<WordVectors>>) -> Self {
        let analyzer = Analyzer::new(settings.language, &settings.stopwords);
        let docs: Vec<ToolDoc> = docs.into_iter().filter(|d| d.enabled).collect();
        let semantic = vectors.map(|vectors| {
            let texts: Vec<String> = docs.iter().map(|d| format!("{}: {}", text::split_words(&d.name).join(" "), d.description)).collect();
            ToolVectors::build(vectors, &texts, |piece| analyzer.is_stopword(piece))
        });
        let inverted = Inverted::build(docs, &analyzer, &settings);
        let chat = Phrases::new(&settings.chat_phrases);
        let memory = Phrases::new(&settings.memory_phrases);
        let followup = Phrases::new(&settings.followup_phrases);
        let followup_answer = Phrases::new(&settings.followup_answer_phrases);
        Self {
            settings,
            analyzer,
            inverted,
            chat,
            memory,
            followup,
            followup_answer,
            semantic,
        }
    }

    /// Whether the word vectors take part in the ranking.
    pub fn has_vectors(&self) -> bool {
        self.semantic.is_some()
    }

    /// How many tools are indexed.
    pub fn len(&self) -> usize {
        self.inverted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn settings(&self) -> &DetectorSettings {
        &self.settings
    }

    /// Decides whether `message` is worth planning, for `actor` in a `chat`, given the chat's
    /// recent tool contexts (newest first).
    ///
    /// In order: a memory question stays in chat; a follow-up cue ("what about", "open it",
    /// "summarize that") or a named entity of a recent context makes a follow-up of it; a message
    /// of greetings, thanks or requests about the conversation stays in chat; otherwise the index
    /// decides, and a vague follow-up with no recent context stays in chat.
    pub fn detect(
        &self,
        message: &str,
        actor: Role,
        chat: ChatKind,
        recent: &[RecentContext],
    ) -> Detection {
        let words = self.analyzer.words(message);
        if words.is_empty() {
            return Detection::stay(ReasonCode::EmptyMessage);
        }
        let raw: Vec<&str> = words.iter().map(|w| w.raw.as_str()).collect();
        if self.memory.any_in(&raw) {
            return Detection::stay(ReasonCode::MemoryQuestion);
        }
        let chat_words = (0..words.len())
            .filter(|&i| self.chat.covers(&raw, i))
            .count();
        let conversational = chat_words > 0
            && words
                .iter()
                .enumerate()
                .all(|(i, w)| w.stop || self.chat.covers(&raw, i));
        let cue = self.followup.any_in(&raw);
        let answer_cue = self.followup_answer.any_in(&raw);
        let indexed = self.index_decision(message, &words, actor, chat);

        let fresh: Vec<usize> = (0..recent.len())
            .filter(|&i| recent[i].age_secs <= self.settings.followup_max_age_secs)
            .collect();
        if !fresh.is_empty() {
            let named: Vec<usize> = fresh
                .iter()
                .copied()
                .filter(|&i| names_entity(&raw, &recent[i]))
                .collect();
            if answer_cue || (cue && !conversational) || !named.is_empty() {
                return self.followup(recent, &fresh, &named, answer_cue, indexed, actor, chat);
            }
        }
        if conversational {
            return Detection::stay(ReasonCode::Conversational);
        }
        if !indexed.should_plan && cue && fresh.is_empty() {
            return Detection {
                reason: ReasonCode::FollowupWithoutContext,
                ..indexed
            };
        }
        indexed
    }

    /// [`Index::detect`], and with `asked`, the tools of a clarifying question the message
    /// answers, as that answer: what the lane, an eval replay and
    /// `gatehouse lane detect` each decide for a message.
    pub fn detect_answering(&self, message: &str, actor: Role, chat: ChatKind, recent: &[RecentContext], asked: Option<&[String]>) -> Detection {
        let detection = self.detect(message, actor, chat, recent);
        match asked {
            Some(asked) => self.answering(message, detection, asked, actor, chat),
            None => detection,
        }
    }

    /// `detection` of a `message` that answers a clarifying question about the `asked` tools:
    /// planned whatever it says ("yes", "Porto"), with the asked tools the actor may still use
    /// first, then the message's own candidates, at most `max_candidates` beyond the asked.
    /// An empty message, a question about what was said before (normal chat memory answers
    /// it), or a question none of whose tools the actor may use any more leaves the detection
    /// as it is.
    fn answering(&self, message: &str, detection: Detection, asked: &[String], actor: Role, chat: ChatKind) -> Detection {
        if message.trim().is_empty() || detection.reason == ReasonCode::MemoryQuestion {
            return detection;
        }
        let mut candidates: Vec<Candidate> = asked
            .iter()
            .filter(|name| self.visible_name(name, actor, chat))
            .map(|name| Candidate { name: name.clone(), score: detection.candidates.iter().find(|c| &c.name == name).map_or(0.0, |c| c.score) })
            .collect();
        if candidates.is_empty() {
            return detection;
        }
        let most = candidates.len() + self.settings.max_candidates;
        for candidate in detection.candidates {
            if candidates.len() < most && !candidates.iter().any(|c| c.name == candidate.name) {
                candidates.push(candidate);
            }
        }
        Detection { should_plan: true, candidates, reason: ReasonCode::ClarificationAnswer, confidence: detection.confidence, followup: detection.followup }
    }

    /// The tools that best match `query` for `actor` in a `chat`, best first, at most `limit`,
    /// whatever the confidence: the planner's tool search (seed 003 WS-5).
    pub fn search(&self, query: &str, actor: Role, chat: ChatKind, limit: usize) -> Vec<Candidate> {
        let words = self.analyzer.words(query);
        if words.is_empty() {
            return Vec::new();
        }
        let query = self.inverted.query(&words, &self.settings);
        self.inverted
            .score(&query, &words, &self.settings)
            .into_iter()
            .filter(|s| s.hit.score > 0.0 && self.visible(s.doc as usize, actor, chat))
            .take(limit)
            .map(|s| Candidate { name: self.inverted.entries[s.doc as usize].name.clone(), score: s.hit.score })
            .collect()
    }

    fn visible(&self, doc: usize, actor: Role, chat: ChatKind) -> bool {
        let entry = &self.inverted.entries[doc];
        // An owner-only tool: an owner's, in a direct chat (in a group everyone reads it).
        (!entry.owner_only || (actor == Role::Owner && chat == ChatKind::Direct))
            && (entry.chat_types.is_empty() || entry.chat_types.contains(&chat))
    }

    fn visible_name(&self, name: &str, actor: Role, chat: ChatKind) -> bool {
        self.inverted
            .entries
            .iter()
            .position(|e| e.name == name)
            .is_some_and(|d| self.visible(d, actor, chat))
    }

    /// The decision from the index: candidates ranked by the lexical score, or with word vectors
    /// by `score / max_idf / 2 + vector_weight × cosine` over every visible tool (so a tool with
    /// no word in common can enter). Confidence, plan and reason are those of the lexical evidence
    /// for the top-ranked tool: the vectors reorder candidates, they never plan on their own.
    fn index_decision(&self, message: &str, words: &[Word], actor: Role, chat: ChatKind) -> Detection {
        let query = self.inverted.query(words, &self.settings);
        let all: Vec<index::Scored> = self.inverted.score(&query, words, &self.settings);
        let any_hit = all.iter().any(|s| s.hit.score > 0.0 && self.visible(s.doc as usize, actor, chat));
        let query_vector = self.semantic.as_ref().and_then(|semantic| Some((semantic, semantic.embed(message)?)));
        // (ranking score, lexical score) of each candidate tool, best first.
        let ranked: Vec<(f32, index::Scored)> = match query_vector {
            Some((semantic, vector)) => {
                let mut hits = vec![index::Hit::default(); self.inverted.len()];
                for s in &all {
                    hits[s.doc as usize] = s.hit;
                }
                let unit = 2.0 * self.inverted.max_idf.max(f32::EPSILON);
                let mut ranked: Vec<(f32, index::Scored)> = (0..self.inverted.len())
                    .filter(|&d| self.visible(d, actor, chat))
                    .map(|d| (hits[d].score / unit + self.settings.vector_weight * semantic.cosine(&vector, d), index::Scored { doc: d as u32, hit: hits[d] }))
                    .collect();
                // Only the first max_candidates are handed on: select them, then sort those.
                let order = |a: &(f32, index::Scored), b: &(f32, index::Scored)| b.0.total_cmp(&a.0).then(a.1.doc.cmp(&b.1.doc));
                let keep = self.settings.max_candidates.max(1);
                if ranked.len() > keep {
                    ranked.select_nth_unstable_by(keep - 1, order);
                    ranked.truncate(keep);
                }
                ranked.sort_by(order);
                ranked
            }
            None => all.into_iter().filter(|s| s.hit.score > 0.0 && self.visible(s.doc as usize, actor, chat)).map(|s| (s.hit.score, s)).collect(),
        };
        let Some((best_score, best)) = ranked.first() else {
            return Detection::stay(ReasonCode::NoCandidate);
        };
        // The plan decision reads the lexical evidence for the top-ranked tool only.
        let confidence = if any_hit { self.confidence(best) } else { 0.0 };
        let threshold = self.inverted.entries[best.doc as usize].plan_threshold.unwrap_or(self.settings.plan_threshold);
        let should_plan = any_hit && confidence >= threshold;
        let floor = if *best_score > 0.0 { best_score * self.settings.candidate_ratio } else { f32::NEG_INFINITY };
        let candidates: Vec<Candidate> = ranked
            .iter()
            .take(self.settings.max_candidates)
            .filter(|(score, _)| *score >= floor)
            .map(|(score, s)| Candidate {
                name: self.inverted.entries[s.doc as usize].name.clone(),
                score: *score,
            })
            .collect();
        Detection {
            should_plan,
            candidates,
            reason: if should_plan {
                ReasonCode::CandidatesFound
            } else if any_hit {
                ReasonCode::BelowThreshold
            } else {
                ReasonCode::NoCandidate
            },
            confidence,
            followup: None,
        }
    }

    /// 0..1 from the evidence for the best tool: its score in units of the rarest word's weight
    /// (a trigger phrase or alias counts `phrase_evidence` whole), weighed by how much of the
    /// tool's name the message names. `evidence_half` evidence gives 0.5.
    fn confidence(&self, best: &index::Scored) -> f32 {
        let entry = &self.inverted.entries[best.doc as usize];
        let max_idf = self.inverted.max_idf;
        let terms = (best.hit.score / max_idf - best.hit.phrase).max(0.0);
        let name = if entry.name_mass > 0.0 {
            (best.hit.name_matched / entry.name_mass).min(1.0)
        } else {
            0.0
        };
        let evidence = terms * (0.5 + 0.5 * name) + best.hit.phrase * self.settings.phrase_evidence;
        evidence / (evidence + self.settings.evidence_half.max(f32::EPSILON))
    }

    /// A follow-up of one of the `fresh` recent contexts: the one whose entities the message
    /// names, else the newest when all are of one tool; when unclear, the planner should ask.
    #[expect(
        clippy::too_many_arguments,
        reason = "the follow-up rule reads every signal of the message"
    )]
    fn followup(
        &self,
        recent: &[RecentContext],
        fresh: &[usize],
        named: &[usize],
        answer_cue: bool,
        indexed: Detection,
        actor: Role,
        chat: ChatKind,
    ) -> Detection {
        let context = match named {
            [one] => Some(*one),
            [] if fresh
                .iter()
                .all(|&i| recent[i].tool == recent[fresh[0]].tool) =>
            {
                Some(fresh[0])
            }
            _ => None,
        };
        let kind = match context {
            None => FollowupKind::Clarify,
            Some(_) if answer_cue => FollowupKind::AnswerFromContext,
            Some(i)
                if indexed
                    .candidates
                    .first()
                    .is_some_and(|c| c.name != recent[i].tool) =>
            {
                FollowupKind::NewTool
            }
            Some(_) => FollowupKind::SameTool,
        };
        let mut candidates = Vec::new();
        let context_tools = context.map_or_else(|| fresh.to_vec(), |i| vec![i]);
        for i in context_tools {
            let tool = &recent[i].tool;
            if self.visible_name(tool, actor, chat)
                && !candidates.iter().any(|c: &Candidate| &c.name == tool)
            {
                candidates.push(Candidate {
                    name: tool.clone(),
                    score: 0.0,
                });
            }
        }
        for c in indexed.candidates {
            if !candidates.iter().any(|x| x.name == c.name) {
                candidates.push(c);
            }
        }
        candidates.truncate(self.settings.max_candidates);
        Detection {
            should_plan: true,
            candidates,
            reason: ReasonCode::FollowupContext,
            confidence: indexed.confidence.max(self.settings.plan_threshold),
            followup: Some(FollowupHint {
                possible: true,
                context_index: context,
                context_id: context.and_then(|i| recent[i].id.clone()),
                kind,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
