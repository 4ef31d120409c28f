//! MCP servers and the quarantine of their tools.

use app::{
    backend::McpBackend,
    dto::{McpFormField, McpFormView, McpPage, McpServerView, McpToolView},
    error::{AppError, code},
};

use super::{ConsoleBackend, internal, label};
use crate::tools::mcp::{
    Answer, AuditActor, McpError, PendingForm, Reviewed,
    elicitation::form::{Field, Kind},
};

fn shown(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn form_field(f: Field) -> McpFormField {
    let (options, format) = match &f.kind {
        Kind::Choice { options } => (options.clone(), None),
        Kind::Text { format, .. } => (Vec::new(), format.clone()),
        _ => (Vec::new(), None),
    };
    McpFormField {
        label: f.title.clone().unwrap_or_else(|| f.name.clone()),
        kind: f.kind.label().to_string(),
        default: f.default.as_ref().map(shown),
        name: f.name,
        description: f.description,
        required: f.required,
        options,
        format,
    }
}

/// How much of an MCP tool's description its row shows; the whole definition is one click away.
const DESCRIPTION_SHOWN: usize = 300;

fn form_view(p: PendingForm) -> McpFormView {
    McpFormView { id: p.id, server: p.server, message: p.message, fields: p.fields.into_iter().map(form_field).collect(), created_at: p.created_at, expires_at: p.expires_at }
}

#[async_trait::async_trait]
impl McpBackend for ConsoleBackend {
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
                    let diff = t.diff();
                    let description = t.definition.get("description").and_then(serde_json::Value::as_str).map(|d| d.chars().take(DESCRIPTION_SHOWN).collect()).unwrap_or_default();
                    McpToolView { catalog_name: t.catalog_name, name: t.name, description, state: t.state, usable: t.usable, present: t.present, definition_hash: t.definition_hash, definition, diff }
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
                auth: s.auth.to_string(),
                needs_login: s.needs_login,
                tools,
            });
        }
        let forms = mcp.forms().await.map_err(mcp_error)?.into_iter().map(form_view).collect();
        Ok(McpPage { config_path: self.state.config.dir.join("mcp.toml").display().to_string(), forms, servers })
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

    async fn mcp_decide(&self, owner_id: i64, tool: &str, approve: bool, reviewed_hash: &str, ip: &str) -> Result<(), AppError> {
        let by = self.mcp_actor(owner_id, ip);
        let reviewed = Reviewed::Definition(reviewed_hash);
        let done = if approve { self.state.mcp.approve(tool, reviewed, &by).await } else { self.state.mcp.reject(tool, reviewed, &by).await };
        done.map(|_| ()).map_err(mcp_error)
    }

    async fn mcp_answer_form(&self, owner_id: i64, id: i64, decision: &str, values: Vec<(String, String)>, ip: &str) -> Result<String, AppError> {
        let answer = match decision {
            "accept" => Answer::AcceptText(values),
            "decline" => Answer::Decline,
            "cancel" => Answer::Cancel,
            _ => return Err(AppError::invalid("decision must be accept, decline or cancel")),
        };
        let state = self.state.mcp.answer_form(id, answer, &self.mcp_actor(owner_id, ip)).await.map_err(mcp_error)?;
        Ok(format!("Form #{id}: {state}. The server gets the answer now."))
    }

}

impl ConsoleBackend {
    fn mcp_actor(&self, owner_id: i64, ip: &str) -> AuditActor {
        AuditActor { owner_id: Some(owner_id), login: None, ip: Some(ip.to_string()) }
    }
}

fn mcp_error(e: McpError) -> AppError {
    match e {
        McpError::UnknownServer(_) | McpError::UnknownTool(_) => AppError::new(code::NOT_FOUND, e.to_string()),
        McpError::Unavailable(_) | McpError::DefinitionChanged(_) => AppError::new(code::CONFLICT, e.to_string()),
        McpError::OAuth(ref o) => AppError::new(o.code(), e.to_string()),
        McpError::FormUnknown(_) => AppError::new("MCP_ELICITATION_UNKNOWN", e.to_string()),
        McpError::FormClosed(_) => AppError::new("MCP_ELICITATION_CLOSED", e.to_string()),
        McpError::FormInvalid(ref f) => AppError::new("MCP_ELICITATION_INVALID", format!("{}: {}", f.field, f.message)),
        McpError::Db(e) => internal(e),
    }
}

