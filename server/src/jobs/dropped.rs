//! Jobs whose loss someone must hear of. A kind can name, when it is registered
//! ([`super::Registry::when_dropped`]), the job that follows when one of its jobs is dropped:
//! discarded (a permanent failure, its last attempt failed, or its lease ran out on its last
//! attempt), or cancelled unrun when its time to live ran out. The follow-up is enqueued in the
//! transaction that drops the job, so no crash can lose it, and its dedupe key (the follow-up's
//! kind, the dropped job's id and attempt) makes it one per drop: a job an owner retries and
//! that is dropped again has a second. An owner's cancel is a decision, not a drop: it has no
//! follow-up. The lane's own runs (`inline`) record no follow-ups: they are tool calls, whose
//! end the lane tells the person itself, so a kind run there must not need one.

use std::{collections::HashMap, sync::Arc};

use sqlx::AnyConnection;

use super::{JobKind, JobQueue};
use crate::db::{
    DbError,
    jobs::{Dropped, NewJob},
};

type Make = Arc<dyn Fn(&Dropped) -> NewJob + Send + Sync>;

/// The follow-up of each kind that has one.
#[derive(Clone, Default)]
pub(super) struct FollowUps(HashMap<String, (JobQueue, Make)>);

impl FollowUps {
    /// A dropped job of kind `K` is followed by the job `follow` makes from it, enqueued on
    /// `queue` with the dropped job's correlation id.
    pub(super) fn add<K: JobKind, F: JobKind>(&mut self, queue: &JobQueue, follow: fn(&Dropped) -> F) {
        let on = queue.clone();
        let make: Make = Arc::new(move |dropped: &Dropped| {
            let mut job = on.job(&follow(dropped));
            job.dedupe_key = Some(format!("{}:{}:{}", F::KIND, dropped.id, dropped.attempt));
            job.correlation_id.clone_from(&dropped.correlation_id);
            job
        });
        self.0.insert(K::KIND.to_string(), (queue.clone(), make));
    }

    /// Enqueues the follow-ups of the `dropped` jobs whose kinds have one, in the caller's
    /// transaction. Wake their workers with the result once it has committed.
    pub(super) async fn enqueue(&self, conn: &mut AnyConnection, dropped: &[Dropped]) -> Result<Woken, DbError> {
        let mut woken = Woken::default();
        for d in dropped {
            let Some((queue, make)) = self.0.get(&d.kind) else { continue };
            if !queue.enqueue_in(conn, &make(d)).await?.deduplicated {
                woken.0.push(queue.clone());
            }
        }
        Ok(woken)
    }
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
