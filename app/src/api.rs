//! Server functions. Each is a thin shell over one of [`crate::backend`]'s traits; every one but
//! those in [`PUBLIC_SERVER_FNS`] starts with `require_owner()`, and the server also refuses
//! requests to the others without a session before they run.

use leptos::prelude::*;

use crate::{
    dto::{ApprovalsPage, ChatDetail, ConversationsPage, DashboardInfo, JobDetail, JobsPage, McpPage, ReloadOutcome, RepairsPage, SettingsInfo, ShellInfo, SimulateOutcome, ToolDetail, ToolsPage, TraceDetail, TracesPage, TryOutcome, WaitingInfo},
    error::AppError,
};
#[cfg(feature = "ssr")]
use crate::{
    auth::{answer, backend, begin_session, client_ip, device_cookie, for_owner, local_peer, require_owner, retry_after, session, set_cookie},
    backend::{LoginOutcome, SetupAccess},
    dto::NewOwner,
    error::code,
};

/// Server functions reachable without a session. Everything else answers 401 without one.
pub const PUBLIC_SERVER_FNS: &[&str] = &["/api/login", "/api/setup_owner"];

/// Only plain same-origin paths are followed after login. Anything that a browser could read
/// as another origin (`//host`, `/\\host`, or with tabs and line breaks it strips) goes to `/`.
#[cfg(feature = "ssr")]
pub fn safe_next(next: &str) -> &str {
    let plain = next.starts_with('/')
        && !next.starts_with("//")
        && next.len() <= 512
        && next.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'\\');
    if plain { next } else { "/" }
}

/// "approve" or "reject", as the decision forms send it.
#[cfg(feature = "ssr")]
fn approves(decision: &str) -> Result<bool, AppError> {
    match decision {
        "approve" => Ok(true),
        "reject" => Ok(false),
        _ => Err(AppError::invalid("decision must be approve or reject")),
    }
}

#[server(endpoint = "setup_owner")]
pub async fn setup_owner(
    display_name: String,
    login: String,
    password: String,
    password_confirm: String,
    whatsapp: String,
    #[server(default)] token: String,
) -> Result<(), AppError> {
    answer(
        async {
            let backend = backend()?;
            // Once an owner exists, setup is gone (410) whatever was typed.
            if !backend.setup_open().await? {
                return Err(AppError::new(crate::error::code::SETUP_CLOSED, "Setup is closed: an owner already exists. Log in instead."));
            }
            if password != password_confirm {
                return Err(AppError::invalid("The two passwords differ."));
            }
            let ip = client_ip().await;
            let access = SetupAccess { local: local_peer().await, token };
            let who = backend
                .create_first_owner(NewOwner { display_name, login, password, phones: whatsapp }, &ip, access)
                .await?;
            begin_session(&session().await?, &who).await?;
            leptos_axum::redirect("/");
            Ok(())
        }
        .await,
    )
}

#[server(endpoint = "login")]
pub async fn login(login: String, password: String, next: String) -> Result<(), AppError> {
    answer(
        async {
            let backend = backend()?;
            let ip = client_ip().await;
            let device = device_cookie().await;
            match backend.login(&login, &password, &ip, device.as_deref()).await? {
                LoginOutcome::Ok { who, device_cookie } => {
                    begin_session(&session().await?, &who).await?;
                    set_cookie(&device_cookie);
                    leptos_axum::redirect(safe_next(&next));
                    Ok(())
                }
                LoginOutcome::Rejected => Err(AppError::new(code::LOGIN_FAILED, "Wrong login name or password.")),
                LoginOutcome::Throttled { retry_after_secs } => {
                    retry_after(retry_after_secs);
                    Err(AppError::new(code::LOGIN_THROTTLED, "Too many failed attempts. Wait a few minutes and try again."))
                }
            }
        }
        .await,
    )
}

