//! The console's interactive parts, the only code compiled to wasm (Leptos islands): pages are
//! rendered on the server, their forms post as plain HTML forms, and these islands keep a page
//! current and mark it ready.
//!
//! Live updates: the server streams typed events (`/api/events`, server-sent events) about what
//! the page shows. After a burst of them (one message makes a dozen) [`Live`] fetches the page
//! again and puts its new live regions in place of the old ones. The browser reconnects by itself
//! and sends the last event's id, and the server replays what was missed, so a page misses
//! nothing across a reconnect. Without wasm the pages still work: a reload shows the latest.

use leptos::prelude::*;

/// The event stream; a page follows some of its topics.
pub const EVENTS_STREAM: &str = "/api/events";
/// Conversations: messages and replies.
pub const MESSAGES_LIVE: &str = "/api/events?topics=message";
/// Traces: messages, their steps and approvals.
pub const TRACES_LIVE: &str = "/api/events?topics=message,approval";
/// Approvals: requests, decisions and the jobs that run them.
pub const APPROVALS_LIVE: &str = "/api/events?topics=approval,job";
/// Jobs: state changes and tool calls.
pub const JOBS_LIVE: &str = "/api/events?topics=job";
/// Repairs: the self-improvement cycle and owners' marks, which make proposals and cases (not
/// every job: a busy queue would fetch the page again all the time).
pub const REPAIRS_LIVE: &str = "/api/events?topics=job&kinds=evals.cycle,evals.mark";

/// Keeps the page's live regions current with the events from `url` (an SSE endpoint of this
/// server): elements marked `data-live-region="NAME"`, each given the content of the element
/// with the same mark in the page fetched again. A region is what the page shows of the data;
/// one holding the field an owner is typing in, or one whose fields, boxes, choices or open
/// details the owner changed, is left as it is until the next update (a swap would undo it).
/// While the stream is open the page's root element carries `data-live="open"`, and `data-live-updates` counts the updates made; while the stream is
/// refused and tried again, `data-live="paused"`, and the page says so ([`LivePaused`]).
#[island]
pub fn Live(url: String) -> impl IntoView {
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| follow(&url));
    #[cfg(not(feature = "hydrate"))]
    let _ = url;
}

/// What a live page shows while its updates are paused (the style sheet shows it only then).
#[component]
pub fn LivePaused() -> impl IntoView {
    view! {
        <p class="banner warn live-paused" role="status" data-testid="live-paused">
            "Live updates are paused: the server did not take this page's connection. Trying again; reload the page to see the latest."
        </p>
    }
}

/// Marks the page ready (`data-hydrated` on `<body>`) once the islands before it are hydrated;
/// tests and scripts wait for it. Rendered last.
#[island]
pub fn Ready() -> impl IntoView {
    Effect::new(|| {
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
}

#[cfg(feature = "hydrate")]
fn follow(url: &str) {
    open_stream(std::rc::Rc::from(url), std::rc::Rc::new(std::cell::Cell::new(0)));
}

/// Opens the event stream. The browser reconnects by itself after a dropped connection; a
/// reconnect that is refused (the session ended: 401; too many live pages: 429; the server
/// restarting behind a proxy: 502/503) closes the stream for good. Then the page is fetched
/// once (a session that ended sends it to the login page), the root element says
/// `data-live="paused"` (the page shows why), and the stream is opened again after a growing
/// pause. A stream opened again starts with a resync event, so the page catches up.
#[cfg(feature = "hydrate")]
fn open_stream(url: std::rc::Rc<str>, failures: std::rc::Rc<std::cell::Cell<u32>>) {
    use std::{cell::Cell, rc::Rc, time::Duration};

    use wasm_bindgen::{JsCast, closure::Closure};

    let Ok(source) = web_sys::EventSource::new(&url) else { return };
    // `dirty`: an event came since the last fetch began; `busy`: a fetch is due or running.
    let (dirty, busy) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_: web_sys::MessageEvent| {
        dirty.set(true);
        if busy.replace(true) {
            return;
        }
        let (dirty, busy) = (dirty.clone(), busy.clone());
        set_timeout(
            move || {
                wasm_bindgen_futures::spawn_local(async move {
                    while dirty.replace(false) {
                        if let Err(e) = refresh().await {
                            leptos::logging::warn!("live update failed: {e:?}");
                        }
                        count_update();
                    }
                    busy.set(false);
                })
            },
            Duration::from_millis(50),
        );
    });
    source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    // Open again: the next refusal starts its pauses from the shortest.
    let opened = failures.clone();
    let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(move |_: web_sys::Event| {
        opened.set(0);
        mark_live("open");
    });
    source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    on_open.forget();
    let stream = source.clone();
    let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_: web_sys::Event| {
        if stream.ready_state() != web_sys::EventSource::CLOSED {
            mark_live("reconnecting");
            return;
        }
        mark_live("paused");
        wasm_bindgen_futures::spawn_local(async {
            if let Err(e) = refresh().await {
                leptos::logging::warn!("live update failed: {e:?}");
            }
        });
        let (url, failures) = (url.clone(), failures.clone());
        let pause = Duration::from_secs(2u64.saturating_pow(failures.get().min(5) + 1).min(60));
        failures.set(failures.get() + 1);
        set_timeout(move || open_stream(url, failures), pause);
    });
    source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
}

