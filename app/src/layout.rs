//! The console frame: navigation, the signed-in owner, the degraded-mode banner and logout.

use leptos::prelude::*;
use leptos_router::{components::{A, Outlet}, hooks::use_navigate};

use crate::{api::{Logout, current_owner}, error::AppError};

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

/// Sends the browser to the login page when a server function says the session is gone.
pub fn redirect_if_unauthorized(err: &AppError) {
    if err.is_unauthorized() {
        let navigate = use_navigate();
        request_animation_frame(move || navigate("/login", Default::default()));
    }
}

#[component]
pub fn ConsoleLayout() -> impl IntoView {
    let shell = Resource::new_blocking(|| (), |_| current_owner());
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
                        Err(err) => {
                            redirect_if_unauthorized(&err);
                            ().into_any()
                        }
                    })}
                </Suspense>
            </header>
            <Suspense fallback=|| ()>
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.degraded).map(|d| view! {
                    <div class="banner warn" role="status" data-testid="degraded-banner">
                        "Degraded mode: no key for the LLM provider \u{201c}" {d.provider.clone()} "\u{201d}. "
                        "Customers get the fallback reply. Set " <code>{d.variable.clone()}</code>
                        " in Gatehouse's environment and restart."
                    </div>
                })}
                {move || shell.get().and_then(|res| res.ok()).and_then(|me| me.storage_warning).map(|w| view! {
                    <div class="banner warn" role="status" data-testid="storage-banner">
                        "Ephemeral storage: " {w} ". Set " <code>"database.url"</code> " to a lasting file or PostgreSQL."
                    </div>
                })}
            </Suspense>
            <nav class="sidenav" aria-label="Console">
                {NAV.iter().map(|(href, label)| view! { <A href=*href exact=true>{*label}</A> }).collect_view()}
            </nav>
            <main class="content">
                <Outlet />
            </main>
        </div>
    }
}
