//! How a worker runs: its queue, concurrency, polling, leases, timeouts and retry backoff, taken
//! from `[jobs]` in the settings.

use std::time::Duration;

use crate::config::JobSettings;

/// A worker's settings; `From<&JobSettings>` reads them from the configuration.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub queue: String,
    /// Jobs run at once by this worker.
    pub concurrency: usize,
    /// Poll even without a notification this often.
    pub poll_interval: Duration,
    /// A claimed job belongs to this worker until the lease runs out; heartbeats extend it.
    pub lease: Duration,
    pub job_timeout: Duration,
    pub shutdown_grace: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// How often expired leases are rescued and stale jobs expired.
    pub maintenance_interval: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self::from(&JobSettings::default())
    }
}

impl From<&JobSettings> for WorkerSettings {
    fn from(s: &JobSettings) -> Self {
        Self {
            queue: s.queue.clone(),
            concurrency: usize::try_from(s.concurrency).unwrap_or(8).max(1),
            poll_interval: s.poll_interval,
            lease: s.lease,
            job_timeout: s.job_timeout,
            shutdown_grace: s.shutdown_grace,
            retry_base: s.retry_base,
            retry_max: s.retry_max,
            maintenance_interval: s.maintenance_interval,
        }
    }
}
