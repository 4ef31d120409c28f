//! The durable job queue: handlers registered by kind, a worker that claims jobs as leases and
//! runs them with a timeout, retries with backoff, and a maintainer that rescues expired leases
//! and expires stale jobs.
//!
//! # Contract for handler authors: at least once
//!
//! A job runs **at least once**, not exactly once. If the process dies (or its lease expires)
//! after a handler did its work but before the completion was recorded, the job is rescued and
//! runs again. A handler whose effect must happen once (sending a message, charging a card)
//! must be idempotent: use [`JobContext::idempotency_key`] (stable across attempts) to record
//! the effect in the same transaction as a marker, or to dedupe at the remote side, and check
//! it before acting again.

pub mod actions;
mod dropped;
pub mod echo;
pub mod inline;
mod outcome;
pub mod queue;
pub mod retry;
pub mod worker;

use std::{collections::HashMap, sync::Arc, time::Duration};

use serde::{Serialize, de::DeserializeOwned};

use crate::db::jobs::JobRow;

pub use dropped::{FollowUps, Followed, follow_up_rows_of, follow_ups_of};
pub use queue::JobQueue;
pub use worker::{Worker, WorkerSettings};

/// Stable error codes, each with one string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString)]
pub enum JobCode {
    #[strum(serialize = "JOB_KIND_UNKNOWN")]
    KindUnknown,
    #[strum(serialize = "JOB_ARGS_INVALID")]
    ArgsInvalid,
    #[strum(serialize = "JOB_TIMEOUT")]
    Timeout,
    #[strum(serialize = "JOB_PANICKED")]
    Panicked,
    /// The run's lease was gone before it ended (an owner cancelled the job, or it was rescued
    /// after a stall): the run was stopped and its result is not recorded.
    #[strum(serialize = "JOB_LEASE_LOST")]
    LeaseLost,
    /// The handler's own database work failed; retried.
    #[strum(serialize = "DATABASE_ERROR")]
    Database,
    /// The handler's own database work found no room on the disk; retried.
    #[strum(serialize = "STORAGE_FULL")]
    StorageFull,
    /// A service refused this deployment's credentials (an expired or revoked access token):
    /// retried once an operator has set working ones.
    #[strum(serialize = "CREDENTIALS_REJECTED")]
    CredentialsRejected,
    /// A service refuses the deployment's account for now (WhatsApp: a policy block, a locked
    /// account, a payment issue): retried once an operator has settled it.
    #[strum(serialize = "ACCOUNT_BLOCKED")]
    AccountBlocked,
}

impl JobCode {
    /// The deployment's failures, not the job's: an operator fixes them, and a run that met one
    /// waits without using an attempt (see [`JobError::uses_attempt`]).
    pub const WAITING_ON_THE_DEPLOYMENT: [JobCode; 3] = [Self::StorageFull, Self::CredentialsRejected, Self::AccountBlocked];

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a handler sees.
#[derive(Debug, Clone)]
pub struct JobContext {
    pub job: JobRow,
    /// When this run is stopped. Work inside takes its own deadlines from what is left, so it
    /// ends on its own terms first.
    pub deadline: tokio::time::Instant,
}

impl JobContext {
    /// What is left of this run's budget, less `reserve` kept for what comes after.
    pub fn deadline_before(&self, reserve: Duration) -> tokio::time::Instant {
        self.deadline.checked_sub(reserve).unwrap_or_else(tokio::time::Instant::now).max(tokio::time::Instant::now())
    }

    /// The same for every attempt of this job: the key for making effects happen once.
    pub fn idempotency_key(&self) -> String {
        format!("job:{}", self.job.id)
    }

    /// Decodes the job's args; undecodable args are a permanent failure.
    pub fn args<T: DeserializeOwned>(&self) -> Result<T, JobError> {
        serde_json::from_str(&self.job.args)
            .map_err(|e| JobError::permanent(JobCode::ArgsInvalid.as_str(), format!("args do not decode: {e}")))
    }
}

/// A successful run.
#[derive(Debug, Clone, Default)]
pub struct JobOutput {
    /// A short, redacted description of the result for the console.
    pub preview: Option<String>,
    /// Run again after this long without counting an attempt (e.g. waiting on a remote).
    pub snooze: Option<Duration>,
}

/// A failed run, with a stable code. Retryable failures are scheduled again with backoff until
/// attempts run out; permanent ones are discarded at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct JobError {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl JobError {
    pub fn retryable(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), retryable: true }
    }

    pub fn permanent(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), retryable: false }
    }

    /// Whether this failure uses up the run's attempt. No room to write, rejected credentials
    /// and a blocked account are the deployment's failures, not the job's, and an operator fixes
    /// them: such a run waits (snoozed) and tries again with the same attempts left, so a full
    /// disk, an expired token or a locked account discards nothing.
    pub fn uses_attempt(&self) -> bool {
        !self.code.parse::<JobCode>().is_ok_and(|code| JobCode::WAITING_ON_THE_DEPLOYMENT.contains(&code))
    }
}

/// A job kind: its name and its arguments, declared once and shared by the code that enqueues
/// it ([`JobQueue::job`]) and the handler that runs it ([`Registry::handle`]).
pub trait JobKind: Serialize + DeserializeOwned + Send + Sync + 'static {
    const KIND: &'static str;
    /// Jobs of this kind with the same `chat_id` run one at a time, in the order they were
    /// stored: a person's messages are answered in turn, each with the one before in memory.
    const ONE_AT_A_TIME_PER_CHAT: bool = false;
}

