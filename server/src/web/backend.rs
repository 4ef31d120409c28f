//! The console's [`AdminBackend`], implemented over the engine.

use app::{
    backend::{AdminBackend, LoginOutcome, OwnerIdentity},
    dto::{
        DashboardInfo, DegradedNotice, JobDetail, JobEventView, JobQuery, JobSummary, JobsPage, MigrationInfo, NewOwner, SecretEntry,
        SettingEntry, SettingsInfo, ShellInfo, StateCount,
    },
    error::{AppError, code},
};
use secrecy::SecretString;

use super::state::AppState;
use crate::{
    config::load::display_url,
    db::{
        self, audit,
        jobs::{self as store, JobFilter, JobRow, JobState},
    },
    jobs::redact::redacted_pretty,
    owners::{self, Login, OwnerError, Throttle, ValidOwner},
};

#[derive(Debug, Clone)]
pub struct ConsoleBackend {
    state: AppState,
}

impl ConsoleBackend {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    fn min_password(&self) -> usize {
        self.state.config.settings.auth.min_password()
    }
}

fn internal(e: impl std::fmt::Display) -> AppError {
    tracing::error!(error = %e, "console backend failure");
    AppError::internal()
}

impl From<OwnerError> for AppError {
    fn from(e: OwnerError) -> Self {
        match e {
            OwnerError::Invalid(msg) => AppError::invalid(msg),
            OwnerError::SetupClosed => AppError::new(code::SETUP_CLOSED, "Setup is closed: an owner already exists. Log in instead."),
            OwnerError::LoginTaken(_) => AppError::new(code::CONFLICT, "That login name is taken."),
            OwnerError::NotFound(_) => AppError::unauthorized(),
            other => internal(other),
        }
    }
}

#[async_trait::async_trait]
impl AdminBackend for ConsoleBackend {
    async fn setup_open(&self) -> Result<bool, AppError> {
        self.state.setup_done().await.map(|done| !done).map_err(internal)
    }

    async fn create_first_owner(&self, owner: NewOwner, ip: &str) -> Result<OwnerIdentity, AppError> {
        // Answer "closed" before judging the input; owners::create_first_owner decides races.
        if !self.setup_open().await? {
            return Err(OwnerError::SetupClosed.into());
        }
        let valid = ValidOwner::parse(&owner.display_name, &owner.login, SecretString::from(owner.password), &owner.phones, self.min_password())?;
        let row = owners::create_first_owner(&self.state.db, valid, ip).await?;
        tracing::info!(owner.id = row.id, "first owner created; setup closed");
        Ok(OwnerIdentity { id: row.id, epoch: row.session_epoch })
    }

    async fn login(&self, login: &str, password: &str, ip: &str) -> Result<LoginOutcome, AppError> {
        let auth = &self.state.config.settings.auth;
        let throttle = Throttle { max_failures: auth.login_max_failures, window: auth.login_failure_window };
        let outcome = owners::login(&self.state.db, login, SecretString::from(password.to_string()), ip, throttle).await?;
        Ok(match outcome {
            Login::Ok(row) => {
                tracing::info!(owner.id = row.id, "owner logged in");
                LoginOutcome::Ok(OwnerIdentity { id: row.id, epoch: row.session_epoch })
            }
            Login::Rejected => {
                tracing::warn!(client.ip = %ip, "login failed");
                LoginOutcome::Rejected
            }
            Login::Throttled { retry_after } => {
                tracing::warn!(client.ip = %ip, retry_after_s = retry_after.as_secs(), "login throttled");
                LoginOutcome::Throttled { retry_after_secs: retry_after.as_secs().max(1) }
            }
        })
    }

