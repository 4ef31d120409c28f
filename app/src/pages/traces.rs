//! The Traces page: every processed message with its route and outcome, filterable by chat,
//! route, outcome, error code and time; one trace as a timeline of its steps. Both follow the
//! live events of messages and approvals.

use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    api::{MarkTrace, get_trace, list_traces},
    dto::{TraceDetail, TraceQuery, TraceSummary},
    live::{TRACES_LIVE, fmt_time},
};

const ROUTES: [&str; 11] = ["chat", "tool_lane", "owner_command", "customer_command", "private_data", "rate_limited", "over_budget", "unknown_type", "degraded", "ignored", "duplicate"];
const OUTCOMES: [&str; 4] = ["replied", "deferred", "ignored", "failed"];

fn query_string(q: &TraceQuery, before: Option<i64>) -> String {
    super::list_query(&[("chat", &q.chat), ("route", &q.route), ("outcome", &q.outcome), ("error_code", &q.error_code)], q.since_minutes, before)
}

fn ms(us: i64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

#[component]
pub fn TracesPage() -> impl IntoView {
    let params = use_query_map();
    let query = Memo::new(move |_| {
        params.with(|p| TraceQuery {
            chat: p.get("chat").unwrap_or_default(),
            route: p.get("route").unwrap_or_default(),
            outcome: p.get("outcome").unwrap_or_default(),
            error_code: p.get("error_code").unwrap_or_default(),
            since_minutes: p.get("since_minutes").and_then(|v| v.parse().ok()).unwrap_or(0),
            before: p.get("before").and_then(|v| v.parse().ok()).unwrap_or(0),
        })
    });
    let page = Resource::new(move || query.get(), |q| list_traces(q.chat, q.route, q.outcome, q.error_code, q.since_minutes, q.before));
    view! {
        {super::page_head("Traces", Some(TRACES_LIVE))}
        <h1>"Traces"</h1>
        // Outside the list: a filter that fails (a bad value, the database away) can be changed.
        {move || filter_form(&query.get())}
        {super::loaded(page, move |p| {
            let q = query.get();
            view! {
                <div data-live-region="traces">
                    {trace_table(p.traces, &q)}
                    {p.next_before.map(|b| view! {
                        <p><a class="button" href=format!("/traces{}", query_string(&q, Some(b)))>"Older traces \u{2192}"</a></p>
                    })}
                </div>
            }
        })}
    }
}

fn filter_form(q: &TraceQuery) -> impl IntoView + use<> {
    view! {
        <form method="get" action="/traces" class="filters" data-testid="trace-filters">
            <label>"Chat" <input type="text" name="chat" value=q.chat.clone() /></label>
            <label>"Route" {super::any_select("route", &ROUTES, &q.route)}</label>
            <label>"Outcome" {super::any_select("outcome", &OUTCOMES, &q.outcome)}</label>
            <label>"Error code" <input type="text" name="error_code" value=q.error_code.clone() /></label>
            <label>"When" {super::since_select(q.since_minutes)}</label>
            <button type="submit">"Filter"</button>
        </form>
    }
}

fn trace_table(traces: Vec<TraceSummary>, q: &TraceQuery) -> AnyView {
    if traces.is_empty() {
        let filtered = *q != TraceQuery::default();
        return view! {
            <div class="empty" data-testid="traces-empty">
                <p><strong>{if filtered { "No traces match these filters." } else { "No traces yet." }}</strong></p>
                <p>"Every message Gatehouse handles, from WhatsApp or the simulator, records a trace of each step here. "
                   "Send one from the Conversations page's simulator to see the first."</p>
            </div>
        }
        .into_any();
    }
    let rows = traces.into_iter().map(|t| view! {
        <tr data-trace-id=t.id data-route=t.route.clone()>
            <td data-label="Trace"><a href=format!("/traces/{}", t.id)>{format!("#{}", t.id)}</a></td>
            <td data-label="When (UTC)">{fmt_time(t.started_at)}</td>
            <td data-label="Chat"><small>{format!("{} · {}", t.channel, t.chat_id)}</small></td>
            <td data-label="Message" data-testid="trace-preview">{t.preview.clone().unwrap_or_else(|| "\u{2014}".into())}</td>
            <td data-label="Actor">{t.actor.clone()}</td>
            <td data-label="Route">{t.route.clone()}</td>
            <td data-label="Outcome"><span class=format!("badge outcome-{}", t.outcome)>{t.outcome.clone()}</span>
                {t.error_code.clone().map(|c| view! { <br/><small class="code">{c}</small> })}</td>
            <td data-label="Time">{ms(t.duration_us)}</td>
        </tr>
    }).collect_view();
    super::list_table("traces-table", &["Trace", "When (UTC)", "Chat", "Message", "Actor", "Route", "Outcome", "Time"], rows)
}

#[component]
pub fn TraceDetailPage() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)));
    let (mark, marked) = super::form_action::<MarkTrace>();
    // What was typed, when the last mark was refused: the form is filled with it again.
    let typed = super::form_input::<MarkTrace>();
    let detail = Resource::new(move || id.get(), get_trace);
    view! {
        {super::page_head("Trace", Some(TRACES_LIVE))}
        <p><a href="/traces">"\u{2190} All traces"</a></p>
        {super::loaded(detail, move |d| {
            let t = d.summary.clone();
            let marking = mark_form(&d, mark, marked, typed.get().filter(|m| m.trace_id == d.summary.id));
            view! {
                <div data-live-region="trace">
                <h1>{format!("Trace #{}", t.id)}" "<span class=format!("badge outcome-{}", t.outcome)>{t.outcome.clone()}</span></h1>
                <table class="kv"><tbody>
                    <tr><th>"Chat"</th><td>
                        <a href=format!("/traces?chat={}", super::url_encode(&t.chat_id))>{t.chat_id.clone()}</a>{format!(" ({}) ", t.channel)}
                        <a href=format!("/conversations/{}/{}", super::url_encode(&t.channel), super::url_encode(&t.chat_id)) data-testid="trace-chat">"the conversation"</a>
                    </td></tr>
                    <tr><th>"Message"</th><td>
                        {match d.text.clone() {
                            Some(text) => view! { <p class="said" data-testid="trace-text">{text}</p> }.into_any(),
                            None => view! { <p class="muted" data-testid="trace-text">"The channel keeps no text for this message (media, a location or a reaction)."</p> }.into_any(),
                        }}
                        <code>{t.message_id.clone()}</code>
                    </td></tr>
                    <tr><th>"Actor"</th><td>{t.actor.clone()}</td></tr>
                    <tr><th>"Route"</th><td data-testid="trace-route">{t.route.clone()}</td></tr>
                    <tr><th>"Error"</th><td>{t.error_code.clone().unwrap_or_else(|| "\u{2014}".into())}</td></tr>
                    <tr><th>"Started"</th><td>{fmt_time(t.started_at)}</td></tr>
                    <tr><th>"Took"</th><td>{ms(t.duration_us)}</td></tr>
                    <tr><th>"Correlation id"</th><td><code>{t.correlation_id.clone()}</code></td></tr>
                </tbody></table>
                <h2>"Timeline"</h2>
                <ol class="timeline" data-testid="trace-timeline">
                    {d.steps.into_iter().map(|s| view! {
                        <li data-step=s.step.clone()>
                            <strong>{s.step.clone()}</strong>" \u{2192} "{s.decision.clone()}" "<code>{s.reason_code.clone()}</code>
                            {format!(" ({})", ms(s.duration_us))}
                            {s.job_id.map(|id| view! { " " <a href=format!("/jobs/{id}") data-testid="step-job">{format!("job #{id}")}</a> })}
                            {(!s.candidates.is_empty()).then(|| view! {
                                <ol class="candidates" data-testid="step-candidates">
                                    {s.candidates.iter().map(|c| view! { <li><code>{c.name.clone()}</code>{format!(" {:.2}", c.score)}</li> }).collect_view()}
                                </ol>
                            })}
                            {(s.detail != "{}").then(|| view! { <pre class="json">{s.detail.clone()}</pre> })}
                        </li>
                    }).collect_view()}
                </ol>
                <h2>"Tool calls"</h2>
                {if d.tool_calls.is_empty() {
                    view! { <p class="muted">"No tool was called for this message."</p> }.into_any()
                } else {
                    view! {
                        <table data-testid="trace-tool-calls">
                            <thead><tr><th>"Tool"</th><th>"Decision"</th><th>"Code"</th><th>"Attempts"</th><th>"Time"</th></tr></thead>
                            <tbody>{d.tool_calls.into_iter().map(|c| view! {
                                <tr><td><a href=format!("/tools/{}", c.tool)>{c.tool.clone()}</a></td><td>{c.decision.clone()}</td><td><code>{c.reason_code.clone()}</code></td><td>{c.attempts}</td><td>{ms(c.latency_us)}</td></tr>
                            }).collect_view()}</tbody>
                        </table>
                    }.into_any()
                }}
                </div>
                {marking}
            }
        })}
    }
}

