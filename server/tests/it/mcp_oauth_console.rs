//! The console's Connect flow over HTTP, against the local authorization server and protected
//! MCP server of mcp_oauth_fake.rs: an owner's session posts Connect and is sent to the
//! authorization server with PKCE and a state; the callback hands the answer on to the finish
//! path, which under that owner's session and with the right state stores the token, after which
//! the server's tools appear. A wrong or missing state, a replay, and a request without the
//! owner's session are refused with stable codes, and none of them uses up the login.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use server::{config::Secrets, tools::mcp};

use crate::{
    both_backends,
    mcp_oauth_fake::Fake,
    support::{PUBLIC_URL, TestApp, TestDb},
};

const KEY: &str = "5f1c0de2a9b84e37c6d1f0a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6";

fn config(fake: &Fake) -> mcp::McpConfig {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp.toml");
    let text =
        format!("[[server]]\nid = \"crm\"\ntrust = \"trusted\"\napproval = \"never\"\ndefault_risk = \"low\"\nauth = \"oauth\"\n[server.transport]\ntype = \"http\"\nurl = \"{}\"\n", fake.url());
    std::fs::write(&path, text).expect("write");
    mcp::config::load(&path, &|_| true).expect("valid mcp.toml")
}

/// The query value `name` of `url`.
fn param(url: &str, name: &str) -> Option<String> {
    url::Url::parse(url).ok()?.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// A path with the same query as `url` but another `state`, or none.
fn finish_path(code: &str, state: Option<&str>) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("code", code);
    if let Some(s) = state {
        q.append_pair("state", s);
    }
    format!("{}?{}", mcp::FINISH_PATH, q.finish())
}

fn refused_with(res: &crate::support::Resp, code: &str) {
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{res:?}");
    assert_eq!(res.location(), Some(format!("/mcp?oauth_error={code}").as_str()), "{res:?}");
}

async fn connect_from_the_console(db: TestDb) {
    let fake = Fake::start(3600).await;
    let secrets = Secrets::from_lookup(|name| (name == mcp::config::TOKEN_KEY_VAR).then(|| KEY.to_string()));
    let app = TestApp::with_mcp(db, config(&fake), secrets).await;
    app.state.mcp.start().await.expect("start");
    assert!(app.state.mcp.live("crm").expect("live").needs_login.is_some(), "not logged in yet");
    let mut owner = app.with_owner("owner", "correct horse battery staple").await;

    // Connect: a redirect to the authorization server, with PKCE and a state.
    let res = owner.post_form(app::pages::mcp::OAUTH_START, &[("server", "crm")]).await;
    assert!(res.status.is_redirection(), "{res:?}");
    let authorize = res.location().expect("location").to_string();
    assert!(authorize.starts_with(&format!("{}/authorize?", fake.base)), "{authorize}");
    assert_eq!(param(&authorize, "code_challenge_method").as_deref(), Some("S256"));
    assert!(param(&authorize, "code_challenge").is_some_and(|c| c.len() >= 43), "{authorize}");
    assert_eq!(param(&authorize, "redirect_uri"), Some(format!("{PUBLIC_URL}{}", mcp::CALLBACK_PATH)));
    let state = param(&authorize, "state").expect("state");
    assert!(state.len() >= 16, "an unguessable state: {state}");

    // The authorization server sends the browser back to the console's callback.
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let landed = client.get(&authorize).send().await.expect("authorize").headers()["location"].to_str().expect("location").to_string();
    assert_eq!(param(&landed, "state").as_deref(), Some(state.as_str()));
    let code = param(&landed, "code").expect("code");
    // The callback comes cross-site (no session cookie): it only hands the answer on, same-site.
    let callback_path = landed.strip_prefix(PUBLIC_URL).expect("on the console").to_string();
    let page = app.client().get(&callback_path).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(&format!("url={}?code=", mcp::FINISH_PATH)), "{}", page.body);

    // Refused: a wrong state, no state, and no owner session. None of them uses the login up.
    refused_with(&owner.get(&finish_path(&code, Some("not-the-state"))).await, "MCP_OAUTH_LOGIN_UNKNOWN");
    refused_with(&owner.get(&finish_path(&code, None)).await, "MCP_OAUTH_LOGIN_UNKNOWN");
    let stranger = app.client().get(&finish_path(&code, Some(&state))).await;
    assert!(stranger.location().is_some_and(|l| l.starts_with("/login?next=")), "sent to log in: {stranger:?}");
    assert!(app.state.mcp.live("crm").expect("live").needs_login.is_some(), "still not logged in");

    // The owner's browser finishes it: the token is stored and the tools appear.
    let done = owner.get(&finish_path(&code, Some(&state))).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{done:?}");
    assert_eq!(done.location(), Some("/mcp?connected=crm"));
    app.state.mcp.wait_connected("crm", Duration::from_secs(30)).await.expect("connects with the new token");
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.state.tools.catalog().get("crm__whoami").is_none() {
        assert!(Instant::now() < deadline, "the server's tools did not appear");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored: String = sqlx::query_scalar("SELECT state FROM mcp_oauth WHERE server_id = 'crm'").fetch_one(&app.state.db.pool).await.expect("row");
    assert_eq!(stored, "connected");
    // A replay of the same answer is refused: a login finishes once.
    refused_with(&owner.get(&finish_path(&code, Some(&state))).await, "MCP_OAUTH_LOGIN_UNKNOWN");
    app.state.mcp.shutdown().await;
}
both_backends!(mcp_oauth_console_connect, connect_from_the_console);