    async fn record_logout(&self, owner_id: i64, ip: &str) -> Result<(), AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        audit::record(&mut conn, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event: audit::event::LOGOUT, ..Default::default() })
            .await
            .map_err(internal)
    }

    async fn shell_info(&self, who: &OwnerIdentity) -> Result<Option<ShellInfo>, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let Some(owner) = db::owners::find_by_id(&mut conn, who.id).await.map_err(internal)? else { return Ok(None) };
        if owner.session_epoch != who.epoch {
            return Ok(None);
        }
        Ok(Some(ShellInfo {
            owner_id: owner.id,
            display_name: owner.display_name,
            login: owner.login,
            degraded: self.state.degraded().map(|(provider, variable)| DegradedNotice { provider: provider.into(), variable: variable.into() }),
        }))
    }

    async fn dashboard(&self) -> Result<DashboardInfo, AppError> {
        let s = &self.state;
        let applied = s.db.applied_migrations().await.map_err(internal)?;
        let mut conn = s.db.pool.acquire().await.map_err(internal)?;
        let owner_count = db::owners::count(&mut conn).await.map_err(internal)?;
        let provider = s.config.settings.llm.provider;
        Ok(DashboardInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            started_at_ms: s.started_at_ms,
            uptime_secs: s.started.elapsed().as_secs(),
            database_backend: s.db.backend.as_str().into(),
            config_path: s.config.path.display().to_string(),
            listen_addr: s.listen_addr.to_string(),
            public_url: s.public_url.clone(),
            migrations_applied: applied.into_iter().map(|m| MigrationInfo { version: m.version, description: m.description }).collect(),
            migrations_known: s.db.known_migrations(),
            llm_provider: provider.as_str().into(),
            llm_key_variable: provider.key_var().into(),
            llm_configured: s.degraded().is_none(),
            owner_count,
        })
    }

    async fn settings(&self, owner_id: i64) -> Result<SettingsInfo, AppError> {
        let s = &self.state;
        let mut conn = s.db.pool.acquire().await.map_err(internal)?;
        let my_phones = db::owners::phones_of(&mut conn, owner_id).await.map_err(internal)?;
        Ok(SettingsInfo {
            config_path: s.config.path.display().to_string(),
            entries: effective_entries(&s.config.settings),
            secrets: s.config.secrets.presence().into_iter().map(|(variable, set)| SecretEntry { variable: variable.into(), set }).collect(),
            my_phones,
        })
    }

    async fn update_phones(&self, owner_id: i64, phones: &str, ip: &str) -> Result<Vec<String>, AppError> {
        Ok(owners::update_phones(&self.state.db, owner_id, phones, ip).await?)
    }

    async fn jobs_page(&self, query: &JobQuery) -> Result<JobsPage, AppError> {
        const PAGE: i64 = 50;
        let state = match query.state.as_str() {
            "" => None,
            s => Some(JobState::parse(s).ok_or_else(|| AppError::invalid(format!("unknown job state {s:?}")))?),
        };
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
        let filter = JobFilter {
            state,
            tool_name: text(&query.tool),
            chat_id: text(&query.chat),
            created_from: (query.since_minutes > 0).then(|| db::now_ms() - query.since_minutes.saturating_mul(60_000)),
            before_id: (query.before > 0).then_some(query.before),
            ..Default::default()
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let counts = store::counts_by_state(&mut conn).await.map_err(internal)?;
        let mut jobs = store::list(&mut conn, &filter, PAGE + 1).await.map_err(internal)?;
        let next_before = (jobs.len() as i64 > PAGE).then(|| {
            jobs.truncate(PAGE as usize);
            jobs.last().map_or(0, |j| j.id)
        });
        Ok(JobsPage {
            counts: counts.into_iter().map(|(s, count)| StateCount { state: s.as_str().into(), count }).collect(),
            jobs: jobs.iter().map(summary).collect(),
            next_before,
        })
    }

    async fn job_detail(&self, id: i64) -> Result<JobDetail, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let job = store::get(&mut conn, id).await.map_err(internal)?.ok_or_else(|| AppError::new(code::NOT_FOUND, format!("There is no job #{id}.")))?;
        let events = store::events(&mut conn, id).await.map_err(internal)?;
        Ok(JobDetail {
            summary: summary(&job),
            queue: job.queue.clone(),
            priority: job.priority,
            dedupe_key: job.dedupe_key.clone(),
            sender_id: job.sender_id.clone(),
            message_id: job.message_id.clone(),
            correlation_id: job.correlation_id.clone(),
            args: redacted_pretty(&job.args),
            scheduled_at: job.scheduled_at,
            started_at: job.started_at,
            completed_at: job.completed_at,
            lease_owner: job.lease_owner.clone(),
            lease_expires_at: job.lease_expires_at,
            last_error_message: job.last_error_message.clone(),
            result_preview: job.result_preview.clone(),
            events: events
                .into_iter()
                .map(|e| JobEventView { at: e.at, state: e.state.as_str().into(), attempt: e.attempt, error_code: e.error_code, message: e.message })
                .collect(),
            can_retry: matches!(job.state, JobState::Scheduled | JobState::Retryable | JobState::Discarded | JobState::Cancelled),
            can_cancel: !job.state.is_finished(),
        })
    }

    async fn retry_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError> {
        self.job_action(owner_id, id, ip, JobAction::Retry).await
    }

    async fn cancel_job(&self, owner_id: i64, id: i64, ip: &str) -> Result<(), AppError> {
        self.job_action(owner_id, id, ip, JobAction::Cancel).await
    }

    fn session_absolute_timeout_ms(&self) -> i64 {
        i64::try_from(self.state.config.settings.auth.session_absolute_timeout.as_millis()).unwrap_or(i64::MAX)
    }
}

