//! The Tools & MCP page: the catalog with filters, each tool's schema, policy and breaker, the
//! checkpoint's recent decisions, notices raised by hooks, a "try it" form that runs a call
//! through the checkpoint as the owner, and a catalog reload.

use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    api::{ReloadTools, TryTool, get_tool, list_tools},
    dto::{ToolCallView, ToolSummary, ToolsQuery},
    live::fmt_time,
};

const PROVIDERS: [&str; 3] = ["builtin", "connector", "mcp"];
const AUDIENCES: [&str; 2] = ["public", "owner_only"];
const RISKS: [&str; 3] = ["low", "medium", "high"];

fn badge(class: &str, text: String) -> impl IntoView + use<> {
    view! { <span class=format!("badge {class}")>{text}</span> }
}

fn breaker_badge(state: &str) -> impl IntoView + use<> {
    let label = match state {
        "open" => "breaker open",
        "half_open" => "breaker half-open",
        _ => "breaker closed",
    };
    view! { <span class=format!("badge breaker-{state}") data-breaker=state.to_string()>{label}</span> }
}

fn short_version(v: &str) -> String {
    v.trim_start_matches("sha256:").chars().take(12).collect()
}

#[component]
pub fn ToolsPage() -> impl IntoView {
    let params = use_query_map();
    let query = Memo::new(move |_| {
        params.with(|p| ToolsQuery {
            provider: p.get("provider").unwrap_or_default(),
            audience: p.get("audience").unwrap_or_default(),
            risk: p.get("risk").unwrap_or_default(),
        })
    });
    let (reload, reloaded) = super::form_action::<ReloadTools>();
    let page = Resource::new(move || query.get(), |q| list_tools(q.provider, q.audience, q.risk));
    view! {
        {super::page_head("Tools & MCP", None)}
        <h1>"Tools & MCP"</h1>
        <div class="actions">
            <a class="button" href="/mcp">"MCP servers \u{2192}"</a>
            <ActionForm action=reload>
                <button type="submit" data-testid="reload-tools">"Reload catalog"</button>
            </ActionForm>
        </div>
        {super::answer_with(reloaded, |res| match res {
            Ok(r) => view! {
                <p class="notice" role="status" data-testid="reload-result">
                    {format!("Catalog reloaded: {} tools.", r.tools)}
                    {(!r.changed.is_empty()).then(|| format!(" Changed: {}.", r.changed.join(", ")))}
                </p>
            }.into_any(),
            Err(e) => view! { <pre class="error" role="alert" data-testid="reload-error" data-code=e.code.clone()>{e.message.clone()}</pre> }.into_any(),
        })}
        {super::loaded(page, move |p| {
            let q = query.get();
            view! {
                <p>"Approval mode: " <strong data-testid="approval-mode">{p.approval_mode.clone()}</strong>
                   " · catalog " <code>{p.catalog_path.clone()}</code></p>
                {filter_form(&q)}
                {tool_table(p.tools, p.total, &q, &p.catalog_path)}
                <h2>"Recent calls"</h2>
                {calls_table(p.recent_calls, "Calls appear here as the assistant, the CLI (gatehouse tools call) or the try-it form on a tool's page use tools.")}
                <h2>"Owner notices"</h2>
                {if p.notices.is_empty() {
                    view! { <p class="empty" data-testid="notices-empty">"No notices. A notify_owner hook in tools.toml raises one when its pattern matches a call or an error."</p> }.into_any()
                } else {
                    view! {
                        <ul class="notices" data-testid="notices">
                            {p.notices.into_iter().map(|n| view! {
                                <li><time>{fmt_time(n.at)}</time>" "<code>{n.reason_code}</code>" "{n.message}</li>
                            }).collect_view()}
                        </ul>
                    }.into_any()
                }}
            }
        })}
    }
}

fn filter_form(q: &ToolsQuery) -> impl IntoView + use<> {
    view! {
        <form method="get" action="/tools" class="filters" data-testid="tool-filters">
            <label>"Provider" {super::any_select("provider", &PROVIDERS, &q.provider)}</label>
            <label>"Audience" {super::any_select("audience", &AUDIENCES, &q.audience)}</label>
            <label>"Risk" {super::any_select("risk", &RISKS, &q.risk)}</label>
            <button type="submit">"Filter"</button>
        </form>
    }
}

