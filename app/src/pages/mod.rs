pub mod approvals;
pub mod conversations;
pub mod dashboard;
pub mod jobs;
pub mod login;
pub mod mcp;
mod mcp_forms;
pub mod repairs;
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

/// `data` as `body` shows it once loaded, or its error inline; the last page stays on screen
/// while it reloads.
pub(crate) fn loaded<T, V>(data: Resource<Result<T, AppError>>, body: impl Fn(T) -> V + Send + Sync + 'static) -> impl IntoView
where
    T: Clone + Send + Sync + 'static,
    V: IntoView + 'static,
{
    view! {
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || data.get().map(|res| match res {
                Err(e) => error_view(&e),
                Ok(p) => body(p).into_any(),
            })}
        </Transition>
    }
}

/// A list page's table: the header cells, then `rows` (one `<tr>` each).
pub(crate) fn list_table(testid: &'static str, headers: &[&'static str], rows: impl IntoView + 'static) -> AnyView {
    view! {
        <div class="table-wrap">
            <table class="list" data-testid=testid>
                <thead><tr>{headers.iter().map(|h| view! { <th>{*h}</th> }).collect_view()}</tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </div>
    }
    .into_any()
}

/// An action's answer: its text as a status notice, or its error.
pub(crate) fn action_notice(answer: impl Get<Value = Option<Result<String, AppError>>> + Send + Sync + 'static, testid: &'static str) -> impl IntoView {
    move || {
        answer.get().map(|r| match r {
            Ok(text) => view! { <p class="notice" role="status" data-testid=testid>{text}</p> }.into_any(),
            Err(e) => error_view(&e),
        })
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
const SINCE_OPTIONS: [(i64, &str); 5] = [(0, "any time"), (15, "last 15 minutes"), (60, "last hour"), (1440, "last 24 hours"), (10_080, "last 7 days")];

/// A filter `<select>`: "any" (the empty value) and then `values`, with `current` selected.
pub(crate) fn any_select(name: &'static str, values: &'static [&'static str], current: &str) -> impl IntoView + use<> {
    let current = current.to_string();
    view! {
        <select name=name>
            <option value="">"any"</option>
            {values.iter().map(|v| view! { <option value=*v selected=current == *v>{*v}</option> }).collect_view()}
        </select>
    }
}

/// The `since_minutes` filter `<select>` of the list pages.
pub(crate) fn since_select(current: i64) -> impl IntoView + use<> {
    view! {
        <select name="since_minutes">
            {SINCE_OPTIONS.into_iter().map(|(m, label)| view! { <option value=m.to_string() selected=current == m>{label}</option> }).collect_view()}
        </select>
    }
}