/// Runs jobs of one kind with their decoded arguments.
#[async_trait::async_trait]
pub trait Handler<K: JobKind>: Send + Sync {
    async fn run(&self, args: K, ctx: &JobContext) -> Result<JobOutput, JobError>;
}

/// A handler's own database failure: transient, so retried.
impl From<crate::db::DbError> for JobError {
    fn from(e: crate::db::DbError) -> Self {
        let code = if e.is_storage_full() { JobCode::StorageFull } else { JobCode::Database };
        Self::retryable(code.as_str(), e.to_string())
    }
}

/// A handler as the worker sees it: any kind, arguments still encoded.
#[async_trait::async_trait]
pub trait JobHandler: Send + Sync {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError>;
}

/// Decodes the arguments for a typed handler; undecodable ones are a permanent failure.
struct Typed<K: JobKind>(Arc<dyn Handler<K>>);

#[async_trait::async_trait]
impl<K: JobKind> JobHandler for Typed<K> {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let args: K = ctx.args()?;
        self.0.run(args, ctx).await
    }
}

/// Called after a job's outcome is recorded. Hooks must not fail the job; they log.
#[async_trait::async_trait]
pub trait JobHook: Send + Sync {
    async fn on_success(&self, _job: &JobRow) {}
    /// `final_failure` is true when the job was discarded (no retry follows).
    async fn on_failure(&self, _job: &JobRow, _error: &JobError, _final_failure: bool) {}
}

/// The job kinds this build handles. Capabilities register their handlers here; a worker claims
/// only jobs of the kinds its registry has, so a job of a kind it does not know (one a newer
/// build enqueued, while an older worker still runs) waits for a worker that does, for a day at
/// most: then it is discarded with `JOB_KIND_UNKNOWN` (a kind a newer build removed).
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.handle::<echo::Echo>(Arc::new(echo::EchoHandler));
    registry
}

/// Maps job kinds to handlers.
#[derive(Default, Clone)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn JobHandler>>,
    /// The kinds of `handlers`, sorted: what a worker claims.
    kinds: Vec<String>,
    /// Kinds whose runs may take longer (or must take less) than the worker's `job_timeout`.
    budgets: HashMap<String, Duration>,
    /// Kinds run one at a time per chat ([`JobKind::ONE_AT_A_TIME_PER_CHAT`]).
    in_order: Vec<String>,
    hooks: Vec<Arc<dyn JobHook>>,
    /// What follows a dropped or cancelled job of a kind ([`dropped`]).
    follow_ups: FollowUps,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("kinds", &self.handlers.keys().collect::<Vec<_>>()).finish()
    }
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, kind: &str, handler: Arc<dyn JobHandler>) -> &mut Self {
        if self.handlers.insert(kind.to_string(), handler).is_none() {
            let at = self.kinds.partition_point(|k| k.as_str() < kind);
            self.kinds.insert(at, kind.to_string());
        }
        self
    }

    /// The kinds registered, sorted: a worker claims jobs of these only.
    pub fn kinds(&self) -> &[String] {
        &self.kinds
    }

    /// Registers `handler` for jobs of kind `K`.
    pub fn handle<K: JobKind>(&mut self, handler: Arc<dyn Handler<K>>) -> &mut Self {
        if K::ONE_AT_A_TIME_PER_CHAT && !self.in_order.iter().any(|k| k == K::KIND) {
            self.in_order.push(K::KIND.to_string());
        }
        self.register(K::KIND, Arc::new(Typed(handler)))
    }

    /// The kinds whose jobs run one at a time per chat, in order.
    pub fn one_at_a_time_per_chat(&self) -> &[String] {
        &self.in_order
    }

    /// Registers `handler` for jobs of kind `K`, each run stopped after `budget`.
    pub fn handle_within<K: JobKind>(&mut self, handler: Arc<dyn Handler<K>>, budget: Duration) -> &mut Self {
        self.budgets.insert(K::KIND.to_string(), budget);
        self.handle(handler)
    }

    /// The budget of one run of `kind`, when it has its own.
    pub fn budget(&self, kind: &str) -> Option<Duration> {
        self.budgets.get(kind).copied()
    }

    /// A job of kind `K` that is dropped (discarded, or expired unrun) is followed by a job of
    /// kind `F` naming it, enqueued on `queue` in the same transaction ([`dropped`]). Not for a
    /// kind the lane runs at once (`inline`): the drops its runs end with record none.
    pub fn when_dropped<K: JobKind, F: JobKind + From<Followed>>(&mut self, queue: &JobQueue) -> &mut Self {
        self.follow_ups.when_dropped::<K, F>(queue);
        self
    }

    /// A job of kind `K` an owner cancels is followed by a job of kind `F` naming it, enqueued
    /// on `queue` in the transaction of the cancel ([`actions::apply`]).
    pub fn when_cancelled<K: JobKind, F: JobKind + From<Followed>>(&mut self, queue: &JobQueue) -> &mut Self {
        self.follow_ups.when_cancelled::<K, F>(queue);
        self
    }

    /// What follows a dropped or cancelled job of a kind, for the owners' actions.
    pub fn follow_ups(&self) -> &FollowUps {
        &self.follow_ups
    }

    pub fn hook(&mut self, hook: Arc<dyn JobHook>) -> &mut Self {
        self.hooks.push(hook);
        self
    }

    pub fn handler(&self, kind: &str) -> Option<Arc<dyn JobHandler>> {
        self.handlers.get(kind).cloned()
    }

    pub fn hooks(&self) -> &[Arc<dyn JobHook>] {
        &self.hooks
    }
}
