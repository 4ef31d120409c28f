//! The Jobs page: live counts per state, a filterable, paged list, and each job's detail with
//! its timeline and the owner actions retry-now, cancel and, for a tool call that gave no
//! result, run the call again as a new job.

use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    api::{CancelJob, RetryJob, RunJobAgain, get_job, list_jobs},
    dto::{JobQuery, JobSummary},
    live::{JOBS_LIVE, fmt_time},
};

const STATES: [&str; 8] = ["available", "scheduled", "running", "retryable", "completed", "cancelled", "discarded", "pending"];

fn query_string(q: &JobQuery, before: Option<i64>) -> String {
    super::list_query(&[("state", &q.state), ("tool", &q.tool), ("chat", &q.chat)], q.since_minutes, before)
}

fn state_badge(state: &str) -> impl IntoView + use<> {
    view! { <span class=format!("badge state-{state}")>{state.to_string()}</span> }
}

#[component]
pub fn JobsPage() -> impl IntoView {
    let params = use_query_map();
    let query = Memo::new(move |_| {
        params.with(|p| JobQuery {
            state: p.get("state").unwrap_or_default(),
            tool: p.get("tool").unwrap_or_default(),
            chat: p.get("chat").unwrap_or_default(),
            since_minutes: p.get("since_minutes").and_then(|v| v.parse().ok()).unwrap_or(0),
            before: p.get("before").and_then(|v| v.parse().ok()).unwrap_or(0),
        })
    });
    let page = Resource::new(move || query.get(), |q| list_jobs(q.state, q.tool, q.chat, q.since_minutes, q.before));
    view! {
        {super::page_head("Jobs", Some(JOBS_LIVE))}
        <h1>"Jobs"</h1>
        // Outside the list: a filter that fails (a bad value, the database away) can be changed.
        {move || filter_form(&query.get())}
        {super::loaded(page, move |p| {
            let q = query.get();
            view! {
                <ul class="counts" data-testid="job-counts" data-live-region="counts">
                    {STATES.iter().map(|s| {
                        let n = p.counts.iter().find(|c| c.state == *s).map_or(0, |c| c.count);
                        let href = query_string(&JobQuery { state: s.to_string(), ..Default::default() }, None);
                        view! { <li><a href=format!("/jobs{href}") data-state=*s>{state_badge(s)}" "<strong>{n}</strong></a></li> }
                    }).collect_view()}
                </ul>
                <div data-live-region="jobs">
                    {job_table(p.jobs, &q)}
                    {p.next_before.map(|b| view! {
                        <p><a class="button" href=format!("/jobs{}", query_string(&q, Some(b)))>"Older jobs \u{2192}"</a></p>
                    })}
                </div>
            }
        })}
    }
}

fn filter_form(q: &JobQuery) -> impl IntoView + use<> {
    view! {
        <form method="get" action="/jobs" class="filters" data-testid="job-filters">
            <label>"State" {super::any_select("state", &STATES, &q.state)}</label>
            <label>"Tool" <input type="text" name="tool" value=q.tool.clone() /></label>
            <label>"Chat" <input type="text" name="chat" value=q.chat.clone() /></label>
            <label>"Created" {super::since_select(q.since_minutes)}</label>
            <button type="submit">"Filter"</button>
        </form>
    }
}

fn job_table(jobs: Vec<JobSummary>, q: &JobQuery) -> AnyView {
    if jobs.is_empty() {
        let filtered = *q != JobQuery::default();
        return view! {
            <div class="empty" data-testid="jobs-empty">
                <p><strong>{if filtered { "No jobs match these filters." } else { "No jobs yet." }}</strong></p>
                <p>"Jobs appear here when messages and tool calls are processed. To check the queue by hand, run "
                   <code>"gatehouse jobs enqueue system.echo --args '{\"message\":\"hello\"}'"</code>"."</p>
            </div>
        }
        .into_any();
    }
    let rows = jobs.into_iter().map(|j| view! {
        <tr data-job-id=j.id>
            <td data-label="Job"><a href=format!("/jobs/{}", j.id)>{format!("#{}", j.id)}</a></td>
            <td data-label="Kind / tool">{j.kind.clone()}{j.tool_name.clone().map(|t| view! { <br/><small>{t}</small> })}</td>
            <td data-label="State">{state_badge(&j.state)}{j.last_error_code.clone().map(|c| view! { <br/><small class="code">{c}</small> })}</td>
            <td data-label="Attempts">{attempts(j.attempt, j.max_attempts, " / ")}</td>
            <td data-label="Chat">{j.chat_id.clone().unwrap_or_default()}</td>
            <td data-label="Updated (UTC)">{fmt_time(j.updated_at)}</td>
        </tr>
    }).collect_view();
    super::list_table("jobs-table", &["Job", "Kind / tool", "State", "Attempts", "Chat", "Updated (UTC)"], rows)
}

