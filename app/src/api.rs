//! Server functions. Each is a thin shell over one of [`crate::backend`]'s traits; every one but
//! those in [`PUBLIC_SERVER_FNS`] starts with `require_owner()`, and the server also refuses
//! requests to the others without a session before they run.

use leptos::prelude::*;

use crate::{
    dto::{ApprovalsPage, ChatDetail, ConversationsPage, DashboardInfo, JobDetail, JobsPage, McpPage, ReloadOutcome, SettingsInfo, ShellInfo, SimulateOutcome, ToolDetail, ToolsPage, TraceDetail, TracesPage, TryOutcome},
    error::AppError,
};
#[cfg(feature = "ssr")]
use crate::{
    auth::{answer, backend, begin_session, client_ip, require_owner, retry_after, session},
    backend::LoginOutcome,
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

#[server(endpoint = "setup_owner")]
pub async fn setup_owner(
    display_name: String,
    login: String,
    password: String,
    password_confirm: String,
    whatsapp: String,
) -> Result<(), AppError> {
    answer(
        async {
            if password != password_confirm {
                return Err(AppError::invalid("The two passwords differ."));
            }
            let backend = backend()?;
            let ip = client_ip().await;
            let who = backend
                .create_first_owner(NewOwner { display_name, login, password, phones: whatsapp }, &ip)
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
            match backend.login(&login, &password, &ip).await? {
                LoginOutcome::Ok(who) => {
                    begin_session(&session().await?, &who).await?;
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

#[server(endpoint = "current_owner")]
pub async fn current_owner() -> Result<ShellInfo, AppError> {
    answer(require_owner().await)
}

#[server(endpoint = "dashboard_facts")]
pub async fn dashboard_facts() -> Result<DashboardInfo, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.dashboard().await
        }
        .await,
    )
}

#[server(endpoint = "console_settings")]
pub async fn console_settings() -> Result<SettingsInfo, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.settings(me.owner_id).await
        }
        .await,
    )
}

#[server(endpoint = "update_phones")]
pub async fn update_phones(phones: String) -> Result<Vec<String>, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.update_phones(me.owner_id, &phones, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "list_jobs")]
pub async fn list_jobs(state: String, tool: String, chat: String, since_minutes: i64, before: i64) -> Result<JobsPage, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.jobs_page(&crate::dto::JobQuery { state, tool, chat, since_minutes, before }).await
        }
        .await,
    )
}

#[server(endpoint = "get_job")]
pub async fn get_job(id: i64) -> Result<JobDetail, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.job_detail(id).await
        }
        .await,
    )
}

#[server(endpoint = "retry_job")]
pub async fn retry_job(id: i64) -> Result<(), AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.retry_job(me.owner_id, id, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "cancel_job")]
pub async fn cancel_job(id: i64) -> Result<(), AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.cancel_job(me.owner_id, id, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "list_tools")]
pub async fn list_tools(provider: String, audience: String, risk: String) -> Result<ToolsPage, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.tools_page(&crate::dto::ToolsQuery { provider, audience, risk }).await
        }
        .await,
    )
}

#[server(endpoint = "get_tool")]
pub async fn get_tool(name: String) -> Result<ToolDetail, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.tool_detail(&name).await
        }
        .await,
    )
}

/// Runs a call through the checkpoint as the signed-in owner.
#[server(endpoint = "try_tool")]
pub async fn try_tool(name: String, args: String, chat_type: String) -> Result<TryOutcome, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.try_tool(me.owner_id, &name, &args, &chat_type, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "reload_tools")]
pub async fn reload_tools() -> Result<ReloadOutcome, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.reload_tools(me.owner_id, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "mcp_servers")]
pub async fn mcp_servers() -> Result<McpPage, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.mcp_page().await
        }
        .await,
    )
}

/// Enables ("true") or disables ("false") an MCP server.
#[server(endpoint = "mcp_set_enabled")]
pub async fn mcp_set_enabled(server: String, enabled: String) -> Result<(), AppError> {
    answer(
        async {
            let me = require_owner().await?;
            let enabled = match enabled.as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(AppError::invalid("enabled must be true or false")),
            };
            backend()?.mcp_set_enabled(me.owner_id, &server, enabled, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "mcp_refresh")]
pub async fn mcp_refresh(server: String) -> Result<String, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.mcp_refresh(me.owner_id, &server, &client_ip().await).await
        }
        .await,
    )
}

/// Approves ("approve") or rejects ("reject") a quarantined MCP tool, by catalog name, bound to
/// the definition hash the page showed: a definition that changed since is not decided.
#[server(endpoint = "mcp_decide")]
pub async fn mcp_decide(tool: String, decision: String, hash: String) -> Result<(), AppError> {
    answer(
        async {
            let me = require_owner().await?;
            let approve = match decision.as_str() {
                "approve" => true,
                "reject" => false,
                _ => return Err(AppError::invalid("decision must be approve or reject")),
            };
            backend()?.mcp_decide(me.owner_id, &tool, approve, &hash, &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "list_approvals")]
pub async fn list_approvals() -> Result<ApprovalsPage, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.approvals_page().await
        }
        .await,
    )
}

/// Approves ("approve") or rejects ("reject", with an optional reason) a waiting tool call.
#[server(endpoint = "decide_approval")]
pub async fn decide_approval(id: i64, decision: String, reason: Option<String>) -> Result<String, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            let approve = match decision.as_str() {
                "approve" => true,
                "reject" => false,
                _ => return Err(AppError::invalid("decision must be approve or reject")),
            };
            backend()?.decide_approval(me.owner_id, id, approve, reason.as_deref().unwrap_or_default(), &client_ip().await).await
        }
        .await,
    )
}

#[server(endpoint = "list_traces")]
pub async fn list_traces(chat: String, route: String, outcome: String, error_code: String, since_minutes: i64, before: i64) -> Result<TracesPage, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.traces_page(&crate::dto::TraceQuery { chat, route, outcome, error_code, since_minutes, before }).await
        }
        .await,
    )
}

#[server(endpoint = "get_trace")]
pub async fn get_trace(id: i64) -> Result<TraceDetail, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.trace_detail(id).await
        }
        .await,
    )
}

#[server(endpoint = "list_chats")]
pub async fn list_chats() -> Result<ConversationsPage, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            backend()?.conversations_page(me.owner_id).await
        }
        .await,
    )
}

#[server(endpoint = "get_chat")]
pub async fn get_chat(channel: String, chat_id: String) -> Result<ChatDetail, AppError> {
    answer(
        async {
            require_owner().await?;
            backend()?.chat_detail(&channel, &chat_id).await
        }
        .await,
    )
}

/// The console's simulator form: one message through the same runtime as WhatsApp. `group` is a
/// checkbox: absent when unchecked.
#[server(endpoint = "simulate_message")]
pub async fn simulate_message(from: String, text: String, chat_id: String, group: Option<String>) -> Result<SimulateOutcome, AppError> {
    answer(
        async {
            let me = require_owner().await?;
            let request = crate::dto::SimulateRequest {
                from,
                text,
                chat_id: Some(chat_id).filter(|c| !c.trim().is_empty()),
                group: group.as_deref() == Some("true"),
                mention: group.as_deref() == Some("true"),
            };
            backend()?.simulate(me.owner_id, request).await
        }
        .await,
    )
}
