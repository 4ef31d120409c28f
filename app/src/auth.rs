//! Server-side session checks, shared by the server functions and the server's page guard.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};
use tower_sessions::Session;

use crate::{
    backend::{OwnerIdentity, SharedBackend},
    dto::ShellInfo,
    error::AppError,
};

const SESSION_KEY: &str = "owner";

/// What a session stores about its owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionOwner {
    id: i64,
    epoch: i64,
    login_at_ms: i64,
}

/// The client address, put into request extensions by the server.
#[derive(Debug, Clone)]
pub struct ClientIp(pub String);

/// Whether the request came from this machine itself: a loopback peer, and no proxy's
/// forwarding header (a proxy on the same machine forwards the whole internet). Put into
/// request extensions by the server; first-run setup answers such requests without a token.
#[derive(Debug, Clone, Copy)]
pub struct LocalPeer(pub bool);

fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

/// The owner behind `session`, or `None` for no session, an expired one, or one whose owner was
/// removed or had the password reset. Invalid sessions are flushed.
pub async fn owner_of(session: &Session, backend: &SharedBackend) -> Result<Option<ShellInfo>, AppError> {
    let stored: Option<SessionOwner> = session.get(SESSION_KEY).await.map_err(session_error)?;
    let Some(stored) = stored else { return Ok(None) };
    let expired = now_ms().saturating_sub(stored.login_at_ms) > backend.session_absolute_timeout_ms();
    let info = if expired { None } else { backend.shell_info(&OwnerIdentity { id: stored.id, epoch: stored.epoch }).await? };
    if info.is_none() {
        let _ = session.flush().await;
    }
    Ok(info)
}

/// Starts a fresh session for `who`, with a new id so a planted id is useless.
pub async fn begin_session(session: &Session, who: &OwnerIdentity) -> Result<(), AppError> {
    let record = SessionOwner { id: who.id, epoch: who.epoch, login_at_ms: now_ms() };
    session.cycle_id().await.map_err(session_error)?;
    session.insert(SESSION_KEY, record).await.map_err(session_error)?;
    Ok(())
}

/// A session store failure: `DATABASE_UNAVAILABLE` (503) when the server's store says the
/// database could not be reached, else the generic internal error.
fn session_error(e: tower_sessions::session::Error) -> AppError {
    tracing::error!(error = %e, "session store failed");
    let unreachable = matches!(&e, tower_sessions::session::Error::Store(tower_sessions::session_store::Error::Backend(m)) if m.starts_with(crate::error::code::DATABASE_UNAVAILABLE));
    if unreachable { AppError::database_unavailable() } else { AppError::internal() }
}

pub(crate) fn backend() -> Result<SharedBackend, AppError> {
    use_context::<SharedBackend>().ok_or_else(|| {
        missing_from_context("the console backend", None);
        AppError::internal()
    })
}

pub(crate) async fn session() -> Result<Session, AppError> {
    leptos_axum::extract::<Session>().await.map_err(|e| {
        missing_from_context("the session", Some(&e.to_string()));
        AppError::internal()
    })
}

/// Logs that `what` was not in the reactive context. A page's data is fetched in a task of its
/// own, which reaches the request's context through its page; a browser that leaves the page
/// (or a live update's fetch it no longer waits for) ends the request and takes the context with
/// it, so the fetch finds nothing, and nobody is waiting for its answer: that is logged at debug.
/// With the request still there, something was not provided, which is a wiring fault.
fn missing_from_context(what: &str, error: Option<&str>) {
    if use_context::<http::request::Parts>().is_none() {
        tracing::debug!(error, "{what} was gone: the request ended before its server function read it");
    } else {
        tracing::error!(error, "{what} is missing from the request's context");
    }
}

pub(crate) async fn client_ip() -> String {
    leptos_axum::extract::<axum::Extension<ClientIp>>().await.map(|ip| ip.0.0).unwrap_or_else(|_| "unknown".into())
}

/// Whether the request came from this machine itself ([`LocalPeer`]); false when unknown.
pub(crate) async fn local_peer() -> bool {
    leptos_axum::extract::<axum::Extension<LocalPeer>>().await.is_ok_and(|local| local.0.0)
}

/// The signed-in owner, or `UNAUTHORIZED`. Every protected server function starts here.
pub async fn require_owner() -> Result<ShellInfo, AppError> {
    let backend = backend()?;
    let session = session().await?;
    owner_of(&session, &backend).await?.ok_or_else(AppError::unauthorized)
}

/// The body of a protected server function: `work` gets the signed-in owner (or the call is
/// refused with `UNAUTHORIZED`) and the backend, and its result is answered as [`answer`] does.
pub async fn for_owner<T, F, Fut>(work: F) -> Result<T, AppError>
where
    T: Serialize,
    F: FnOnce(ShellInfo, SharedBackend) -> Fut,
    Fut: Future<Output = Result<T, AppError>>,
{
    let result = async {
        // Taken before the session is read: see `missing_from_context`.
        let backend = backend()?;
        let me = owner_of(&session().await?, &backend).await?.ok_or_else(AppError::unauthorized)?;
        work(me, backend).await
    }
    .await;
    if let Ok(value) = &result {
        keep_for_the_page(value).await;
    }
    answer(result)
}

/// When a form's typed fields are kept for its page ([`for_owner_keeping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepInput {
    /// When the work is refused: a form that did its work starts empty again (a message sent).
    Refused,
    /// After every post: a form that is tried again with changes (a tool's arguments).
    Always,
}

