use axum::http::StatusCode;

use crate::{
    both_backends,
    support::{TestApp, TestDb},
};

async fn health_ready_metrics(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut c = app.client();
    let health = c.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK);
    assert!(health.headers.get("x-request-id").is_some(), "every response carries a request id");
    let ready = c.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    assert_eq!(ready.json()["status"], "ready");
    c.get("/login").await;
    // A made-up method is answered 405 and counted as "other": a client cannot add series.
    let odd = c.request(axum::http::Method::from_bytes(b"ZZTOP0001").expect("method"), "/webhooks/whatsapp", None).await;
    assert_eq!(odd.status, StatusCode::METHOD_NOT_ALLOWED);
    // A scraper on this machine (the console's /metrics answers no one else without a token).
    let metrics = app.client_from("127.0.0.1:40000").get("/metrics").await;
    assert!(!metrics.body.contains("ZZTOP0001"), "{}", metrics.body);
    assert!(metrics.body.contains("http_requests_total{route=\"/webhooks/whatsapp\",method=\"other\",status=\"405\"}"), "{}", metrics.body);
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(metrics.body.contains("gatehouse_build_info"), "{}", metrics.body);
    assert!(metrics.body.contains("http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\"}"), "{}", metrics.body);
    assert!(metrics.body.contains("http_request_duration_seconds_bucket"), "{}", metrics.body);
    assert!(metrics.body.contains("tool_breaker_state{tool=\"web_fetch\"} 0"), "breaker state per tool: {}", metrics.body);
}
both_backends!(operations, health_ready_metrics);

async fn readyz_fails_when_database_goes_away(mut_db: TestDb) {
    let mut app = TestApp::new(mut_db).await;
    let mut c = app.client();
    assert_eq!(c.get("/readyz").await.status, StatusCode::OK);
    match app.state.db.backend {
        // The database itself disappears under the running server.
        server::db::Backend::Postgres => app.db.drop_now().await,
        // A SQLite file cannot vanish from under open handles; a closed pool is the same outage.
        server::db::Backend::Sqlite => app.state.db.close().await,
    }
    let res = c.get("/readyz").await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE, "{}", res.body);
    assert_eq!((res.json()["status"].as_str(), res.json()["code"].as_str()), (Some("unavailable"), Some("DATABASE_UNAVAILABLE")), "{}", res.body);
    assert!(res.json()["reason"].as_str().unwrap_or_default().contains("database"), "{}", res.body);
    assert_eq!(c.get("/healthz").await.status, StatusCode::OK, "still alive");
}
both_backends!(readyz_outage, readyz_fails_when_database_goes_away);

async fn readyz_reports_pending_migrations(db: TestDb) {
    let app = TestApp::new(db).await;
    sqlx::query("DELETE FROM _sqlx_migrations").execute(&app.state.db.pool).await.expect("forget migrations");
    let res = app.client().get("/readyz").await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    // Unauthenticated callers learn how many, not which: the list would say which build this is.
    let expected = format!("{} migrations pending; run `gatehouse migrate`", app.state.db.known_migrations());
    assert_eq!(res.json()["reason"].as_str(), Some(expected.as_str()), "{}", res.body);
}
both_backends!(readyz_pending, readyz_reports_pending_migrations);

async fn state_changes_need_same_origin(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", "correct horse battery").await;
    let login = [("login", "ada"), ("password", "correct horse battery"), ("next", "/")];

    let mut evil = app.client();
    evil.origin = Some("https://evil.example".into());
    let res = evil.post_form("/api/login", &login).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert_eq!(res.json()["code"], "CSRF_ORIGIN_MISMATCH");
    assert!(evil.cookie.is_none());

    let mut bare = app.client();
    bare.origin = None;
    assert_eq!(bare.post_form("/api/login", &login).await.status, StatusCode::FORBIDDEN, "no Origin and no Referer");

    // A logged-in owner's session does not make a cross-origin change acceptable.
    let mut owner = app.client();
    owner.post_form("/api/login", &login).await;
    owner.origin = Some("http://127.0.0.1:3001".into());
    let res = owner.post_form("/api/update_phones", &[("phones", "+15550009999")]).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    owner.origin = Some(crate::support::PUBLIC_URL.into());
    let res = owner.post_form("/api/console_settings", &[]).await;
    assert_eq!(res.json()["my_phones"], serde_json::json!(["+15550001111"]), "refused change did not happen");
}
both_backends!(csrf, state_changes_need_same_origin);