/// `data-live` on the root element: `open`, `reconnecting` or `paused`.
#[cfg(feature = "hydrate")]
fn mark_live(state: &str) {
    if let Some(root) = document().document_element() {
        let _ = root.set_attribute("data-live", state);
    }
}

/// Counts the live updates done on the root element (`data-live-updates`), for scripts and
/// tests that wait for one.
#[cfg(feature = "hydrate")]
fn count_update() {
    if let Some(root) = document().document_element() {
        let done = root.get_attribute("data-live-updates").and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        let _ = root.set_attribute("data-live-updates", &(done + 1).to_string());
    }
}

/// Sent with a live update's fetch of the page: it shows no form answer (and takes none away
/// from the page the browser may be about to load; see [`crate::pages::form_action`]).
pub const LIVE_FETCH_HEADER: &str = "x-gatehouse-live";

/// Fetches the page again and swaps its live regions in. A session that ended meanwhile sends
/// the fetch to the login page, and the browser follows.
#[cfg(feature = "hydrate")]
async fn refresh() -> Result<(), wasm_bindgen::JsValue> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;

    let window = window();
    let href = window.location().href()?;
    // Marked, so that this fetch leaves a form's answer for the page the browser goes to next.
    let headers = web_sys::Headers::new()?;
    headers.set(LIVE_FETCH_HEADER, "1")?;
    let init = web_sys::RequestInit::new();
    init.set_headers(&headers);
    let request = web_sys::Request::new_with_str_and_init(&href, &init)?;
    let response: web_sys::Response = JsFuture::from(window.fetch_with_request(&request)).await?.dyn_into()?;
    if response.redirected() {
        return window.location().assign(&response.url());
    }
    if !response.ok() {
        return Ok(());
    }
    let html = JsFuture::from(response.text()?).await?.as_string().unwrap_or_default();
    let fresh = web_sys::DomParser::new()?.parse_from_string(&html, web_sys::SupportedType::TextHtml)?;
    let document = document();
    let focused = document.active_element();
    let regions = document.query_selector_all("[data-live-region]")?;
    for i in 0..regions.length() {
        let Some(old) = regions.item(i).and_then(|n| n.dyn_into::<web_sys::Element>().ok()) else { continue };
        if focused.as_ref().is_some_and(|f| old.contains(Some(f))) || changed_by_owner(&old) {
            continue;
        }
        let Some(name) = old.get_attribute("data-live-region") else { continue };
        if let Some(new) = fresh.query_selector(&format!("[data-live-region=\"{name}\"]"))? {
            old.set_inner_html(&new.inner_html());
        }
    }
    Ok(())
}

/// Whether the owner changed something in `region` that a swap would undo: a field typed in
/// (and left), a box ticked, a choice made, a diff opened. Such a region waits, as one holding
/// the focused field does, until the owner is done (a form posted reloads the page anyway).
#[cfg(feature = "hydrate")]
fn changed_by_owner(region: &web_sys::Element) -> bool {
    use wasm_bindgen::JsCast;

    let Ok(controls) = region.query_selector_all("input, textarea, select, details[open]") else { return false };
    (0..controls.length()).filter_map(|i| controls.item(i)).any(|node| {
        if let Some(input) = node.dyn_ref::<web_sys::HtmlInputElement>() {
            return match input.type_().as_str() {
                "checkbox" | "radio" => input.checked() != input.default_checked(),
                "hidden" | "submit" | "button" => false,
                _ => input.value() != input.default_value(),
            };
        }
        if let Some(text) = node.dyn_ref::<web_sys::HtmlTextAreaElement>() {
            return text.default_value().is_ok_and(|original| text.value() != original);
        }
        if let Some(select) = node.dyn_ref::<web_sys::HtmlSelectElement>() {
            let options = select.options();
            return (0..options.length()).filter_map(|i| options.item(i)).filter_map(|o| o.dyn_into::<web_sys::HtmlOptionElement>().ok()).any(|o| o.selected() != o.default_selected());
        }
        // An open <details> (a repair's diff, an MCP tool's definition).
        true
    })
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) for unix milliseconds (none before 1970 are stored).
pub fn fmt_time(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0).unsigned_abs());
    // RFC 3339 with whole seconds, `2026-11-30T00:53:20Z`, written the way the console shows times.
    humantime::format_rfc3339_seconds(at).to_string().replacen('T', " ", 1).trim_end_matches('Z').to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00");
        assert_eq!(super::fmt_time(1_796_000_000_000), "2026-11-30 00:53:20");
        assert_eq!(super::fmt_time(951_782_400_000), "2000-02-29 00:00:00");
    }
}
