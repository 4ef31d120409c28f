//! The MCP servers page: each server's status, transport and trust, its tools with their
//! quarantine state and definition diffs, last errors, live; the owner actions enable,
//! disable, refresh now, approve and reject, each audited; and the forms servers ask the owners
//! to fill in during a call (`mcp_forms`).
//!
//! Tool names and definitions come from MCP servers and are untrusted text: they are shown as
//! text, never as markup.

use leptos::prelude::*;

use crate::{
    api::{McpAnswerForm, McpDecide, McpRefresh, McpSetEnabled, mcp_servers},
    dto::{McpServerView, McpToolView},
    live::fmt_time,
};

/// Where the Connect button of an OAuth server posts (the server redirects to its
/// authorization server; the login comes back to the console under the owner's session).
pub const OAUTH_START: &str = "/mcp/oauth/start";

/// The SSE endpoint that announces MCP status changes.
pub const MCP_STREAM: &str = "/api/mcp/stream";

#[component]
pub fn McpPage() -> impl IntoView {
    let query = leptos_router::hooks::use_query_map();
    let toggle = ServerAction::<McpSetEnabled>::new();
    let (refresh, refreshed) = super::form_action::<McpRefresh>();
    let decide = ServerAction::<McpDecide>::new();
    let (answer, answered) = super::form_action::<McpAnswerForm>();
    // What was filled in, when a form's answer was refused: that form is filled with it again.
    let typed = super::form_input::<McpAnswerForm>();
    let page = Resource::new(|| (), |_| mcp_servers());
    view! {
        {super::page_head("MCP servers", Some(MCP_STREAM))}
        <p><a href="/tools">"\u{2190} Tools"</a></p>
        <h1>"MCP servers"</h1>
        {move || toggle.value().get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
        {move || decide.value().get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
        {super::action_notice(refreshed, "refresh-result")}
        {super::action_notice(answered, "form-result")}
        {move || {
            let query = query.get();
            // Anyone can send an owner a link to this page: only a server id and a stable code
            // are shown from it, never a sentence of the link's own.
            let connected = query.get("connected").filter(|s| is_server_id(s)).map(|s| view! { <p class="notice" data-testid="oauth-connected">{format!("{s} is connected.")}</p> });
            let failed = query.get("oauth_error").map(|c| {
                let code = if is_code(&c) { c } else { "MCP_OAUTH_FAILED".to_string() };
                view! { <p class="error" data-testid="oauth-error">{format!("The login did not finish ({code}); see the log, then try Connect again.")}</p> }
            });
            (connected, failed)
        }}
        {super::loaded(page, move |p| {
            let forms = (!p.forms.is_empty()).then(|| view! {
                <h2>"Forms waiting for you"</h2>
                {p.forms.clone().into_iter().map(|f| {
                    let filled = typed.get().filter(|t| t.id == f.id).map(|t| t.values).unwrap_or_default();
                    super::mcp_forms::form_card(f, answer, filled)
                }).collect_view()}
            });
            // A form may outlive its server's entry in mcp.toml: it is shown until it expires.
            let servers = if p.servers.is_empty() {
                view! {
                    <div class="empty" data-testid="mcp-empty">
                        <p><strong>"No MCP servers are configured."</strong></p>
                        <p>"Declare servers in " <code>{p.config_path.clone()}</code>
                           " (stdio commands or Streamable HTTP URLs; the file explains every key), then restart Gatehouse. "
                           "Their tools wait here for your approval before the assistant can use them."</p>
                    </div>
                }
                .into_any()
            } else {
                p.servers.into_iter().map(|s| server_card(s, toggle, refresh, decide)).collect_view().into_any()
            };
            view! { <div data-live-region="mcp">{forms} {servers}</div> }.into_any()
        })}
    }
}

fn server_card(
    s: McpServerView,
    toggle: ServerAction<McpSetEnabled>,
    refresh: ServerAction<McpRefresh>,
    decide: ServerAction<McpDecide>,
) -> impl IntoView {
    let id = s.id.clone();
    let refresh_id = s.id.clone();
    let health = if s.enabled { s.health.clone() } else { "disabled".to_string() };
    view! {
        <section class="card mcp-server" id=format!("server-{}", s.id) data-server=s.id.clone() data-health=health.clone()>
            <h2>{s.id.clone()}" "<span class=format!("badge health-{health}")>{health.clone()}</span>
                " "<span class="badge">{s.trust.clone()}</span></h2>
            <table class="kv"><tbody>
                <tr><th>"Transport"</th><td>{s.transport.clone()}" "<code>{s.target.clone()}</code></td></tr>
                <tr><th>"Tools"</th><td data-testid="tool-count">{format!("{} listed, {} waiting for approval", s.tool_count, s.pending)}</td></tr>
                <tr><th>"Last seen"</th><td>{s.last_seen_at.map(fmt_time).unwrap_or_else(|| "never".into())}</td></tr>
                {s.last_error.clone().map(|e| view! { <tr><th>"Last error"</th><td class="error" data-testid="last-error">{e}</td></tr> })}
            </tbody></table>
            {s.needs_login.clone().map(|why| view! {
                <p class="banner warning" data-testid="needs-login">
                    <strong>"Needs login: "</strong>"its tools are withheld until an owner connects it. "{why}
                </p>
            })}
            <div class="actions">
                {(s.auth == "oauth" && s.enabled).then(|| view! {
                    // A plain form: the server answers with a redirect to the authorization server.
                    <form method="post" action=OAUTH_START>
                        <input type="hidden" name="server" value=id.clone() />
                        <button type="submit" data-testid="connect-server">
                            {if s.needs_login.is_some() { "Connect" } else { "Connect again" }}
                        </button>
                    </form>
                })}
                <ActionForm action=toggle>
                    <input type="hidden" name="server" value=id.clone() />
                    <input type="hidden" name="enabled" value=if s.enabled { "false" } else { "true" } />
                    <button type="submit" class=if s.enabled { "danger" } else { "" } data-testid="toggle-server">
                        {if s.enabled { "Disable" } else { "Enable" }}
                    </button>
                </ActionForm>
                {s.enabled.then(|| view! {
                    <ActionForm action=refresh>
                        <input type="hidden" name="server" value=refresh_id.clone() />
                        <button type="submit" data-testid="refresh-server">"Refresh now"</button>
                    </ActionForm>
                })}
            </div>
            {if s.tools.is_empty() {
                view! { <p class="empty">"No tools known yet. They appear after the first successful discovery."</p> }.into_any()
            } else {
                view! {
                    <div class="table-wrap">
                        <table class="list" data-testid="mcp-tools">
                            <thead><tr><th>"Tool"</th><th>"State"</th><th>"Definition"</th><th></th></tr></thead>
                            <tbody>{s.tools.into_iter().map(|t| tool_row(t, decide)).collect_view()}</tbody>
                        </table>
                    </div>
                }.into_any()
            }}
        </section>
    }
}

fn tool_row(t: McpToolView, decide: ServerAction<McpDecide>) -> impl IntoView {
    let state = if t.usable { "approved".to_string() } else { t.state.clone() };
    let waiting = t.state != "approved";
    let name = t.catalog_name.clone();
    let reject_name = t.catalog_name.clone();
    let (hash, reject_hash) = (t.definition_hash.clone(), t.definition_hash.clone());
    view! {
        <tr data-tool=t.catalog_name.clone() data-state=t.state.clone()>
            <td data-label="Tool">
                <code>{t.catalog_name.clone()}</code>
                {(!t.description.is_empty()).then(|| view! { <br/><small data-testid="mcp-tool-description" title="as the server describes it">{t.description.clone()}</small> })}
                {(!t.present).then(|| view! { <br/><small>"no longer listed by the server"</small> })}
            </td>
            <td data-label="State"><span class=format!("badge quarantine-{state}")>{state.clone()}</span></td>
            <td data-label="Definition">
                <details>
                    <summary>{if t.diff.is_empty() { "definition".to_string() } else { "changed definition (diff)".to_string() }}" "<small>{t.definition_hash.chars().take(19).collect::<String>()}</small></summary>
                    {if t.diff.is_empty() {
                        view! { <pre class="json">{t.definition.clone()}</pre> }.into_any()
                    } else {
                        view! {
                            <pre class="diff" data-testid="definition-diff">
                                {t.diff.into_iter().map(|line| {
                                    let class = if line.starts_with("+ ") { "add" } else if line.starts_with("- ") { "del" } else { "same" };
                                    view! { <span class=class>{line}"\n"</span> }
                                }).collect_view()}
                            </pre>
                        }.into_any()
                    }}
                </details>
            </td>
            <td class="actions">
                {(waiting && t.present).then(|| view! {
                    <ActionForm action=decide>
                        <input type="hidden" name="tool" value=name.clone() />
                        <input type="hidden" name="decision" value="approve" />
                        <input type="hidden" name="hash" value=hash.clone() />
                        <button type="submit" data-testid="approve-tool">"Approve"</button>
                    </ActionForm>
                })}
                {(t.state != "rejected").then(|| view! {
                    <ActionForm action=decide>
                        <input type="hidden" name="tool" value=reject_name.clone() />
                        <input type="hidden" name="decision" value="reject" />
                        <input type="hidden" name="hash" value=reject_hash.clone() />
                        <button type="submit" class="danger" data-testid="reject-tool">"Reject"</button>
                    </ActionForm>
                })}
            </td>
        </tr>
    }
}

/// What could be a server id: letters, digits, `-`, `_` and `.`, at most 64 (wider than
/// `mcp.toml`'s own rule, which check-config enforces; here it only keeps sentences out).
fn is_server_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A stable error code: capitals, digits and `_`, at most 64.
fn is_code(s: &str) -> bool {
    (3..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') && s.as_bytes()[0].is_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_and_codes_are_shown_from_a_link() {
        assert!(is_server_id("shop-crm") && is_server_id("files_v2.local"));
        assert!(!is_server_id("session revoked, log in at https://evil.example") && !is_server_id(""));
        assert!(is_code("MCP_OAUTH_DENIED"));
        assert!(!is_code("session revoked, re-enter your password") && !is_code("mcp_oauth") && !is_code("A"));
    }
}
