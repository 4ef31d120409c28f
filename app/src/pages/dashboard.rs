use leptos::prelude::*;
use leptos_meta::Title;

use crate::{api::dashboard_facts, dto::DashboardInfo};

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
    view! {
        <Title text="Dashboard · Gatehouse" />
        <h1>"Dashboard"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || info.get().map(|res| match res {
                Ok(info) => facts(&info).into_any(),
                Err(e) => super::error_view(&e),
            })}
        </Suspense>
    }
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
