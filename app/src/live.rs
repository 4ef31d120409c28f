//! Live updates: the server streams typed events (`/api/events`, server-sent events) about
//! what the page shows; a page re-fetches its data when the returned counter moves. The browser
//! reconnects by itself and sends the last event's id, and the server replays what was missed,
//! so a page misses nothing across a reconnect. Without wasm the pages still work: a reload
//! shows the latest.

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

/// A counter that increases after events from `url` (an SSE endpoint of this server); a burst
/// of events (one message makes a dozen) moves it once. While the stream is open the page's
/// root element carries `data-live="open"`.
pub fn use_live(url: &'static str) -> ReadSignal<u64> {
    let (version, set_version) = signal(0u64);
    #[cfg(feature = "hydrate")]
    {
        use std::{cell::Cell, rc::Rc, time::Duration};

        use wasm_bindgen::{JsCast, closure::Closure};
        Effect::new(move |_| {
            let Ok(source) = web_sys::EventSource::new(url) else { return };
            let pending = Rc::new(Cell::new(false));
            let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_: web_sys::MessageEvent| {
                if pending.replace(true) {
                    return;
                }
                let pending = pending.clone();
                set_timeout(
                    move || {
                        pending.set(false);
                        set_version.update(|v| *v += 1);
                    },
                    Duration::from_millis(50),
                );
            });
            source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
            on_message.forget();
            let mark = |state: &'static str| {
                move |_: web_sys::Event| {
                    if let Some(root) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.document_element()) {
                        let _ = root.set_attribute("data-live", state);
                    }
                }
            };
            let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(mark("open"));
            source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
            on_open.forget();
            let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(mark("reconnecting"));
            source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
            on_error.forget();
            let source = send_wrapper::SendWrapper::new(source);
            on_cleanup(move || source.close());
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (url, set_version);
    version
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) for unix milliseconds.
pub fn fmt_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
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