async fn request_ids_are_ours_unless_plain(db: TestDb) {
    let app = TestApp::new(db).await;
    let send = |id: &'static str| {
        let router = app.router.clone();
        async move {
            let req = axum::http::Request::get("/healthz").header("x-request-id", id).body(axum::body::Body::empty()).expect("request");
            let res = tower::ServiceExt::oneshot(router, req).await.expect("infallible");
            res.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string)
        }
    };
    assert_eq!(send("proxy-7f3a_01").await.as_deref(), Some("proxy-7f3a_01"), "a plain token is kept");
    let replaced = send("evil\" injected=\"1").await.expect("an id");
    assert!(uuid::Uuid::parse_str(&replaced).is_ok(), "replaced with our own: {replaced}");
}
both_backends!(request_ids, request_ids_are_ours_unless_plain);

async fn loopback_console_accepts_both_names(db: TestDb) {
    let app = TestApp::with(db, |s| s.server.public_url = String::new()).await;
    let mut c = app.client();
    c.origin = Some("http://localhost:3000".into());
    let res = c.post_form("/api/login", &[("login", "nobody"), ("password", "whatever it is"), ("next", "/")]).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "reached the login check: {}", res.body);
    c.origin = Some("http://localhost:3001".into());
    let res = c.post_form("/api/login", &[("login", "nobody"), ("password", "whatever it is"), ("next", "/")]).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
}
both_backends!(loopback_origins, loopback_console_accepts_both_names);

#[tokio::test]
async fn port_fallback_and_strict_port() {
    // A port whose next one nobody else can be handed meanwhile.
    let taken = tokio::net::TcpListener::bind(("127.0.0.1", crate::support::quiet_port(1))).await.expect("bind");
    let addr = taken.local_addr().expect("addr");
    let fallback = server::web::serve::bind_with_fallback(addr, false).await.expect("falls back");
    let got = fallback.local_addr().expect("addr").port();
    assert_eq!(got, addr.port() + 1, "the next port after {}", addr.port());
    let strict = server::web::serve::bind_with_fallback(addr, true).await;
    assert_eq!(strict.err().map(|e| e.kind()), Some(std::io::ErrorKind::AddrInUse));
}

/// A database that does not survive a restart is said on every response and on every console
/// page (seed 003 WS-1.4); a lasting one says nothing.
async fn ephemeral_storage_is_said_everywhere(db: TestDb) {
    let lasting = TestApp::new(TestDb::sqlite()).await;
    let res = lasting.client().get("/healthz").await;
    assert!(res.headers.get("x-gatehouse-storage").is_none());

    let app = TestApp::with(db, |s| s.database.url = "sqlite::memory:".into()).await;
    let res = app.client().get("/healthz").await;
    assert_eq!(res.headers.get("x-gatehouse-storage").and_then(|v| v.to_str().ok()), Some("ephemeral"));
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let page = owner.get("/").await;
    assert!(page.body.contains("storage-banner") && page.body.contains("in memory"), "{}", page.body);
}
both_backends!(ops_ephemeral_storage, ephemeral_storage_is_said_everywhere);