#[component]
pub fn JobDetailPage() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)));
    let retry = ServerAction::<RetryJob>::new();
    let cancel = ServerAction::<CancelJob>::new();
    let run_again = ServerAction::<RunJobAgain>::new();
    let detail = Resource::new(move || id.get(), get_job);
    view! {
        {super::page_head("Job", Some(JOBS_LIVE))}
        <p><a href="/jobs">"\u{2190} All jobs"</a></p>
        <div data-live-region="job">
        {super::loaded(detail, move |d| {
            let s = d.summary.clone();
            let id = s.id;
            let rows: Vec<(&str, String)> = vec![
                ("Kind", s.kind.clone()),
                ("Tool", s.tool_name.clone().unwrap_or_else(|| "\u{2014}".into())),
                ("Attempts", attempts(s.attempt, s.max_attempts, " of ")),
                ("Queue / priority", format!("{} / {}", d.queue, d.priority)),
                ("Chat", s.chat_id.clone().unwrap_or_else(|| "\u{2014}".into())),
                ("Sender", d.sender_id.clone().unwrap_or_else(|| "\u{2014}".into())),
                ("Message", d.message_id.clone().unwrap_or_else(|| "\u{2014}".into())),
                ("Dedupe key", d.dedupe_key.clone().unwrap_or_else(|| "\u{2014}".into())),
                ("Correlation id", d.correlation_id.clone()),
                ("Created", fmt_time(s.created_at)),
                ("Scheduled", fmt_time(d.scheduled_at)),
                ("Started", d.started_at.map(fmt_time).unwrap_or_else(|| "\u{2014}".into())),
                ("Finished", d.completed_at.map(fmt_time).unwrap_or_else(|| "\u{2014}".into())),
                ("Lease", d.lease_owner.clone().map(|o| format!("{o} until {}", d.lease_expires_at.map(fmt_time).unwrap_or_default())).unwrap_or_else(|| "\u{2014}".into())),
            ];
            let job_link = |label: &'static str, testid: &'static str, other: i64| view! {
                <p data-testid=testid>{label}" "<a href=format!("/jobs/{other}")>{format!("job #{other}")}</a></p>
            };
            view! {
                <h1>{format!("Job #{id}")}" "{state_badge(&s.state)}</h1>
                <div class="actions">
                    {d.can_retry.then(|| view! {
                        <ActionForm action=retry>
                            <input type="hidden" name="id" value=id />
                            <button type="submit" data-testid="retry-job">"Retry now"</button>
                        </ActionForm>
                    })}
                    {d.can_cancel.then(|| view! {
                        <ActionForm action=cancel>
                            <input type="hidden" name="id" value=id />
                            <button type="submit" class="danger" data-testid="cancel-job">"Cancel"</button>
                        </ActionForm>
                    })}
                    {d.can_run_again.then(|| view! {
                        <ActionForm action=run_again>
                            <input type="hidden" name="id" value=id />
                            <button type="submit" data-testid="run-job-again">"Run the call again"</button>
                        </ActionForm>
                    })}
                </div>
                {d.can_run_again.then(|| view! {
                    <p class="muted" data-testid="run-again-hint">"Runs the call again as a new job. The person gets its answer if it succeeds; a failure is not told to them again."</p>
                })}
                {d.run_again_warning.clone().map(|w| view! { <p class="warning" data-testid="run-again-warning">{w}</p> })}
                {move || run_again.value().get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
                {d.ran_again_as.map(|other| job_link("Last run again as", "ran-again-as", other))}
                {d.again_of.map(|other| job_link("Runs again the call of", "again-of", other))}
                {move || retry.value().get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
                {move || cancel.value().get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
                {s.last_error_code.clone().map(|code| {
                    let message = d.last_error_message.clone().unwrap_or_default();
                    view! { <p class="error" data-testid="job-error"><code>{code}</code>" "{message}</p> }
                })}
                <table class="kv"><tbody>
                    {rows.into_iter().map(|(k, v)| view! { <tr><th>{k}</th><td>{v}</td></tr> }).collect_view()}
                </tbody></table>
                <h2>"Arguments"</h2>
                <pre class="json" data-testid="job-args">{d.args.clone()}</pre>
                {d.result_preview.clone().map(|p| view! { <h2>"Result"</h2><pre class="json">{p}</pre> })}
                <h2>"Timeline"</h2>
                <ol class="timeline" data-testid="job-timeline">
                    {d.events.clone().into_iter().map(|e| view! {
                        <li>
                            <time>{fmt_time(e.at)}</time>" "{state_badge(&e.state)}
                            {format!(" attempt {}", e.attempt)}
                            {e.error_code.map(|c| view! { " "<code>{c}</code> })}
                            {e.message.map(|m| view! { " "<span>{m}</span> })}
                        </li>
                    }).collect_view()}
                </ol>
            }
        })}
        </div>
    }
}

/// The attempts of a job that keeps itself going (the periodic ones): as good as no limit.
pub const NO_ATTEMPT_LIMIT: u32 = u32::MAX;

/// A job's attempts and its limit, or "no limit" for one with [`NO_ATTEMPT_LIMIT`]; `of` goes
/// between the two.
pub fn attempts(attempt: i64, max: i64, of: &str) -> String {
    if max >= i64::from(NO_ATTEMPT_LIMIT) { format!("{attempt} (no limit)") } else { format!("{attempt}{of}{max}") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_periodic_jobs_attempts_have_no_limit() {
        assert_eq!(super::attempts(2, 5, " / "), "2 / 5");
        assert_eq!(super::attempts(3, i64::from(super::NO_ATTEMPT_LIMIT), " of "), "3 (no limit)");
    }
}
