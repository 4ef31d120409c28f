//! Calls whose outcome may be unknown. A call that changes something and carries no idempotency
//! key (an MCP or built-in write, a connector action over GET) is not safe to make twice: it is
//! marked as made, in its own write, before it is made. A later run of its job that finds the
//! mark but no kept answer (the run that made it stopped, or could not keep its answer), or a
//! run whose call failed in a way that may still have taken effect (a timeout, an error
//! answer), does not make it again: the person is told its outcome is unknown, and the owners
//! which job to check.

use super::{Answer, Processor};
use crate::{
    db::{
        self, DbError,
        jobs::JobRow,
        owner_notifications::{self, Notification},
        tool_answers,
    },
    lane::{data, job::ToolCallJob},
    owners::notices,
    tools::{ToolDef, checkpoint::ToolCode},
};

impl Processor {
    /// Whether a call of `tool` may not be made twice: it changes something, and its attempts
    /// carry no idempotency key.
    pub(super) fn unsafe_to_repeat(&self, tool: Option<&ToolDef>) -> bool {
        tool.is_some_and(|t| !self.checkpoint.repeats_safely(t))
    }

    /// Marks job `row`'s call as made, before it is: `false` when an earlier run marked it.
    /// Not marked (the write failed), it is not made.
    pub(super) async fn mark_started(&self, row: &JobRow) -> Result<bool, DbError> {
        tool_answers::start(&mut *self.db.acquire_write().await?, row.id).await
    }

    /// Removes the mark of a call that surely did not take effect (refused, never sent), so
    /// another attempt may make it. Should that fail, the next attempt says the outcome is
    /// unknown instead: the safe side.
    pub(super) async fn unmark(&self, row: &JobRow) {
        let cleared = async { tool_answers::unstart(&mut *self.db.acquire_write().await?, row.id).await }.await;
        if let Err(e) = cleared {
            tracing::warn!(job.id = row.id, correlation_id = %row.correlation_id, error = %e, "clearing a failed call's mark failed; it is not made again");
        }
    }

    /// The answer of a call whose effect is unknown, which is never made again. The person is
    /// told so; every owner is told too, unless the call was approved (its outcome goes to the
    /// owner who decided).
    pub(super) async fn outcome_unknown(&self, job: &ToolCallJob, row: &JobRow) -> Answer {
        let code = ToolCode::OutcomeUnknown.as_str();
        tracing::error!(job.id = row.id, correlation_id = %row.correlation_id, tool = %job.tool, code, "whether the call took effect is unknown; it is not made again");
        if job.approval.is_none() {
            let link = format!("{}/jobs/{}", self.console_url, row.id);
            let message = self.lane.unknown_outcome_notice.replace("{tool}", &job.tool).replace("{job}", &row.id.to_string()).replace("{link}", &link);
            let notice = Notification { at: db::now_ms(), hook: "tool_call".into(), tool: job.tool.clone(), reason_code: code.into(), message, correlation_id: row.correlation_id.clone() };
            // Once a job: a run that could not keep this answer either comes here again.
            let told = async {
                let mut tx = self.db.begin_write().await?;
                if !owner_notifications::exists(&mut tx, code, &notice.message).await? {
                    notices::raise(&mut tx, &self.queue, &notice, true).await?;
                }
                self.queue.commit(tx).await
            };
            if let Err(e) = told.await {
                tracing::error!(job.id = row.id, correlation_id = %row.correlation_id, error = %e, "telling the owners of a call with an unknown outcome failed");
            }
        }
        let text = data::plain_text(&self.lane.unknown_outcome_reply, self.lane.summary_max_chars as usize);
        Answer::failed(text, code)
    }
}