/// The console's address is the webhook's, which the internet reaches: without a token its
/// /metrics answers only a request made on this machine, by the rule first-run setup follows
/// (a loopback peer, no proxy's header, a console published here), and refuses anyone else
/// with a stable code that says what to set. With GATEHOUSE_METRICS_TOKEN set, the bearer of
/// the token gets them from anywhere. (The rule reads no table: SQLite only.)
#[tokio::test]
async fn console_metrics_answer_only_this_machine_without_a_token() {
    let app = TestApp::new(TestDb::sqlite()).await;
    let refused = |res: &crate::support::Resp| res.status == StatusCode::FORBIDDEN && res.json()["code"] == "METRICS_NOT_LOCAL" && res.body.contains("GATEHOUSE_METRICS_TOKEN");
    let local = app.client_from("127.0.0.1:40000").get("/metrics").await;
    assert_eq!(local.status, StatusCode::OK, "{}", local.body);
    assert!(local.body.contains("gatehouse_build_info"), "{}", local.body);
    let remote = app.client_from("203.0.113.9:40000").get("/metrics").await;
    assert!(refused(&remote), "{}: {}", remote.status, remote.body);
    assert!(!remote.body.contains("gatehouse_build_info"), "{}", remote.body);
    for header in ["X-Forwarded-For", "Forwarded", "X-Real-IP"] {
        let mut proxied = app.client_from("127.0.0.1:40000");
        proxied.headers.push((header.into(), "203.0.113.9".into()));
        let res = proxied.get("/metrics").await;
        assert!(refused(&res), "through a proxy on this machine ({header}): {}: {}", res.status, res.body);
    }
    drop(app);

    // Published under another host, every request may have come through a proxy here.
    let published = TestApp::with(TestDb::sqlite(), |s| s.server.public_url = "https://bot.example".into()).await;
    let res = published.client_from("127.0.0.1:40000").get("/metrics").await;
    assert!(refused(&res), "{}: {}", res.status, res.body);

    let secrets = server::config::Secrets::from_lookup(|name| (name == "GATEHOUSE_METRICS_TOKEN").then(|| "metrics-token-7f3a".to_string()));
    let tokened = TestApp::with_secrets(TestDb::sqlite(), secrets, |_| {}).await;
    let mut remote = tokened.client_from("203.0.113.9:40000");
    assert_eq!(remote.get("/metrics").await.status, StatusCode::UNAUTHORIZED);
    remote.headers.push(("authorization".into(), "Bearer metrics-token-7f3a".into()));
    let res = remote.get("/metrics").await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert!(res.body.contains("gatehouse_build_info"), "{}", res.body);
}

