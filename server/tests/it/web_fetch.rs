//! web_fetch against local servers only: loopback is refused unless allowed, redirects are
//! checked at every hop, and limits hold. (Other ranges are covered by the address-check unit
//! tests, which send no traffic.)

use std::time::Duration;

use axum::{
    Router,
    http::header,
    response::{IntoResponse, Redirect},
    routing::get,
};
use server::tools::builtins::web_fetch::{FetchCode, FetchLimits, WebFetch};

async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    port
}

async fn site(other_port: u16) -> u16 {
    let router = Router::new()
        .route("/page", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], "<html><head><title>Menu</title></head><body><h1>Lunch</h1><p>Soup &amp; bread</p></body></html>") }))
        .route("/img", get(|| async { ([(header::CONTENT_TYPE, "image/png")], vec![0u8; 16]) }))
        .route("/big", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "x".repeat(300_000)) }))
        .route("/to-localhost", get(move || async move { Redirect::temporary(&format!("http://localhost:{other_port}/page")) }))
        .route("/to-loopback-ip", get(move || async move { Redirect::temporary(&format!("http://127.0.0.1:{other_port}/page")) }))
        .route("/to-metadata", get(|| async { Redirect::temporary("http://169.254.169.254/latest/meta-data/") }))
        .route("/loop", get(|| async { Redirect::temporary("/loop") }))
        .route("/same-host", get(|| async { Redirect::temporary("/page") }))
        .route("/error", get(|| async { (axum::http::StatusCode::BAD_GATEWAY, "nope").into_response() }))
        .route("/latin1", get(|| async { ([(header::CONTENT_TYPE, "text/plain; charset=iso-8859-1")], b"Caf\xe9 cr\xe8me".to_vec()) }))
        .route("/meta", get(|| async { ([(header::CONTENT_TYPE, "text/html")], b"<html><head><meta charset=\"windows-1252\"><title>Caf\xe9</title></head><body><p>\x93Quoted\x94</p></body></html>".to_vec()) }))
        .route("/utf16", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], [&[0xFF, 0xFE][..], &"Hi ☕".encode_utf16().flat_map(u16::to_le_bytes).collect::<Vec<u8>>()].concat()) }));
    serve(router).await
}

fn fetcher(allowed: &[String]) -> WebFetch {
    WebFetch::new(FetchLimits { allowed_hosts: allowed.to_vec(), max_bytes: 100_000, timeout: Duration::from_secs(5), ..Default::default() }).expect("client")
}

#[tokio::test]
async fn loopback_is_refused_unless_allowed() {
    let other = site(0).await;
    let port = site(other).await;
    let strict = fetcher(&[]);
    for url in [format!("http://127.0.0.1:{port}/page"), format!("http://localhost:{port}/page"), format!("http://[::1]:{port}/page"), format!("http://2130706433:{port}/page"), format!("http://0x7f.0.0.1:{port}/page")] {
        let err = strict.fetch(&url).await.expect_err(&url);
        assert_eq!(err.code, FetchCode::AddressForbidden.as_str(), "{url}: {err}");
    }
    let allowed = fetcher(&[format!("127.0.0.1:{port}")]);
    let page = allowed.fetch(&format!("http://127.0.0.1:{port}/page")).await.expect("allowed host");
    assert_eq!(page["title"], "Menu");
    assert_eq!(page["text"], "Lunch\nSoup & bread");
    let same = allowed.fetch(&format!("http://127.0.0.1:{port}/same-host")).await.expect("same-host redirect");
    assert_eq!(same["final_url"], format!("http://127.0.0.1:{port}/page"));
}

#[tokio::test]
async fn every_redirect_hop_is_checked() {
    let other = site(0).await;
    let port = site(other).await;
    let allowed = fetcher(&[format!("127.0.0.1:{port}")]);
    for (path, expected) in [("/to-localhost", FetchCode::AddressForbidden.as_str()), ("/to-loopback-ip", FetchCode::AddressForbidden.as_str()), ("/to-metadata", FetchCode::AddressForbidden.as_str()), ("/loop", FetchCode::UrlInvalid.as_str())] {
        let err = allowed.fetch(&format!("http://127.0.0.1:{port}{path}")).await.expect_err(path);
        assert_eq!(err.code, expected, "{path}: {err}");
    }
}