/// [`for_owner`] for a form whose typed fields are worth keeping: after a plain form post (see
/// [`KeepInput`] for when), `input` (the server function's own arguments) is kept for the page
/// the browser comes back to, which fills the form with it again
/// ([`crate::pages::form_input`]), so nothing typed is lost. Never for a password.
pub async fn for_owner_keeping<I, T, F, Fut>(input: &I, keep: KeepInput, work: F) -> Result<T, AppError>
where
    I: Serialize,
    T: Serialize,
    F: FnOnce(ShellInfo, SharedBackend) -> Fut,
    Fut: Future<Output = Result<T, AppError>>,
{
    let result = for_owner(work).await;
    let wanted = match &result {
        Ok(_) => keep == KeepInput::Always,
        // Without an owner there is nobody to keep it for.
        Err(e) => !e.is_unauthorized(),
    };
    if wanted {
        keep_for_the_page_as(input, crate::api::INPUT_KEY).await;
    }
    result
}

/// After a plain form post (the browser is sent back to the form's page, see `answer`), keeps
/// the server function's result for that page to show ([`take_answer`]), in rows of its own:
/// the session's record is saved by every request, concurrent ones too, and would lose it. An
/// error needs no keeping: server_fn carries it back in the URL.
async fn keep_for_the_page<T: Serialize>(value: &T) {
    keep_for_the_page_as(value, "").await;
}

/// [`keep_for_the_page`] under the server function's path with `suffix` added.
async fn keep_for_the_page_as<T: Serialize>(value: &T, suffix: &str) {
    if !is_plain_form_post() {
        return;
    }
    let Some(path) = use_context::<http::request::Parts>().map(|p| format!("{}{suffix}", p.uri.path())) else { return };
    let Ok(json) = serde_json::to_string(value) else { return };
    // A function with nothing to answer (retry, cancel, a switch): its page shows the change.
    if json == "null" {
        return;
    }
    let (Ok(session), Ok(backend)) = (session().await, backend()) else { return };
    let Some(id) = session.id() else { return };
    if let Err(e) = backend.keep_form_answer(&id.to_string(), &path, &json).await {
        tracing::warn!(error = %e.message, path, "could not keep a form's answer for its page");
    }
}

/// What the last plain form post to the server function at `path` answered (as JSON), once: the
/// page the browser came back to shows it, and a reload does not. A live update's fetch of the
/// page gets nothing and takes nothing.
pub async fn take_answer(path: &str) -> Result<Option<String>, AppError> {
    // A live update's fetch of the page may run while the browser follows the form's redirect.
    if use_context::<http::request::Parts>().is_some_and(|p| p.headers.contains_key(crate::live::LIVE_FETCH_HEADER)) {
        return Ok(None);
    }
    let Some(id) = session().await?.id() else { return Ok(None) };
    backend()?.take_form_answer(&id.to_string(), path).await
}

/// True for a plain HTML form post: the answer must be a redirect back to the form, which
/// carries the error in its URL, not an error status the browser would show as JSON. (A page
/// rendered on the server answers with its data's status instead: an unknown job is a 404.)
fn is_plain_form_post() -> bool {
    use_context::<http::request::Parts>()
        .filter(|p| p.method == http::Method::POST)
        .and_then(|p| p.headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).map(|v| v.contains("text/html")))
        .unwrap_or(false)
}

/// Sets the HTTP status (and Retry-After) for an error answer.
pub fn answer<T>(result: Result<T, AppError>) -> Result<T, AppError> {
    if let Err(err) = &result {
        if is_plain_form_post() {
            return result;
        }
        if let Some(res) = use_context::<leptos_axum::ResponseOptions>()
            && let Ok(status) = http::StatusCode::from_u16(err.status())
        {
            res.set_status(status);
        }
    }
    result
}

/// The cookie that makes a browser an owner signed in from a trusted device: its logins for
/// that owner are throttled by its own failures only, so guessing the owner's login name from
/// elsewhere cannot hold the owner back (see the server's `owners::Throttle`).
pub const DEVICE_COOKIE: &str = "gatehouse_device";

/// The request's [`DEVICE_COOKIE`], if it sent one.
pub(crate) async fn device_cookie() -> Option<String> {
    let headers = leptos_axum::extract::<http::HeaderMap>().await.ok()?;
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(tower_sessions::cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == DEVICE_COOKIE)
        .map(|c| c.value().to_string())
}

/// Adds a `Set-Cookie` header with `value` to the response.
pub(crate) fn set_cookie(value: &str) {
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>()
        && let Ok(v) = http::HeaderValue::from_str(value)
    {
        res.append_header(http::header::SET_COOKIE, v);
    }
}

/// Adds `Retry-After` to the response.
pub fn retry_after(secs: u64) {
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>()
        && let Ok(v) = http::HeaderValue::from_str(&secs.to_string())
    {
        res.insert_header(http::header::RETRY_AFTER, v);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write,
        sync::{Arc, Mutex},
    };

    use leptos::prelude::*;

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log lines").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `f` logs at ERROR.
    fn errors_of(f: impl FnOnce()) -> String {
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt().with_max_level(tracing::Level::ERROR).with_ansi(false).with_writer(move || sink.clone()).finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(lines.0.lock().expect("log lines").clone()).expect("utf-8")
    }

    /// A page's data fetched after the browser left (its request, and the context with it, gone)
    /// is refused quietly; the same absence while the request is there is a wiring fault.
    #[test]
    fn a_backend_gone_with_its_request_is_not_logged_as_an_error() {
        let gone = Owner::new();
        let logged = errors_of(|| gone.with(|| assert!(super::backend().is_err())));
        assert!(logged.is_empty(), "{logged}");

        let unwired = Owner::new();
        let logged = errors_of(|| {
            unwired.with(|| {
                provide_context(http::Request::new(()).into_parts().0);
                assert!(super::backend().is_err());
            });
        });
        assert!(logged.contains("the console backend is missing from the request's context"), "{logged}");
    }
}
