//! Normal chat with memory: the person's turn, the chat's history within its token budget
//! (compacted by the compaction model when it outgrows it), the chat model's answer.

use std::time::Instant;

use serde_json::json;

use super::{
    Inbound, Runtime, RuntimeError, memory,
    speakers::{self, Speakers},
};
use crate::{
    db::{self, conversation as store},
    domain::ChatKind,
    llm::{ChatRequest, ErrorCode, LlmError, Purpose},
    traces::Recorder,
};


/// The person's turn of `inbound` as memory stores it: its text, counted as the model reads it
/// (`current`, under its sender's `label` in a group).
fn person_turn<'a>(inbound: &'a Inbound, label: Option<&'a str>, current: &str, at: i64) -> store::NewTurn<'a> {
    store::NewTurn {
        chat_id: &inbound.chat_id,
        channel: &inbound.channel,
        role: store::role::USER,
        text: &inbound.text,
        message_id: &inbound.message_id,
        at,
        tokens: memory::estimate_tokens(current),
        sender: label.map(|_| inbound.sender.as_str()),
        sender_label: label,
        origin: None,
    }
}
impl Runtime {
    /// In a group, how its members' words read to the model, and the label this message's
    /// sender's turn is stored under (fixed then for every later read). `(None, None)` in a
    /// direct chat.
    async fn speaker(&self, conn: &mut sqlx::AnyConnection, inbound: &Inbound) -> Result<(Option<Speakers>, Option<String>), RuntimeError> {
        let conv = &self.settings.conversation;
        let speakers = if inbound.chat_kind == ChatKind::Group { Speakers::new(&conv.group_turn_format) } else { None };
        if speakers.is_none() {
            return Ok((None, None));
        }
        let owners = db::owners::list(&mut *conn).await?;
        let label = match db::owners::owner_by_phone(&mut *conn, &inbound.sender).await?.and_then(|id| owners.iter().find(|o| o.id == id)) {
            Some(owner) => speakers::owner_label(&conv.group_owner_label, &owner.display_name),
            None => {
                let names: Vec<String> = owners.into_iter().map(|o| o.display_name).collect();
                let reserved = speakers::Reserved { words: &conv.reserved_member_names, names: &names };
                speakers::label_for(&store::members(&mut *conn, &inbound.chat_id).await?, &inbound.sender, inbound.sender_name.as_deref(), &conv.group_unnamed_member, reserved)
            }
        };
        Ok((speakers, Some(label)))
    }

    /// Keeps an exchange the tool lane answered in the chat's memory, as normal chat keeps its
    /// own: the person's words and the reply they were sent (a tool's summarised answer, the
    /// note that it will follow, a question back), never a tool's prompt or its raw result
    /// (seed §15's compact memory marker). Normal chat and the planner so read the conversation
    /// as the person had it ("say that again", "thanks, and for the other order?"). The reply is
    /// kept as the lane's ([`store::origin::TOOL_LANE`]): made from tool results, a model reads
    /// it again as data. A reply with a private-data tool's answer (`private`) is kept as
    /// `lane.private_answer_memory` instead, as the tool's context is never kept. A message
    /// handled again keeps its person's turn and the reply it got this time. A failed write is
    /// logged: the reply still goes out, and only memory lacks it.
    pub(super) async fn remember_lane_exchange(&self, inbound: &Inbound, reply: &str, private: bool) {
        let reply = db::clean_text(if private { self.settings.lane.private_answer_memory.trim() } else { reply.trim() });
        if reply.is_empty() {
            return;
        }
        let remembered = async {
            let mut conn = self.db.pool.acquire().await?;
            let (speakers, label) = self.speaker(&mut conn, inbound).await?;
            drop(conn);
            let current = speakers.as_ref().map_or_else(|| inbound.text.clone(), |s| s.say(label.as_deref(), &inbound.text));
            let user_turn = person_turn(inbound, label.as_deref(), &current, db::now_ms());
            let answer = store::NewTurn { role: store::role::ASSISTANT, text: &reply, tokens: memory::estimate_tokens(&reply), sender: None, sender_label: None, origin: Some(store::origin::TOOL_LANE), ..user_turn.clone() };
            let mut tx = self.db.begin_write().await?;
            store::insert_turn(&mut tx, &user_turn).await?;
            store::upsert_answer(&mut tx, &answer).await?;
            tx.commit().await?;
            Ok::<(), RuntimeError>(())
        };
        if let Err(e) = remembered.await {
            tracing::warn!(correlation_id = %inbound.correlation_id, error = %e, "keeping the tool lane's exchange in the chat's memory failed");
        }
    }

