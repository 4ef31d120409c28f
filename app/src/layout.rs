//! The console frame: navigation (with what waits for the owner behind each section), the
//! signed-in owner, the banners and logout.

use leptos::prelude::*;
use leptos_router::components::{A, Outlet};

use crate::{
    api::{Logout, current_owner, waiting},
    dto::{DiskNotice, WaitingInfo},
    error::AppError,
    live::fmt_time,
};

/// The console's sections, in navigation order: (path, label).
pub const NAV: &[(&str, &str)] = &[
    ("/", "Dashboard"),
    ("/conversations", "Conversations"),
    ("/traces", "Traces"),
    ("/approvals", "Approvals"),
    ("/jobs", "Jobs"),
    ("/tools", "Tools & MCP"),
    ("/mcp", "MCP servers"),
    ("/repairs", "Repairs"),
    ("/settings", "Settings"),
];

/// How many things wait for an owner behind a section of [`NAV`].
fn waiting_behind(path: &str, w: &WaitingInfo) -> i64 {
    match path {
        "/approvals" => w.approvals,
        "/mcp" => w.mcp_tools + w.mcp_forms,
        "/repairs" => w.repairs,
        _ => 0,
    }
}

/// The navigation's links, each with the count of what waits behind it (none when nothing does,
/// or when the count could not be read).
fn nav_links(waiting: Option<WaitingInfo>) -> impl IntoView {
    NAV.iter()
        .map(|(href, label)| {
            let n = waiting.as_ref().map_or(0, |w| waiting_behind(href, w));
            // Screen readers get the count in the link's name ("Approvals 2 waiting for you"),
            // which starts with the words shown, so a spoken command that names them works.
            let name = (n > 0).then(|| format!("{label} {n} waiting for you"));
            let count = (n > 0).then(|| view! { " "<span class="nav-count" data-testid="nav-count" aria-hidden="true">{n}</span> });
            view! { <A href=*href exact=true attr:aria-label=name>{*label}{count}</A> }
        })
        .collect_view()
}

/// What waits for an owner, as the navigation read it for this page: the dashboard lists the
/// same counts without reading them again.
#[derive(Clone, Copy)]
pub struct Waiting(pub Resource<Result<WaitingInfo, AppError>>);

#[component]
pub fn ConsoleLayout() -> impl IntoView {
    let shell = Resource::new_blocking(|| (), |_| current_owner());
    let waiting = Resource::new_blocking(|| (), |_| waiting());
    provide_context(Waiting(waiting));
    let logout = ServerAction::<Logout>::new();
    view! {
        <div class="console">
            <header class="topbar">
                <a class="brand" href="/">"Gatehouse"</a>
                <Suspense fallback=|| ()>
                    {move || shell.get().map(|res| match res {
                        Ok(me) => view! {
                            <span class="who" data-testid="owner-name">{me.display_name.clone()}</span>
                            <ActionForm action=logout attr:class="logout">
                                <button type="submit" data-testid="logout">"Log out"</button>
                            </ActionForm>
                        }.into_any(),
                        // The server's guard sends a request without a session to the login page
                        // before the page renders.
                        Err(_) => ().into_any(),
                    })}
                </Suspense>
            </header>
            <div class="banners">
            <Suspense fallback=|| ()>
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.degraded).map(|d| view! {
                    <div class="banner warn" role="status" data-testid="degraded-banner">
                        "Degraded mode: no key for the LLM provider \u{201c}" {d.provider.clone()} "\u{201d}. "
                        "Customers get the fallback reply. Set " <code>{d.variable.clone()}</code>
                        " in Gatehouse's environment and restart."
                    </div>
                })}
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.disk).map(disk_banner)}
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.whatsapp_token_rejected_since_ms).map(|since| view! {
                    <div class="banner alert" role="alert" data-testid="token-banner">
                        <strong>"Meta refuses the WhatsApp access token."</strong>
                        {format!(" Since {} UTC no reply goes out; they wait in the queue and are sent once the token works (within WhatsApp's 24-hour window). Set a working ", fmt_time(since))}
                        <code>"WHATSAPP_ACCESS_TOKEN"</code>" and restart Gatehouse."
                    </div>
                })}
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.whatsapp_sending_unset).map(|setting| view! {
                    <div class="banner alert" role="alert" data-testid="sending-banner">
                        <strong>"WhatsApp messages come in, but no reply can go out: "</strong><code>{setting}</code>" is not set."
                        " The messages wait in the queue and are answered in turn once it is set and Gatehouse restarted (within WhatsApp's 24-hour window)."
                    </div>
                })}
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.storage_warning).map(|w| view! {
                    <div class="banner warn" role="status" data-testid="storage-banner">
                        "Ephemeral storage: " {w} ". Set " <code>"database.url"</code> " to a lasting file or PostgreSQL."
                    </div>
                })}
            </Suspense>
            </div>
            // Live pages keep the counts current too.
            <nav class="sidenav" aria-label="Console" data-live-region="nav">
                <Suspense fallback=|| nav_links(None)>
                    {move || waiting.get().map(|w| nav_links(w.ok()))}
                </Suspense>
            </nav>
            <main class="content">
                <Outlet />
            </main>
        </div>
    }
}

/// Bytes as an owner reads them, in the binary units of `database.low_space_mib` and of the
/// owners' WhatsApp notice: "12 KiB", "312 MiB", "4.2 GiB".
pub fn bytes_text(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match n {
        n if n >= GIB => format!("{:.1} GiB", n as f64 / GIB as f64),
        n if n >= MIB => format!("{} MiB", n / MIB),
        n => format!("{} KiB", n / KIB),
    }
}

/// A full disk (writes fail) or a nearly full one, on every page.
fn disk_banner(d: DiskNotice) -> impl IntoView {
    let free = d.free_bytes.map(|b| format!(" {} free.", bytes_text(b))).unwrap_or_default();
    match d.full_since_ms {
        Some(since) => {
            let last = d.last_full_ms.filter(|l| l / 1000 > since / 1000).map(|l| format!(", the last at {}", fmt_time(l))).unwrap_or_default();
            view! {
                <div class="banner alert" role="alert" data-testid="disk-full-banner">
                    <strong>"The database's disk is full."</strong>
                    {format!(" Writes fail since {} UTC{last}.{free} ", fmt_time(since))}
                    "Nothing is lost: WhatsApp delivers each refused message again later (the webhook answers 503 "<code>"STORAGE_FULL"</code>"), and replies wait in the queue. Free space on that disk; Gatehouse resumes by itself."
                </div>
            }
            .into_any()
        }
        None => view! {
            <div class="banner warn" role="status" data-testid="disk-low-banner">
                <strong>"Little room left for the database."</strong>
                {format!("{free} This shows below {} MiB (", d.low_space_mib)}<code>"database.low_space_mib"</code>"). On a full disk nothing new is stored until there is room again."
            </div>
        }
        .into_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::bytes_text;

    #[test]
    fn bytes_read_in_the_units_of_the_threshold() {
        assert_eq!(bytes_text(0), "0 KiB");
        assert_eq!(bytes_text(12 << 10), "12 KiB");
        assert_eq!(bytes_text((312 << 20) + 5), "312 MiB");
        assert_eq!(bytes_text((4 << 30) + (1 << 29)), "4.5 GiB");
    }
}