#[tokio::test]
async fn limits_on_type_size_status_scheme_and_hosts() {
    let port = site(0).await;
    let host = format!("127.0.0.1:{port}");
    let f = fetcher(std::slice::from_ref(&host));
    assert_eq!(f.fetch(&format!("http://{host}/img")).await.expect_err("image").code, FetchCode::ContentType.as_str());
    let big = f.fetch(&format!("http://{host}/big")).await.expect("big");
    assert_eq!(big["truncated"], true);
    assert_eq!(big["text"].as_str().map(str::len), Some(100_000));
    let err = f.fetch(&format!("http://{host}/error")).await.expect_err("502");
    assert!(err.code == FetchCode::HttpStatus.as_str() && err.retryable, "{err}");
    assert_eq!(f.fetch("file:///etc/passwd").await.expect_err("file").code, FetchCode::UrlInvalid.as_str());
    assert_eq!(f.fetch(&format!("http://user:pw@{host}/page")).await.expect_err("creds").code, FetchCode::UrlInvalid.as_str());
    let denied = WebFetch::new(FetchLimits { allowed_hosts: vec![host.clone()], denied_hosts: vec!["127.0.0.1".into()], ..Default::default() }).expect("client");
    assert_eq!(denied.fetch(&format!("http://{host}/page")).await.expect_err("denied").code, FetchCode::HostDenied.as_str());
}

/// An `allowed_hosts` entry with a port exempts that port only: the same host's other ports get
/// the public-address check like any host.
#[tokio::test]
async fn an_allowed_port_allows_that_port_only() {
    let other = site(0).await;
    let port = site(other).await;
    let f = fetcher(&[format!("localhost:{port}")]);
    let page = f.fetch(&format!("http://localhost:{port}/page")).await.expect("the allowed port");
    assert_eq!(page["title"], "Menu");
    let err = f.fetch(&format!("http://localhost:{other}/page")).await.expect_err("another port of the allowed host");
    assert_eq!(err.code, FetchCode::AddressForbidden.as_str(), "{err}");
    // Nor through a redirect from the allowed port.
    let err = f.fetch(&format!("http://localhost:{port}/to-localhost")).await.expect_err("redirect to another port");
    assert_eq!(err.code, FetchCode::AddressForbidden.as_str(), "{err}");
    // An entry without a port covers every port.
    let any = fetcher(&["localhost".to_string()]);
    assert!(any.fetch(&format!("http://localhost:{other}/page")).await.is_ok());
}

/// A denied host stays denied spelled with a trailing dot, as a subdomain, or by its address.
#[tokio::test]
async fn denied_hosts_cover_spellings_subdomains_and_addresses() {
    let port = site(0).await;
    let limits = |denied: &[&str]| FetchLimits {
        allowed_hosts: vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("sub.localhost:{port}")],
        denied_hosts: denied.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    };
    let by_name = WebFetch::new(limits(&["LocalHost"])).expect("client");
    for url in [format!("http://localhost:{port}/page"), format!("http://localhost.:{port}/page"), format!("http://sub.localhost:{port}/page"), format!("http://127.0.0.1:{port}/page")] {
        let err = by_name.fetch(&url).await.expect_err(&url);
        assert_eq!(err.code, FetchCode::HostDenied.as_str(), "{url}: {err}");
    }
    let by_net = WebFetch::new(limits(&["127.0.0.0/8"])).expect("client");
    for url in [format!("http://127.0.0.1:{port}/page"), format!("http://[::ffff:127.0.0.1]:{port}/page"), format!("http://localhost:{port}/page")] {
        let err = by_net.fetch(&url).await.expect_err(&url);
        assert_eq!(err.code, FetchCode::HostDenied.as_str(), "{url}: {err}");
    }
}

/// A catalog the checkpoint publishes (a reload) brings its connectors' hosts to web_fetch at
/// once: a connector added is refused from then on, one removed is free again. web_fetch used
/// to keep the hosts of the catalog it started with until a restart.
#[tokio::test]
async fn a_reload_brings_its_connector_hosts() {
    use std::sync::Arc;
    let port = site(0).await;
    let limits = FetchLimits { allowed_hosts: vec![format!("127.0.0.1:{port}")], ..Default::default() };
    let fetch = Arc::new(WebFetch::new(limits).expect("client"));
    let url = format!("http://127.0.0.1:{port}/page");
    assert!(fetch.fetch(&url).await.is_ok(), "no connector yet");

    let test_db = crate::support::TestDb::sqlite();
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    let secrets = server::config::SecretSource::empty();
    let audit = server::tools::checkpoint::AuditWriter::spawn(db.clone(), server::jobs::JobQueue::new(db.clone()));
    let mut checkpoint = server::tools::Checkpoint::new(db.clone(), Arc::new(server::tools::Catalog::default()), audit, secrets.clone());
    checkpoint.register_builtin(server::tools::builtins::web_fetch::HANDLER, fetch.clone());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tools.toml"), crate::lane_e2e::TOOLS).expect("tools");
    std::fs::write(dir.path().join("connectors.toml"), crate::lane_e2e::connectors(([127, 0, 0, 1], port).into())).expect("connectors");
    let files = server::tools::ToolFiles::load(dir.path(), &secrets).expect("tool files");
    checkpoint.reload(files.catalog);
    let err = fetch.fetch(&url).await.expect_err("the new connector's host");
    assert_eq!(err.code, FetchCode::ConnectorHost.as_str(), "{err}");
    checkpoint.reload(Arc::new(server::tools::Catalog::default()));
    assert!(fetch.fetch(&url).await.is_ok(), "a removed connector's host is free again");
}

