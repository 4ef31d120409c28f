//! Test helpers: a fresh database per test on either backend, an app built on it, and a small
//! HTTP client that drives the router in-process and keeps the session cookie.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::ConnectInfo,
    http::{HeaderMap, Method, Request, StatusCode, header},
};
use http_body_util::BodyExt;
use server::{
    bootstrap::{Gatehouse, Overrides},
    config::{LoadedConfig, Secrets, Settings},
    db::Db,
    tools::ToolFiles,
    web::{self, AppState},
};
use sqlx::{Connection, Executor};
use tower::ServiceExt;

pub const PUBLIC_URL: &str = "http://127.0.0.1:3000";

/// A loopback port for a test that must name its port (a server it restarts on the same one,
/// the next ports after a taken one), free with the `spare` ports after it. It lies below the
/// kernel's ephemeral range, which `127.0.0.1:0` and every outgoing connection draw from, so
/// no other test or process here is handed it meanwhile; and no two calls in this process
/// return overlapping ports.
pub fn quiet_port(spare: u16) -> u16 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU16> = std::sync::OnceLock::new();
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|low| low.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral.saturating_sub(spare + 1));
    let next = NEXT.get_or_init(|| std::sync::atomic::AtomicU16::new(rand::random_range(low..high)));
    let wrap = |p: u16| if (low..high).contains(&p) { p } else { low };
    for _ in 0..200 {
        // The update always applies (it never returns None).
        let taken = next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(wrap(p) + spare + 1)).unwrap_or_else(|p| p);
        let port = wrap(taken);
        if (port..=port + spare).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return port;
        }
    }
    panic!("no free loopback port below {ephemeral}");
}

fn postgres_admin_url() -> String {
    std::env::var("GATEHOUSE_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database that exists for one test and is removed afterwards.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    pg_name: Option<String>,
}

impl TestDb {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("nested/gatehouse.db").display());
        Self { url, _dir: Some(dir), pg_name: None }
    }

    /// A fresh PostgreSQL database, or `None` when PostgreSQL is unreachable outside CI. With
    /// `CI=true` an unreachable server fails the test.
    pub async fn postgres() -> Option<Self> {
        sqlx::any::install_default_drivers();
        let admin = postgres_admin_url();
        let conn = tokio::time::timeout(Duration::from_secs(5), sqlx::AnyConnection::connect(&admin)).await;
        let mut conn = match conn {
            Ok(Ok(conn)) => conn,
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".into(),
                };
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("PostgreSQL at {admin} is unreachable and CI=true: {why}");
                }
                eprintln!("\n!!!!!!!! PostgreSQL SKIPPED: {admin} is unreachable ({why}). Set GATEHOUSE_TEST_POSTGRES_URL or start PostgreSQL. !!!!!!!!\n");
                return None;
            }
        };
        static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SWEPT.swap(true, Ordering::Relaxed) {
            sweep_abandoned(&mut conn).await;
        }
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!("gh_test_{}_{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed), rand_suffix());
        let create = format!("CREATE DATABASE {name}");
        match tokio::time::timeout(PG_ADMIN_LIMIT, conn.execute(create.as_str())).await {
            Ok(done) => done.expect("create test database"),
            Err(_) => panic!("CREATE DATABASE {name} did not finish within {PG_ADMIN_LIMIT:?}; PostgreSQL activity:\n{}", postgres_activity().await),
        };
        let _ = conn.close().await;
        let mut url = url::Url::parse(&admin).expect("postgres url");
        url.set_path(&format!("/{name}"));
        Some(Self { url: url.to_string(), _dir: None, pg_name: Some(name) })
    }

    pub async fn connect(&self) -> Db {
        self.connect_with(server::config::DatabaseSettings::default().max_connections).await
    }

    /// [`TestDb::connect`] with a pool of `max_connections`.
    pub async fn connect_with(&self, max_connections: u32) -> Db {
        let settings = server::config::DatabaseSettings { url: self.url.clone(), max_connections, ..Default::default() };
        Db::connect(&settings).await.expect("connect test database")
    }

    /// Removes the PostgreSQL database now (e.g. to test what happens when it goes away).
    pub async fn drop_now(&mut self) {
        if let Some(name) = self.pg_name.take() {
            drop_pg(&name).await;
        }
    }
}

/// Drops the test databases of test processes that no longer run (killed before their own
/// cleanup), so that an interrupted run does not leave databases behind for good.
async fn sweep_abandoned(conn: &mut sqlx::AnyConnection) {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let names: Vec<String> = match sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE 'gh\\_test\\_%'").fetch_all(&mut *conn).await {
        Ok(names) => names,
        Err(e) => return eprintln!("cannot list abandoned test databases: {e}"),
    };
    for name in names {
        let pid = name.strip_prefix("gh_test_").and_then(|rest| rest.split('_').next()).and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = conn.execute(drop_database_sql(&name).as_str()).await;
        }
    }
}

/// Drops the database even while connections to it are open.
fn drop_database_sql(name: &str) -> String {
    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
}