fn tool_table(tools: Vec<ToolSummary>, total: usize, q: &ToolsQuery, catalog_path: &str) -> AnyView {
    if tools.is_empty() {
        let message = if total == 0 {
            format!("No tools yet. Declare tools in {catalog_path} (connector actions in connectors.toml beside it), then press Reload catalog or send Gatehouse SIGHUP.")
        } else {
            format!("No tool matches these filters ({total} in the catalog).")
        };
        let filtered = *q != ToolsQuery::default();
        return view! {
            <div class="empty" data-testid="tools-empty">
                <p><strong>{message}</strong></p>
                {filtered.then(|| view! { <p><a href="/tools">"Clear the filters"</a></p> })}
            </div>
        }
        .into_any();
    }
    let rows = tools.into_iter().map(|t| view! {
        <tr data-tool=t.name.clone()>
            <td data-label="Tool">
                <a href=format!("/tools/{}", t.name)>{t.name.clone()}</a>
                {(!t.enabled).then(|| view! { " " {badge("off", "disabled".into())} })}
                <br/><small>{t.title.clone()}</small>
            </td>
            <td data-label="Provider">{t.provider.clone()}</td>
            <td data-label="Audience">{t.audience.clone()}</td>
            <td data-label="Risk">{badge(&format!("risk-{}", t.risk), t.risk.clone())}</td>
            <td data-label="Approval">{t.approval.clone()}</td>
            <td data-label="Breaker">{breaker_badge(&t.breaker)}</td>
            <td data-label="Version"><code title=t.version.clone()>{short_version(&t.version)}</code></td>
        </tr>
    }).collect_view();
    super::list_table("tools-table", &["Tool", "Provider", "Audience", "Risk", "Approval", "Breaker", "Version"], rows)
}

fn calls_table(calls: Vec<ToolCallView>, empty: &'static str) -> AnyView {
    if calls.is_empty() {
        return view! { <p class="empty" data-testid="calls-empty">"No calls yet. " {empty}</p> }.into_any();
    }
    let rows = calls.into_iter().map(|c| view! {
        <tr data-decision=c.decision.clone()>
            <td data-label="When (UTC)">{fmt_time(c.at)}</td>
            <td data-label="Tool"><a href=format!("/tools/{}", c.tool)>{c.tool.clone()}</a></td>
            <td data-label="Actor">{format!("{} · {}", c.actor, c.chat_type)}</td>
            <td data-label="Decision">{badge(&format!("decision-{}", c.decision), c.decision.clone())}</td>
            <td data-label="Reason"><code>{c.reason_code.clone()}</code></td>
            <td data-label="Latency">{format!("{:.1} ms", c.latency_us as f64 / 1000.0)}</td>
            <td data-label="Attempts">{c.attempts}</td>
            <td data-label="Correlation"><small>{c.correlation_id.clone()}</small></td>
        </tr>
    }).collect_view();
    super::list_table("calls-table", &["When (UTC)", "Tool", "Actor", "Decision", "Reason", "Latency", "Attempts", "Correlation"], rows)
}

