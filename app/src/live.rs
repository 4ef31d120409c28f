//! Live updates: the server pushes a server-sent event whenever something a page shows has
//! changed; pages re-fetch their data when the returned counter moves. Without wasm the pages
//! still work, without live updates.

use leptos::prelude::*;

/// A counter that increases on every event from `url` (an SSE endpoint of this server).
pub fn use_live(url: &'static str) -> ReadSignal<u64> {
    let (version, set_version) = signal(0u64);
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::{JsCast, closure::Closure};
        Effect::new(move |_| {
            let Ok(source) = web_sys::EventSource::new(url) else { return };
            let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |_: web_sys::MessageEvent| {
                set_version.update(|v| *v += 1);
            });
            source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
            on_message.forget();
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
