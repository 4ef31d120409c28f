use std::time::Duration;

use axum::http::{StatusCode, header};
use sqlx::Row;

use crate::{
    both_backends,
    support::{TestApp, TestDb},
};

const PASSWORD: &str = "correct horse battery";

async fn login_success_failure_and_logout(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;

    let mut c = app.client();
    let wrong = c.post_form("/api/login", &[("login", "ada"), ("password", "not the password"), ("next", "/")]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.json()["code"], "LOGIN_FAILED");
    let unknown = c.post_form("/api/login", &[("login", "nobody"), ("password", "not the password"), ("next", "/")]).await;
    assert_eq!(unknown.json()["message"], wrong.json()["message"], "unknown login and wrong password look alike");
    assert!(c.cookie.is_none(), "no session after failures");

    let ok = c.post_form("/api/login", &[("login", "ADA"), ("password", PASSWORD), ("next", "/settings")]).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(ok.location(), Some("/settings"), "next is honoured");
    let cookie = ok.headers.get(header::SET_COOKIE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains("Secure"), "plain http console: {cookie}");
    let first_id = c.cookie.clone().expect("session cookie");
    assert_eq!(c.get("/").await.status, StatusCode::OK);

    // Logging in again cycles the session id (no fixation).
    c.post_form("/api/login", &[("login", "ada"), ("password", PASSWORD), ("next", "//evil.example/")]).await;
    let second_id = c.cookie.clone().expect("session cookie");
    assert_ne!(first_id, second_id);

    let out = c.post_form("/api/logout", &[]).await;
    assert_eq!(out.status, StatusCode::OK);
    assert_eq!(out.location(), Some("/login"));
    let page = c.get("/jobs").await;
    assert_eq!(page.location(), Some("/login?next=%2Fjobs"));
    // Replaying the old cookie does not bring the session back.
    c.cookie = Some(second_id);
    assert_eq!(c.get("/").await.location(), Some("/login?next=%2F"));

    // The audit has the events and never the password.
    let rows = sqlx::query("SELECT event, COALESCE(login, ''), detail FROM owner_audit ORDER BY id").fetch_all(&app.state.db.pool).await.expect("audit");
    let events: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
    for e in ["setup_completed", "login_failed", "login_ok", "logout"] {
        assert!(events.iter().any(|x| x == e), "{e} in {events:?}");
    }
    for r in &rows {
        let text = format!("{} {}", r.get::<String, _>(1), r.get::<String, _>(2));
        assert!(!text.contains("not the password") && !text.contains(PASSWORD), "password leaked into the audit");
    }
}
both_backends!(login_flow, login_success_failure_and_logout);

async fn unsafe_next_is_ignored(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let mut c = app.client();
    for next in ["//evil.example/", "https://evil.example/", "/\\evil.example", "/\t/evil.example", "/\n/x", "/a b", "/\u{7f}"] {
        let res = c.post_form("/api/login", &[("login", "ada"), ("password", PASSWORD), ("next", next)]).await;
        assert_eq!(res.location(), Some("/"), "{next}");
    }
}
both_backends!(login_next_param, unsafe_next_is_ignored);

