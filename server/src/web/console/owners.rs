//! First-run setup, login, sessions, the owner's settings and the dashboard.

use app::{
    backend::{LoginOutcome, OwnerIdentity, OwnersBackend, SetupAccess},
    dto::{DashboardInfo, DegradedNotice, DiskNotice, SpendInfo, MigrationInfo, WaitingInfo, NewOwner, SecretEntry, SettingEntry, SettingsInfo, ShellInfo, ToolSecretEntry},
    error::{AppError, code},
};
use secrecy::SecretString;
use sqlx::AnyConnection;

use super::{ConsoleBackend, internal};
use crate::{
    config::load::display_url,
    db::{self, audit},
    owners::{self, Login, OwnerError, Throttle, ValidOwner},
};

impl From<OwnerError> for AppError {
    fn from(e: OwnerError) -> Self {
        match e {
            OwnerError::Invalid(msg) => AppError::invalid(msg),
            OwnerError::SetupClosed => AppError::new(code::SETUP_CLOSED, "Setup is closed: an owner already exists. Log in instead."),
            OwnerError::SetupNotLocal => AppError::new("SETUP_NOT_LOCAL", "Setup is answered only on the machine Gatehouse runs on, or with GATEHOUSE_SETUP_TOKEN (at least 20 characters): open /setup?token=<its value>."),
            OwnerError::LoginTaken(_) => AppError::new(code::CONFLICT, "That login name is taken."),
            OwnerError::NotFound(_) => AppError::unauthorized(),
            OwnerError::Db(e) => internal(e),
            other => internal(other),
        }
    }
}

impl ConsoleBackend {
    fn min_password(&self) -> usize {
        self.state.config.settings.auth.min_password()
    }
}

#[async_trait::async_trait]
impl OwnersBackend for ConsoleBackend {
    async fn setup_open(&self) -> Result<bool, AppError> {
        self.state.setup_done().await.map(|done| !done).map_err(internal)
    }

    async fn create_first_owner(&self, owner: NewOwner, ip: &str, access: SetupAccess) -> Result<OwnerIdentity, AppError> {
        // Answer "closed" before judging the input; owners::create_first_owner decides races.
        if !self.setup_open().await? {
            return Err(OwnerError::SetupClosed.into());
        }
        // Whoever sets up first owns the bot: from anywhere on the internet that reaches the
        // webhook, only with the token the operator chose.
        if !owners::setup_allowed(access.local, &access.token, self.state.config.secrets.setup_token.as_ref()) {
            tracing::warn!(ip, "first-run setup refused: not from this machine, and no valid setup token");
            return Err(OwnerError::SetupNotLocal.into());
        }
        let valid = ValidOwner::parse(&owner.display_name, &owner.login, SecretString::from(owner.password), &owner.phones, self.min_password())?;
        let row = owners::create_first_owner(&self.state.db, valid, ip).await?;
        tracing::info!(owner.id = row.id, "first owner created; setup closed");
        Ok(OwnerIdentity { id: row.id, epoch: row.session_epoch })
    }

    async fn login(&self, login: &str, password: &str, ip: &str, device: Option<&str>) -> Result<LoginOutcome, AppError> {
        let auth = &self.state.config.settings.auth;
        let throttle = Throttle { max_failures: auth.login_max_failures, window: auth.login_failure_window, device_lifetime: auth.trusted_device_lifetime };
        let outcome = owners::login(&self.state.db, login, SecretString::from(password.to_string()), ip, device, throttle).await?;
        Ok(match outcome {
            Login::Ok { owner, device } => {
                tracing::info!(owner.id = owner.id, "owner logged in");
                let max_age = time::Duration::seconds(i64::try_from(auth.trusted_device_lifetime.as_secs()).unwrap_or(i64::MAX));
                let device_cookie = tower_sessions::cookie::Cookie::build((app::auth::DEVICE_COOKIE, device))
                    .path("/")
                    .http_only(true)
                    .same_site(tower_sessions::cookie::SameSite::Strict)
                    .secure(self.state.secure_cookies())
                    .max_age(max_age)
                    .build();
                LoginOutcome::Ok { who: OwnerIdentity { id: owner.id, epoch: owner.session_epoch }, device_cookie: device_cookie.to_string() }
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
        // Given back before the sender takes one of its own: every console request (and each
        // live stream's session check) comes here, and requests that each held one connection
        // while waiting for a second would starve the pool until its timeout.
        drop(conn);
        let token_rejected_since = self.state.whatsapp_sender.token_rejected_since().await.map_err(internal)?;
        Ok(Some(ShellInfo {
            owner_id: owner.id,
            display_name: owner.display_name,
            login: owner.login,
            degraded: self.state.degraded().map(|(provider, variable)| DegradedNotice { provider: provider.into(), variable: variable.into() }),
            storage_warning: self.state.config.settings.database.storage_warning().map(String::from),
            disk: disk_notice(&self.state.db, &self.state.config.settings.database),
            whatsapp_token_rejected_since_ms: token_rejected_since,
            whatsapp_sending_unset: self.state.config.secrets.whatsapp_app_secret.as_ref().and(self.state.whatsapp_sender.missing_setting()).map(String::from),
        }))
    }

    async fn waiting(&self) -> Result<WaitingInfo, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        waiting_in(&mut conn, db::now_ms()).await
    }

    async fn dashboard(&self) -> Result<DashboardInfo, AppError> {
        let s = &self.state;
        let applied = s.db.applied_migrations().await.map_err(internal)?;
        // Read before this function holds a connection of its own (see `shell_info`).
        let budgets = s.budget.status().await.map_err(internal)?;
        let mut conn = s.db.pool.acquire().await.map_err(internal)?;
        let owner_count = db::owners::count(&mut conn).await.map_err(internal)?;
        let provider = s.config.settings.llm.provider;
        let mut spend = Vec::new();
        for (period, _key, starts_at) in crate::budget::periods_at(db::now_ms()) {
            let spoken = if period == crate::budget::Period::Day { "today" } else { "this month" };
            let budget = budgets.iter().find(|b| b.period == period);
            let spent = match budget {
                Some(b) => b.spent_micro_usd,
                None => db::budget::spent_since(&mut conn, starts_at).await.map_err(internal)?.micro_usd,
            };
            spend.push(SpendInfo {
                period: spoken.into(),
                spent_usd: crate::budget::usd(spent),
                budget_usd: budget.map(|b| crate::budget::usd(b.budget_micro_usd)),
                percent: budget.map(crate::budget::PeriodSpend::percent),
                exhausted: budget.is_some_and(crate::budget::PeriodSpend::exhausted),
                warned: budget.is_some_and(|b| !b.warned.is_empty()),
            });
        }
        Ok(DashboardInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            started_at_ms: s.started_at_ms,
            uptime_secs: s.started.elapsed().as_secs(),
            database_backend: s.db.backend.as_str().into(),
            database_free_bytes: s.db.free_bytes(),
            config_path: s.config.path.display().to_string(),
            listen_addr: s.listen_addr.to_string(),
            public_url: s.public_url.clone(),
            migrations_applied: applied.into_iter().map(|m| MigrationInfo { version: m.version, description: m.description }).collect(),
            migrations_known: s.db.known_migrations(),
            llm_provider: provider.as_str().into(),
            llm_key_variable: provider.key_var().into(),
            llm_configured: s.degraded().is_none(),
            owner_count,
            charts: super::charts::all(&mut conn, db::now_ms()).await.map_err(internal)?,
            spend,
            budget_action: <&str>::from(s.config.settings.budget.at_limit).into(),
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
            tool_secrets: crate::tools::secrets_named(&s.tools.catalog(), &s.mcp, &s.config.secrets.source)
                .into_iter()
                .map(|n| ToolSecretEntry { variable: n.variable, used_by: n.used_by, set: n.set })
                .collect(),
            my_phones,
        })
    }

    async fn update_phones(&self, owner_id: i64, phones: &str, ip: &str) -> Result<Vec<String>, AppError> {
        Ok(owners::update_phones(&self.state.db, owner_id, phones, ip).await?)
    }

    async fn keep_form_answer(&self, session_id: &str, path: &str, answer: &str) -> Result<(), AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        db::sessions::keep_form_answer(&mut conn, session_id, path, answer).await.map_err(internal)
    }

