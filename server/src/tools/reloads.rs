//! Catalog reloads that reach every process of a deployment. A reload made in one process (the
//! console's button, a repair's approval, a SIGHUP) is counted in the database; every process
//! follows the count ([`Reloads::follow`]) and, when another process moved it, reloads its own
//! tool files. So a tool turned off in the console is off in a separate `gatehouse worker` too
//! within one `jobs.poll_interval`, not only after that worker's own SIGHUP.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;

use super::{Checkpoint, FilesDigest, ReloadError, ReloadReport, mcp::McpManager, reload_catalog};
use crate::{
    config::LoadedConfig,
    db::{self, Db, DbError, catalog_reloads},
};

/// This process's catalog reloads, told to and heard from the other processes.
#[derive(Clone)]
pub struct Reloads {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloads").finish_non_exhaustive()
    }
}

struct Inner {
    config: Arc<LoadedConfig>,
    mcp: McpManager,
    checkpoint: Arc<Checkpoint>,
    db: Db,
    /// Held across a reload, so this process's own reloads and the ones it follows never run
    /// at once.
    state: Mutex<Followed>,
}

struct Followed {
    /// The count this process's catalog is as new as; `None` until first read.
    seen: Option<i64>,
    /// The tool files this process started with, as they were read.
    files_digest: FilesDigest,
    /// A reload made here that the other processes were not told of yet (the count could not
    /// be written); told at the next poll.
    owed: bool,
}

impl Reloads {
    /// `files_digest`: the tool files the catalog the checkpoint holds was read from
    /// ([`ToolFiles::digest`](super::ToolFiles)).
    pub fn new(config: Arc<LoadedConfig>, mcp: McpManager, checkpoint: Arc<Checkpoint>, db: Db, files_digest: FilesDigest) -> Self {
        let state = Mutex::new(Followed { seen: None, files_digest, owed: false });
        Self { inner: Arc::new(Inner { config, mcp, checkpoint, db, state }) }
    }

    /// Reloads this process's catalog from its files (see [`reload_catalog`]) and tells the
    /// other processes to reload theirs (`told_others` in the report says whether that was
    /// written; if not, a running process tells them at its next poll). A refused reload tells
    /// nobody: the current catalog stays everywhere.
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let mut state = self.inner.state.lock().await;
        let mut report = reload_catalog(&self.inner.config, &self.inner.mcp, &self.inner.checkpoint).await?;
        report.told_others = self.tell_others(&mut state).await;
        state.owed = !report.told_others;
        Ok(report)
    }

    /// Checks the count every `interval` until `shutdown` says stop: a reload another process
    /// made is followed here, and one made here that could not be told is told. Spawned by
    /// `serve` and `worker` once their MCP servers have started.
    pub async fn follow(self, interval: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = *shutdown.borrow_and_update();
            if stopping {
                return;
            }
            tokio::select! {
                _ = every.tick() => self.poll().await,
                changed = shutdown.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One check of the count (what [`Reloads::follow`] does each interval).
    pub async fn poll(&self) {
        let mut state = self.inner.state.lock().await;
        if state.owed {
            state.owed = !self.tell_others(&mut state).await;
            if state.owed {
                return;
            }
        }
        let generation = match self.read().await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the catalog reload count; checking again at the next poll");
                return;
            }
        };
        let stale = match state.seen {
            Some(seen) => generation != seen,
            // The first read: the reloads counted so far may have been made after this process
            // read its files, and may have changed them. Whether they did is in the files
            // themselves; the reload's time, written by another host's clock, cannot say.
            None => generation > 0 && super::files_digest(&self.inner.config.dir) != state.files_digest,
        };
        // A follow that failed for a passing cause is tried again at the next poll.
        if !stale || self.follow_one().await {
            state.seen = Some(generation);
        }
    }

    async fn read(&self) -> Result<i64, DbError> {
        let mut conn = self.inner.db.pool.acquire().await?;
        catalog_reloads::current(&mut conn).await
    }

    /// Counts this process's reload; false when the count could not be written (told at the
    /// next poll). When the count moved past the one this process had seen by more than this
    /// reload, another process reloaded meanwhile (perhaps after writing its files, which this
    /// process may have read before the write), so this one reloads again.
    async fn tell_others(&self, state: &mut Followed) -> bool {
        let told = async {
            let mut tx = self.inner.db.begin_write().await?;
            let generation = catalog_reloads::announce(&mut tx, db::now_ms()).await?;
            tx.commit().await?;
            Ok::<_, DbError>(generation)
        };
        match told.await {
            Ok(generation) => {
                // Not knowing the count before (no poll yet), this reload, just made, is the newest.
                let others_too = state.seen.is_some_and(|seen| generation > seen + 1);
                // When following the other reload fails, the count before it stays seen, so
                // the next poll tries again.
                if !others_too || self.follow_one().await {
                    state.seen = Some(generation);
                } else {
                    state.seen = Some(generation - 1);
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the other processes could not be told of this catalog reload; telling them at the next poll");
                false
            }
        }
    }

    /// Reloads following another process; false when it failed for a cause that may pass (an
    /// MCP catalog that could not be read), so it is tried again. Files with problems are
    /// final: the current catalog stays until they are fixed and reloaded again.
    async fn follow_one(&self) -> bool {
        match reload_catalog(&self.inner.config, &self.inner.mcp, &self.inner.checkpoint).await {
            Ok(report) => {
                tracing::info!(tools = report.tools, changed = ?report.changed, "tool catalog reloaded, following a reload in another process");
                true
            }
            Err(e @ ReloadError::Files(_)) => {
                tracing::error!(error = %e, "another process reloaded the tool catalog, but this one's files were refused; keeping the current catalog");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "following another process's catalog reload failed; trying again at the next poll");
                false
            }
        }
    }
}