#[server(endpoint = "logout")]
pub async fn logout() -> Result<(), AppError> {
    answer(
        async {
            let me = require_owner().await?;
            let session = session().await?;
            session.flush().await.map_err(|e| {
                tracing::error!(error = %e, "logout could not delete the session");
                AppError::internal()
            })?;
            backend()?.record_logout(me.owner_id, &client_ip().await).await?;
            leptos_axum::redirect("/login");
            Ok(())
        }
        .await,
    )
}

/// Added to a server function's path, the key a refused form's input is kept under
/// (`auth::for_owner_keeping`, [`crate::pages::form_input`]).
pub const INPUT_KEY: &str = "#input";

/// What the browser's last plain form post to the server function at `path` answered, kept for
/// the page it came back to (JSON, taken once); see [`crate::pages::form_action`].
#[server(endpoint = "take_answer")]
pub async fn take_answer(path: String) -> Result<Option<String>, AppError> {
    for_owner(|_, _| async move { crate::auth::take_answer(&path).await }).await
}

#[server(endpoint = "current_owner")]
pub async fn current_owner() -> Result<ShellInfo, AppError> {
    answer(require_owner().await)
}

#[server(endpoint = "dashboard_facts")]
pub async fn dashboard_facts() -> Result<DashboardInfo, AppError> {
    for_owner(|_, backend| async move { backend.dashboard().await }).await
}

#[server(endpoint = "waiting")]
pub async fn waiting() -> Result<WaitingInfo, AppError> {
    for_owner(|_, backend| async move { backend.waiting().await }).await
}

#[server(endpoint = "console_settings")]
pub async fn console_settings() -> Result<SettingsInfo, AppError> {
    for_owner(|me, backend| async move { backend.settings(me.owner_id).await }).await
}

#[server(endpoint = "update_phones")]
pub async fn update_phones(phones: String) -> Result<Vec<String>, AppError> {
    let typed = UpdatePhones { phones: phones.clone() };
    crate::auth::for_owner_keeping(&typed, crate::auth::KeepInput::Refused, |me, backend| async move { backend.update_phones(me.owner_id, &phones, &client_ip().await).await }).await
}

#[server(endpoint = "list_jobs")]
pub async fn list_jobs(state: String, tool: String, chat: String, since_minutes: i64, before: i64) -> Result<JobsPage, AppError> {
    let query = crate::dto::JobQuery { state, tool, chat, since_minutes, before };
    for_owner(|_, backend| async move { backend.jobs_page(&query).await }).await
}

#[server(endpoint = "get_job")]
pub async fn get_job(id: i64) -> Result<JobDetail, AppError> {
    for_owner(|_, backend| async move { backend.job_detail(id).await }).await
}

#[server(endpoint = "retry_job")]
pub async fn retry_job(id: i64) -> Result<(), AppError> {
    for_owner(|me, backend| async move { backend.retry_job(me.owner_id, id, &client_ip().await).await }).await
}

#[server(endpoint = "run_job_again")]
pub async fn run_job_again(id: i64) -> Result<i64, AppError> {
    for_owner(|me, backend| async move { backend.run_job_again(me.owner_id, id, &client_ip().await).await }).await
}

#[server(endpoint = "cancel_job")]
pub async fn cancel_job(id: i64) -> Result<(), AppError> {
    for_owner(|me, backend| async move { backend.cancel_job(me.owner_id, id, &client_ip().await).await }).await
}

#[server(endpoint = "list_tools")]
pub async fn list_tools(provider: String, audience: String, risk: String) -> Result<ToolsPage, AppError> {
    let query = crate::dto::ToolsQuery { provider, audience, risk };
    for_owner(|_, backend| async move { backend.tools_page(&query).await }).await
}

#[server(endpoint = "get_tool")]
pub async fn get_tool(name: String) -> Result<ToolDetail, AppError> {
    for_owner(|_, backend| async move { backend.tool_detail(&name).await }).await
}

