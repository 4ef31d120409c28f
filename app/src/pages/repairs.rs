//! The Repairs page: configuration diffs proposed for failing eval cases, each with its diff
//! (side by side on wide screens), the before/after replay over every case (regressions in
//! red), and the findings and traces behind it; Approve (a second, explicit confirmation for
//! one that breaks a passing case), Reject with a reason, and Roll back an applied one. Below,
//! the latest findings. Nothing changes until an owner approves. Live: it refreshes when the
//! job queue moves (the periodic cycle is a job).
//!
//! Diffs and notes hold text from configuration files and people: shown as text, never markup.

use leptos::prelude::*;

use crate::{
    api::{DecideRepair, RunRepairCycle, list_repairs},
    dto::{DiffRow, FindingView, RepairView, ReplayRow},
    live::{REPAIRS_LIVE, fmt_time},
};

#[component]
pub fn RepairsPage() -> impl IntoView {
    let (decide, decided) = super::form_action::<DecideRepair>();
    let (cycle, cycled) = super::form_action::<RunRepairCycle>();
    let page = Resource::new(|| (), |_| list_repairs());
    view! {
        {super::page_head("Repairs", Some(REPAIRS_LIVE))}
        <h1>"Repairs"</h1>
        <p class="muted">"Traces that went wrong become eval cases; for a failing case Gatehouse proposes a change to config/tools.toml and replays every case before and after. Nothing changes until you approve it."</p>
        <ActionForm action=cycle>
            <button type="submit" data-testid="run-cycle">"Scan traces and propose now"</button>
        </ActionForm>
        {super::action_notice(cycled, "cycle-result")}
        {super::action_notice(decided, "repair-result")}
        {super::loaded(page, move |p| {
            let every = if p.scan_every == "0s" { "The periodic scan is off (evals.scan_every = \"0s\").".to_string() } else { format!("Traces are scanned every {}.", p.scan_every) };
            view! {
                <div data-live-region="repairs">
                <p class="muted" data-testid="repairs-status">{format!("{} eval case(s). {every}", p.cases)}</p>
                <h2>"Proposals"</h2>
                {if p.repairs.is_empty() {
                    view! {
                        <div class="empty" data-testid="repairs-empty">
                            <p><strong>"No repair has been proposed."</strong></p>
                            <p>"Open a trace that went wrong on the "<a href="/traces">"Traces"</a>" page and mark it with what should have happened (owners can also reply "<code>"/wrong tool:NAME"</code>" to the bot on WhatsApp), or add a case with "
                               <code>"gatehouse eval add"</code>". Proposals appear here for cases that fail."</p>
                        </div>
                    }.into_any()
                } else {
                    p.repairs.into_iter().map(|r| repair_card(r, decide)).collect_view().into_any()
                }}
                <h2>"Findings"</h2>
                {findings_table(p.findings)}
                </div>
            }
        })}
    }
}

fn badge(pass: bool) -> impl IntoView {
    view! { <span class=if pass { "badge outcome-replied" } else { "badge outcome-failed" }>{if pass { "pass" } else { "fail" }}</span> }
}

fn replay_table(rows: Vec<ReplayRow>) -> AnyView {
    let rows = rows
        .into_iter()
        .map(|r| {
            let class = if r.before_pass && !r.after_pass {
                "regression"
            } else if !r.before_pass && r.after_pass {
                "fixed"
            } else {
                ""
            };
            view! {
                <tr class=class data-testid="replay-row" data-case=r.case.clone()>
                    <td data-label="Case"><code>{r.case.clone()}</code></td>
                    <td data-label="Expected"><code>{r.expect.clone()}</code></td>
                    <td data-label="Before">{badge(r.before_pass)}" "<small>{r.before.clone()}</small></td>
                    <td data-label="After">{badge(r.after_pass)}" "<small>{r.after.clone()}</small></td>
                </tr>
            }
        })
        .collect_view();
    super::list_table("replay-table", &["Case", "Expected", "Before", "After"], rows)
}