/// The OAuth login of an MCP server in the owner's browser: the Connect button posts to
/// [`START_PATH`] (same-origin, under the owner's session), which redirects to the authorization
/// server; that sends the browser back to [`CALLBACK_PATH`], which passes the answer on,
/// same-site, to [`FINISH_PATH`], where the owner's session (a SameSite=Strict cookie, not sent
/// on the cross-site redirect itself) finishes the login that owner started.
pub mod oauth_routes {
    use app::{auth::ClientIp, dto::ShellInfo};
    use axum::{
        Extension, Form, Router,
        extract::{Query, State},
        http::{HeaderValue, StatusCode, header},
        response::{Html, IntoResponse, Redirect, Response},
        routing::{get, post},
    };
    use crate::{
        tools::mcp::{AuditActor, CALLBACK_PATH, FINISH_PATH},
        web::AppState,
    };

    pub const START_PATH: &str = app::pages::mcp::OAUTH_START;

    /// The routes behind the owner guard (start and finish).
    pub fn owner_routes(state: AppState) -> Router {
        Router::new().route(START_PATH, post(start)).route(FINISH_PATH, get(finish)).with_state(state)
    }

    /// The callback, outside the guard: it only hands the answer on to [`FINISH_PATH`].
    pub fn callback_route() -> Router {
        Router::new().route(CALLBACK_PATH, get(callback))
    }

    fn back_to_page(query: &str) -> Response {
        Redirect::to(&format!("/mcp?{query}")).into_response()
    }

    fn failed(code: &str) -> Response {
        back_to_page(&format!("oauth_error={}", url::form_urlencoded::byte_serialize(code.as_bytes()).collect::<String>()))
    }

    #[derive(serde::Deserialize)]
    pub struct StartForm {
        server: String,
    }

    // Both routes take the owner the console guard let the request in as ([`ShellInfo`], from
    // its one read of the session); they are behind it, so a request without one is no owner's.

    async fn start(State(state): State<AppState>, me: Option<Extension<ShellInfo>>, ip: Option<Extension<ClientIp>>, Form(form): Form<StartForm>) -> Response {
        let Some(Extension(ShellInfo { owner_id, .. })) = me else { return StatusCode::UNAUTHORIZED.into_response() };
        let by = AuditActor { owner_id: Some(owner_id), login: None, ip: ip.map(|Extension(ClientIp(ip))| ip) };
        match state.mcp.begin_login(&form.server, Some(owner_id), &by).await {
            Ok(url) => Redirect::to(&url).into_response(),
            Err(e) => {
                tracing::warn!(mcp.server = %form.server, code = e.code(), error = %e, "MCP login could not start");
                failed(e.code())
            }
        }
    }

    /// A page that sends the browser on to the finish path with the same query, from this
    /// origin (a `meta` refresh): the owner's session cookie then comes along.
    async fn callback(uri: axum::http::Uri) -> Response {
        let query = uri.query().unwrap_or("");
        let target = format!("{FINISH_PATH}?{query}");
        let escaped = target.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;");
        let mut page = Html(format!(
            "<!doctype html><meta charset=utf-8><meta name=referrer content=no-referrer><meta http-equiv=refresh content=\"0;url={escaped}\"><title>Gatehouse</title><p><a href=\"{escaped}\">Continue to Gatehouse</a></p>"
        ))
        .into_response();
        page.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        page
    }

    #[derive(serde::Deserialize)]
    pub struct FinishQuery {
        code: Option<String>,
        state: Option<String>,
        iss: Option<String>,
        error: Option<String>,
    }

    async fn finish(State(state): State<AppState>, me: Option<Extension<ShellInfo>>, ip: Option<Extension<ClientIp>>, Query(q): Query<FinishQuery>) -> Response {
        let Some(Extension(ShellInfo { owner_id, .. })) = me else { return StatusCode::UNAUTHORIZED.into_response() };
        if q.error.is_some() {
            return failed("MCP_OAUTH_DENIED");
        }
        let (Some(code), Some(oauth_state)) = (q.code, q.state) else { return failed("MCP_OAUTH_LOGIN_UNKNOWN") };
        let by = AuditActor { owner_id: Some(owner_id), login: None, ip: ip.map(|Extension(ClientIp(ip))| ip) };
        match state.mcp.finish_login(Some(owner_id), &code, &oauth_state, q.iss.as_deref(), &by).await {
            Ok(server) => back_to_page(&format!("connected={server}")),
            Err(e) => {
                tracing::warn!(code = e.code(), error = %e, "MCP login could not finish");
                failed(e.code())
            }
        }
    }
}
