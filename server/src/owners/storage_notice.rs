//! Tells the owners on WhatsApp when the database's disk runs low, before it is full: on a full
//! disk nothing can be stored or sent, so this is the warning that can still go out. SQLite
//! only (PostgreSQL's disk is its server's, out of sight here); at most once a UTC day, counted
//! from the notices already stored, so a restart does not repeat it.

use std::time::Duration;

use crate::{
    config::DatabaseSettings,
    db::{self, Db, DbError, owner_notifications::Notification},
    jobs::JobQueue,
};

use super::notices;

/// The stable code of the notice, in the console's list of owner notices.
pub const STORAGE_LOW: &str = "STORAGE_LOW";

/// Checks the free space now and raises the notice when it is due. Returns whether it did.
pub async fn check(db: &Db, queue: &JobQueue, settings: &DatabaseSettings, now: i64) -> Result<bool, DbError> {
    if settings.low_space_notice.trim().is_empty() {
        return Ok(false);
    }
    let Some(free) = db.free_bytes().filter(|&free| settings.is_low_on_space(free)) else {
        return Ok(false);
    };
    let day_start = now - now.rem_euclid(86_400_000);
    let mut tx = db.begin_write().await?;
    if db::owner_notifications::latest_at(&mut tx, STORAGE_LOW).await?.is_some_and(|at| at >= day_start) {
        return Ok(false);
    }
    let message = settings.low_space_notice.replace("{free}", &mib(free)).replace("{threshold}", &format!("{} MiB", settings.low_space_mib));
    let notice = Notification { at: now, hook: "storage".into(), tool: String::new(), reason_code: STORAGE_LOW.into(), message, correlation_id: uuid::Uuid::now_v7().to_string() };
    notices::raise(&mut tx, queue, &notice, true).await?;
    queue.commit(tx).await?;
    tracing::warn!(code = STORAGE_LOW, free_bytes = free, threshold_mib = settings.low_space_mib, "the database's disk is low: owners told");
    Ok(true)
}

/// Bytes in MiB, as the notice says them.
fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// Checks every `every` while the process runs.
pub fn spawn(db: Db, queue: JobQueue, settings: DatabaseSettings, every: Duration) {
    if db.free_bytes().is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if let Err(e) = check(&db, &queue, &settings, db::now_ms()).await {
                db.storage().failed(&e);
                tracing::debug!(error = %e, "the low-disk notice could not be checked");
            }
        }
    });
}
