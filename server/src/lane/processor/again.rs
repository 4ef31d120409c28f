//! Whether the person heard how the job a run again follows ended (`lane::rerun`): a run again's
//! failure, or its cancel, is told only to a person who did not.

use super::{Processor, stopped::CallStopped};
use crate::{
    db::{DbError, tool_answers},
    jobs::follow_ups_of,
    lane::job::ToolCallJob,
};

/// How far back a chain of runs again is followed (each ran the one before it again).
const MAX_CHAIN: usize = 32;

impl Processor {
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
