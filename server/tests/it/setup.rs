use axum::http::StatusCode;
use secrecy::SecretString;
use server::owners::{self, OwnerError, ValidOwner};

use crate::{
    both_backends,
    support::{TestApp, TestDb},
};

fn owner(n: usize) -> ValidOwner {
    ValidOwner::parse(&format!("Owner {n}"), &format!("owner{n}"), SecretString::from("a long enough password"), &format!("+1555000{n:04}"), 12)
        .expect("valid owner")
}

async fn concurrent_setups_create_one_owner(db: TestDb) {
    let app = TestApp::new(db).await;
    let tasks: Vec<_> = (0..4)
        .map(|n| {
            let db = app.state.db.clone();
            tokio::spawn(async move { owners::create_first_owner(&db, owner(n), "127.0.0.1").await })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        match task.await.expect("join") {
            Ok(_) => won += 1,
            Err(OwnerError::SetupClosed) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!(won, 1, "exactly one setup wins");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    assert_eq!(server::db::owners::count(&mut conn).await.expect("count"), 1);
    assert!(server::db::owners::setup_completed(&mut conn).await.expect("state"));
}
both_backends!(setup_race, concurrent_setups_create_one_owner);

async fn concurrent_setups_over_http(db: TestDb) {
    let app = TestApp::new(db).await;
    let calls = (0..3).map(|n| {
        let mut client = app.client_from(&format!("127.0.1.{n}:4000"));
        async move {
            let login = format!("racer{n}");
            let phone = format!("+1555111{n:04}");
            client
                .post_form("/api/setup_owner", &[
                    ("display_name", "Racer"),
                    ("login", login.as_str()),
                    ("password", "a long enough password"),
                    ("password_confirm", "a long enough password"),
                    ("whatsapp", phone.as_str()),
                ])
                .await
                .status
        }
    });
    let statuses = futures_join(calls).await;
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == StatusCode::OK || *s == StatusCode::GONE), "{statuses:?}");
}
both_backends!(setup_race_http, concurrent_setups_over_http);

async fn futures_join<F: std::future::Future<Output = StatusCode> + Send + 'static>(calls: impl Iterator<Item = F>) -> Vec<StatusCode> {
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("join"));
    }
    out
}

async fn racing_setups_with_the_same_number_get_setup_closed(db: TestDb) {
    let app = TestApp::new(db).await;
    let calls = (0..3).map(|n| {
        let mut client = app.client_from(&format!("127.0.2.{n}:4000"));
        async move {
            let login = format!("twin{n}");
            client
                .post_form("/api/setup_owner", &[
                    ("display_name", "Twin"),
                    ("login", login.as_str()),
                    ("password", "a long enough password"),
                    ("password_confirm", "a long enough password"),
                    ("whatsapp", "+15550007777"),
                ])
                .await
                .status
        }
    });
    let statuses = futures_join(calls).await;
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == StatusCode::OK || *s == StatusCode::GONE), "losers are told setup is closed: {statuses:?}");
}
both_backends!(setup_race_same_phone, racing_setups_with_the_same_number_get_setup_closed);

async fn first_run_redirects_and_setup_closes(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut visitor = app.client();
    for path in ["/", "/jobs", "/settings", "/login"] {
        let res = visitor.get(path).await;
        assert!(res.status.is_redirection(), "{path}: {}", res.status);
        assert_eq!(res.location(), Some("/setup"), "{path}");
    }
    assert_eq!(visitor.get("/setup").await.status, StatusCode::OK);

    // Validation (on this machine): short password, mismatch, bad number. Nothing is created.
    let mut visitor = app.client_from("127.0.0.1:40000");
    let short = visitor
        .post_form("/api/setup_owner", &[("display_name", "A"), ("login", "ab"), ("password", "short"), ("password_confirm", "short"), ("whatsapp", "+15550001111")])
        .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert_eq!(short.json()["code"], "INVALID_INPUT");
    assert!(short.json()["message"].as_str().unwrap_or_default().contains("12"));
    let bad_phone = visitor
        .post_form("/api/setup_owner", &[("display_name", "A"), ("login", "ab"), ("password", "long enough pass"), ("password_confirm", "long enough pass"), ("whatsapp", "5550001111")])
        .await;
    assert_eq!(bad_phone.status, StatusCode::BAD_REQUEST);
    assert!(app.state.setup_done().await.is_ok_and(|done| !done));

    let mut owner = app.with_owner("ada", "correct horse battery").await;
    assert!(owner.cookie.is_some(), "setup logs the owner in");
    assert_eq!(owner.get("/").await.status, StatusCode::OK);

    let mut other = app.client();
    let again = other
        .post_form("/api/setup_owner", &[("display_name", "Eve"), ("login", "eve"), ("password", "long enough pass"), ("password_confirm", "long enough pass"), ("whatsapp", "+15550002222")])
        .await;
    assert_eq!(again.status, StatusCode::GONE);
    assert_eq!(again.json()["code"], "SETUP_CLOSED");
    // Closed whatever was typed: two passwords that differ are not judged any more.
    let differ = other
        .post_form("/api/setup_owner", &[("display_name", "Eve"), ("login", "eve"), ("password", "long enough pass"), ("password_confirm", "other pass"), ("whatsapp", "+15550002222")])
        .await;
    assert_eq!((differ.status, differ.json()["code"].as_str()), (StatusCode::GONE, Some("SETUP_CLOSED")), "{}", differ.body);
    let page = other.get("/setup").await;
    assert_eq!(page.location(), Some("/login"), "setup page closed for good");
}
both_backends!(first_run, first_run_redirects_and_setup_closes);