#[derive(Debug, Clone, Copy)]
enum JobAction {
    Retry,
    Cancel,
}

impl ConsoleBackend {
    /// Retry-now or cancel, and its audit row, in one transaction.
    async fn job_action(&self, owner_id: i64, id: i64, ip: &str, action: JobAction) -> Result<(), AppError> {
        let now = db::now_ms();
        let mut tx = self.state.db.begin_write().await.map_err(internal)?;
        let (changed, event) = match action {
            JobAction::Retry => (store::retry_now(&mut tx, id, now).await, audit::event::JOB_RETRY),
            JobAction::Cancel => (store::cancel(&mut tx, id, "cancelled by an owner", now).await, audit::event::JOB_CANCEL),
        };
        let changed = changed.map_err(internal)?;
        if !changed {
            return Err(AppError::new(code::CONFLICT, format!("Job #{id} cannot be changed in its current state.")));
        }
        let detail = serde_json::json!({ "job_id": id });
        audit::record(&mut tx, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event, detail: Some(detail), ..Default::default() })
            .await
            .map_err(internal)?;
        tx.commit().await.map_err(internal)?;
        tracing::info!(owner.id = owner_id, job.id = id, action = event, "owner changed a job");
        self.state.jobs.notify();
        Ok(())
    }
}

fn summary(j: &JobRow) -> JobSummary {
    JobSummary {
        id: j.id,
        kind: j.kind.clone(),
        state: j.state.as_str().into(),
        tool_name: j.tool_name.clone(),
        chat_id: j.chat_id.clone(),
        attempt: j.attempt,
        max_attempts: j.max_attempts,
        created_at: j.created_at,
        updated_at: j.updated_at,
        last_error_code: j.last_error_code.clone(),
    }
}

/// The effective settings as dotted keys. URL values lose credentials and query strings.
pub fn effective_entries(settings: &crate::config::Settings) -> Vec<SettingEntry> {
    let mut out = Vec::new();
    if let Ok(value) = serde_json::to_value(settings) {
        flatten("", &value, &mut out);
    }
    for entry in &mut out {
        if entry.key.ends_with("url") && !entry.value.is_empty() {
            entry.value = display_url(&entry.value);
        }
    }
    out
}

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<SettingEntry>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::String(s) => out.push(SettingEntry { key: prefix.into(), value: s.clone() }),
        other => out.push(SettingEntry { key: prefix.into(), value: other.to_string() }),
    }
}