async fn parallel_guesses_cannot_pass_the_limit(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let attempts: Vec<_> = (0..20)
        .map(|i| {
            let mut c = app.client_from(&format!("10.9.0.{i}:1000"));
            tokio::spawn(async move { c.post_form("/api/login", &[("login", "ada"), ("password", "wrong password"), ("next", "/")]).await.status })
        })
        .collect();
    let mut checked = 0;
    for a in attempts {
        match a.await.expect("join") {
            StatusCode::UNAUTHORIZED => checked += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(checked, 5, "exactly the limit of password checks, however parallel");
}
both_backends!(login_throttle_parallel, parallel_guesses_cannot_pass_the_limit);

async fn logout_is_not_undone_by_a_request_in_flight(db: TestDb) {
    use tower_sessions::{SessionStore, session::{Id, Record}};
    let app = TestApp::new(db).await;
    let store = server::web::session_store::DbSessionStore::new(app.state.db.clone());
    let mut record = Record { id: Id::default(), data: Default::default(), expiry_date: time::OffsetDateTime::now_utc() + time::Duration::hours(1) };
    store.create(&mut record).await.expect("create");
    assert!(store.load(&record.id).await.expect("load").is_some());
    // Logout deletes the session; a request that loaded it earlier then saves it.
    store.delete(&record.id).await.expect("delete");
    store.save(&record).await.expect("save");
    assert!(store.load(&record.id).await.expect("load").is_none(), "the deleted session stays deleted");
}
both_backends!(logout_race, logout_is_not_undone_by_a_request_in_flight);

async fn throttles_by_account_and_by_address(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;

    // Five failures for one account from five addresses lock that account.
    for i in 0..5 {
        let mut c = app.client_from(&format!("10.1.0.{i}:1000"));
        let res = c.post_form("/api/login", &[("login", "ada"), ("password", "wrong password"), ("next", "/")]).await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    let mut fresh = app.client_from("10.1.1.1:1000");
    let locked = fresh.post_form("/api/login", &[("login", "ada"), ("password", PASSWORD), ("next", "/")]).await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = locked.headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((1..=15 * 60).contains(&retry), "{retry}");
    assert_eq!(locked.json()["code"], "LOGIN_THROTTLED");
    assert!(fresh.cookie.is_none(), "the right password does not get in while throttled");

    // Five failures from one address, for different names, lock that address for everyone.
    let mut spray = app.client_from("10.2.0.1:1000");
    for i in 0..5 {
        let login = format!("guess{i}");
        spray.post_form("/api/login", &[("login", login.as_str()), ("password", "wrong password"), ("next", "/")]).await;
    }
    let res = spray.post_form("/api/login", &[("login", "someone"), ("password", "whatever it is"), ("next", "/")]).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS);
    let same_message = res.json()["message"].clone();
    assert_eq!(same_message, locked.json()["message"], "one generic message");
}
both_backends!(login_throttle, throttles_by_account_and_by_address);

/// Session expiry tests read the clock, so each assertion holds only where the elapsed time
/// proves it: a session is at most as old as the time since before its login began, and at least
/// as old as the time since the login returned. A slow, loaded machine then skips no check that
/// matters and fails none that it cannot decide.
async fn idle_expiry(db: TestDb) {
    const IDLE: Duration = Duration::from_secs(2);
    let app = TestApp::with(db, |s| s.auth.session_idle_timeout = IDLE).await;
    let before_login = std::time::Instant::now();
    let mut c = app.with_owner("ada", PASSWORD).await;
    let status = c.get("/").await.status;
    if before_login.elapsed() < IDLE {
        assert_eq!(status, StatusCode::OK, "a session used within its idle limit is served");
    }
    tokio::time::sleep(IDLE + Duration::from_millis(1100)).await;
    assert_eq!(c.get("/").await.location(), Some("/login?next=%2F"), "idle session expired");
}
both_backends!(session_idle_expiry, idle_expiry);

/// The owner's own requests keep a session alive; a live update's refetch of the page
/// (`x-gatehouse-live`) does not, so a console left open on a busy deployment still ends when
/// its owner walks away. (Every request used to slide the idle expiry.)
async fn live_refetches_do_not_keep_a_session_alive(db: TestDb) {
    const IDLE: Duration = Duration::from_secs(2);
    let app = TestApp::with(db, |s| s.auth.session_idle_timeout = IDLE).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let logged_in = std::time::Instant::now();
    let mut used = logged_in;
    // Used every 400 ms for longer than the idle limit: still served, wherever no gap between
    // two uses reached the limit.
    while logged_in.elapsed() < IDLE + Duration::from_millis(800) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let gap = used.elapsed();
        let status = c.get("/").await.status;
        if gap < IDLE {
            assert_eq!(status, StatusCode::OK, "the owner's use slides the idle expiry");
        }
        used = std::time::Instant::now();
    }
    // Then only live refetches, for longer than the limit.
    let mut live = c.clone();
    live.headers.push(("x-gatehouse-live".into(), "1".into()));
    let last_own = std::time::Instant::now();
    while last_own.elapsed() < IDLE + Duration::from_millis(1100) {
        live.get("/").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(c.get("/").await.location(), Some("/login?next=%2F"), "the refetches did not keep it alive");
}
both_backends!(session_live_refetch, live_refetches_do_not_keep_a_session_alive);

/// A visitor's made-up session cookie never makes a row: failed logins (throttled or not) and
/// pages before a login save nothing, and the cookie is not answered with a new one.
async fn a_visitors_cookie_stores_no_session(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let sessions = async || sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM sessions").fetch_one(&app.state.db.pool).await.expect("count");
    let before = sessions().await;
    let mut c = app.client();
    for _ in 0..3 {
        c.cookie = Some(tower_sessions::session::Id::default().to_string());
        let res = c.post_form("/api/login", &[("login", "ada"), ("password", "not the password"), ("next", "/")]).await;
        assert!(res.status.is_client_error(), "{}", res.status);
        c.cookie = Some(tower_sessions::session::Id::default().to_string());
        c.get("/").await;
    }
    assert_eq!(sessions().await, before, "no row for a visitor");
}
both_backends!(session_visitor_cookie, a_visitors_cookie_stores_no_session);

async fn absolute_expiry(db: TestDb) {
    const LIMIT: Duration = Duration::from_secs(4);
    let app = TestApp::with(db, |s| s.auth.session_absolute_timeout = LIMIT).await;
    let before_login = std::time::Instant::now();
    let mut c = app.with_owner("ada", PASSWORD).await;
    let after_login = std::time::Instant::now();
    // Staying active does not extend the absolute limit: use the session every 300 ms while it
    // is surely inside the limit, then once surely past it.
    let mut served = 0;
    while before_login.elapsed() + Duration::from_millis(300) < LIMIT {
        let status = c.get("/").await.status;
        if before_login.elapsed() < LIMIT {
            assert_eq!(status, StatusCode::OK, "inside the absolute limit");
            served += 1;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(served >= 2, "the session was used while valid ({served} times)");
    tokio::time::sleep((LIMIT + Duration::from_millis(200)).saturating_sub(after_login.elapsed())).await;
    assert_eq!(c.get("/").await.location(), Some("/login?next=%2F"), "absolute limit reached");
}
both_backends!(session_absolute_expiry, absolute_expiry);

async fn password_reset_ends_sessions(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    assert_eq!(c.get("/").await.status, StatusCode::OK);
    server::owners::reset_password(&app.state.db, "ada", secrecy::SecretString::from("a brand new password"), 12).await.expect("reset");
    assert_eq!(c.get("/").await.location(), Some("/login?next=%2F"));
    let res = c.post_form("/api/login", &[("login", "ada"), ("password", "a brand new password"), ("next", "/")]).await;
    assert_eq!(res.status, StatusCode::OK);
}
both_backends!(reset_voids_sessions, password_reset_ends_sessions);

async fn secure_cookie_on_https(db: TestDb) {
    // Published under another host, setup needs the token (see setup::setup_local_only).
    let token = server::config::Secrets::from_lookup(|name| (name == "GATEHOUSE_SETUP_TOKEN").then(|| "setup-token-over-https-0".to_string()));
    let app = TestApp::with_secrets(db, token, |s| s.server.public_url = "https://console.example.com".into()).await;
    let mut c = app.client();
    c.origin = Some("https://console.example.com".into());
    let res = c
        .post_form("/api/setup_owner", &[("display_name", "Ada"), ("login", "ada"), ("password", PASSWORD), ("password_confirm", PASSWORD), ("whatsapp", "+15550001111"), ("token", "setup-token-over-https-0")])
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let cookie = res.headers.get(header::SET_COOKIE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(cookie.contains("Secure"), "{cookie}");
    assert_eq!(res.headers.get(header::STRICT_TRANSPORT_SECURITY).and_then(|v| v.to_str().ok()), Some("max-age=31536000"), "come back over https only");
    let plain = TestApp::new(TestDb::sqlite()).await.client().get("/login").await;
    assert!(plain.headers.get(header::STRICT_TRANSPORT_SECURITY).is_none(), "not on a plain http console");
}
both_backends!(https_cookie, secure_cookie_on_https);

/// A console page says which scripts it may run: the hydration scripts Leptos writes with this
/// page's nonce, fresh for each page, and the site's own files. Any other answer may run none.
async fn pages_run_their_own_scripts_only(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let policy = |res: &crate::support::Resp| res.headers.get(header::CONTENT_SECURITY_POLICY).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let mut c = app.client();
    let mut nonces = Vec::new();
    for path in ["/login", "/", "/jobs"] {
        let page = c.get(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        let policy = policy(&page);
        let nonce = policy.split("'nonce-").nth(1).and_then(|rest| rest.split('\'').next()).unwrap_or_else(|| panic!("{path}: no nonce in {policy:?}"));
        assert!(policy.contains(&format!("script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval';")), "{path}: {policy}");
        for part in ["object-src 'none'", "base-uri 'none'", "frame-ancestors 'none'", "style-src 'self';"] {
            assert!(policy.contains(part), "{path}: {part} in {policy}");
        }
        assert!(!policy.contains("unsafe-inline"), "{path}: {policy}");
        // Every script the page holds carries the nonce (the hydration script among them).
        let scripts: Vec<&str> = page.body.split("<script").skip(1).map(|rest| rest.split('>').next().unwrap_or_default()).collect();
        assert!(!scripts.is_empty(), "{path}: a page hydrates");
        for tag in &scripts {
            assert!(tag.contains(&format!("nonce=\"{nonce}\"")), "{path}: <script{tag}> without the page's nonce");
        }
        nonces.push(nonce.to_string());
        if path == "/login" {
            assert_eq!(login(&mut c, "ada", PASSWORD).await.status, StatusCode::OK);
        }
    }
    nonces.sort();
    nonces.dedup();
    assert_eq!(nonces.len(), 3, "a nonce is used once");

    for path in ["/healthz", "/assets/gatehouse.css", "/no/such/page"] {
        let other = c.get(path).await;
        assert_eq!(policy(&other), "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'", "{path}");
    }
}
both_backends!(content_security_policy, pages_run_their_own_scripts_only);

async fn owners_edit_their_numbers(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let res = c.post_form("/api/update_phones", &[("phones", "+15550001111\n+447700900123")]).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.json(), serde_json::json!(["+15550001111", "+447700900123"]));
    let bad = c.post_form("/api/update_phones", &[("phones", "12345")]).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let settings = c.post_form("/api/console_settings", &[]).await;
    assert_eq!(settings.json()["my_phones"], serde_json::json!(["+15550001111", "+447700900123"]));
}
both_backends!(phone_numbers, owners_edit_their_numbers);

/// A NUL character in a console call's form or address is refused as input (PostgreSQL
/// refuses it in text: a filter holding one was a server error).
async fn a_nul_in_a_console_request_is_refused_as_input(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let fields = [("chat", "1555\u{0}"), ("route", ""), ("outcome", ""), ("error_code", ""), ("since_minutes", "0"), ("before", "0")];
    let fine = c.post_form("/api/list_traces", &fields.map(|(k, v)| (k, if k == "chat" { "1555" } else { v }))).await;
    assert_eq!(fine.status, StatusCode::OK, "{}", fine.body);
    let nul = c.post_form("/api/list_traces", &fields).await;
    assert_eq!((nul.status, nul.json()["code"].as_str()), (StatusCode::BAD_REQUEST, Some("INVALID_INPUT")), "{}", nul.body);
    let in_path = c.get("/api/simulator/chats/sim%00x").await;
    assert_eq!(in_path.status, StatusCode::BAD_REQUEST, "{}", in_path.body);
    // A page's filter (rendered on the server from its query): a page saying so to a browser.
    c.headers.push(("accept".into(), "text/html,application/xhtml+xml".into()));
    let page = c.get("/traces?chat=1555%00").await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.body);
    assert!(page.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/html")), "{:?}", page.headers);
    assert!(page.body.contains("data-error-code=\"INVALID_INPUT\"") && page.body.contains("NUL"), "{}", page.body);
}
both_backends!(console_nul_refused, a_nul_in_a_console_request_is_refused_as_input);

/// A database that cannot be reached is said as such: 503 `DATABASE_UNAVAILABLE`, from the
/// session check and from a server function alike, not a 500 that reads as a fault.
async fn a_database_outage_is_answered_503(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    assert_eq!(c.post_form("/api/waiting", &[]).await.status, StatusCode::OK);
    app.state.db.pool.close().await;
    let down = c.post_form("/api/waiting", &[]).await;
    assert_eq!((down.status, down.json()["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("DATABASE_UNAVAILABLE")), "{}", down.body);
    // Through a domain's own error too (logging in: the owners module's).
    let login = app.client().post_form("/api/login", &[("login", "ada"), ("password", PASSWORD), ("next", "/")]).await;
    assert_eq!((login.status, login.json()["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("DATABASE_UNAVAILABLE")), "{}", login.body);
    // A browser gets a page that says so, with a way back, not JSON.
    c.headers.push(("accept".into(), "text/html".into()));
    c.headers.push(("referer".into(), "http://127.0.0.1:3000/approvals?x=1".into()));
    let page = c.get("/approvals").await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE, "{}", page.body);
    assert!(page.body.contains("data-error-code=\"DATABASE_UNAVAILABLE\"") && page.body.contains("href=\"/approvals?x=1\""), "{}", page.body);
}
both_backends!(console_database_outage, a_database_outage_is_answered_503);

/// A form posted from a page whose session ended meanwhile (no scripts: a plain post) goes to
/// the login and then back to that page, not to a JSON error.
async fn a_form_posted_after_the_session_ended_goes_to_the_login(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    c.post_form("/api/logout", &[]).await;
    c.headers.push(("accept".into(), "text/html".into()));
    c.headers.push(("referer".into(), "http://127.0.0.1:3000/jobs?state=failed".into()));
    let res = c.post_form("/api/retry_job", &[("id", "1")]).await;
    assert!(res.status.is_redirection(), "{} {}", res.status, res.body);
    assert_eq!(res.location(), Some("/login?next=%2Fjobs%3Fstate%3Dfailed"));
    c.headers.retain(|(name, _)| name != "accept");
    assert_eq!(c.post_form("/api/retry_job", &[("id", "1")]).await.status, StatusCode::UNAUTHORIZED, "a script still gets 401");
}
both_backends!(console_form_after_session, a_form_posted_after_the_session_ended_goes_to_the_login);

async fn login(c: &mut crate::support::Client, who: &str, password: &str) -> crate::support::Resp {
    c.post_form("/api/login", &[("login", who), ("password", password), ("next", "/")]).await
}

fn retry_after(res: &crate::support::Resp) -> u64 {
    res.headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("Retry-After")
}

/// Moves every recorded login attempt `secs` into the past: the throttle's clock, without a sleep.
async fn age_attempts(app: &TestApp, secs: u64) {
    sqlx::query("UPDATE owner_audit SET at = at - $1").bind(i64::try_from(secs * 1000).expect("ms")).execute(&app.state.db.pool).await.expect("age");
}

/// Guessing an owner's password, from one address or many, does not lock the owner out: an
/// address that never failed for the account waits a short, growing delay, not the window.
async fn guessing_cannot_lock_the_owner_out(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let mut attacker = app.client_from("10.6.0.1:1000");
    for _ in 0..5 {
        assert_eq!(login(&mut attacker, "ada", "guess").await.status, StatusCode::UNAUTHORIZED);
    }
    let locked = login(&mut attacker, "ada", PASSWORD).await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS, "the guessing address is locked");
    assert!(retry_after(&locked) > 14 * 60, "for the rest of the window: {}", retry_after(&locked));

    // The owner's own address never failed: a short delay, not the window.
    let mut owner = app.client_from("10.7.0.1:1000");
    let slowed = login(&mut owner, "ada", PASSWORD).await;
    assert_eq!(slowed.status, StatusCode::TOO_MANY_REQUESTS);
    let first_delay = retry_after(&slowed);
    assert!(first_delay <= 60, "a delay of about a minute, not the 15-minute window: {first_delay}");
    age_attempts(&app, first_delay + 1).await;
    let ok = login(&mut owner, "ada", PASSWORD).await;
    assert_eq!(ok.status, StatusCode::OK, "the owner gets in once the delay has passed: {}", ok.body);

    // More guesses from fresh addresses: one per delay, and each delay longer than the last.
    let mut second = app.client_from("10.6.0.2:1000");
    assert_eq!(login(&mut second, "ada", "guess").await.status, StatusCode::UNAUTHORIZED);
    let mut third = app.client_from("10.6.0.3:1000");
    let held = login(&mut third, "ada", "guess").await;
    assert_eq!(held.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&held) > first_delay, "progressive: {} after {first_delay}", retry_after(&held));
    // An address that failed for the account is locked for it, not slowed.
    let again = login(&mut second, "ada", "guess").await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&again) > 14 * 60, "{}", retry_after(&again));
    // Other accounts are not affected from a clean address.
    assert_eq!(login(&mut app.client_from("10.7.0.9:1000"), "bob", "not set up").await.status, StatusCode::UNAUTHORIZED);
}
both_backends!(login_no_owner_lockout, guessing_cannot_lock_the_owner_out);

/// The device cookie a login answer set, as a `Cookie` header's value, with its attributes.
fn device_cookie(res: &crate::support::Resp) -> (String, String) {
    let set = res.headers.get_all(header::SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).find(|v| v.starts_with("gatehouse_device=")).expect("a device cookie");
    let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
    (pair.to_string(), attributes.to_string())
}

/// A browser that brings its device cookie (OWASP's device cookies).
fn with_device(mut c: crate::support::Client, cookie: &str) -> crate::support::Client {
    c.headers.push(("cookie".into(), cookie.into()));
    c
}

/// The browser an owner signed in from before gets in at once while others guess the owner's
/// login name from many addresses: its logins count its own failures only. Any other browser
/// (no cookie, a made-up one, one from before a password reset, one that failed too often
/// itself) is throttled as before.
async fn a_trusted_device_gets_in_while_others_guess(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let signed_in = login(&mut app.client_from("10.7.0.1:1000"), "ada", PASSWORD).await;
    assert_eq!(signed_in.status, StatusCode::OK, "{}", signed_in.body);
    let (laptop, attributes) = device_cookie(&signed_in);
    for part in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=7776000"] {
        assert!(attributes.contains(part), "{part} in {attributes}");
    }
    assert!(!attributes.contains("Secure"), "plain http console: {attributes}");

    for i in 1..=7 {
        let guess = login(&mut app.client_from(&format!("10.6.0.{i}:1000")), "ada", "guess").await;
        assert!([StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS].contains(&guess.status), "{}", guess.body);
    }
    let elsewhere = login(&mut app.client_from("10.7.0.2:1000"), "ada", PASSWORD).await;
    assert_eq!(elsewhere.status, StatusCode::TOO_MANY_REQUESTS, "a browser without the cookie waits");
    let made_up = login(&mut with_device(app.client_from("10.7.0.2:1000"), "gatehouse_device=made-up"), "ada", PASSWORD).await;
    assert_eq!(made_up.status, StatusCode::TOO_MANY_REQUESTS, "so does a made-up cookie");
    let mut travelling = with_device(app.client_from("10.8.0.1:1000"), &laptop);
    let trusted = login(&mut travelling, "ada", PASSWORD).await;
    assert_eq!(trusted.status, StatusCode::OK, "the trusted device gets in at once, from any address: {}", trusted.body);
    assert_eq!(device_cookie(&trusted).0, laptop, "and keeps its cookie");
    assert_eq!(travelling.get("/").await.status, StatusCode::OK);
    let other_name = login(&mut with_device(app.client_from("10.8.0.1:1000"), &laptop), "bob", "not set up").await;
    assert_eq!(other_name.status, StatusCode::UNAUTHORIZED, "the cookie is no key: a wrong login is still wrong");

    // Its own failures count: past the limit it is throttled like any other browser.
    let mut clumsy = with_device(app.client_from("10.8.0.2:1000"), &laptop);
    for _ in 0..5 {
        assert_eq!(login(&mut clumsy, "ada", "typo").await.status, StatusCode::UNAUTHORIZED, "its own failures are answered, not held back");
    }
    assert_eq!(login(&mut clumsy, "ada", PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS);

    // A password reset ends every device's trust.
    sqlx::query("DELETE FROM owner_audit WHERE device IS NOT NULL").execute(&app.state.db.pool).await.expect("forget the device's failures");
    assert_eq!(login(&mut with_device(app.client_from("10.8.0.3:1000"), &laptop), "ada", PASSWORD).await.status, StatusCode::OK, "trusted again once its failures are gone");
    server::owners::reset_password(&app.state.db, "ada", secrecy::SecretString::from("a brand new password"), 12).await.expect("reset");
    let after_reset = login(&mut with_device(app.client_from("10.8.0.4:1000"), &laptop), "ada", "a brand new password").await;
    assert_eq!(after_reset.status, StatusCode::TOO_MANY_REQUESTS, "not trusted after a reset");

    // The database holds the token's digest only.
    let token = laptop.trim_start_matches("gatehouse_device=");
    let stored: Vec<String> = sqlx::query_scalar("SELECT digest FROM owner_devices").fetch_all(&app.state.db.pool).await.expect("devices");
    assert!(!stored.is_empty() && stored.iter().all(|d| d.len() == 64 && d != token), "{stored:?}");
}
both_backends!(login_trusted_device, a_trusted_device_gets_in_while_others_guess);

/// An owner's trusted devices are the last used ones, at most a few, and none unused for the
/// lifetime: a client that keeps no cookie makes a new device at each login.
async fn trusted_devices_are_bounded(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let owner = server::db::owners::find_by_login(&mut conn, "ada").await.expect("read").expect("owner");
    let kept = server::owners::TRUSTED_DEVICES_KEPT;
    for i in 0..kept + 5 {
        server::db::owners::remember_device(&mut conn, &format!("device-{i:02}"), &owner, 1_000 + i, 0, kept).await.expect("remember");
    }
    let oldest: (i64, i64) = sqlx::query_as("SELECT COUNT(*), MIN(last_used_at) FROM owner_devices").fetch_one(&mut *conn).await.expect("count");
    assert_eq!(oldest, (kept, 1_005), "the last used are kept");
    server::db::owners::remember_device(&mut conn, "device-00", &owner, 2_000, 1_010, kept).await.expect("remember");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM owner_devices WHERE last_used_at <= 1010").fetch_one(&mut *conn).await.expect("count");
    assert_eq!(left, 0, "none unused for the lifetime");
}
both_backends!(login_devices_bounded, trusted_devices_are_bounded);

/// Behind a reverse proxy every request comes from the proxy. Its X-Forwarded-For is believed
/// only when configured, and only from the proxy: clients then get buckets of their own, and a
/// client cannot pick its bucket by sending the header itself.
async fn clients_behind_a_trusted_proxy_are_told_apart(db: TestDb) {
    let app = TestApp::with(db, |s| {
        s.server.trusted_proxies = vec!["10.0.0.1".parse().expect("proxy")];
        s.server.client_ip_header = "x-forwarded-for".into();
    })
    .await;
    app.with_owner("ada", PASSWORD).await;
    let via_proxy = |client: &str| {
        let mut c = app.client_from("10.0.0.1:4000");
        c.headers.push(("x-forwarded-for".into(), format!("198.51.100.77, {client}")));
        c
    };
    let mut guesser = via_proxy("203.0.113.5");
    for i in 0..5 {
        assert_eq!(login(&mut guesser, &format!("guess{i}"), "wrong").await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(login(&mut guesser, "ada", PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS, "the guesser's own address is locked");
    // Another client behind the same proxy has its own bucket.
    assert_eq!(login(&mut via_proxy("203.0.113.6"), "ada", PASSWORD).await.status, StatusCode::OK);
    // The audit records the client, not the proxy.
    let ips: Vec<String> = sqlx::query("SELECT DISTINCT ip FROM owner_audit WHERE event IN ('login_failed', 'login_ok')")
        .fetch_all(&app.state.db.pool)
        .await
        .expect("audit")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(ips.iter().all(|ip| ip.starts_with("203.0.113.")), "{ips:?}");

    // A client connecting directly cannot choose its address with the header.
    let mut direct = app.client_from("10.9.9.9:5000");
    direct.headers.push(("x-forwarded-for".into(), "203.0.113.200".into()));
    for _ in 0..5 {
        login(&mut direct, "nobody", "wrong").await;
        direct.headers[0].1 = format!("203.0.113.{}", 201 + direct.headers.len());
    }
    assert_eq!(login(&mut direct, "ada", PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS, "counted by its real address");
}
both_backends!(login_behind_proxy, clients_behind_a_trusted_proxy_are_told_apart);

/// Without configuration no proxy header is read: the default trusts nobody.
async fn no_proxy_is_trusted_by_default(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", PASSWORD).await;
    for i in 0..5 {
        let mut c = app.client_from("10.0.0.1:4000");
        c.headers.push(("x-forwarded-for".into(), format!("203.0.113.{i}")));
        login(&mut c, &format!("guess{i}"), "wrong").await;
    }
    let mut next = app.client_from("10.0.0.1:4000");
    next.headers.push(("x-forwarded-for".into(), "203.0.113.99".into()));
    assert_eq!(login(&mut next, "someone", "wrong").await.status, StatusCode::TOO_MANY_REQUESTS, "one address, whatever the header says");
}
both_backends!(login_proxy_default, no_proxy_is_trusted_by_default);

/// What a plain form post answered waits for the page the browser is sent back to, which takes
/// it once; a request of the same session that was in flight meanwhile (a live update's fetch)
/// and saves the session's record afterwards does not lose it, and an answer no page took is
/// gone after its time.
async fn a_form_answer_survives_a_concurrent_save_and_is_taken_once(db: TestDb) {
    use tower_sessions::{SessionStore, session::Id};
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let store = server::web::session_store::DbSessionStore::new(app.state.db.clone());
    let id: Id = c.cookie.as_deref().expect("session cookie").parse().expect("session id");
    let in_flight = store.load(&id).await.expect("load").expect("a live session");

    assert_eq!(plain_form_post(&mut c, "/settings", "/api/update_phones", &[("phones", "+15550001111")]).await.status, StatusCode::FOUND);
    store.save(&in_flight).await.expect("the request in flight saves what it loaded");
    let first = take_answer(&mut c, "/api/update_phones").await;
    let answer: serde_json::Value = serde_json::from_str(first.as_str().expect("an answer")).expect("JSON");
    assert_eq!(answer, serde_json::json!(["+15550001111"]));
    assert_eq!(take_answer(&mut c, "/api/update_phones").await, serde_json::Value::Null, "taken once");

    assert_eq!(plain_form_post(&mut c, "/settings", "/api/update_phones", &[("phones", "+15550002222")]).await.status, StatusCode::FOUND);
    let stale = server::db::sessions::FORM_ANSWER_TTL_MS + 1000;
    sqlx::query("UPDATE form_answers SET created_at = created_at - $1").bind(stale).execute(&app.state.db.pool).await.expect("age");
    assert_eq!(take_answer(&mut c, "/api/update_phones").await, serde_json::Value::Null, "an answer no page took in time is gone");
}
both_backends!(form_answers, a_form_answer_survives_a_concurrent_save_and_is_taken_once);

/// A chat's page takes what its own form answered: a message sent from there is not shown again
/// as the simulator's result on the Conversations page opened afterwards.
async fn a_chat_page_takes_its_own_forms_answer(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let first = c.post_form("/api/simulate_message", &[("from", "+15550100000"), ("text", "hello"), ("chat_id", "")]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let chat_id = first.json()["chat_id"].as_str().expect("a chat").to_string();
    let page = format!("/conversations/simulator/{chat_id}");

    let sent = plain_form_post(&mut c, &page, "/api/simulate_message", &[("from", "+15550100000"), ("text", "and again"), ("chat_id", &chat_id)]).await;
    assert_eq!(sent.status, StatusCode::FOUND);
    assert_eq!(c.get(&page).await.status, StatusCode::OK, "the browser comes back to the chat");
    let list = c.get("/conversations").await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(!list.body.contains("data-testid=\"sim-result\""), "the chat's message is not shown as the Conversations page's result: {}", list.body);
}
both_backends!(chat_form_answer, a_chat_page_takes_its_own_forms_answer);

/// A form post as a browser without JavaScript sends it from the console's page `from_page`.
/// A refused form's input fills the form again on the page of the record it was typed for, and
/// on no other: a trace's mark refused on one trace does not show on another's page. What a
/// refused form held goes with its session, and after its time whether or not another form is
/// posted.
async fn a_refused_forms_input_fills_its_own_page_only(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.with_owner("ada", PASSWORD).await;
    let mut traces = Vec::new();
    for text in ["one", "two"] {
        let sent = c.post_form("/api/simulate_message", &[("from", "+15550100000"), ("text", text), ("chat_id", "")]).await;
        assert_eq!(sent.status, StatusCode::OK, "{}", sent.body);
        traces.push(sent.json()["trace_id"].as_i64().expect("a trace"));
    }
    let (a, b) = (traces[0], traces[1]);
    let refuse = |on: i64| [("trace_id", on.to_string()), ("expect", "sometimes".to_string()), ("note", "kept note".to_string())];
    let fields = refuse(a);
    let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(plain_form_post(&mut c, &format!("/traces/{a}"), "/api/mark_trace", &fields).await.status, StatusCode::FOUND);
    let page = c.get(&format!("/traces/{a}")).await;
    assert!(page.body.contains("value=\"sometimes\"") && page.body.contains("value=\"kept note\""), "{}", page.body);
    assert!(!c.get(&format!("/traces/{a}")).await.body.contains("kept note"), "taken once");

    assert_eq!(plain_form_post(&mut c, &format!("/traces/{a}"), "/api/mark_trace", &fields).await.status, StatusCode::FOUND);
    assert!(!c.get(&format!("/traces/{b}")).await.body.contains("kept note"), "another trace's page does not show it");

    let kept = || async { sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM form_answers").fetch_one(&app.state.db.pool).await.expect("count") };
    assert_eq!(plain_form_post(&mut c, &format!("/traces/{a}"), "/api/mark_trace", &fields).await.status, StatusCode::FOUND);
    assert_eq!(kept().await, 1);
    let stale = server::db::sessions::FORM_ANSWER_TTL_MS + 1000;
    sqlx::query("UPDATE form_answers SET created_at = created_at - $1").bind(stale).execute(&app.state.db.pool).await.expect("age");
    server::db::sessions::delete_expired(&mut app.state.db.pool.acquire().await.expect("conn")).await.expect("clean");
    assert_eq!(kept().await, 0, "gone after its time with no other form posted");
    assert_eq!(plain_form_post(&mut c, &format!("/traces/{a}"), "/api/mark_trace", &fields).await.status, StatusCode::FOUND);
    let session = c.cookie.clone().expect("session");
    server::db::sessions::delete(&mut app.state.db.pool.acquire().await.expect("conn"), &session).await.expect("delete");
    assert_eq!(kept().await, 0, "gone with its session");
}
both_backends!(form_input_kept, a_refused_forms_input_fills_its_own_page_only);

async fn plain_form_post(c: &mut crate::support::Client, from_page: &str, path: &str, fields: &[(&str, &str)]) -> crate::support::Resp {
    c.headers = vec![("accept".into(), "text/html".into()), ("referer".into(), format!("{}{from_page}", crate::support::PUBLIC_URL))];
    let res = c.post_form(path, fields).await;
    c.headers.clear();
    res
}

/// What the page of a form takes of the answer kept for it (JSON text, or null).
async fn take_answer(c: &mut crate::support::Client, path: &str) -> serde_json::Value {
    let res = c.post_form("/api/take_answer", &[("path", path)]).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.json()
}