/// "Was this wrong?": what should have happened becomes a finding and an eval case, which the
/// Repairs page replays and proposes a fix for.
fn mark_form(d: &TraceDetail, mark: ServerAction<MarkTrace>, marked: super::Answer<String>, typed: Option<MarkTrace>) -> impl IntoView + use<> {
    let expect = typed.as_ref().map(|m| m.expect.clone()).unwrap_or_default();
    let chosen = typed.as_ref().and_then(|m| m.pattern.clone()).unwrap_or_default();
    let note = typed.and_then(|m| m.note).unwrap_or_default();
    let findings = d.findings.clone();
    let patterns = d.patterns.clone();
    let expectations: Vec<String> = ["normal_chat", "guard", "clarify"]
        .into_iter()
        .map(String::from)
        .chain(d.tools.iter().map(|t| format!("tool:{t}")))
        .collect();
    let trace_id = d.summary.id.to_string();
    view! {
        <h2 id="mark">"Was this wrong?"</h2>
        {(!findings.is_empty()).then(|| view! {
            <ul data-testid="trace-findings">{findings.into_iter().map(|f| view! {
                <li><code>{f.pattern.clone()}</code>{format!(" ({}) ", f.source)}{f.note.clone()}
                    {(!f.expect.is_empty()).then(|| view! { " \u{2192} should have been "<code>{f.expect.clone()}</code> })}</li>
            }).collect_view()}</ul>
        })}
        {super::action_notice(marked, "mark-result")}
        <ActionForm action=mark attr:class="filters" attr:data-testid="mark-form">
            <input type="hidden" name="trace_id" value=trace_id />
            <label>"Should have been "
                <input type="text" name="expect" value=expect list="mark-expectations" required placeholder="tool:NAME, normal_chat, guard or clarify" data-testid="mark-expect" />
            </label>
            <datalist id="mark-expectations">{expectations.into_iter().map(|e| view! { <option value=e></option> }).collect_view()}</datalist>
            <label>"Pattern "
                <select name="pattern" data-testid="mark-pattern">
                    <option value="">"as the expectation implies"</option>
                    {patterns.into_iter().map(|p| view! { <option value=p.clone() selected=p == chosen>{p.clone()}</option> }).collect_view()}
                </select>
            </label>
            <label>"What should have happened " <input type="text" name="note" value=note maxlength="500" data-testid="mark-note" /></label>
            <button type="submit" data-testid="mark-wrong">"Mark wrong"</button>
        </ActionForm>
    }
}
