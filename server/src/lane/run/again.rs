//! A message handled again (its first run stopped before its reply was recorded: a crash, a
//! full disk) that stored a call which changes something, or asked an owner, is answered from
//! what it stored instead of being planned again: a planner asked again may propose other
//! arguments, and the change would be made, or an owner asked, a second time.

use serde_json::json;

use super::Lane;
use crate::{
    channel::Inbound,
    conversation::LaneOutcome,
    db::{self, DbError, approvals::State},
    jobs::JobKind,
    lane::job::ToolCallJob,
    traces::Recorder,
};

impl Lane {
    /// What this message's first run stored, as its answer: each call's kept answer the lane
    /// took for the reply, that an unfinished call's answer follows, that a request waits for
    /// an owner. A call whose job sent its answer, and a settled request (its settlement's job
    /// tells the person), add nothing. `None`: the message stored no call that changes
    /// something and asked no owner; it is planned as usual (a read run again costs a lookup,
    /// and a chain goes on from its kept results). Asked before detection: a message handled
    /// again may be detected otherwise (the tool context its first run stored, a reload).
    pub(super) async fn handled_before(&self, inbound: &Inbound, trace: &mut Recorder) -> Option<LaneOutcome> {
        let lane = &self.settings.lane;
        let stored = async {
            let mut conn = self.db.pool.acquire().await?;
            let jobs = db::jobs::for_message(&mut conn, &inbound.chat_id, ToolCallJob::KIND, &inbound.message_id).await?;
            let asked = db::approvals::asked_by(&mut conn, &inbound.channel, &inbound.message_id).await?;
            Ok::<_, DbError>((jobs, asked))
        };
        let (jobs, asked) = match stored.await {
            Ok(stored) => stored,
            Err(e) => return Some(self.unreadable(trace, &e)),
        };
        // An approved call's job is its request's: the request says what it came to. A job whose
        // arguments cannot be read may have been a write: it counts as one.
        let mut changes = false;
        let mut calls = Vec::new();
        for row in jobs {
            match serde_json::from_str::<ToolCallJob>(&row.args) {
                Ok(job) if job.approval.is_some() => {}
                Ok(job) => {
                    changes |= !self.read_only(&job.tool);
                    calls.push((row, job));
                }
                Err(e) => {
                    tracing::warn!(job.id = row.id, correlation_id = %inbound.correlation_id, error = %e, "a stored call's arguments cannot be read; the message is not planned again");
                    changes = true;
                }
            }
        }
        if !changes && asked.is_empty() {
            return None;
        }
        let mut replies: Vec<String> = Vec::new();
        let mut say = |text: String| {
            if !replies.contains(&text) {
                replies.push(text);
            }
        };
        let mut private = false;
        for (row, job) in &calls {
            let reply = match self.processor.kept(row).await {
                Ok(Some(answer)) if answer.in_reply => {
                    private |= self.private(&job.tool);
                    Some(answer.text)
                }
                Ok(Some(_)) => None,
                // Underway: its job sends the answer.
                Ok(None) if !row.state.is_finished() => Some(lane.pending_reply.clone()),
                // Ended without an answer (an owner cancelled it): nothing to take.
                Ok(None) => None,
                Err(e) => return Some(self.unreadable(trace, &e)),
            };
            tracing::info!(event = "AgentToolJobDedupe", job.id = row.id, tool = %job.tool, correlation_id = %inbound.correlation_id, "the message's call was stored before; not planned again");
            if let Some(reply) = reply {
                say(reply);
            }
        }
        let now = db::now_ms();
        for request in &asked {
            if request.state == State::Pending && request.expires_at > now {
                say(lane.approval_reply.clone());
            } else {
                // Settled (or expiring): its own job tells the person, once.
                let state = if request.state == State::Pending { State::Expired } else { request.state };
                super::bridge::already_settled(trace, &request.tool, state);
            }
        }
        let job_ids: Vec<i64> = calls.iter().map(|(row, _)| row.id).collect();
        let approval_ids: Vec<i64> = asked.iter().map(|a| a.id).collect();
        trace.step("AgentToolJobDedupe", "handled_before", "OK", json!({ "job_ids": job_ids, "approval_ids": approval_ids }));
        if replies.is_empty() {
            return Some(LaneOutcome::Quiet);
        }
        Some(LaneOutcome::Handled { reply: replies.join("\n\n"), private })
    }

    /// What this message stored could not be read: planning without knowing could make a change
    /// twice, so the message's run fails, and it is handled again later (the worker logs why).
    fn unreadable(&self, trace: &mut Recorder, e: &DbError) -> LaneOutcome {
        trace.step("AgentToolJobDedupe", "failed", e.code(), json!({}));
        LaneOutcome::Failed { code: e.code(), message: e.to_string() }
    }
}