fn diff_table(path: String, rows: Vec<DiffRow>) -> impl IntoView {
    let no = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
    view! {
        <div class="diff" data-testid="repair-diff">
            <p><code>{path}</code></p>
            <table class="diff-side">
                <tbody>
                    {rows.into_iter().map(|r| view! {
                        <tr class=format!("diff-{}", r.kind)>
                            <td class="ln">{no(r.old_no)}</td>
                            <td class="old">{r.old.clone().unwrap_or_default()}</td>
                            <td class="ln">{no(r.new_no)}</td>
                            <td class="new">{r.new.clone().unwrap_or_default()}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
}

fn repair_card(r: RepairView, decide: ServerAction<DecideRepair>) -> impl IntoView {
    let (approve_id, reject_id, rollback_id) = (r.id.to_string(), r.id.to_string(), r.id.to_string());
    let seen = r.seen.clone();
    let actions = match r.state.as_str() {
        "proposed" => {
            let confirm = (r.regressions > 0).then(|| {
                view! {
                    <label class="warning" data-testid="confirm-regressions">
                        <input type="checkbox" name="confirm" value="yes" />
                        {format!(" I understand this breaks {} case(s) that pass today", r.regressions)}
                    </label>
                }
            });
            view! {
                <div class="actions">
                    <ActionForm action=decide>
                        <input type="hidden" name="id" value=approve_id />
                        <input type="hidden" name="action" value="approve" />
                        <input type="hidden" name="seen" value=seen />
                        {confirm}
                        <button type="submit" data-testid="approve-repair">"Approve and apply"</button>
                    </ActionForm>
                    <ActionForm action=decide>
                        <input type="hidden" name="id" value=reject_id />
                        <input type="hidden" name="action" value="reject" />
                        <label>"Reason "<input type="text" name="reason" required maxlength="300" data-testid="reject-repair-reason" /></label>
                        <button type="submit" class="danger" data-testid="reject-repair">"Reject"</button>
                    </ActionForm>
                </div>
            }
            .into_any()
        }
        "applied" => view! {
            <ActionForm action=decide>
                <input type="hidden" name="id" value=rollback_id />
                <input type="hidden" name="action" value="rollback" />
                <button type="submit" class="danger" data-testid="rollback-repair">"Roll back"</button>
            </ActionForm>
        }
        .into_any(),
        _ => ().into_any(),
    };
    let decided = r.decided_at.map(|at| {
        let by = r.decided_by.clone().unwrap_or_default();
        let reason = r.reason.clone().map(|why| format!(" Reason: {why}")).unwrap_or_default();
        // A rolled-back repair was applied first: its approval, then its rollback.
        let state = if r.state == "rolled_back" { "applied" } else { r.state.as_str() };
        // Rolled back before the owner was kept (migration 0041): the time alone.
        let rolled_back = r.rolled_back_at.map(|back| match &r.rolled_back_by {
            Some(who) => format!(" Rolled back by {who} at {}.", fmt_time(back)),
            None => format!(" Rolled back at {}.", fmt_time(back)),
        });
        let rolled_back = rolled_back.unwrap_or_default();
        view! { <p class="muted" data-testid="repair-decided">{format!("{state} by {by} at {}.{reason}{rolled_back}", fmt_time(at))}</p> }
    });
    let counts = format!("{} case(s) fixed, {} regressed", r.fixes, r.regressions);
    let counts_class = if r.regressions > 0 { "error" } else { "muted" };
    view! {
        <article class="repair" id=format!("repair-{}", r.id) data-testid="repair" data-id=r.id.to_string() data-state=r.state.clone()>
            <h3>{format!("#{} ", r.id)}{r.summary.clone()}" "<span class=format!("badge repair-{}", r.state)>{r.state.clone()}</span></h3>
            <p class=counts_class data-testid="repair-counts">{counts}{format!(" · strategy {} · proposed {}", r.strategy, fmt_time(r.created_at))}</p>
            {decided}
            {r.files.into_iter().map(|(path, rows)| diff_table(path, rows)).collect_view()}
            <details><summary>"Unified diff"</summary><pre class="json">{r.diff.clone()}</pre></details>
            <h4>"Replay over every case"</h4>
            {replay_table(r.table)}
            {(!r.findings.is_empty()).then(|| view! {
                <h4>"Behind it"</h4>
                <ul>{r.findings.into_iter().map(|f| view! {
                    <li><code>{f.pattern.clone()}</code>" in "<a href=format!("/traces/{}", f.trace_id)>{format!("trace #{}", f.trace_id)}</a>{(!f.note.is_empty()).then(|| format!(": {}", f.note))}</li>
                }).collect_view()}</ul>
            })}
            {actions}
        </article>
    }
}

fn findings_table(findings: Vec<FindingView>) -> AnyView {
    if findings.is_empty() {
        return view! {
            <p class="empty" data-testid="findings-empty">"No findings yet. The scan looks for provider errors behind generic replies, owner-only tools offered to customers, refused connector URLs, missed follow-ups, plans naming tools they were not offered and promises with no job behind them; your marks on traces are listed here too."</p>
        }
        .into_any();
    }
    let rows = findings
        .into_iter()
        .map(|f| {
            let expect = if f.expect.is_empty() {
                view! { <small>"not said yet: "<a href=format!("/traces/{}#mark", f.trace_id)>"mark the trace"</a></small> }.into_any()
            } else {
                view! { <code>{f.expect.clone()}</code> }.into_any()
            };
            view! {
                <tr data-testid="finding-row" data-pattern=f.pattern.clone()>
                    <td data-label="Trace"><a href=format!("/traces/{}", f.trace_id)>{format!("#{}", f.trace_id)}</a></td>
                    <td data-label="Pattern"><code>{f.pattern.clone()}</code></td>
                    <td data-label="Found by">{f.source.clone()}</td>
                    <td data-label="What was seen">{f.note.clone()}</td>
                    <td data-label="Should have been">{expect}</td>
                    <td data-label="Case">{if f.has_case { "yes" } else { "no" }}</td>
                    <td data-label="When (UTC)">{fmt_time(f.created_at)}</td>
                </tr>
            }
        })
        .collect_view();
    super::list_table("findings-table", &["Trace", "Pattern", "Found by", "What was seen", "Should have been", "Case", "When (UTC)"], rows)
}