    async fn take_form_answer(&self, session_id: &str, path: &str) -> Result<Option<String>, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        db::sessions::take_form_answer(&mut conn, session_id, path).await.map_err(internal)
    }

    fn session_absolute_timeout_ms(&self) -> i64 {
        i64::try_from(self.state.config.settings.auth.session_absolute_timeout.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The database's room to write, when the owner should hear of it: writes failing for want of
/// room, or (SQLite) less than `low_space_mib` left on its disk.
fn disk_notice(db: &db::Db, settings: &crate::config::DatabaseSettings) -> Option<DiskNotice> {
    let full = db.storage().full();
    let free_bytes = db.free_bytes();
    let low = free_bytes.is_some_and(|free| settings.is_low_on_space(free));
    (full.is_some() || low).then(|| DiskNotice { full_since_ms: full.map(|f| f.since_ms), last_full_ms: full.map(|f| f.last_ms), free_bytes, low_space_mib: settings.low_space_mib })
}

/// The effective settings as dotted keys. URL values lose credentials and query strings,
/// whatever their key is called (`database.url`, `telemetry.otlp_endpoint`, ...).
pub fn effective_entries(settings: &crate::config::Settings) -> Vec<SettingEntry> {
    let mut out = Vec::new();
    if let Ok(value) = serde_json::to_value(settings) {
        flatten("", &value, &mut out);
    }
    for entry in &mut out {
        let is_url = !entry.value.contains(char::is_whitespace) && url::Url::parse(&entry.value).is_ok_and(|u| u.has_host());
        if entry.key.ends_with("url") && !entry.value.is_empty() || is_url {
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

/// What waits for an owner at `now`.
async fn waiting_in(conn: &mut AnyConnection, now: i64) -> Result<WaitingInfo, AppError> {
    let w = db::stats::waiting(conn, now).await.map_err(internal)?;
    Ok(WaitingInfo {
        approvals: w.approvals,
        oldest_approval_age_ms: w.oldest_approval_at.map(|t| (now - t).max(0)),
        mcp_tools: w.mcp_tools,
        mcp_forms: w.mcp_forms,
        repairs: w.repairs,
    })
}

#[cfg(test)]
mod tests {
    use super::effective_entries;

    #[test]
    fn a_url_setting_loses_its_credentials_whatever_its_key_is_called() {
        let mut settings = crate::config::Settings::default();
        settings.telemetry.otlp_endpoint = "https://user:PASSWORD@otlp.example/v1?api-key=KEY#frag".into();
        let entries = effective_entries(&settings);
        let endpoint = entries.iter().find(|e| e.key == "telemetry.otlp_endpoint").expect("the key is listed");
        assert_eq!(endpoint.value, "https://otlp.example/v1");
        assert!(entries.iter().all(|e| !e.value.contains("PASSWORD") && !e.value.contains("KEY")), "{entries:?}");
        // Words an owner wrote with a link in them stay as written.
        settings.llm.fallback_reply = "Sorry, try again or see https://shop.example/help".into();
        let reply = effective_entries(&settings).into_iter().find(|e| e.key == "llm.fallback_reply").expect("listed");
        assert_eq!(reply.value, settings.llm.fallback_reply);
    }
}
