//! The console's [`AdminBackend`], implemented over the engine.

use app::{
    backend::{AdminBackend, LoginOutcome, OwnerIdentity},
    dto::{
        ChatDetail, ChatMessageView, ChatView, ConversationsPage, DashboardInfo, DegradedNotice, JobDetail, JobEventView, JobQuery, JobSummary, JobsPage, McpPage, McpServerView, McpToolView, MigrationInfo,
        NewOwner, OwnerNotice,
        ReloadOutcome, SecretEntry, SecretFieldView, SettingEntry, SettingsInfo, ShellInfo, SimulateOutcome, SimulateRequest, StateCount, ToolCallView, ToolDetail, ToolSummary,
        ToolsPage, ToolsQuery, TraceDetail, TraceQuery, TraceStepView, TraceSummary, TracesPage, TryOutcome,
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

    async fn tools_page(&self, query: &ToolsQuery) -> Result<ToolsPage, AppError> {
        let catalog = self.state.tools.catalog();
        let matches = |have: String, want: &str| want.is_empty() || have == want;
        let tools: Vec<ToolSummary> = catalog
            .all()
            .map(|t| self.tool_summary(t))
            .filter(|t| matches(t.provider.clone(), &query.provider) && matches(t.audience.clone(), &query.audience) && matches(t.risk.clone(), &query.risk))
            .collect();
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let recent_calls = db::tool_audit::recent(&mut conn, None, 50).await.map_err(internal)?.iter().map(call_view).collect();
        let notices = db::owner_notifications::recent(&mut conn, 20)
            .await
            .map_err(internal)?
            .into_iter()
            .map(|n| OwnerNotice { at: n.at, hook: n.hook, tool: n.tool, reason_code: n.reason_code, message: n.message })
            .collect();
        Ok(ToolsPage {
            approval_mode: label(&catalog.approval_mode),
            catalog_path: self.state.config.dir.join("tools.toml").display().to_string(),
            total: catalog.len(),
            tools,
            recent_calls,
            notices,
        })
    }

    async fn tool_detail(&self, name: &str) -> Result<ToolDetail, AppError> {
        use crate::tools::policy::{Actor, Decision, decide};
        let catalog = self.state.tools.catalog();
        let tool = catalog.get(name).ok_or_else(|| AppError::new(code::NOT_FOUND, format!("There is no tool named {name:?} in the catalog.")))?;
        let spec = &tool.spec;
        let policy = |actor: Actor| match decide(spec, catalog.approval_mode, actor) {
            Decision::Allow => "allowed".to_string(),
            Decision::NeedsApproval { reason } => format!("needs an owner's approval ({reason})"),
            Decision::Deny { reason } => format!("denied ({reason})"),
        };
        let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
        let required: Vec<String> = spec.input_schema.get("required").and_then(|r| r.as_array()).map(|r| r.iter().filter_map(|v| v.as_str().map(String::from)).collect()).unwrap_or_default();
        let example: serde_json::Map<String, serde_json::Value> = required
            .iter()
            .filter(|f| !spec.managed_fields.contains(f) && !spec.secret_fields.contains_key(*f))
            .map(|f| (f.clone(), serde_json::Value::String(String::new())))
            .collect();
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let recent_calls = db::tool_audit::recent(&mut conn, Some(name), 20).await.map_err(internal)?.iter().map(call_view).collect();
        Ok(ToolDetail {
            summary: self.tool_summary(&tool),
            when_to_use: spec.when_to_use.clone(),
            when_not_to_use: spec.when_not_to_use.clone(),
            aliases: spec.aliases.clone(),
            triggers: spec.triggers.clone(),
            chat_types: spec.chat_types.iter().map(label).collect(),
            input_schema: pretty(&spec.input_schema),
            output_schema: spec.output_schema.as_ref().map(pretty),
            managed_fields: spec.managed_fields.clone(),
            secret_fields: spec
                .secret_fields
                .iter()
                .map(|(field, var)| SecretFieldView { field: field.clone(), variable: var.clone(), set: std::env::var(var).is_ok_and(|v| !v.trim().is_empty()) })
                .collect(),
            timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
            retry: format!("{} attempt(s), backoff from {} ms", spec.retry.max_attempts, spec.retry.backoff.as_millis()),
            async_policy: label(&spec.async_policy),
            chainable: spec.chainable,
            max_result_bytes: spec.max_result_bytes,
            connector: tool.connector.as_ref().map(|c| format!("{}: {:?} {}/{}", c.connector, c.action.method, c.base_url.trim_end_matches('/'), c.action.path)),
            owner_policy: policy(Actor::Owner),
            customer_policy: policy(Actor::Customer),
            hooks: catalog.hooks.iter().filter(|h| h.applies_to(name)).map(|h| format!("{} ({}, {})", h.spec.name, label(&h.spec.point), label(&h.spec.kind))).collect(),
            example_args: serde_json::to_string_pretty(&example).unwrap_or_else(|_| "{}".into()),
            recent_calls,
        })
    }

    async fn try_tool(&self, owner_id: i64, name: &str, args_json: &str, chat_type: &str, ip: &str) -> Result<TryOutcome, AppError> {
        use crate::tools::{CallContext, ToolCall, catalog::ChatType, policy::Actor};
        let args: serde_json::Value = serde_json::from_str(if args_json.trim().is_empty() { "{}" } else { args_json })
            .map_err(|e| AppError::invalid(format!("The arguments are not valid JSON: {e}")))?;
        let chat_type = match chat_type {
            "group" => ChatType::Group,
            "direct" | "" => ChatType::Direct,
            other => return Err(AppError::invalid(format!("Unknown chat type {other:?}; use direct or group."))),
        };
        let correlation_id = format!("console-{}", uuid::Uuid::new_v4().simple());
        {
            let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
            let detail = serde_json::json!({ "tool": name, "correlation_id": correlation_id });
            audit::record(&mut conn, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event: audit::event::TOOL_TRY, detail: Some(detail), ..Default::default() })
                .await
                .map_err(internal)?;
        }
        let ctx = CallContext {
            actor: Actor::Owner,
            chat_type,
            chat_id: Some("console".into()),
            sender_id: Some(format!("owner:{owner_id}")),
            correlation_id: correlation_id.clone(),
            approved: false,
        };
        let started = std::time::Instant::now();
        let result = self.state.tools.execute(ToolCall { name: name.to_string(), args }, &ctx).await;
        // The page shows the call in "recent calls" right away.
        self.state.tools.audit().flush().await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(match result {
            Ok(ok) => TryOutcome {
                tool: name.to_string(),
                ok: true,
                code: "OK".into(),
                message: String::new(),
                output: Some(serde_json::to_string_pretty(&ok.output).unwrap_or_default()),
                attempts: ok.attempts,
                correlation_id,
                latency_ms,
            },
            Err(f) => TryOutcome { tool: name.to_string(), ok: false, code: f.code, message: f.message, output: None, attempts: 0, correlation_id, latency_ms },
        })
    }

    async fn reload_tools(&self, owner_id: i64, ip: &str) -> Result<ReloadOutcome, AppError> {
        let outcome = crate::tools::reload_catalog(&self.state.config.path, &self.state.mcp, &self.state.tools).await;
        let detail = match &outcome {
            Ok(r) => serde_json::json!({ "ok": true, "tools": r.tools, "changed": r.changed }),
            Err(crate::tools::ReloadError::Config(e)) => serde_json::json!({ "ok": false, "problems": e.0.len() }),
            Err(crate::tools::ReloadError::Mcp(_)) => serde_json::json!({ "ok": false, "problems": 1 }),
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        audit::record(&mut conn, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event: audit::event::TOOLS_RELOAD, detail: Some(detail), ..Default::default() })
            .await
            .map_err(internal)?;
        match outcome {
            Ok(r) => Ok(ReloadOutcome { tools: r.tools, changed: r.changed }),
            Err(crate::tools::ReloadError::Config(e)) => Err(AppError::new(
                code::CONFIG_INVALID,
                format!("The catalog was not reloaded; the current one stays. {} problem(s):\n{}", e.0.len(), e.0.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n")),
            )),
            Err(crate::tools::ReloadError::Mcp(e)) => Err(internal(e)),
        }
    }

    async fn conversations_page(&self, owner_id: i64) -> Result<ConversationsPage, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let chats = db::simulator::chats(&mut conn, 200)
            .await
            .map_err(internal)?
            .into_iter()
            .map(|c| ChatView { channel: c.channel, chat_id: c.chat_id, messages: c.messages, last_at: c.last_at })
            .collect();
        let owner_numbers = db::owners::phones_of(&mut conn, owner_id).await.map_err(internal)?;
        Ok(ConversationsPage { chats, owner_numbers })
    }

    async fn chat_detail(&self, channel: &str, chat_id: &str) -> Result<ChatDetail, AppError> {
        if !matches!(channel, "whatsapp" | "simulator") {
            return Err(AppError::invalid("The channel is whatsapp or simulator."));
        }
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let messages: Vec<ChatMessageView> = db::simulator::messages(&mut conn, channel, chat_id, 500)
            .await
            .map_err(internal)?
            .into_iter()
            .map(|m| ChatMessageView { direction: m.direction, sender: m.sender, text: m.text, state: m.state, error_code: m.error_code, trace_id: m.trace_id, at: m.at })
            .collect();
        if messages.is_empty() {
            return Err(AppError::new(code::NOT_FOUND, format!("There is no {channel} chat {chat_id:?}.")));
        }
        Ok(ChatDetail { channel: channel.into(), chat_id: chat_id.into(), messages })
    }

    async fn simulate(&self, _owner_id: i64, request: SimulateRequest) -> Result<SimulateOutcome, AppError> {
        use crate::conversation::{ChatKind, Inbound};
        let text = request.text.trim();
        if text.is_empty() || text.chars().count() > 4096 {
            return Err(AppError::invalid("Write a message of 1 to 4,096 characters."));
        }
        let digits: String = request.from.chars().filter(char::is_ascii_digit).collect();
        let plausible = request.from.trim().trim_start_matches('+').chars().all(|c| c.is_ascii_digit() || c == ' ' || c == '-');
        if !plausible || !(6..=15).contains(&digits.len()) {
            return Err(AppError::invalid("The sender must be a phone number (6 to 15 digits, + allowed)."));
        }
        let chat_id = match request.chat_id.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
            Some(c) if c.len() > 100 => return Err(AppError::invalid("The chat id is too long.")),
            Some(c) => c.to_string(),
            None if request.group => "sim-group".to_string(),
            None => format!("sim-{digits}"),
        };
        let id = uuid::Uuid::new_v4().simple().to_string();
        let inbound = Inbound {
            channel: "simulator".into(),
            message_id: format!("sim_{id}"),
            chat_id: chat_id.clone(),
            chat_kind: if request.group { ChatKind::Group } else { ChatKind::Direct },
            sender: digits.clone(),
            text: text.to_string(),
            mentions_bot: request.group && request.mention,
            correlation_id: format!("sim-{id}"),
            ..Inbound::default()
        };
        let outcome = self.state.runtime.handle(&inbound).await.map_err(internal)?;
        let now = db::now_ms();
        let mut tx = self.state.db.begin_write().await.map_err(internal)?;
        let incoming = db::simulator::NewSimMessage {
            chat_id: &chat_id,
            direction: "in",
            sender: &digits,
            text,
            message_id: &inbound.message_id,
            state: "received",
            trace_id: outcome.trace_id,
            at: now,
        };
        db::simulator::insert(&mut tx, &incoming).await.map_err(internal)?;
        if let Some(reply) = &outcome.reply {
            let reply_id = format!("{}_reply", inbound.message_id);
            let out = db::simulator::NewSimMessage { direction: "out", sender: "bot", text: reply, message_id: &reply_id, state: "delivered", at: now + 1, ..incoming };
            db::simulator::insert(&mut tx, &out).await.map_err(internal)?;
            if let Some(trace_id) = outcome.trace_id {
                let step = db::traces::Step { step: "delivery".into(), decision: "delivered".into(), reason_code: "SIMULATOR".into(), duration_us: 0, detail: "{}".into() };
                db::traces::append_step(&mut tx, trace_id, &step).await.map_err(internal)?;
            }
        }
        tx.commit().await.map_err(internal)?;
        Ok(SimulateOutcome {
            chat_id,
            message_id: inbound.message_id,
            actor: outcome.actor.as_str().into(),
            route: outcome.route.as_str().into(),
            reply: outcome.reply,
            trace_id: outcome.trace_id,
            error_code: outcome.error_code,
        })
    }

    async fn traces_page(&self, q: &TraceQuery) -> Result<TracesPage, AppError> {
        const PAGE: i64 = 50;
        let filter = db::traces::TraceFilter {
            chat_id: q.chat.trim().to_string(),
            route: q.route.clone(),
            outcome: q.outcome.clone(),
            error_code: q.error_code.trim().to_string(),
            since_ms: if q.since_minutes > 0 { db::now_ms() - q.since_minutes * 60_000 } else { 0 },
            before_id: q.before.max(0),
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let mut rows = db::traces::list(&mut conn, &filter, PAGE + 1).await.map_err(internal)?;
        let next_before = (rows.len() as i64 > PAGE).then(|| rows[PAGE as usize - 1].id);
        rows.truncate(PAGE as usize);
        Ok(TracesPage { traces: rows.into_iter().map(trace_summary).collect(), next_before })
    }

    async fn trace_detail(&self, id: i64) -> Result<TraceDetail, AppError> {
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        let (trace, steps) = db::traces::get(&mut conn, id).await.map_err(internal)?.ok_or_else(|| AppError::new(code::NOT_FOUND, format!("There is no trace #{id}.")))?;
        let steps = steps
            .into_iter()
            .map(|s| {
                let detail = serde_json::from_str::<serde_json::Value>(&s.detail).map(|v| serde_json::to_string_pretty(&v).unwrap_or_default()).unwrap_or(s.detail);
                TraceStepView { step: s.step, decision: s.decision, reason_code: s.reason_code, duration_us: s.duration_us, detail: if detail == "{}" { "{}".into() } else { detail } }
            })
            .collect();
        Ok(TraceDetail { summary: trace_summary(trace), steps })
    }

    async fn mcp_page(&self) -> Result<McpPage, AppError> {
        let mcp = &self.state.mcp;
        let mut servers = Vec::new();
        for s in mcp.servers().await.map_err(mcp_error)? {
            let tools = mcp
                .tools(&s.id)
                .await
                .map_err(mcp_error)?
                .into_iter()
                .map(|t| {
                    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
                    let definition = pretty(&t.definition);
                    let diff = t.previous_definition.as_ref().map(|old| line_diff(&pretty(old), &definition)).unwrap_or_default();
                    McpToolView { catalog_name: t.catalog_name, name: t.name, state: t.state, usable: t.usable, present: t.present, definition_hash: t.definition_hash, definition, diff }
                })
                .collect();
            servers.push(McpServerView {
                id: s.id,
                transport: s.transport.to_string(),
                target: s.target,
                trust: label(&s.trust),
                enabled: s.enabled,
                health: s.health,
                last_error: s.last_error,
                last_seen_at: s.last_seen_at,
                tool_count: s.tool_count,
                pending: s.pending,
                tools,
            });
        }
        Ok(McpPage { config_path: self.state.config.dir.join("mcp.toml").display().to_string(), servers })
    }

    async fn mcp_set_enabled(&self, owner_id: i64, server: &str, enabled: bool, ip: &str) -> Result<(), AppError> {
        self.state.mcp.set_enabled(server, enabled, &self.mcp_actor(owner_id, ip)).await.map_err(mcp_error)
    }

    async fn mcp_refresh(&self, owner_id: i64, server: &str, ip: &str) -> Result<String, AppError> {
        let r = self.state.mcp.refresh(server, Some(&self.mcp_actor(owner_id, ip))).await.map_err(mcp_error)?;
        let mut text = format!("{server}: {} tool(s) listed, {} taken, in {} ms.", r.listed, r.taken, r.elapsed_ms);
        if r.truncated {
            text.push_str(" The list was longer than the configured bound; the rest was ignored.");
        }
        if !r.skipped.is_empty() {
            text.push_str(&format!(" {} skipped (see the log).", r.skipped.len()));
        }
        Ok(text)
    }

    async fn mcp_decide(&self, owner_id: i64, tool: &str, approve: bool, ip: &str) -> Result<(), AppError> {
        let by = self.mcp_actor(owner_id, ip);
        let done = if approve { self.state.mcp.approve(tool, &by).await } else { self.state.mcp.reject(tool, &by).await };
        done.map(|_| ()).map_err(mcp_error)
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

fn trace_summary(t: db::traces::TraceRow) -> TraceSummary {
    TraceSummary {
        id: t.id,
        correlation_id: t.correlation_id,
        channel: t.channel,
        chat_id: t.chat_id,
        message_id: t.message_id,
        actor: t.actor,
        route: t.route,
        outcome: t.outcome,
        error_code: t.error_code,
        started_at: t.started_at,
        duration_us: t.duration_us,
    }
}

fn mcp_error(e: crate::tools::mcp::McpError) -> AppError {
    use crate::tools::mcp::McpError;
    match e {
        McpError::UnknownServer(_) | McpError::UnknownTool(_) => AppError::new(code::NOT_FOUND, e.to_string()),
        McpError::Unavailable(_) => AppError::new(code::CONFLICT, e.to_string()),
        McpError::Db(_) => internal(e),
    }
}

/// A line diff of two texts (longest common subsequence): "  " same, "- " removed, "+ " added.
/// Definitions are bounded by discovery, so the quadratic table stays small; past 2,000 lines
/// each side is shown whole instead.
pub fn line_diff(old: &str, new: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    if a.len() > 2_000 || b.len() > 2_000 {
        return a.iter().map(|l| format!("- {l}")).chain(b.iter().map(|l| format!("+ {l}"))).collect();
    }
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push(format!("  {}", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(format!("+ {}", b[j]));
            j += 1;
        } else {
            out.push(format!("- {}", a[i]));
            i += 1;
        }
    }
    out
}

/// The snake_case name serde gives an enum value.
fn label<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn call_view(r: &db::tool_audit::AuditRow) -> ToolCallView {
    ToolCallView {
        at: r.at,
        tool: r.tool.clone(),
        version: r.version.clone(),
        actor: r.actor.clone(),
        chat_type: r.chat_type.clone(),
        chat_id: r.chat_id.clone(),
        decision: r.decision.clone(),
        reason_code: r.reason_code.clone(),
        latency_us: r.latency_us,
        attempts: r.attempts,
        correlation_id: r.correlation_id.clone(),
    }
}

impl ConsoleBackend {
    fn mcp_actor(&self, owner_id: i64, ip: &str) -> crate::tools::mcp::Actor {
        crate::tools::mcp::Actor { owner_id: Some(owner_id), login: None, ip: Some(ip.to_string()) }
    }

    fn tool_summary(&self, t: &crate::tools::ToolDef) -> ToolSummary {
        use crate::tools::breaker::BreakerState;
        let s = &t.spec;
        let breaker = match self.state.tools.breakers().state(&s.name, std::time::Instant::now()) {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        };
        ToolSummary {
            name: s.name.clone(),
            title: s.title.clone(),
            description: s.description.clone(),
            provider: label(&s.provider),
            operation: label(&s.operation),
            audience: label(&s.audience),
            risk: label(&s.risk),
            approval: label(&s.approval),
            enabled: s.enabled,
            version: t.version.clone(),
            breaker: breaker.into(),
            tags: s.tags.clone(),
        }
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