/// With GATEHOUSE_METRICS_TOKEN set, /metrics answers only the bearer of the token; with
/// server.metrics_addr set, it is not on the console's address at all; and a scrape counts the
/// jobs table at most once per maintenance interval, however often it is scraped.
async fn metrics_behind_a_token_an_address_and_a_refresh_interval(db: TestDb) {
    let secrets = server::config::Secrets::from_lookup(|name| (name == "GATEHOUSE_METRICS_TOKEN").then(|| "metrics-token-7f3a".to_string()));
    let app = TestApp::with_secrets(db, secrets, |s| {
        s.jobs.maintenance_interval = std::time::Duration::from_secs(3600);
        s.server.metrics_addr = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let mut c = app.client();
    assert_eq!(c.get("/metrics").await.status, StatusCode::NOT_FOUND, "not on the console's address");

    let scrape = |auth: Option<&str>| {
        let router = server::web::metrics_router(app.state.clone());
        let auth = auth.map(str::to_string);
        async move {
            let mut req = axum::http::Request::builder().uri("/metrics");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let res = tower::ServiceExt::oneshot(router, req.body(axum::body::Body::empty()).expect("request")).await.expect("infallible");
            let status = res.status();
            let www = res.headers().get("www-authenticate").map(|v| v.to_str().unwrap_or_default().to_string());
            assert!(res.headers().get("x-request-id").is_some_and(|v| !v.is_empty()), "every answer names its request");
            let body = http_body_util::BodyExt::collect(res.into_body()).await.expect("body").to_bytes();
            (status, www, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, www, body) = scrape(None).await;
    assert_eq!((status, www.as_deref()), (StatusCode::UNAUTHORIZED, Some("Bearer")));
    assert!(body.contains("METRICS_UNAUTHORIZED") && !body.contains("metrics-token-7f3a"), "{body}");
    assert_eq!(scrape(Some("Bearer wrong-token")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(Some("metrics-token-7f3a")).await.0, StatusCode::UNAUTHORIZED, "the Bearer scheme is required");
    let (status, _, body) = scrape(Some("Bearer metrics-token-7f3a")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("jobs{state=\"available\"}"), "{body}");
    let first = *app.state.job_counts_read.lock().await;
    assert!(first.is_some(), "the first scrape counted the jobs");
    for _ in 0..5 {
        assert_eq!(scrape(Some("Bearer metrics-token-7f3a")).await.0, StatusCode::OK);
    }
    assert_eq!(*app.state.job_counts_read.lock().await, first, "later scrapes within the interval did not count again");
}
both_backends!(metrics_access, metrics_behind_a_token_an_address_and_a_refresh_interval);

/// The console's assets as scripts/build leaves them: content-hashed names linked from the
/// pages, served brotli- or gzip-compressed as the browser accepts, and cached as immutable, so a
/// repeat visit fetches no wasm; anything unhashed is revalidated.
async fn console_assets_are_hashed_precompressed_and_immutable(db: TestDb) {
    let site = tempfile::tempdir().expect("site");
    let pkg = site.path().join("pkg");
    std::fs::create_dir_all(&pkg).expect("pkg");
    let hash = "0123456789abcdef";
    for (name, body) in [
        (format!("gatehouse.{hash}.wasm"), "WASM".to_string()),
        (format!("gatehouse.{hash}.wasm.br"), "BROTLI".to_string()),
        (format!("gatehouse.{hash}.wasm.gz"), "GZIP".to_string()),
        (format!("gatehouse.{hash}.js"), "export default 1;".to_string()),
        ("hash.txt".to_string(), format!("{hash}\n")),
        ("notes.txt".to_string(), "unhashed".to_string()),
    ] {
        std::fs::write(pkg.join(name), body).expect("write");
    }
    let root = site.path().to_path_buf();
    let app = TestApp::with(db, move |s| s.server.site_root = root).await;
    let mut owner = app.with_owner("assets", "a long enough password").await;
    let page = owner.get("/").await;
    assert!(page.body.contains(&format!("/pkg/gatehouse.{hash}.wasm")) && page.body.contains(&format!("/pkg/gatehouse.{hash}.js")), "pages link the hashed names: {}", page.body);

    let mut client = app.client();
    let wasm = format!("/pkg/gatehouse.{hash}.wasm");
    for (accept, encoding, body) in [("br, gzip", Some("br"), "BROTLI"), ("gzip", Some("gzip"), "GZIP"), ("identity", None, "WASM")] {
        client.headers = vec![("accept-encoding".into(), accept.into())];
        let res = client.get(&wasm).await;
        assert_eq!(res.status, 200);
        assert_eq!(res.headers.get("content-encoding").and_then(|v| v.to_str().ok()), encoding, "accept-encoding {accept}");
        assert_eq!(res.body, body);
        assert_eq!(res.headers.get("cache-control").and_then(|v| v.to_str().ok()), Some("public, max-age=31536000, immutable"));
        assert_eq!(res.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/wasm"));
    }
    client.headers.clear();
    let other = client.get("/pkg/notes.txt").await;
    assert_eq!(other.headers.get("cache-control").and_then(|v| v.to_str().ok()), Some("no-cache"), "an unhashed file is revalidated");
}
both_backends!(console_assets, console_assets_are_hashed_precompressed_and_immutable);
