//! What a `tool.call` job's run reads of an owner's run again of a call (`lane::rerun`): whether
//! this job's call was run again as another job, and whether the person heard how the job a run
//! again follows ended.

use super::{Processor, stopped::CallStopped};
use crate::{
    db::{DbError, jobs::JobRow, tool_answers},
    jobs::follow_ups_of,
    lane::{job::ToolCallJob, rerun},
};

/// How far back a chain of runs again is followed (each ran the one before it again).
const MAX_CHAIN: usize = 32;

impl Processor {
    /// The job that ran job `row`'s call again, if an owner did.
    pub(super) async fn ran_again(&self, row: &JobRow) -> Result<Option<i64>, DbError> {
        Ok(rerun::latest(&mut *self.db.pool.acquire().await?, row).await?.map(|again| again.id))
    }

    /// Whether the person heard how job `first` ended, or the job it ran again, and so on: its
    /// answer (in the message's reply, or sent on its own) or that it was stopped went out.
    pub(super) async fn first_told(&self, job: &ToolCallJob, first: i64) -> Result<bool, DbError> {
        let mut next = Some(first);
        for _ in 0..MAX_CHAIN {
            let Some(id) = next else { break };
            let mut conn = self.db.pool.acquire().await?;
            if tool_answers::get(&mut conn, id).await?.is_some_and(|kept| kept.in_reply) {
                return Ok(true);
            }
            let stops = follow_ups_of::<CallStopped>(&mut conn, &job.reply_to.chat_id, id).await?;
            let earlier = crate::db::jobs::get(&mut conn, id).await?.and_then(|row| serde_json::from_str::<ToolCallJob>(&row.args).ok()).and_then(|call| call.again_of);
            drop(conn);
            for sent_by in std::iter::once(id).chain(stops) {
                if self.outbound.went_out(&job.reply_to, sent_by).await? {
                    return Ok(true);
                }
            }
            next = earlier;
        }
        Ok(false)
    }
}
