//! The tool catalog, a tool's detail with its policy, the try-it form and catalog reloads.

use app::{
    backend::ToolsBackend,
    dto::{OwnerNotice, ReloadOutcome, SecretFieldView, ToolDetail, ToolSummary, ToolsPage, ToolsQuery, TryOutcome},
    error::{AppError, code},
};

use super::{ConsoleBackend, call_view, internal, label};
use crate::db::{self, audit};

#[async_trait::async_trait]
impl ToolsBackend for ConsoleBackend {
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
        use crate::{
            domain::Role,
            tools::policy::{Decision, decide},
        };
        let catalog = self.state.tools.catalog();
        let tool = catalog.get(name).ok_or_else(|| AppError::new(code::NOT_FOUND, format!("There is no tool named {name:?} in the catalog.")))?;
        let spec = &tool.spec;
        let policy = |actor: Role| match decide(spec, catalog.approval_mode, actor) {
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
                .map(|(field, var)| SecretFieldView { field: field.clone(), variable: var.clone(), set: self.state.config.secrets.source.is_set(var) })
                .collect(),
            timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
            retry: format!("{} attempt(s), backoff from {} ms", spec.retry.max_attempts, spec.retry.backoff.as_millis()),
            async_policy: label(&spec.async_policy),
            chainable: spec.chainable,
            max_result_bytes: spec.max_result_bytes,
            answer_template: spec.answer_template.clone(),
            connector: tool.connector.as_ref().map(|c| format!("{}: {:?} {}/{}", c.connector, c.action.method, c.base_url.trim_end_matches('/'), c.action.path)),
            owner_policy: policy(Role::Owner),
            customer_policy: policy(Role::Customer),
            hooks: catalog.hooks.iter().filter(|h| h.applies_to(name)).map(|h| format!("{} ({}, {})", h.spec.name, label(&h.spec.point), label(&h.spec.kind))).collect(),
            example_args: serde_json::to_string_pretty(&example).unwrap_or_else(|_| "{}".into()),
            recent_calls,
        })
    }

    async fn try_tool(&self, owner_id: i64, name: &str, args_json: &str, chat_type: &str, ip: &str) -> Result<TryOutcome, AppError> {
        use crate::{
            domain::{ChatKind, Role},
            tools::{CallContext, ToolCall},
        };
        let args: serde_json::Value = serde_json::from_str(if args_json.trim().is_empty() { "{}" } else { args_json })
            .map_err(|e| AppError::invalid(format!("The arguments are not valid JSON: {e}")))?;
        let chat_type = match chat_type {
            "group" => ChatKind::Group,
            "direct" | "" => ChatKind::Direct,
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
            actor: Role::Owner,
            chat_type,
            chat_id: Some("console".into()),
            sender_id: Some(format!("owner:{owner_id}")),
            correlation_id: correlation_id.clone(),
            approved: None,
            trace_id: None,
        };
        let started = std::time::Instant::now();
        let call = ToolCall { name: name.to_string(), args };
        // A call that needs an owner becomes a request on the Approvals page instead of failing.
        if let Ok(crate::tools::checkpoint::Checked { needs_approval: Some(_), .. }) = self.state.tools.check(&call, &ctx) {
            let who = crate::approvals::Requester {
                actor: Role::Owner,
                channel: crate::approvals::CONSOLE.into(),
                chat_kind: chat_type,
                chat_id: "console".into(),
                sender: format!("owner:{owner_id}"),
                message_id: correlation_id.clone(),
                request: format!("Try it: {name}"),
                correlation_id: correlation_id.clone(),
            };
            let requested = self.state.approvals.request(&call, &who, None, None).await.map_err(|e| match e {
                crate::approvals::ApprovalError::Db(e) => internal(e),
                other => internal(other),
            })?;
            let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Ok(TryOutcome {
                tool: name.to_string(),
                ok: false,
                code: crate::tools::checkpoint::ToolCode::NeedsApproval.as_str().into(),
                message: format!("Nothing ran. The call waits as approval request #{} until an owner decides.", requested.id),
                output: None,
                attempts: 0,
                correlation_id,
                latency_ms,
                approval_id: Some(requested.id),
            });
        }
        let result = self.state.tools.execute(call, &ctx).await;
        // The page shows the call in "recent calls" right away.
        self.state.tools.audit().flush().await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(match result {
            Ok(ok) => TryOutcome {
                tool: name.to_string(),
                ok: true,
                code: "OK".into(),
                message: String::new(),
                output: Some(serde_json::to_string_pretty(&self.shown_result(name, ok.output)).unwrap_or_default()),
                attempts: ok.attempts,
                correlation_id,
                latency_ms,
                approval_id: None,
            },
            Err(f) => TryOutcome { tool: name.to_string(), ok: false, code: f.code, message: f.message, output: None, attempts: 0, correlation_id, latency_ms, approval_id: None },
        })
    }

    async fn reload_tools(&self, owner_id: i64, ip: &str) -> Result<ReloadOutcome, AppError> {
        let outcome = self.state.reloads.reload().await;
        let detail = match &outcome {
            Ok(r) => serde_json::json!({ "ok": true, "tools": r.tools, "changed": r.changed }),
            Err(crate::tools::ReloadError::Files(problems)) => serde_json::json!({ "ok": false, "problems": problems.len() }),
            Err(crate::tools::ReloadError::Mcp(_)) => serde_json::json!({ "ok": false, "problems": 1 }),
        };
        let mut conn = self.state.db.pool.acquire().await.map_err(internal)?;
        audit::record(&mut conn, audit::AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event: audit::event::TOOLS_RELOAD, detail: Some(detail), ..Default::default() })
            .await
            .map_err(internal)?;
        match outcome {
            Ok(r) => Ok(ReloadOutcome { tools: r.tools, changed: r.changed }),
            Err(crate::tools::ReloadError::Files(problems)) => Err(AppError::new(
                code::CONFIG_INVALID,
                format!("The catalog was not reloaded; the current one stays. {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n")),
            )),
            Err(crate::tools::ReloadError::Mcp(crate::tools::mcp::McpError::Db(e))) => Err(internal(e)),
            Err(crate::tools::ReloadError::Mcp(e)) => Err(internal(e)),
        }
    }

}


impl ConsoleBackend {
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

impl ConsoleBackend {
    /// A result as the page shows it: without fields whose names look secret, nor the tool's
    /// secret and managed fields, as a result stored for being large is kept.
    fn shown_result(&self, tool: &str, mut output: serde_json::Value) -> serde_json::Value {
        match self.state.tools.catalog().get(tool) {
            Some(def) => def.spec.redact_result(&mut output),
            None => crate::redact::redact(&mut output),
        }
        output
    }
}
