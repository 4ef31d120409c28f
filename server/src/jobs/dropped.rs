//! Jobs whose loss someone must hear of. A kind can name, when it is registered
//! ([`super::Registry::when_dropped`]), the job that follows when one of its jobs is dropped:
//! discarded (a permanent failure, its last attempt failed, or its lease ran out on its last
//! attempt), or cancelled unrun when its time to live ran out. The follow-up is enqueued in the
//! transaction that drops the job, so no crash can lose it, and its dedupe key (the follow-up's
//! kind, the dropped job's id and attempt) makes it one per drop: a job an owner retries and
//! that is dropped again has a second. An owner's cancel is a decision, not a drop: it has no
//! follow-up here; a kind can name one for that too ([`super::Registry::when_cancelled`]),
//! queued in the transaction of the cancel (`jobs::actions`). The lane's own runs (`inline`)
//! record no follow-ups of the drops they end with (a lease of theirs that runs out is
//! maintenance's drop, which does): they are tool calls, whose end the lane tells the person
//! itself, so a kind run there must not rely on one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sqlx::AnyConnection;

use super::{JobKind, JobQueue};
use crate::db::{
    DbError,
    jobs::{Dropped, JobRow, NewJob},
};

/// A follow-up's arguments: the job it follows, at the attempt that was dropped or cancelled (a
/// job an owner retried since is not that one). A follow-up kind wraps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    pub job_id: i64,
    pub attempt: i64,
}

impl From<&Dropped> for Followed {
    fn from(d: &Dropped) -> Self {
        Self { job_id: d.id, attempt: d.attempt }
    }
}

/// The ids of the follow-ups of kind `F` of job `job_id`, in its chat `chat_id`, oldest first:
/// a job an owner cancelled, retried and cancelled again has one for each cancel (each of the
/// same attempt, once the one before finished, since a finished job's key dedupes nothing).
pub async fn follow_ups_of<F: JobKind>(conn: &mut AnyConnection, chat_id: &str, job_id: i64) -> Result<Vec<i64>, DbError> {
    Ok(follow_up_rows_of::<F>(conn, chat_id, job_id).await?.into_iter().map(|row| row.id).collect())
}

/// [`follow_ups_of`], the jobs themselves.
pub async fn follow_up_rows_of<F: JobKind>(conn: &mut AnyConnection, chat_id: &str, job_id: i64) -> Result<Vec<JobRow>, DbError> {
    let rows = crate::db::jobs::in_chat(conn, chat_id, F::KIND).await?;
    Ok(rows.into_iter().filter(|row| serde_json::from_str::<Followed>(&row.args).is_ok_and(|f| f.job_id == job_id)).collect())
}

/// Makes a kind's follow-up of a job, on its queue.
type Make = fn(&JobQueue, &Dropped) -> NewJob;
type ByKind = HashMap<String, (JobQueue, Make)>;

/// The follow-up of each kind that has one: of a drop, and of an owner's cancel.
#[derive(Clone, Default)]
pub struct FollowUps {
    dropped: ByKind,
    cancelled: ByKind,
}

impl std::fmt::Debug for FollowUps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowUps").field("dropped", &self.dropped.keys().collect::<Vec<_>>()).field("cancelled", &self.cancelled.keys().collect::<Vec<_>>()).finish()
    }
}

/// The follow-up of kind `F` of the job `dropped`, on `queue`: once per job and attempt, with
/// that job's correlation id and chat (the Jobs page lists it under the chat).
fn follow_up<F: JobKind + From<Followed>>(queue: &JobQueue, dropped: &Dropped) -> NewJob {
    let mut job = queue.job(&F::from(Followed::from(dropped)));
    job.dedupe_key = Some(format!("{}:{}:{}", F::KIND, dropped.id, dropped.attempt));
    job.correlation_id.clone_from(&dropped.correlation_id);
    job.chat_id.clone_from(&dropped.chat_id);
    job
}

impl FollowUps {
    /// A dropped job of kind `K` is followed by a job of kind `F`, on `queue`.
    pub(super) fn when_dropped<K: JobKind, F: JobKind + From<Followed>>(&mut self, queue: &JobQueue) {
        self.dropped.insert(K::KIND.to_string(), (queue.clone(), follow_up::<F>));
    }

    /// A job of kind `K` an owner cancelled is followed by a job of kind `F`, on `queue`.
    pub(super) fn when_cancelled<K: JobKind, F: JobKind + From<Followed>>(&mut self, queue: &JobQueue) {
        self.cancelled.insert(K::KIND.to_string(), (queue.clone(), follow_up::<F>));
    }

    /// Enqueues the follow-ups of the `dropped` jobs whose kinds have one, in the caller's
    /// transaction. Wake their workers with the result once it has committed.
    pub(super) async fn enqueue(&self, conn: &mut AnyConnection, dropped: &[Dropped]) -> Result<Woken, DbError> {
        enqueue(&self.dropped, conn, dropped).await
    }

    /// The same for a job an owner cancelled.
    pub(super) async fn enqueue_cancelled(&self, conn: &mut AnyConnection, cancelled: &Dropped) -> Result<Woken, DbError> {
        enqueue(&self.cancelled, conn, std::slice::from_ref(cancelled)).await
    }
}

async fn enqueue(by_kind: &ByKind, conn: &mut AnyConnection, jobs: &[Dropped]) -> Result<Woken, DbError> {
    let mut woken = Woken::default();
    for d in jobs {
        let Some((queue, make)) = by_kind.get(&d.kind) else { continue };
        if !queue.enqueue_in(conn, &make(queue, d)).await?.deduplicated {
            woken.0.push(queue.clone());
        }
    }
    Ok(woken)
}

/// The queues that got follow-ups in a transaction: [`Woken::wake`] them once it has committed.
#[derive(Default)]
#[must_use = "wake the queues once the transaction has committed"]
pub(super) struct Woken(Vec<JobQueue>);

impl Woken {
    pub(super) fn wake(self) {
        for queue in self.0 {
            queue.notify();
        }
    }
}
