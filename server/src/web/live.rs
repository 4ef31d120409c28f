//! Server-sent events for live console pages. The stream sends an event whenever the newest
//! job state change moves (one indexed lookup per second per open page), and a keep-alive.

use std::{convert::Infallible, time::Duration};

use axum::{
    extract::State,
    response::sse::{Event, KeepAlive, Sse},
};
use futures_util::Stream;

use super::state::AppState;

pub async fn jobs_stream(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold((state, None::<i64>), |(state, mut last)| async move {
        loop {
            let latest: Option<i64> = sqlx::query_as::<_, (Option<i64>,)>("SELECT MAX(id) FROM job_events").fetch_one(&state.db.pool).await.ok().and_then(|r| r.0);
            let latest = latest.unwrap_or(0);
            if last != Some(latest) {
                let first = last.is_none();
                last = Some(latest);
                if !first {
                    return Some((Ok(Event::default().event("message").data(latest.to_string())), (state, last)));
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