/// A connector's host is reached through the connector only, never through web_fetch, even
/// when allowed_hosts lists it.
#[tokio::test]
async fn connector_hosts_are_refused() {
    let port = site(0).await;
    let limits = FetchLimits { allowed_hosts: vec![format!("127.0.0.1:{port}"), format!("localhost:{port}")], ..Default::default() };
    let f = WebFetch::with_connector_hosts(limits, &[format!("localhost:{port}")]).expect("client");
    for url in [format!("http://localhost:{port}/page"), format!("http://LOCALHOST.:{}/page", port + 1), format!("http://127.0.0.1:{port}/page")] {
        let err = f.fetch(&url).await.expect_err(&url);
        assert_eq!(err.code, FetchCode::ConnectorHost.as_str(), "{url}: {err}");
    }
}

/// A page is read in its own encoding: the Content-Type's charset, an HTML page's
/// `<meta charset>`, a byte-order mark; UTF-8 otherwise.
#[tokio::test]
async fn pages_are_read_in_their_own_encoding() {
    let port = site(0).await;
    let host = format!("127.0.0.1:{port}");
    let f = fetcher(std::slice::from_ref(&host));
    assert_eq!(f.fetch(&format!("http://{host}/latin1")).await.expect("latin1")["text"], "Café crème");
    let meta = f.fetch(&format!("http://{host}/meta")).await.expect("meta");
    assert_eq!((meta["title"].as_str(), meta["text"].as_str()), (Some("Café"), Some("“Quoted”")));
    assert_eq!(f.fetch(&format!("http://{host}/utf16")).await.expect("utf16")["text"], "Hi ☕");
}

/// A page that is missing or not text is the site's failure, not web_fetch's: however many a
/// chat sends, the tool's circuit breaker stays closed for every other chat.
#[tokio::test]
async fn dead_links_do_not_open_the_tools_circuit_breaker() {
    use std::sync::Arc;
    use server::{domain::{ChatKind, Role}, tools::{CallContext, ToolCall}};
    let port = site(0).await;
    let fetch = Arc::new(WebFetch::new(FetchLimits { allowed_hosts: vec![format!("127.0.0.1:{port}")], ..Default::default() }).expect("client"));
    let test_db = crate::support::TestDb::sqlite();
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tools.toml");
    let tool = format!(
        "[[tool]]\nname = \"web_fetch\"\ntitle = \"Fetch\"\ndescription = \"Reads a page.\"\nprovider = \"builtin\"\nhandler = \"{}\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = {{ type = \"object\", required = [\"url\"], properties = {{ url = {{ type = \"string\" }} }} }}\n",
        server::tools::builtins::web_fetch::HANDLER
    );
    std::fs::write(&path, tool).expect("tools.toml");
    let catalog = Arc::new(server::tools::Catalog::load(&path, &|_| false).expect("catalog"));
    let secrets = server::config::SecretSource::empty();
    let audit = server::tools::checkpoint::AuditWriter::spawn(db.clone(), server::jobs::JobQueue::new(db.clone()));
    let mut checkpoint = server::tools::Checkpoint::new(db.clone(), catalog, audit, secrets);
    checkpoint.register_builtin(server::tools::builtins::web_fetch::HANDLER, fetch);
    let ctx = |chat: &str| CallContext { actor: Role::Customer, chat_type: ChatKind::Direct, chat_id: Some(chat.into()), sender_id: None, correlation_id: format!("dead-{chat}"), approved: None, trace_id: None };
    let call = |path: &str| ToolCall { name: "web_fetch".into(), args: serde_json::json!({ "url": format!("http://127.0.0.1:{port}{path}") }) };
    for path in ["/img", "/img", "/error", "/img"] {
        let failed = checkpoint.execute(call(path), &ctx("chat-a")).await.expect_err(path);
        assert_ne!(failed.code, server::tools::checkpoint::ToolCode::CircuitOpen.as_str(), "{path}: {failed:?}");
    }
    let page = checkpoint.execute(call("/page"), &ctx("chat-b")).await.expect("another chat's page is fetched");
    assert_eq!(page.output["title"], "Menu");
}
