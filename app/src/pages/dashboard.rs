use leptos::prelude::*;

use crate::{
    api::dashboard_facts,
    dto::{Chart, DashboardInfo, WaitingInfo},
    layout::Waiting,
};

fn uptime(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h) {
        (0, 0) => format!("{m}m {s}s"),
        (0, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[component]
pub fn DashboardPage() -> impl IntoView {
    let info = Resource::new_blocking(|| (), |_| dashboard_facts());
    let counts = use_context::<Waiting>();
    view! {
        {super::page_head("Dashboard", None)}
        <h1>"Dashboard"</h1>
        <Suspense fallback=|| ()>{move || counts.and_then(|c| c.0.get()).and_then(Result::ok).map(waiting)}</Suspense>
        {super::loaded(info, |info| view! { {facts(&info)} {spend(&info)} {charts(&info)} })}
    }
}

/// `n` of a thing, in words: "1 tool call", "3 tool calls".
fn count(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What waits for the owner's decision, first on the page, each linked to where it is decided.
fn waiting(w: WaitingInfo) -> impl IntoView {
    let mut items = Vec::new();
    if w.approvals > 0 {
        let oldest = w.oldest_approval_age_ms.map(|ms| format!(" (the oldest for {})", super::approvals::age(ms))).unwrap_or_default();
        items.push(("approvals", "/approvals", format!("{} waiting for your approval{oldest}", count(w.approvals, "tool call", "tool calls"))));
    }
    if w.mcp_tools > 0 {
        items.push(("mcp-tools", "/mcp", format!("{} in quarantine: new or changed, not offered until you approve", count(w.mcp_tools, "MCP tool", "MCP tools"))));
    }
    if w.mcp_forms > 0 {
        items.push(("mcp-forms", "/mcp", format!("{} from MCP servers waiting for your answer", count(w.mcp_forms, "form", "forms"))));
    }
    if w.repairs > 0 {
        items.push(("repairs", "/repairs", format!("{} to review", count(w.repairs, "repair proposal", "repair proposals"))));
    }
    if items.is_empty() {
        return view! {
            <p class="all-clear" data-testid="waiting-none">"Nothing waits for you: no tool call to approve, MCP tool in quarantine, server form or repair proposal."</p>
        }
        .into_any();
    }
    view! {
        <section class="waiting" data-testid="dashboard-waiting">
            <h2>"Waiting for you"</h2>
            <ul>
                {items.into_iter().map(|(key, href, text)| view! { <li data-waiting=key><a href=href>{text}</a></li> }).collect_view()}
            </ul>
        </section>
    }
    .into_any()
}

fn facts(i: &DashboardInfo) -> impl IntoView + use<> {
    let llm = if i.llm_configured {
        format!("{} (key set)", i.llm_provider)
    } else {
        format!("{}: degraded, set {}", i.llm_provider, i.llm_key_variable)
    };
    let latest = i.migrations_applied.last().map(|m| format!("{:04} {}", m.version, m.description)).unwrap_or_else(|| "none".into());
    let rows = vec![
        ("Version", i.version.clone()),
        ("Uptime", uptime(i.uptime_secs)),
        ("Database", i.database_backend.clone()),
        ("Free on the database's disk", i.database_free_bytes.map_or_else(|| "not known here (PostgreSQL's own disk)".into(), crate::layout::bytes_text)),
        ("Config file", i.config_path.clone()),
        ("Listening on", i.listen_addr.clone()),
        ("Public URL", i.public_url.clone()),
        ("Migrations applied", format!("{} of {} (latest: {latest})", i.migrations_applied.len(), i.migrations_known)),
        ("LLM provider", llm),
        ("Owners", i.owner_count.to_string()),
    ];
    view! {
        <dl class="facts" data-testid="dashboard-facts">
            {rows.into_iter().map(|(k, v)| view! { <div><dt>{k}</dt><dd>{v}</dd></div> }).collect_view()}
        </dl>
    }
}

/// Model spend today and this month against the budgets, with a warning once a share is
/// reached.
fn spend(i: &DashboardInfo) -> impl IntoView + use<> {
    let any_budget = i.spend.iter().any(|s| s.budget_usd.is_some());
    let action = if i.budget_action == "degraded" { "customers get the limit reply until the period ends" } else { "owners are warned; everyone is still answered" };
    let alerts: Vec<String> = i
        .spend
        .iter()
        .filter(|s| s.warned || s.exhausted)
        .map(|s| match (s.exhausted, &s.budget_usd) {
            (true, Some(b)) => format!("Model spend {} reached its budget: ${} of ${b}; {action}.", s.period, s.spent_usd),
            (_, Some(b)) => format!("Model spend {} is at {}% of its budget: ${} of ${b}.", s.period, s.percent.unwrap_or_default(), s.spent_usd),
            (_, None) => String::new(),
        })
        .collect();
    let rows: Vec<(String, String)> = i
        .spend
        .iter()
        .map(|s| {
            let value = match (&s.budget_usd, s.percent) {
                (Some(b), Some(p)) => format!("${} of ${b} ({p}%)", s.spent_usd),
                _ => format!("${} (no budget)", s.spent_usd),
            };
            (format!("Model spend {}", s.period), value)
        })
        .collect();
    view! {
        <h2>"Model spend"</h2>
        {alerts.into_iter().map(|a| view! { <p class="error" role="alert" data-testid="budget-alert">{a}</p> }).collect_view()}
        <dl class="facts" data-testid="dashboard-spend">
            {rows.into_iter().map(|(k, v)| view! { <div><dt>{k}</dt><dd>{v}</dd></div> }).collect_view()}
        </dl>
        {(!any_budget).then(|| view! {
            <p class="empty" data-testid="budget-empty">"No spend budget is set. Set daily_usd or monthly_usd under [budget] in config/gatehouse.toml to be warned at 50%, 80% and 100% of it. Spend counts models priced under [[models.prices]]."</p>
        })}
    }
}

/// How a chart's value reads.
fn value_text(unit: &str, value: i64) -> String {
    match unit {
        "usd_micro" => format!("${:.2}", value as f64 / 1_000_000.0),
        "ms" if value >= 1000 => format!("{:.1} s", value as f64 / 1000.0),
        "ms" => format!("{value} ms"),
        _ => value.to_string(),
    }
}

/// The charts, drawn as SVG on the server: they show without wasm and scale to a phone.
fn charts(i: &DashboardInfo) -> impl IntoView + use<> {
    view! {
        <h2>"Activity"</h2>
        <div class="charts">{i.charts.iter().map(chart).collect_view()}</div>
    }
}

/// One stacked bar chart: a bar a bucket, a colour a series, the legend linking each series'
/// list.
fn chart(c: &Chart) -> impl IntoView + use<> {
    const BAR: f64 = 10.0;
    const HEIGHT: f64 = 60.0;
    let totals: Vec<i64> = c.bars.iter().map(|b| b.values.iter().sum()).collect();
    let max = totals.iter().copied().max().unwrap_or(0);
    let title = match &c.link {
        Some(link) => view! { <a href=link.clone()>{c.title.clone()}</a> }.into_any(),
        None => view! { <span>{c.title.clone()}</span> }.into_any(),
    };
    let body = if max == 0 {
        view! { <p class="empty" data-testid="chart-empty">{c.empty.clone()}</p> }.into_any()
    } else {
        let width = BAR * c.bars.len().max(1) as f64;
        let mut rects = Vec::new();
        for (i, bar) in c.bars.iter().enumerate() {
            let mut y = HEIGHT;
            for (j, &value) in bar.values.iter().enumerate().filter(|(_, v)| **v > 0) {
                let h = HEIGHT * value as f64 / max as f64;
                y -= h;
                let series = c.series.get(j).map(|s| s.name.clone()).unwrap_or_default();
                let label = format!("{} {}: {}", bar.label, series, value_text(&c.unit, value));
                rects.push(view! {
                    <rect x=format!("{:.1}", i as f64 * BAR + 1.0) y=format!("{y:.2}") width=format!("{:.1}", BAR - 2.0) height=format!("{h:.2}")
                        class=format!("s{}", j % 8) data-series=series><title>{label}</title></rect>
                });
            }
        }
        // A chart of groups (jobs by state) names each bar in its legend; its axis would
        // name two of them as if they were a range.
        let end = |bar: Option<&crate::dto::ChartBar>| bar.filter(|_| c.over_time).map(|b| b.label.clone()).unwrap_or_default();
        let (first, last) = (end(c.bars.first()), end(c.bars.last()));
        let legend = c.series.iter().enumerate().map(|(j, s)| {
            let total: i64 = c.bars.iter().map(|b| b.values.get(j).copied().unwrap_or(0)).sum();
            let name = format!("{} ({})", s.name, value_text(&c.unit, total));
            let entry = match &s.link {
                Some(link) => view! { <a href=link.clone()>{name}</a> }.into_any(),
                None => view! { <span>{name}</span> }.into_any(),
            };
            view! { <li><span class=format!("swatch s{}", j % 8)></span>{entry}</li> }
        }).collect_view();
        view! {
            <svg class="chart-plot" viewBox=format!("0 0 {width} {HEIGHT}") preserveAspectRatio="none" role="img" aria-label=c.title.clone()>
                {rects}
            </svg>
            <div class="chart-axis"><span>{first}</span><span>{format!("max {}", value_text(&c.unit, max))}</span><span>{last}</span></div>
            <ul class="legend">{legend}</ul>
        }.into_any()
    };
    view! {
        <figure class="chart" data-testid=format!("chart-{}", c.id)>
            <figcaption>{title}</figcaption>
            {body}
        </figure>
    }
}