fn setup_form(token: &str) -> Vec<(&'static str, String)> {
    [("display_name", "Ada"), ("login", "ada"), ("password", "a long enough password"), ("password_confirm", "a long enough password"), ("whatsapp", "+15550001111")]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .chain([("token", token.to_string())])
        .collect()
}

/// Whoever sets up first owns the bot, and the console shares its address with the webhook that
/// the internet reaches. Setup answers this machine's own requests (loopback, and not forwarded
/// by a proxy on it); from anywhere else only with the token the operator set.
async fn setup_from_elsewhere_needs_the_token(db: TestDb) {
    let secrets = server::config::Secrets::from_lookup(|name| (name == "GATEHOUSE_SETUP_TOKEN").then(|| "first-run-token-1234567".to_string()));
    let app = TestApp::with_secrets(db, secrets, |_| {}).await;
    let post = |client: &mut crate::support::Client, token: &'static str| {
        let mut client = client.clone();
        async move {
            let form = setup_form(token);
            let fields: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            client.post_form("/api/setup_owner", &fields).await
        }
    };
    let mut remote = app.client_from("203.0.113.7:5000");
    for token in ["", "wrong-token", "first-run-token-12"] {
        let res = post(&mut remote, token).await;
        assert_eq!((res.status, res.json()["code"].as_str()), (StatusCode::FORBIDDEN, Some("SETUP_NOT_LOCAL")), "token {token:?}: {}", res.body);
    }
    // A proxy on this machine is a loopback peer for the whole internet.
    for header in ["X-Forwarded-For", "Forwarded", "X-Real-IP"] {
        let mut proxied = app.client_from("127.0.0.1:5000");
        proxied.headers.push((header.into(), "203.0.113.7".into()));
        let res = post(&mut proxied, "").await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{header}: {}", res.body);
    }
    assert!(app.state.setup_done().await.is_ok_and(|done| !done), "nothing was created");
    let res = post(&mut remote, "first-run-token-1234567").await;
    assert_eq!(res.status, StatusCode::OK, "the token opens setup from elsewhere: {}", res.body);
    assert!(app.state.setup_done().await.expect("state"));
}
both_backends!(setup_needs_local_or_token, setup_from_elsewhere_needs_the_token);

/// Without a configured token, setup from elsewhere is refused whatever token is sent.
async fn setup_without_a_token_is_local_only(db: TestDb) {
    let app = TestApp::new(db).await;
    let form = setup_form("guess");
    let fields: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let res = app.client_from("203.0.113.8:5000").post_form("/api/setup_owner", &fields).await;
    assert_eq!((res.status, res.json()["code"].as_str()), (StatusCode::FORBIDDEN, Some("SETUP_NOT_LOCAL")), "{}", res.body);
    let res = app.client_from("[::1]:5000").post_form("/api/setup_owner", &fields).await;
    assert_eq!(res.status, StatusCode::OK, "IPv6 loopback is this machine: {}", res.body);
}

