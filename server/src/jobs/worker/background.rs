//! What a worker does beside its runs: maintenance (rescuing expired leases, expiring jobs past
//! their time to live, letting go of cancelled runs' leases, queueing the follow-ups of the jobs
//! it dropped) and, on PostgreSQL, listening for other processes' enqueues.

use std::time::Duration;

use super::{
    super::{JobCode, queue::NOTIFY_CHANNEL},
    Worker,
};
use crate::db::{self, Backend, DbError, jobs as store};

/// How long a due job of a kind this worker does not handle is left for a worker that does
/// (another build's, during an upgrade) before it is discarded: long past any upgrade.
const UNCLAIMED_KIND_GRACE: Duration = Duration::from_secs(24 * 60 * 60);

impl Worker {
    pub(super) async fn maintain(self) {
        loop {
            let result = async {
                let mut tx = self.db.begin_write().await?;
                let now = db::now_ms();
                let rescued = store::rescue(&mut tx, self.db.backend, now).await?;
                let expired = store::expire(&mut tx, self.db.backend, now).await?;
                let released = store::release_cancelled_leases(&mut tx, self.db.backend, now).await?;
                let due_before = now.saturating_sub(db::duration_ms(UNCLAIMED_KIND_GRACE));
                let kinds = self.registry.kinds();
                let unknown = store::discard_unknown_kinds(&mut tx, self.db.backend, &self.settings.queue, kinds, JobCode::KindUnknown.as_str(), due_before, now).await?;
                if !unknown.is_empty() {
                    tracing::warn!(worker = %self.id, count = unknown.len(), code = JobCode::KindUnknown.as_str(), "discarded jobs of kinds no worker took for a day");
                }
                let dropped = store::dropped_among(&mut tx, &[rescued.as_slice(), expired.as_slice(), unknown.as_slice()].concat()).await?;
                let followed = self.registry.follow_ups().enqueue(&mut tx, &dropped).await?;
                tx.commit().await?;
                followed.wake();
                Ok::<_, DbError>((rescued, expired, released))
            }
            .await;
            match result {
                Ok((rescued, expired, released)) => {
                    if released > 0 {
                        self.wake.notify_one();
                    }
                    if !rescued.is_empty() {
                        tracing::warn!(worker = %self.id, count = rescued.len(), "rescued jobs whose lease expired");
                        self.wake.notify_one();
                    }
                    if !expired.is_empty() {
                        tracing::info!(worker = %self.id, count = expired.len(), "expired jobs past their time to live");
                    }
                }
                Err(e) => tracing::warn!(worker = %self.id, error = %e, "job maintenance failed"),
            }
            tokio::time::sleep(self.settings.maintenance_interval).await;
        }
    }

    /// On PostgreSQL, wakes this worker when another process enqueues.
    pub(super) async fn listen(self) {
        if self.db.backend != Backend::Postgres {
            return;
        }
        let Some(url) = self.db.postgres_url() else { return };
        loop {
            match sqlx::postgres::PgListener::connect(&url).await {
                Ok(mut listener) => {
                    if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
                        tracing::warn!(error = %e, "LISTEN failed");
                    } else {
                        while let Ok(n) = listener.recv().await {
                            if n.payload() == self.settings.queue {
                                self.wake.notify_one();
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot connect for LISTEN; polling only"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}