#[component]
pub fn ToolDetailPage() -> impl IntoView {
    let params = use_params_map();
    let name = Memo::new(move |_| params.with(|p| p.get("name").unwrap_or_default()));
    let (try_it, tried) = super::form_action::<TryTool>();
    // What was typed, when the last try was refused: the form is filled with it again.
    let typed = super::form_input::<TryTool>();
    let detail = Resource::new(move || name.get(), get_tool);
    view! {
        {super::page_head("Tool", None)}
        <p><a href="/tools">"\u{2190} All tools"</a></p>
        {super::loaded(detail, move |d| {
            let t = d.summary.clone();
            let typed = typed.get().filter(|typed| typed.name == t.name);
            let args = typed.as_ref().map_or_else(|| d.example_args.clone(), |typed| typed.args.clone());
            let in_group = typed.as_ref().is_some_and(|typed| typed.chat_type == "group");
            let rows: Vec<(&str, String)> = vec![
                ("Title", t.title.clone()),
                ("Provider", t.provider.clone()),
                ("Operation", t.operation.clone()),
                ("Audience", t.audience.clone()),
                ("Risk", t.risk.clone()),
                ("Approval", t.approval.clone()),
                ("Chat types", d.chat_types.join(", ")),
                ("Timeout", format!("{} ms per attempt", d.timeout_ms)),
                ("Retries", d.retry.clone()),
                ("Background", d.async_policy.clone()),
                ("Chainable", if d.chainable { "yes".into() } else { "no".into() }),
                ("Inline result limit", format!("{} bytes", d.max_result_bytes)),
                ("Managed fields", if d.managed_fields.is_empty() { "\u{2014}".into() } else { d.managed_fields.join(", ") }),
                ("Version", t.version.clone()),
            ];
            view! {
                <h1>{t.name.clone()}" "{breaker_badge(&t.breaker)}{(!t.enabled).then(|| view! { " " {badge("off", "disabled".into())} })}</h1>
                <p>{t.description.clone()}</p>
                <table class="kv" data-testid="tool-facts"><tbody>
                    {rows.into_iter().map(|(k, v)| view! { <tr><th>{k}</th><td>{v}</td></tr> }).collect_view()}
                    {d.connector.clone().map(|c| view! { <tr><th>"Connector"</th><td><code>{c}</code></td></tr> })}
                    <tr><th>"Reply"</th><td data-testid="tool-reply">{match d.answer_template.clone() {
                        Some(template) => view! { "its own answer: "<code>{template}</code>" (the summarizer's when a value it names is missing)" }.into_any(),
                        None => view! { "written by the summarizer from the result" }.into_any(),
                    }}</td></tr>
                    <tr><th>"Policy for owners"</th><td data-testid="owner-policy">{d.owner_policy.clone()}</td></tr>
                    <tr><th>"Policy for customers"</th><td data-testid="customer-policy">{d.customer_policy.clone()}</td></tr>
                    <tr><th>"Hooks"</th><td>{if d.hooks.is_empty() { "\u{2014}".to_string() } else { d.hooks.join(", ") }}</td></tr>
                    <tr><th>"Secret fields"</th><td>
                        {if d.secret_fields.is_empty() { view! { "\u{2014}" }.into_any() } else {
                            d.secret_fields.clone().into_iter().map(|s| view! {
                                <span>{s.field}" \u{2190} "<code>{s.variable}</code>{if s.set { " (set)" } else { " (not set)" }}" "</span>
                            }).collect_view().into_any()
                        }}
                    </td></tr>
                </tbody></table>
                {(!d.when_to_use.is_empty()).then(|| view! { <p><strong>"When to use: "</strong>{d.when_to_use.clone()}</p> })}
                {(!d.when_not_to_use.is_empty()).then(|| view! { <p><strong>"When not to use: "</strong>{d.when_not_to_use.clone()}</p> })}
                <h2>"Phrases the lane finds it by"</h2>
                {if t.enabled {
                    phrases(&d.triggers, &d.aliases)
                } else {
                    view! {
                        <p class="empty" data-testid="tool-disabled">
                            <strong>"Disabled: "</strong>"the lane never offers it, whatever its phrases, and the checkpoint refuses calls to it ("<code>"TOOL_DISABLED"</code>"). Set "<code>"enabled = true"</code>" in its tool file, then reload the catalog."
                        </p>
                    }
                    .into_any()
                }}
                <h2>"Input schema"</h2>
                <pre class="json" data-testid="input-schema">{d.input_schema.clone()}</pre>
                {d.output_schema.clone().map(|s| view! { <h2>"Output schema"</h2><pre class="json">{s}</pre> })}
                <h2>"Try it"</h2>
                <p>"Runs one call through the checkpoint as you (an owner), with every check, hook and the audit. A call that needs an owner's approval is not run here: it becomes a request on the Approvals page, and runs once an owner approves it."</p>
                <ActionForm action=try_it attr:class="try-it" attr:data-testid="try-form">
                    <input type="hidden" name="name" value=t.name.clone() />
                    <label>"Arguments (JSON)"
                        <textarea name="args" rows="5" data-testid="try-args">{args}</textarea>
                    </label>
                    <label>"Chat type"
                        <select name="chat_type" data-testid="try-chat-type">
                            <option value="direct" selected=!in_group>"direct"</option>
                            <option value="group" selected=in_group>"group"</option>
                        </select>
                    </label>
                    <button type="submit" data-testid="try-run">"Run through the checkpoint"</button>
                </ActionForm>
                {super::answer_view(tried, |o| view! {
                        <div class=if o.ok { "try-result ok" } else { "try-result failed" } data-testid="try-result" data-code=o.code.clone()>
                            <p><strong>{match (o.ok, o.approval_id) {
                                (true, _) => "Allowed and run".to_string(),
                                (false, Some(id)) => format!("Waiting for an owner's approval: request #{id}"),
                                (false, None) => format!("Stopped: {}", o.code),
                            }}</strong>
                               {format!(" · {} attempt(s) · {} ms · ", o.attempts, o.latency_ms)}<small>{o.correlation_id.clone()}</small></p>
                            {(!o.ok).then(|| view! { <p>{o.message.clone()}</p> })}
                            {o.approval_id.map(|_| view! { <p><a href="/approvals" data-testid="try-approval">"Decide it on the Approvals page"</a></p> })}
                            {o.output.clone().map(|out| view! { <pre class="json">{out}</pre> })}
                        </div>
                })}
                <h2>"Recent calls"</h2>
                {calls_table(d.recent_calls.clone(), "Use the form above to make one.")}
            }
        })}
    }
}

/// What a tool with neither triggers nor aliases costs, and what to do about it: shown on its
/// page and printed by `gatehouse check-config`.
pub const NO_PHRASES: &str = "The lane plans it only for a message that shares many words with its description, \
so most short requests for it stay in normal chat. Add the phrases people use for it (triggers, aliases in tools.toml).";

/// The phrases the lane's detector finds a tool by; without any, [`NO_PHRASES`].
fn phrases(triggers: &[String], aliases: &[String]) -> AnyView {
    if triggers.is_empty() && aliases.is_empty() {
        return view! {
            <p class="empty" data-testid="tool-phrases">
                <strong>"No triggers or aliases. "</strong>{NO_PHRASES}" Then reload the catalog."
            </p>
        }
        .into_any();
    }
    let list = |items: &[String]| if items.is_empty() { "\u{2014}".to_string() } else { items.iter().map(|p| format!("\u{201c}{p}\u{201d}")).collect::<Vec<_>>().join(", ") };
    view! {
        <table class="kv" data-testid="tool-phrases"><tbody>
            <tr><th>"Triggers"</th><td>{list(triggers)}</td></tr>
            <tr><th>"Aliases"</th><td>{list(aliases)}</td></tr>
        </tbody></table>
    }
    .into_any()
}