/// Setup answers anyone who reaches it, as often as they ask: a configured token too short to
/// be out of reach of guessing opens nothing, even when given right.
async fn a_short_setup_token_opens_nothing(db: TestDb) {
    const SHORT: &str = "guessable-token";
    let secrets = server::config::Secrets::from_lookup(|name| (name == "GATEHOUSE_SETUP_TOKEN").then(|| SHORT.to_string()));
    let app = TestApp::with_secrets(db, secrets, |_| {}).await;
    let form = setup_form(SHORT);
    let fields: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let res = app.client_from("203.0.113.9:5000").post_form("/api/setup_owner", &fields).await;
    assert_eq!((res.status, res.json()["code"].as_str()), (StatusCode::FORBIDDEN, Some("SETUP_NOT_LOCAL")), "{}", res.body);
    assert!(app.state.setup_done().await.is_ok_and(|done| !done), "nothing was created");
    let res = app.client_from("127.0.0.1:5000").post_form("/api/setup_owner", &fields).await;
    assert_eq!(res.status, StatusCode::OK, "this machine needs no token: {}", res.body);
}
both_backends!(setup_short_token, a_short_setup_token_opens_nothing);

/// A console published under another host is reached through a proxy, and one on this machine
/// left at its defaults (nginx's proxy_pass) adds no forwarding header: its loopback requests
/// are the internet's, so setup there needs the token; so do requests from a trusted proxy.
async fn a_console_published_elsewhere_is_never_local(db: TestDb) {
    let app = TestApp::with(db, |s| {
        s.server.public_url = "https://bot.example".into();
        s.server.trusted_proxies = vec!["127.0.0.2".parse().expect("net")];
        s.server.client_ip_header = "x-forwarded-for".into();
    })
    .await;
    let form = setup_form("");
    let fields: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for peer in ["127.0.0.1:5000", "127.0.0.2:5000"] {
        let mut proxied = app.client_from(peer);
        proxied.origin = Some("https://bot.example".into());
        let res = proxied.post_form("/api/setup_owner", &fields).await;
        assert_eq!((res.status, res.json()["code"].as_str()), (StatusCode::FORBIDDEN, Some("SETUP_NOT_LOCAL")), "{peer}: {}", res.body);
    }
}
both_backends!(setup_published_elsewhere, a_console_published_elsewhere_is_never_local);
both_backends!(setup_local_only, setup_without_a_token_is_local_only);

/// A tool whose timeout and retries outlast the `tool.call` job's budget (with the summary and
/// the answer's sends), or that is named like the planner's own tool, is a config problem,
/// found by every command that loads the config.
#[test]
fn a_tool_that_outlasts_its_job_takes_the_planners_name_or_searches_nowhere_is_a_config_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gatehouse.toml"), "").expect("config");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tools.toml")).expect("tools");
    std::fs::write(dir.path().join("tools.toml"), shipped.replacen("timeout = \"15s\"", "timeout = \"200s\"", 1)).expect("slow tool");
    let err = server::bootstrap::load_config(&dir.path().join("gatehouse.toml")).expect_err("the slow tool is refused");
    assert!(err.to_string().contains("tool (web_fetch).timeout") && err.to_string().contains("jobs.timeouts.tool_call"), "{err}");
    std::fs::write(dir.path().join("tools.toml"), &shipped).expect("shipped tools");
    server::bootstrap::load_config(&dir.path().join("gatehouse.toml")).expect("the shipped tools fit");
    // A file tool named like the planner's own search tool would never be offered.
    std::fs::write(dir.path().join("gatehouse.toml"), "[lane]\nsearch_tool = \"web_search\"\nsearch_description = \"Finds more tools.\"\n").expect("config");
    let err = server::bootstrap::load_config(&dir.path().join("gatehouse.toml")).expect_err("the name clash is refused");
    assert!(err.to_string().contains("tool (web_search).name") && err.to_string().contains("lane.search_tool"), "{err}");
    // The search tool turned on with no provider to ask would fail every call.
    let off = "# Off until a provider is set under [web_search] in gatehouse.toml.\nenabled = false";
    assert!(shipped.contains(off), "the shipped web_search is off");
    std::fs::write(dir.path().join("tools.toml"), shipped.replacen(off, "enabled = true", 1)).expect("search on");
    std::fs::write(dir.path().join("gatehouse.toml"), "").expect("config");
    let err = server::bootstrap::load_config(&dir.path().join("gatehouse.toml")).expect_err("search without a provider is refused");
    assert!(err.to_string().contains("tool (web_search).enabled") && err.to_string().contains("base_url"), "{err}");
    std::fs::write(dir.path().join("gatehouse.toml"), "[web_search]\nbase_url = \"http://127.0.0.1:8888\"\n").expect("config");
    server::bootstrap::load_config(&dir.path().join("gatehouse.toml")).expect("search with a provider loads");
}