/// Runs a call through the checkpoint as the signed-in owner.
#[server(endpoint = "try_tool")]
pub async fn try_tool(name: String, args: String, chat_type: String) -> Result<TryOutcome, AppError> {
    let typed = TryTool { name: name.clone(), args: args.clone(), chat_type: chat_type.clone() };
    crate::auth::for_owner_keeping(&typed, crate::auth::KeepInput::Always, |me, backend| async move { backend.try_tool(me.owner_id, &name, &args, &chat_type, &client_ip().await).await }).await
}

#[server(endpoint = "reload_tools")]
pub async fn reload_tools() -> Result<ReloadOutcome, AppError> {
    for_owner(|me, backend| async move { backend.reload_tools(me.owner_id, &client_ip().await).await }).await
}

#[server(endpoint = "mcp_servers")]
pub async fn mcp_servers() -> Result<McpPage, AppError> {
    for_owner(|_, backend| async move { backend.mcp_page().await }).await
}

/// Enables ("true") or disables ("false") an MCP server.
#[server(endpoint = "mcp_set_enabled")]
pub async fn mcp_set_enabled(server: String, enabled: String) -> Result<(), AppError> {
    for_owner(|me, backend| async move {
        let enabled = match enabled.as_str() {
            "true" => true,
            "false" => false,
            _ => return Err(AppError::invalid("enabled must be true or false")),
        };
        backend.mcp_set_enabled(me.owner_id, &server, enabled, &client_ip().await).await
    })
    .await
}

#[server(endpoint = "mcp_refresh")]
pub async fn mcp_refresh(server: String) -> Result<String, AppError> {
    for_owner(|me, backend| async move { backend.mcp_refresh(me.owner_id, &server, &client_ip().await).await }).await
}

/// Approves ("approve") or rejects ("reject") a quarantined MCP tool, by catalog name, bound to
/// the definition hash the page showed: a definition that changed since is not decided.
#[server(endpoint = "mcp_decide")]
pub async fn mcp_decide(tool: String, decision: String, hash: String) -> Result<(), AppError> {
    for_owner(|me, backend| async move {
        let approve = approves(&decision)?;
        backend.mcp_decide(me.owner_id, &tool, approve, &hash, &client_ip().await).await
    })
    .await
}

/// Answers a form an MCP server asked for during a call: "accept" (with `values`, checked
/// against the form's schema; omitted fields take their defaults), "decline" or "cancel".
#[server(endpoint = "mcp_answer_form")]
pub async fn mcp_answer_form(id: i64, decision: String, #[server(default)] values: std::collections::BTreeMap<String, String>) -> Result<String, AppError> {
    let typed = McpAnswerForm { id, decision: decision.clone(), values: values.clone() };
    crate::auth::for_owner_keeping(&typed, crate::auth::KeepInput::Refused, |me, backend| async move {
        if !matches!(decision.as_str(), "accept" | "decline" | "cancel") {
            return Err(AppError::invalid("decision must be accept, decline or cancel"));
        }
        backend.mcp_answer_form(me.owner_id, id, &decision, values.into_iter().collect(), &client_ip().await).await
    })
    .await
}

#[server(endpoint = "list_approvals")]
pub async fn list_approvals() -> Result<ApprovalsPage, AppError> {
    for_owner(|_, backend| async move { backend.approvals_page().await }).await
}

/// Approves ("approve") or rejects ("reject", with an optional reason) a waiting tool call.
#[server(endpoint = "decide_approval")]
pub async fn decide_approval(id: i64, decision: String, reason: Option<String>) -> Result<String, AppError> {
    for_owner(|me, backend| async move {
        let approve = approves(&decision)?;
        backend.decide_approval(me.owner_id, id, approve, reason.as_deref().unwrap_or_default(), &client_ip().await).await
    })
    .await
}

#[server(endpoint = "list_repairs")]
pub async fn list_repairs() -> Result<RepairsPage, AppError> {
    for_owner(|_, backend| async move { backend.repairs_page().await }).await
}

