//! Each `tool.call` job's final answer, kept (`tool_answers`) before anything sends it, with who
//! sends it: a retried job sends the same answer again, and a message handled again takes it
//! again, instead of the call being made twice.

use super::{Answer, Processor};
use crate::{
    db::{
        DbError,
        jobs::JobRow,
        tool_answers::{self, KeptAnswer},
    },
    lane::{job::ToolCallJob, summarizer::Writer},
};

impl Processor {
    /// Keeps job `row`'s answer, with who sends it: the lane, in the reply to the message that
    /// asked (`in_reply`: it was still waiting), or else the job itself. One write both keeps
    /// the answer and says so, before the lane is handed it: a crash after it leaves the job,
    /// run again, sending nothing, and the message, handled again, taking the answer again. An
    /// answer kept before is only marked as the lane's. A failed write is logged: the answer
    /// still goes out, and only a rerun of its job would run the call again.
    pub async fn keep(&self, job: &ToolCallJob, row: &JobRow, answer: &Answer, in_reply: bool) {
        // Kept before, and nothing new to say of it: no write.
        if answer.replayed && (answer.in_reply || !in_reply) {
            return;
        }
        let kept = async {
            let mut conn = self.db.acquire_write().await?;
            if answer.replayed {
                tool_answers::mark_in_reply(&mut conn, row.id, true).await
            } else {
                let keep = KeptAnswer { text: answer.text.clone(), failure: answer.failure.clone(), used_model: answer.by == Some(Writer::Model), output: self.chain_output(job, answer), in_reply };
                tool_answers::keep(&mut conn, row.id, &keep).await
            }
        };
        if let Err(e) = kept.await {
            tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, in_reply, error = %e, "keeping a tool call's answer failed");
        }
    }

    /// The lane stopped listening after job `job_id`'s answer was kept as its reply (its own run
    /// was stopped): the answer is its job's to send again. A failed write is logged: a rerun of
    /// the job would then send nothing, and the message handled again takes the answer.
    pub async fn handed_back(&self, job_id: i64) {
        let marked = async { tool_answers::mark_in_reply(&mut *self.db.acquire_write().await?, job_id, false).await }.await;
        if let Err(e) = marked {
            tracing::warn!(job.id = job_id, error = %e, "marking a tool call's answer as its job's to send failed");
        }
    }

    /// The answer an earlier attempt of job `row` kept, if one did.
    pub async fn kept(&self, row: &JobRow) -> Result<Option<Answer>, DbError> {
        let kept = tool_answers::get(&mut *self.db.pool.acquire().await?, row.id).await?;
        Ok(kept.map(|kept| {
            let output = kept.output.as_deref().and_then(|o| serde_json::from_str(o).ok());
            Answer { text: kept.text, failure: kept.failure, retryable: false, by: None, fallback_code: None, output, replayed: true, context_id: None, in_reply: kept.in_reply }
        }))
    }

    /// What a chain's next step is planned from, kept with a chainable tool's answer so the
    /// message handled again plans from it too: the result as cleaned for the planner (no
    /// secret or managed fields, chat id or sender).
    fn chain_output(&self, job: &ToolCallJob, answer: &Answer) -> Option<String> {
        let tool = self.checkpoint.catalog().get(&job.tool).filter(|t| t.spec.chainable)?;
        let output = answer.output.as_ref()?;
        let shown = crate::lane::summarizer::clean_with(output, &tool.spec.hidden_fields(), &[job.reply_to.chat_id.clone(), job.sender.clone()]);
        Some(crate::lane::canonical_json(&shown))
    }
}
