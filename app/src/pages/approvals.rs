//! The Approvals page: tool calls waiting for an owner, each bound to the exact call (tool
//! version and arguments, shown with secrets and personal data replaced), with its risk, who
//! asked, why it waits, its age and trace; Approve and Reject (with an optional reason); and the
//! latest decisions with how the approved calls ran. Live: it refreshes on the events of
//! approvals and jobs, which every request, decision, expiry and run makes.
//!
//! Arguments come from people and models: untrusted text, shown as text, never as markup.

use leptos::prelude::*;

use crate::{
    api::{DecideApproval, list_approvals},
    dto::ApprovalView,
    live::{APPROVALS_LIVE, fmt_time},
};

/// "42 s", "5 min", "3 h", "2 d".
pub(crate) fn age(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

fn trace_link(trace_id: Option<i64>) -> impl IntoView + use<> {
    trace_id.map(|t| view! { <a href=format!("/traces/{t}") data-testid="approval-trace">{format!("trace #{t}")}</a> })
}

#[component]
pub fn ApprovalsPage() -> impl IntoView {
    let (decide, decided) = super::form_action::<DecideApproval>();
    let page = Resource::new(|| (), |_| list_approvals());
    view! {
        {super::page_head("Approvals", Some(APPROVALS_LIVE))}
        <h1>"Approvals"</h1>
        {super::action_notice(decided, "decision-result")}
        {super::loaded(page, move |p| {
            let now = p.now;
            view! {
                <div data-live-region="approvals">
                <h2>"Waiting for you"</h2>
                {if p.pending.is_empty() {
                    view! {
                        <div class="empty" data-testid="approvals-empty">
                            <p><strong>"No tool call is waiting for an owner."</strong></p>
                            <p>"Calls wait here when a tool's policy asks for an owner (approval mode "
                               <code>{p.approval_mode.clone()}</code>" in config/tools.toml: medium- and high-risk calls in auto mode, and tools with "
                               <code>"approval = \"always\""</code>"). Try one from the "<a href="/tools">"Tools"</a>" page, or with "
                               <code>"gatehouse tools call NAME --args '{...}'"</code>"."</p>
                        </div>
                    }.into_any()
                } else {
                    let cards = p.pending.into_iter().map(|a| pending_card(a, now, decide)).collect_view();
                    view! { <ul class="approvals" data-testid="approvals-pending">{cards}</ul> }.into_any()
                }}
                <h2>"Decided"</h2>
                {if p.decided.is_empty() {
                    view! { <p class="empty" data-testid="approvals-decided-empty">"No decisions yet. Approved, rejected and expired requests are listed here with how each approved call ran."</p> }.into_any()
                } else {
                    let rows = p.decided.into_iter().map(decided_row).collect_view();
                    super::list_table("approvals-decided", &["#", "Call", "State", "Decided", "Run"], rows)
                }}
                </div>
            }
        })}
    }
}

fn call_cell(a: &ApprovalView) -> impl IntoView + use<> {
    view! {
        <td data-label="Call">
            <code>{a.tool.clone()}</code>" "<small title="definition version">{a.version.clone()}</small>
            <pre class="json" data-testid="approval-args">{a.args.clone()}</pre>
        </td>
    }
}

/// Why a call waits: the reason in words with its code beside it (requests stored before the
/// words existed have only the code).
fn why(a: &ApprovalView) -> impl IntoView + use<> {
    let code = view! { <code>{a.reason_code.clone()}</code> };
    if a.reason == a.reason_code {
        view! { <span data-testid="approval-reason">{code}</span> }.into_any()
    } else {
        view! { <span data-testid="approval-reason">{a.reason.clone()}" "<small>{code}</small></span> }.into_any()
    }
}

/// A waiting call as a card, not a table row: an owner deciding on a phone sees the call, why it
/// waits and both buttons without scrolling sideways.
fn pending_card(a: ApprovalView, now: i64, decide: ServerAction<DecideApproval>) -> impl IntoView {
    let id = a.id.to_string();
    let reject_id = id.clone();
    // Each card's buttons named apart for screen readers and voice control.
    let (approve_label, reject_label) = (format!("Approve #{} {}", a.id, a.tool), format!("Reject #{} {}", a.id, a.tool));
    view! {
        <li class="approval-card" data-testid="approval-row" data-id=a.id.to_string() data-state=a.state.clone()>
            <p class="approval-head">
                <strong>{format!("#{}", a.id)}</strong>" "<code>{a.tool.clone()}</code>" "
                <span class=format!("badge risk-{}", a.risk)>{format!("{} risk", a.risk)}</span>" "
                <small title="definition version">{a.version.clone()}</small>
            </p>
            <pre class="json" data-testid="approval-args">{a.args.clone()}</pre>
            <p>"Why it waits: "{why(&a)}</p>
            <p><small>
                "Asked by "{a.requester.clone()}" on "{a.channel.clone()}", "
                <span data-testid="approval-age" title=fmt_time(a.requested_at)>{format!("{} ago", age(now - a.requested_at))}</span>
                "; expires "{fmt_time(a.expires_at)}". "{trace_link(a.trace_id)}
            </small></p>
            <div class="decide">
                <ActionForm action=decide>
                    <input type="hidden" name="id" value=id />
                    <input type="hidden" name="decision" value="approve" />
                    <button type="submit" data-testid="approve-approval" aria-label=approve_label>"Approve"</button>
                </ActionForm>
                <ActionForm action=decide>
                    <input type="hidden" name="id" value=reject_id />
                    <input type="hidden" name="decision" value="reject" />
                    <label>"Reason (optional) "<input type="text" name="reason" maxlength="300" data-testid="reject-reason" /></label>
                    <button type="submit" class="danger" data-testid="reject-approval" aria-label=reject_label>"Reject"</button>
                </ActionForm>
            </div>
        </li>
    }
}

fn decided_row(a: ApprovalView) -> impl IntoView {
    let who = match (&a.decided_by, &a.decided_via) {
        (Some(by), Some(via)) => format!("by {by} ({via})"),
        _ => String::new(),
    };
    let run = match (&a.job_id, &a.outcome) {
        (Some(job), Some(outcome)) => view! { <a href=format!("/jobs/{job}")>{format!("job #{job}")}</a>" "<code data-testid="approval-outcome">{outcome.clone()}</code> }.into_any(),
        (Some(job), None) => {
            // Still under way, or ended without an outcome (cancelled, or its attempts ran out).
            let state = match a.job_state.as_deref() {
                Some(ended @ ("cancelled" | "discarded")) => ended.to_string(),
                Some("completed") | None => "finishing".to_string(),
                Some(_) => "running".to_string(),
            };
            view! { <a href=format!("/jobs/{job}")>{format!("job #{job}")}</a>" "<span data-testid="approval-run-state">{state}</span> }.into_any()
        }
        _ => view! { <span>"not run"</span> }.into_any(),
    };
    view! {
        <tr data-testid="approval-row" data-id=a.id.to_string() data-state=a.state.clone()>
            <td data-label="#">{format!("#{}", a.id)}</td>
            {call_cell(&a)}
            <td data-label="State"><span class=format!("badge approval-{}", a.state)>{a.state.clone()}</span></td>
            <td data-label="Decided">
                {a.decided_at.map(fmt_time)}" "{who}
                {a.decision_note.clone().map(|n| view! { <br/><small data-testid="approval-note">{format!("Reason: {n}")}</small> })}
                <br/>{trace_link(a.trace_id)}
            </td>
            <td data-label="Run">{run}</td>
        </tr>
    }
}