/// Scans new traces, makes eval cases and proposes repairs now.
#[server(endpoint = "run_repair_cycle")]
pub async fn run_repair_cycle() -> Result<String, AppError> {
    for_owner(|me, backend| async move { backend.run_cycle(me.owner_id, &client_ip().await).await })
        .await
}

/// "approve" (with `confirm` = "yes" for a proposal that breaks a passing case), "reject"
/// (with a reason) or "rollback" a repair.
#[server(endpoint = "decide_repair")]
pub async fn decide_repair(
    id: i64,
    action: String,
    confirm: Option<String>,
    seen: Option<String>,
    reason: Option<String>,
) -> Result<String, AppError> {
    for_owner(|me, backend| async move {
        if !matches!(action.as_str(), "approve" | "reject" | "rollback") {
            return Err(AppError::invalid(
                "action must be approve, reject or rollback",
            ));
        }
        let confirm = confirm.as_deref() == Some("yes");
        backend
            .decide_repair(
                me.owner_id,
                id,
                &action,
                confirm,
                seen.as_deref(),
                reason.as_deref().unwrap_or_default(),
                &client_ip().await,
            )
            .await
    })
    .await
}

/// Marks a trace wrong: `expect` is what should have happened (normal_chat, guard, clarify or
/// tool:NAME[,NAME]); `pattern` a failure pattern's code or empty.
#[server(endpoint = "mark_trace")]
pub async fn mark_trace(
    trace_id: i64,
    expect: String,
    pattern: Option<String>,
    note: Option<String>,
) -> Result<String, AppError> {
    let typed = MarkTrace { trace_id, expect: expect.clone(), pattern: pattern.clone(), note: note.clone() };
    let mark = crate::dto::TraceMark {
        trace_id,
        expect,
        pattern: pattern.unwrap_or_default(),
        note: note.unwrap_or_default(),
    };
    crate::auth::for_owner_keeping(&typed, crate::auth::KeepInput::Refused, |me, backend| async move {
        backend
            .mark_trace(me.owner_id, mark, &client_ip().await)
            .await
    })
    .await
}

#[server(endpoint = "list_traces")]
pub async fn list_traces(chat: String, route: String, outcome: String, error_code: String, since_minutes: i64, before: i64) -> Result<TracesPage, AppError> {
    let query = crate::dto::TraceQuery { chat, route, outcome, error_code, since_minutes, before };
    for_owner(|_, backend| async move { backend.traces_page(&query).await }).await
}

#[server(endpoint = "get_trace")]
pub async fn get_trace(id: i64) -> Result<TraceDetail, AppError> {
    for_owner(|_, backend| async move { backend.trace_detail(id).await }).await
}

#[server(endpoint = "list_chats")]
pub async fn list_chats() -> Result<ConversationsPage, AppError> {
    for_owner(|me, backend| async move { backend.conversations_page(me.owner_id).await }).await
}

#[server(endpoint = "get_chat")]
pub async fn get_chat(channel: String, chat_id: String) -> Result<ChatDetail, AppError> {
    for_owner(|_, backend| async move { backend.chat_detail(&channel, &chat_id).await }).await
}

/// The console's simulator form: one message through the same runtime as WhatsApp. `group` is a
/// checkbox: absent when unchecked.
#[server(endpoint = "simulate_message")]
pub async fn simulate_message(from: String, text: String, chat_id: String, group: Option<String>) -> Result<SimulateOutcome, AppError> {
    let typed = SimulateMessage { from: from.clone(), text: text.clone(), chat_id: chat_id.clone(), group: group.clone() };
    crate::auth::for_owner_keeping(&typed, crate::auth::KeepInput::Refused, |me, backend| async move {
        let request = crate::dto::SimulateRequest {
            from,
            text,
            chat_id: Some(chat_id).filter(|c| !c.trim().is_empty()),
            group: group.as_deref() == Some("true"),
            mention: group.as_deref() == Some("true"),
        };
        backend.simulate(me.owner_id, request).await
    })
    .await
}