fn rand_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// Bounds each administrative step (connecting, creating and dropping a test database), so a
/// stuck PostgreSQL fails one test with its activity printed instead of stalling the run.
const PG_ADMIN_LIMIT: Duration = Duration::from_secs(60);

/// How long one test body may take before it fails, printing PostgreSQL's activity. A hang must
/// fail its own test, not stall the whole run until CI gives up.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

async fn drop_pg(name: &str) {
    let drop = async {
        let mut conn = sqlx::AnyConnection::connect(&postgres_admin_url()).await?;
        conn.execute(drop_database_sql(name).as_str()).await?;
        conn.close().await
    };
    match tokio::time::timeout(PG_ADMIN_LIMIT, drop).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("test database {name} was not dropped: {e}"),
        Err(_) => eprintln!("DROP DATABASE {name} did not finish within {PG_ADMIN_LIMIT:?}; PostgreSQL activity:\n{}", postgres_activity().await),
    }
}

/// Every other PostgreSQL backend: its database, state, what it waits for, for how long, and
/// the start of its query. For diagnosing a test that hangs.
pub async fn postgres_activity() -> String {
    let query = "SELECT coalesce(string_agg(format('pid %s db %s %s wait %s/%s for %s: %s', pid, datname, state, \
                 wait_event_type, wait_event, now() - query_start, left(query, 160)), E'\\n'), '(none)') \
                 FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'";
    let activity = async {
        let mut conn = sqlx::AnyConnection::connect(&postgres_admin_url()).await?;
        let text: String = sqlx::query_scalar(query).fetch_one(&mut conn).await?;
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(text)
    };
    match tokio::time::timeout(Duration::from_secs(10), activity).await {
        Ok(Ok(text)) => text,
        Ok(Err(e)) => format!("(unavailable: {e})"),
        Err(_) => "(unavailable: timed out)".into(),
    }
}

/// Runs one test body within [`TEST_LIMIT`].
pub async fn within_limit<F: std::future::Future>(test: &str, body: F) -> F::Output {
    match tokio::time::timeout(TEST_LIMIT, body).await {
        Ok(out) => out,
        Err(_) => panic!("{test} did not finish within {TEST_LIMIT:?}; PostgreSQL activity:\n{}", postgres_activity().await),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            // Drop runs outside async context; a short-lived runtime on its own thread does it.
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    rt.block_on(drop_pg(&name));
                }
            })
            .join();
        }
    }
}

/// Runs a test body on SQLite and on PostgreSQL.
#[macro_export]
macro_rules! both_backends {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let test = concat!(module_path!(), "::sqlite");
                $crate::support::within_limit(test, super::$body($crate::support::TestDb::sqlite())).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(db) = $crate::support::TestDb::postgres().await {
                    $crate::support::within_limit(concat!(module_path!(), "::postgres"), super::$body(db)).await;
                }
            }
        }
    };
}

pub fn settings_for(db: &TestDb) -> Settings {
    let mut settings = Settings::default();
    settings.database.url = db.url.clone();
    settings.server.public_url = PUBLIC_URL.into();
    settings.server.site_root = PathBuf::from("/nonexistent-site-root");
    settings
}

pub struct TestApp {
    pub gatehouse: Gatehouse,
    pub state: AppState,
    pub router: Router,
    pub db: TestDb,
}

impl TestApp {
    pub async fn new(db: TestDb) -> Self {
        Self::with(db, |_| {}).await
    }

    pub async fn with(db: TestDb, tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::with_secrets(db, Secrets::default(), tweak).await
    }

