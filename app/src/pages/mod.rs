pub mod conversations;
pub mod dashboard;
pub mod jobs;
pub mod login;
pub mod mcp;
pub mod pending;
pub mod settings;
pub mod setup;
pub mod tools;
pub mod traces;

use leptos::prelude::*;

use crate::error::AppError;

#[component]
pub fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>() {
        res.set_status(http::StatusCode::NOT_FOUND);
    }
    view! {
        <main class="narrow">
            <h1>"Not found"</h1>
            <p>"There is no page here. " <a href="/">"Back to the dashboard"</a></p>
        </main>
    }
}

/// Shows a server function error inline.
pub fn error_view(err: &AppError) -> AnyView {
    crate::layout::redirect_if_unauthorized(err);
    view! { <p class="error" role="alert" data-code=err.code.clone()>{err.message.clone()}</p> }.into_any()
}

/// Percent-encodes a value for a URL path segment or query value.
pub(crate) fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The "created / when" filter of list pages: (minutes back, label); 0 means any time.
pub(crate) const SINCE_OPTIONS: [(i64, &str); 5] = [(0, "any time"), (15, "last 15 minutes"), (60, "last hour"), (1440, "last 24 hours"), (10_080, "last 7 days")];
