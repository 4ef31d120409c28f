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

use leptos::{prelude::*, server_fn::ServerFn};
use leptos_meta::Title;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;

use crate::{
    api::take_answer,
    error::AppError,
    live::{Live, LivePaused},
};

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

/// A page's title ("NAME · Gatehouse" in the browser's tab) and, for a page that follows
/// events from the SSE endpoint `live`, its [`Live`] island.
pub(crate) fn page_head(name: &'static str, live: Option<&'static str>) -> impl IntoView {
    view! {
        <Title text=format!("{name} · Gatehouse") />
        {live.map(|url| view! { <Live url=url.to_string() /><LivePaused /> })}
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

/// The server action behind a page's form, and what the browser's last post of that form
/// answered, on the page it came back to: an error travels in the URL (server_fn puts it there,
/// [`ServerAction::value`] reads it), a result kept for the session ([`take_answer`], once). Show the
/// answer with [`answer_view`].
pub(crate) fn form_action<S>() -> (ServerAction<S>, Answer<S::Output>)
where
    S: ServerFn<Error = AppError> + Clone + Send + Sync + 'static,
    S::Output: DeserializeOwned + Clone + Send + Sync + 'static,
{
    let action = ServerAction::<S>::new();
    let kept = Resource::new_blocking(|| (), |_| take_answer(S::PATH.to_string()));
    let answer = Signal::derive(move || {
        action.value().get().or_else(|| {
            let json = kept.get()?.ok()??;
            serde_json::from_str(&json).ok().map(Ok)
        })
    });
    (action, answer)
}

/// What was typed into the form of server function `S` when its last plain post was refused:
/// the function's own arguments, kept for the page the browser came back to
/// (`auth::for_owner_keeping`) and taken once, to fill the form with again.
pub(crate) fn form_input<S>() -> Signal<Option<S>>
where
    S: ServerFn + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let kept = Resource::new_blocking(|| (), |_| take_answer(format!("{}{}", S::PATH, crate::api::INPUT_KEY)));
    Signal::derive(move || {
        let json = kept.get()?.ok()??;
        serde_json::from_str(&json).ok()
    })
}

/// What a form's last post answered, if the browser just came back from one ([`form_action`]).
pub(crate) type Answer<T> = Signal<Option<Result<T, AppError>>>;

/// An answer from [`form_action`] as `show` shows it.
pub(crate) fn answer_with<T, V>(answer: Answer<T>, show: impl Fn(Result<T, AppError>) -> V + Send + Sync + 'static) -> impl IntoView
where
    T: Clone + Send + Sync + 'static,
    V: IntoView + 'static,
{
    view! { <Suspense fallback=|| ()>{move || answer.get().map(&show)}</Suspense> }
}

/// An answer from [`form_action`] as `ok` shows it, or its error.
pub(crate) fn answer_view<T, V>(answer: Answer<T>, ok: impl Fn(T) -> V + Send + Sync + 'static) -> impl IntoView
where
    T: Clone + Send + Sync + 'static,
    V: IntoView + 'static,
{
    answer_with(answer, move |r| match r {
        Ok(value) => ok(value).into_any(),
        Err(e) => error_view(&e),
    })
}

/// An action's answer: its text as a status notice, or its error.
pub(crate) fn action_notice(answer: Answer<String>, testid: &'static str) -> impl IntoView {
    answer_view(answer, move |text| view! { <p class="notice" role="status" data-testid=testid>{text}</p> })
}

/// Shows a server function error inline.
pub fn error_view(err: &AppError) -> AnyView {
    view! { <p class="error" role="alert" data-code=err.code.clone()>{err.message.clone()}</p> }.into_any()
}

/// What [`url_encode`] leaves as it is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Percent-encodes a value for a URL path segment or query value.
pub(crate) fn url_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// A list page's query string (`?k=v&…`, or nothing): its text filters that are set, its time
/// filter, and `before` for the page of older rows.
pub(crate) fn list_query(filters: &[(&str, &str)], since_minutes: i64, before: Option<i64>) -> String {
    let texts = filters.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={}", url_encode(v)));
    let since = (since_minutes > 0).then(|| format!("since_minutes={since_minutes}"));
    let parts: Vec<String> = texts.chain(since).chain(before.map(|b| format!("before={b}"))).collect();
    if parts.is_empty() { String::new() } else { format!("?{}", parts.join("&")) }
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

#[cfg(test)]
mod tests {
    #[test]
    fn values_are_percent_encoded_but_unreserved_characters() {
        assert_eq!(super::url_encode("+1 555/ü&a=b"), "%2B1%20555%2F%C3%BC%26a%3Db");
        assert_eq!(super::url_encode("Az09-_.~"), "Az09-_.~");
    }

    #[test]
    fn a_list_query_has_the_filters_that_are_set() {
        assert_eq!(super::list_query(&[("state", ""), ("chat", "")], 0, None), "");
        assert_eq!(super::list_query(&[("state", "running"), ("chat", "+1 555")], 60, Some(42)), "?state=running&chat=%2B1%20555&since_minutes=60&before=42");
        assert_eq!(super::list_query(&[("route", "")], 0, Some(7)), "?before=7");
    }
}