    /// An app whose secrets (webhook and Graph API credentials) are `secrets`.
    pub async fn with_secrets(db: TestDb, secrets: Secrets, tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::build(db, std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config")), secrets, tweak).await
    }

    /// An app whose config files (gatehouse.toml, tools.toml, ...) are in `dir`, so tests can
    /// edit them and reload.
    pub async fn in_config_dir(db: TestDb, dir: &std::path::Path) -> Self {
        Self::build(db, dir, Secrets::default(), |_| {}).await
    }

    /// An app over the tool files in `dir` (tools.toml, connectors.toml), with `secrets`.
    pub async fn in_dir_with(db: TestDb, dir: &std::path::Path, secrets: Secrets, tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::build(db, dir, secrets, tweak).await
    }

    async fn build(db: TestDb, dir: &std::path::Path, secrets: Secrets, tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::build_with(db, dir, secrets, tweak, Overrides::default(), Arc::default()).await
    }

    /// An app with these MCP servers (their supervisors not started: `state.mcp.start()`) and
    /// `secrets`, over the shipped tool files.
    pub async fn with_mcp(db: TestDb, mcp: server::tools::mcp::McpConfig, secrets: Secrets) -> Self {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config"));
        Self::build_with(db, dir, secrets, |_| {}, Overrides::default(), Arc::new(mcp)).await
    }

    async fn build_with(
        db: TestDb,
        dir: &std::path::Path,
        secrets: Secrets,
        tweak: impl FnOnce(&mut Settings),
        overrides: Overrides,
        mcp: Arc<server::tools::mcp::McpConfig>,
    ) -> Self {
        init_test_logs();
        let mut settings = settings_for(&db);
        tweak(&mut settings);
        let pool = db.connect_with(settings.database.max_connections).await;
        pool.migrate().await.expect("migrate");
        // The shipped tool files need no secrets; MCP servers are the MCP tests' own.
        let files = ToolFiles { mcp, ..ToolFiles::load(dir, &secrets.source).expect("tool files load") };
        let config = LoadedConfig::new(settings, secrets, dir.join("gatehouse.toml"));
        let gatehouse = Gatehouse::build_with(config, files, pool, overrides).expect("build");
        let state = AppState::new(&gatehouse, "127.0.0.1:3000".parse().expect("addr"), web::ops::metrics_handle());
        let router = web::router(state.clone());
        Self { gatehouse, state, router, db }
    }

    /// Another process of the same deployment, as `gatehouse worker` builds it: the same
    /// database and config directory `dir`, its own pool, checkpoint and MCP manager.
    pub async fn another_process(&self, dir: &std::path::Path) -> Gatehouse {
        let files = ToolFiles::load(dir, &Secrets::default().source).expect("tool files load");
        let config = LoadedConfig::new(settings_for(&self.db), Secrets::default(), dir.join("gatehouse.toml"));
        Gatehouse::build(config, files, self.db.connect().await).expect("build")
    }

    pub fn client(&self) -> Client {
        self.client_from("10.0.0.1:50000")
    }

    /// A client whose requests appear to come from `peer` (for per-address throttling).
    pub fn client_from(&self, peer: &str) -> Client {
        Client { router: self.router.clone(), cookie: None, peer: peer.parse().expect("peer addr"), origin: Some(PUBLIC_URL.into()), headers: Vec::new() }
    }

    /// Creates the first owner through the setup server function (from this machine, as setup
    /// needs) and returns a logged-in client.
    pub async fn with_owner(&self, login: &str, password: &str) -> Client {
        let mut local = self.client_from("127.0.0.1:50000");
        let res = local
            .post_form("/api/setup_owner", &[
                ("display_name", "Test Owner"),
                ("login", login),
                ("password", password),
                ("password_confirm", password),
                ("whatsapp", "+15550001111"),
            ])
            .await;
        assert_eq!(res.status, StatusCode::OK, "setup: {}", res.body);
        Client { cookie: local.cookie, ..self.client() }
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Resp {
    pub fn location(&self) -> Option<&str> {
        self.headers.get(header::LOCATION).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Clone)]
pub struct Client {
    router: Router,
    pub cookie: Option<String>,
    peer: SocketAddr,
    pub origin: Option<String>,
    /// Extra request headers (a proxy's X-Forwarded-For, say).
    pub headers: Vec<(String, String)>,
}

impl Client {
    pub async fn request(&mut self, method: Method, path: &str, body: Option<String>) -> Resp {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(origin) = &self.origin {
            req = req.header(header::ORIGIN, origin);
        }
        if let Some(cookie) = &self.cookie {
            req = req.header(header::COOKIE, format!("{}={cookie}", web::SESSION_COOKIE));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        for (name, value) in &self.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let mut req = req.body(Body::from(body.unwrap_or_default())).expect("request");
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let res = self.router.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let headers = res.headers().clone();
        for set in headers.get_all(header::SET_COOKIE) {
            let text = set.to_str().unwrap_or_default();
            if let Some(rest) = text.strip_prefix(&format!("{}=", web::SESSION_COOKIE)) {
                let value = rest.split(';').next().unwrap_or_default();
                let removed = text.contains("Max-Age=0") || value.is_empty();
                self.cookie = if removed { None } else { Some(value.to_string()) };
            }
        }
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        Resp { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
    }

    pub async fn get(&mut self, path: &str) -> Resp {
        self.request(Method::GET, path, None).await
    }

    pub async fn post_json(&mut self, path: &str, body: &serde_json::Value) -> Resp {
        let mut req = Request::builder().method(Method::POST).uri(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(origin) = &self.origin {
            req = req.header(header::ORIGIN, origin);
        }
        if let Some(cookie) = &self.cookie {
            req = req.header(header::COOKIE, format!("{}={cookie}", web::SESSION_COOKIE));
        }
        let mut req = req.body(Body::from(body.to_string())).expect("request");
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let res = self.router.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        Resp { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
    }

    pub async fn post_form(&mut self, path: &str, fields: &[(&str, &str)]) -> Resp {
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
        self.request(Method::POST, path, Some(body)).await
    }
}

/// Warnings and errors go to the test's captured output, so a failing test shows why the app
/// answered as it did (`RUST_LOG` overrides the level).
pub fn init_test_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Log lines written on the thread that started the capture, for checking what a line holds
/// (a `current_thread` test sees its spawned tasks' lines too).
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures every level until the guard is dropped.
    pub fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let captured = Self::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_max_level(tracing::Level::TRACE).with_ansi(false).finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}