    /// Normal chat: the person's turn is stored, history is assembled within the budget
    /// (compacting older turns when needed), the chat model answers, the answer is stored.
    /// The inner error is the LLM error code (the caller sends the fallback reply).
    pub(super) async fn chat(&self, inbound: &Inbound, trace: &mut Recorder) -> Result<Result<String, String>, RuntimeError> {
        let conv = &self.settings.conversation;
        let now = db::now_ms();
        let mut conn = self.db.pool.acquire().await?;
        // An earlier run of this message stored its answer but stopped before recording the
        // reply (a crash, a failed write): the same answer again, not a second model call whose
        // text would differ from the one memory keeps.
        if let Some(reply) = store::answer_to(&mut conn, &inbound.chat_id, &inbound.message_id).await? {
            trace.step("llm", "reused", "EARLIER_ANSWER", json!({ "purpose": "chat" }));
            return Ok(Ok(reply));
        }
        let quoted = match (&inbound.quoted_text, &inbound.quoted_id) {
            (Some(text), _) => Some(text.clone()),
            (None, Some(id)) => store::text_of(&mut conn, &inbound.chat_id, id).await?,
            (None, None) => None,
        };
        let summary = store::summary(&mut conn, &inbound.chat_id).await?;
        let mut history: Vec<store::Turn> = store::turns_after(&mut conn, &inbound.chat_id, summary.as_ref().map_or(0, |s| s.covers_through)).await?;
        // An earlier run of this message stored the person's turn and stopped before the answer
        // (a crash, a failed call). Left where it is, a compaction now (of the turns that came
        // meanwhile, which this run reads without it) would cover it without having read it:
        // it is stored again below, after them.
        if history.iter().any(|t| t.message_id == inbound.message_id) {
            drop(conn);
            let mut tx = self.db.begin_write().await?;
            store::forget_unanswered_turn(&mut tx, &inbound.chat_id, &inbound.message_id).await?;
            tx.commit().await?;
            conn = self.db.pool.acquire().await?;
            history.retain(|t| t.message_id != inbound.message_id);
        }
        let (speakers, label) = self.speaker(&mut conn, inbound).await?;
        drop(conn);
        let current = speakers.as_ref().map_or_else(|| inbound.text.clone(), |s| s.say(label.as_deref(), &inbound.text));
        let current_tokens = memory::estimate_tokens(&current) + quoted.as_deref().map_or(0, memory::estimate_tokens);
        let budget = i64::from(conv.history_token_budget);
        let keep_recent = usize::try_from(conv.keep_recent_turns).unwrap_or(usize::MAX);
        let (summary, turns) = match memory::plan(summary.as_ref(), &history, current_tokens, budget, keep_recent) {
            memory::Plan::Fits => {
                trace.step("memory", "fits", "WITHIN_BUDGET", json!({ "turns": history.len(), "summary": summary.is_some() }));
                (summary, history)
            }
            memory::Plan::Compact { older, keep } => {
                let compacted = within(inbound.deadline, memory::summarize(self.model.as_ref(), &self.settings.models, &conv.compaction_prompt, summary.as_ref(), &older, speakers.as_ref(), &inbound.correlation_id)).await;
                // A summary the model did not finish (cut at its token limit, refused, filtered)
                // would stand for good for the turns it replaces: the oldest turns are left out
                // instead, and the next message tries again.
                let stop_reason = compacted.as_ref().ok().map(|res| res.stop_reason.as_str().to_string());
                let summarized = compacted.map_err(|e| e.code.as_str().to_string()).and_then(|res| {
                    let text = res.text().trim().to_string();
                    if text.is_empty() {
                        Err("LLM_EMPTY_SUMMARY".to_string())
                    } else if !res.stop_reason.is_finished() {
                        Err("LLM_SUMMARY_UNFINISHED".to_string())
                    } else {
                        Ok((res, text))
                    }
                });
                match summarized {
                    Ok((res, text)) => {
                        let new = store::Summary { text, covers_through: older.last().map_or(0, |t| t.id) };
                        let mut tx = self.db.begin_write().await?;
                        // Another message of this chat compacted meanwhile: its summary stays, and
                        // this one serves this answer only.
                        let saved = store::save_summary(&mut tx, &inbound.chat_id, &new, summary.as_ref().map_or(0, |s| s.covers_through), now).await?;
                        tx.commit().await?;
                        trace.step(
                            "memory",
                            "compacted",
                            "OVER_BUDGET",
                            json!({
                                "summarized_turns": older.len(), "kept_turns": keep.len(), "saved": saved, "purpose": "compaction", "model": res.model,
                                "input_tokens": res.usage.input_tokens, "output_tokens": res.usage.output_tokens,
                                "latency_ms": u64::try_from(res.latency.as_millis()).unwrap_or(u64::MAX),
                            }),
                        );
                        (Some(new), keep)
                    }
                    Err(code) => {
                        tracing::warn!(correlation_id = %inbound.correlation_id, code = %code, "compacting chat memory failed; leaving out the oldest turns instead");
                        let mut all = older;
                        all.extend(keep);
                        let kept = memory::truncate(summary.as_ref(), all, current_tokens, budget, keep_recent);
                        trace.step("memory", "truncated", &code, json!({ "kept_turns": kept.len(), "stop_reason": stop_reason }));
                        (summary, kept)
                    }
                }
            }
        };
        let messages = memory::messages(summary.as_ref(), &turns, &current, quoted.as_deref(), speakers.as_ref());
        let mut req = ChatRequest::new(&self.settings.models, Purpose::Chat, inbound.correlation_id.clone(), messages);
        // The configured prompt, with the date and time where the business is.
        req = req.with_system(crate::untrusted::with_facts(&conv.system_prompt, &json!({ "now": super::clock::facts(&conv.timezone) })));
        // The person's turn is stored before the call, so it stays in memory even if the call fails.
        let mut tx = self.db.begin_write().await?;
        let user_turn = person_turn(inbound, label.as_deref(), &current, now);
        store::insert_turn(&mut tx, &user_turn).await?;
        tx.commit().await?;
        let started = Instant::now();
        match within(inbound.deadline, self.model.chat(&req)).await {
            Ok(res) => {
                // A NUL would fail the PostgreSQL insert after the model was paid for: removed here.
                let reply = db::clean_text(res.text().trim());
                trace.step(
                    "llm",
                    "answered",
                    res.stop_reason.as_str(),
                    json!({
                        "purpose": "chat", "model": res.model, "input_tokens": res.usage.input_tokens, "output_tokens": res.usage.output_tokens,
                        "latency_ms": started.elapsed().as_millis() as u64, "attempts": res.attempts,
                    }),
                );
                if reply.is_empty() {
                    return Ok(Err("LLM_EMPTY_REPLY".into()));
                }
                let mut tx = self.db.begin_write().await?;
                let turn = store::NewTurn { role: store::role::ASSISTANT, text: &reply, tokens: memory::estimate_tokens(&reply), at: db::now_ms(), sender: None, sender_label: None, ..user_turn };
                if store::insert_turn(&mut tx, &turn).await? {
                    tx.commit().await?;
                    return Ok(Ok(reply));
                }
                // Another run of this message (a job rescued while this one stalled) stored its
                // answer first: that one is what memory keeps, so it is the one to send.
                let kept = store::answer_to(&mut tx, &inbound.chat_id, &inbound.message_id).await?;
                tx.commit().await?;
                Ok(Ok(kept.unwrap_or(reply)))
            }
            Err(e) => {
                trace.step("llm", "failed", e.code.as_str(), json!({ "purpose": "chat", "model": req.model, "attempts": e.attempts }));
                Ok(Err(e.code.as_str().to_string()))
            }
        }
    }
}

/// A model call within the channel's deadline: past it the call is given up as `LLM_TIMEOUT`,
/// so the fallback reply can still be sent in time.
async fn within<T>(deadline: Option<tokio::time::Instant>, call: impl std::future::Future<Output = Result<T, LlmError>>) -> Result<T, LlmError> {
    let Some(deadline) = deadline else { return call.await };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(LlmError::new(ErrorCode::Timeout, "no answer before the message's deadline", false)),
    }
}
