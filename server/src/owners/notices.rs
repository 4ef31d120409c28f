//! Notices for owners: a hook's `notify_owner`, a customer's private-data question. Each is kept
//! for the console, and on WhatsApp each owner number gets it through a durable
//! [`DeliverNotice`] job, enqueued in the same transaction as the notice.

use sqlx::AnyConnection;

use crate::{
    db::{self, DbError, owner_notifications::Notification},
    jobs::{JobKind, JobQueue},
};

/// One notice to one owner number on WhatsApp (the channel's handler sends it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeliverNotice {
    /// The owner's number, digits only, as WhatsApp addresses it.
    pub to: String,
    pub message: String,
}

impl JobKind for DeliverNotice {
    const KIND: &'static str = "owner.notify";
}

/// Stores `notice` and, with `on_whatsapp`, enqueues its delivery to every owner number, all in
/// the caller's transaction (commit it with [`JobQueue::commit`]). Returns the deliveries
/// enqueued.
pub async fn raise(conn: &mut AnyConnection, queue: &JobQueue, notice: &Notification, on_whatsapp: bool) -> Result<usize, DbError> {
    db::owner_notifications::insert(conn, notice).await?;
    if !on_whatsapp {
        return Ok(0);
    }
    let phones = db::owners::all_phones(conn).await?;
    let jobs: Vec<_> = phones
        .iter()
        .map(|phone| {
            let mut job = queue.job(&DeliverNotice { to: phone.trim_start_matches('+').to_string(), message: notice.message.clone() });
            job.correlation_id.clone_from(&notice.correlation_id);
            job
        })
        .collect();
    queue.enqueue_many_in(conn, &jobs).await?;
    Ok(jobs.len())
}
