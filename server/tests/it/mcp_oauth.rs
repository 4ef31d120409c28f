//! MCP servers behind OAuth 2.1, against a local authorization server and the MCP server it
//! protects (mcp_oauth_fake.rs): a login, refresh across a restart, an expired refresh token
//! (needs login, tools withheld, owners told), tokens never in logs, the database's other
//! tables or the model's results, and two processes on PostgreSQL sharing one token.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};
use server::{
    db::Db,
    domain::Role,
    tools::{
        CallContext, Catalog, Checkpoint, ToolCall,
        catalog::ChatKind,
        checkpoint::{AuditWriter, SecretSource, ToolFailure, ToolSuccess},
        mcp::{self, AuditActor, McpManager},
    },
};
use sqlx::Row;

use crate::{both_backends, mcp_oauth_fake::Fake, support::TestDb};

const KEY: &str = "5f1c0de2a9b84e37c6d1f0a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6";
const BIN: &str = env!("CARGO_BIN_EXE_gatehouse");

fn secrets() -> SecretSource {
    SecretSource::from_fn(|name| (name == mcp::config::TOKEN_KEY_VAR).then(|| KEY.to_string()))
}

fn servers_toml(fake: &Fake) -> String {
    format!(
        "[[server]]\nid = \"crm\"\ntrust = \"trusted\"\napproval = \"never\"\ndefault_risk = \"low\"\nauth = \"oauth\"\n[server.transport]\ntype = \"http\"\nurl = \"{}\"\n",
        fake.url()
    )
}

fn actor() -> AuditActor {
    AuditActor {
        owner_id: None,
        login: Some("test-owner".into()),
        ip: None,
    }
}

struct Rig {
    checkpoint: Arc<Checkpoint>,
    manager: McpManager,
}

impl Rig {
    /// Gatehouse's MCP side over `db`; `start` runs the supervisors (a process serving).
    async fn new(db: &Db, fake: &Fake, start: bool) -> Self {
        Self::with_secrets(db, fake, start, secrets()).await
    }

    /// The same, as a process whose environment is `secrets`.
    async fn with_secrets(db: &Db, fake: &Fake, start: bool, secrets: SecretSource) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mcp.toml");
        std::fs::write(&path, servers_toml(fake)).expect("write mcp.toml");
        let config = mcp::config::load(&path, &|_| true).expect("valid mcp.toml");
        let manager = McpManager::new(db.clone(), &config, secrets.clone());
        manager.set_public_url("http://127.0.0.1:3000");
        let checkpoint = Checkpoint::new(
            db.clone(),
            Arc::new(Catalog::default()),
            AuditWriter::spawn(db.clone(), server::jobs::JobQueue::new(db.clone())),
            secrets,
        );
        let checkpoint = manager.install(checkpoint, Arc::new(Catalog::default()));
        if start {
            manager.start().await.expect("start");
        }
        Self {
            checkpoint,
            manager,
        }
    }

    async fn call(&self) -> Result<ToolSuccess, ToolFailure> {
        let ctx = CallContext {
            actor: Role::Owner,
            chat_type: ChatKind::Direct,
            chat_id: Some("chat-1".into()),
            sender_id: None,
            correlation_id: "oauth-test".into(),
            approved: None,
            trace_id: None,
        };
        self.checkpoint
            .execute(
                ToolCall {
                    name: "crm__whoami".into(),
                    args: json!({}),
                },
                &ctx,
            )
            .await
    }
}

/// Where the authorization server sends the browser (it approves at once).
async fn follow(authorization_url: &str) -> String {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = client
        .get(authorization_url)
        .send()
        .await
        .expect("authorize");
    assert_eq!(
        response.status().as_u16(),
        303,
        "the authorization server redirects back"
    );
    response.headers()["location"]
        .to_str()
        .expect("location")
        .to_string()
}

async fn login(manager: &McpManager) {
    let url = manager
        .begin_login("crm", None, &actor())
        .await
        .expect("login starts");
    assert!(
        url.contains("code_challenge=") && url.contains("code_challenge_method=S256"),
        "PKCE: {url}"
    );
    let landed = follow(&url).await;
    assert!(
        landed.starts_with("http://127.0.0.1:3000/mcp/oauth/callback?"),
        "{landed}"
    );
    assert_eq!(
        manager
            .finish_login_url(&landed, &actor())
            .await
            .expect("login finishes"),
        "crm"
    );
}

async fn stored(db: &Db) -> (Option<String>, String, i64) {
    let mut conn = db.pool.acquire().await.expect("conn");
    let row =
        sqlx::query("SELECT credentials, state, refreshes FROM mcp_oauth WHERE server_id = 'crm'")
            .fetch_one(&mut *conn)
            .await
            .expect("row");
    (
        row.get("credentials"),
        row.get("state"),
        row.get("refreshes"),
    )
}

async fn refresh_across_a_restart(test_db: TestDb) {
    let fake = Fake::start(0).await;
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    // The login (the tokens it gets are due for a refresh at once), in a process that stops.
    login(&Rig::new(&db, &fake, false).await.manager).await;
    let issued = fake.with(|s| s.issued.clone());
    let (sealed, state, _) = stored(&db).await;
    let sealed = sealed.expect("credentials stored");
    assert_eq!(state, "connected");
    assert!(
        issued.iter().all(|t| !sealed.contains(t.as_str())),
        "tokens are stored sealed"
    );

    // A restart: the stored refresh token is used once, and the call goes out with the new token.
    let rig = Rig::new(&db, &fake, true).await;
    rig.manager
        .wait_connected("crm", Duration::from_secs(30))
        .await
        .expect("connects with a refreshed token");
    let out = rig.call().await.expect("the call works");
    assert_eq!(out.output["untrusted"], json!(true));
    let (grants, bearer, login_access) =
        fake.with(|s| (s.refresh_grants, s.last_bearer.clone(), s.issued[0].clone()));
    assert_eq!(grants, 1);
    assert_ne!(
        bearer.as_deref(),
        Some(login_access.as_str()),
        "the refreshed token is sent, not the expired one"
    );
    assert_eq!(stored(&db).await.2, 1);
    rig.manager.shutdown().await;

    // Another restart uses the refreshed token as stored: no second refresh.
    let rig = Rig::new(&db, &fake, true).await;
    rig.manager
        .wait_connected("crm", Duration::from_secs(30))
        .await
        .expect("connects");
    rig.call().await.expect("the call works");
    assert_eq!(fake.with(|s| s.refresh_grants), 1);
    rig.manager.shutdown().await;
}
both_backends!(
    oauth_tokens_are_refreshed_across_a_restart,
    refresh_across_a_restart
);

/// A server with a fresh database, not logged in at first (it says so), then logged in by an
/// owner, connected, and called once.
async fn connected(test_db: &TestDb) -> (Fake, Db, Rig) {
    let fake = Fake::start(3600).await;
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    let rig = Rig::new(&db, &fake, true).await;
    assert_eq!(
        rig.manager
            .live("crm")
            .expect("live")
            .needs_login
            .as_deref()
            .map(|r| r.contains("not logged in")),
        Some(true)
    );
    login(&rig.manager).await;
    rig.manager
        .wait_connected("crm", Duration::from_secs(30))
        .await
        .expect("connects after the login");
    rig.call().await.expect("the call works");
    (fake, db, rig)
}

/// A process whose token key cannot open the stored login (another key, or none) leaves the
/// login alone: its own calls fail and say why, and the process whose key opens it goes on.
async fn a_process_with_another_key_leaves_the_login_alone(test_db: TestDb) {
    let (fake, db, rig) = connected(&test_db).await;
    let other_key = "0".repeat(64);
    for (key, code) in [(Some(other_key.as_str()), "MCP_TOKEN_UNREADABLE"), (None, "MCP_TOKEN_KEY_MISSING")] {
        let key = key.map(str::to_string);
        let stranger = Rig::with_secrets(&db, &fake, true, SecretSource::from_fn(move |name| (name == mcp::config::TOKEN_KEY_VAR).then(|| key.clone()).flatten())).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let live = loop {
            let live = stranger.manager.live("crm").expect("live");
            if live.last_error.is_some() || live.needs_login.is_some() {
                break live;
            }
            assert!(std::time::Instant::now() < deadline, "the other process never tried the login");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(live.needs_login.is_none(), "{code}: not a lost login: {live:?}");
        assert!(live.last_error.as_deref().unwrap_or_default().contains(code), "{live:?}");
        let refused = stranger.call().await.expect_err("no token in that process");
        assert!(refused.message.contains(code), "{refused:?}");
        // Its trouble stays in that process: the health the working process recorded stands.
        let health: String = sqlx::query_scalar("SELECT health FROM mcp_servers WHERE id = 'crm'").fetch_one(&db.pool).await.expect("health");
        assert_eq!(health, "connected", "{code}");
        stranger.manager.shutdown().await;
        let (credentials, state, _) = stored(&db).await;
        assert_eq!((credentials.is_some(), state.as_str()), (true, "connected"), "{code}: the login is as it was stored");
        rig.call().await.expect("the process whose key opens it goes on");
    }
    rig.manager.shutdown().await;
}
both_backends!(oauth_another_key_leaves_the_login, a_process_with_another_key_leaves_the_login_alone);

/// A second login while the server is connected registers another client (dynamic client
/// registration): the live session's next refresh is made as that client, so the new login is
/// kept. (It used to be refreshed as the first client, refused, and the new login dropped.)
async fn a_login_while_connected_survives_its_first_refresh(test_db: TestDb) {
    let (fake, db, rig) = connected(&test_db).await;

    // Logged in again (an owner's "Connect again"); its tokens are due for a refresh at once.
    fake.with(|s| s.login_expires_in = 0);
    login(&rig.manager).await;
    rig.call().await.expect("the call works after the refresh");
    assert_eq!(fake.with(|s| (s.registrations, s.refresh_grants)), (2, 1), "a second client, refreshed once");
    assert_eq!(stored(&db).await.1, "connected", "the new login is kept");
    assert!(rig.manager.live("crm").expect("live").needs_login.is_none());
    rig.manager.shutdown().await;
}
both_backends!(
    oauth_relogin_while_connected,
    a_login_while_connected_survives_its_first_refresh
);

async fn expired_refresh_token(test_db: TestDb) {
    let (fake, db, rig) = connected(&test_db).await;

    // The access token is revoked and the refresh token expired.
    fake.with(|s| {
        s.revoked = true;
        s.reject_refresh = true;
    });
    let failure = rig.call().await.expect_err("the call fails");
    // A provider's own code leads the message of TOOL_PROVIDER_ERROR.
    assert!(
        failure.code == "TOOL_PROVIDER_ERROR" && failure.message.starts_with("MCP_NEEDS_LOGIN"),
        "{failure:?}"
    );
    let status = rig
        .manager
        .servers()
        .await
        .expect("servers")
        .into_iter()
        .find(|s| s.id == "crm")
        .expect("crm");
    assert!(status.needs_login.is_some(), "{status:?}");
    // Withheld: the next call does not reach the server.
    let calls = fake.with(|s| s.tool_calls);
    let withheld = rig.call().await.expect_err("withheld");
    assert!(
        withheld.code == "MCP_NEEDS_LOGIN" || withheld.message.starts_with("MCP_NEEDS_LOGIN"),
        "{withheld:?}"
    );
    assert_eq!(fake.with(|s| s.tool_calls), calls);
    assert!(
        rig.checkpoint.catalog().get("crm__whoami").is_none(),
        "not offered to the planner"
    );
    let (credentials, state, _) = stored(&db).await;
    assert_eq!((credentials, state.as_str()), (None, "needs_login"));
    // The owners are told, once.
    let mut conn = db.pool.acquire().await.expect("conn");
    let notices: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM owner_notifications WHERE reason_code = 'MCP_NEEDS_LOGIN'",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("notices");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].contains("gatehouse mcp login crm") && notices[0].contains("/mcp#server-crm"),
        "{}",
        notices[0]
    );
    drop(conn);

    // A new login brings the tools back.
    fake.with(|s| {
        s.revoked = false;
        s.reject_refresh = false;
    });
    login(&rig.manager).await;
    rig.manager
        .wait_connected("crm", Duration::from_secs(30))
        .await
        .expect("reconnects");
    rig.call().await.expect("the tools are back");
    rig.manager.shutdown().await;
}
both_backends!(
    an_expired_refresh_token_means_needs_login_with_tools_withheld,
    expired_refresh_token
);

/// A server whose token cannot be refreshed tells every owner once on WhatsApp, with the
/// console link and the words of `[mcp] needs_login_notice`, however many calls fail after.
async fn needs_login_is_told_on_whatsapp_once(test_db: TestDb) {
    let graph = crate::whatsapp::FakeGraph::start().await;
    let app = crate::whatsapp::app(test_db, Some(&graph), |_| {}).await;
    let db = app.state.db.clone();
    {
        let mut tx = db.begin_write().await.expect("tx");
        for (login, phone) in [("o1", "+16505550101"), ("o2", "+16505550102")] {
            sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('O', $1, 'x', 1, 0, 0)")
                .bind(login)
                .execute(&mut *tx)
                .await
                .expect("owner");
            sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ($1, (SELECT MAX(id) FROM owners), 0)")
                .bind(phone)
                .execute(&mut *tx)
                .await
                .expect("phone");
        }
        tx.commit().await.expect("commit");
    }
    let fake = Fake::start(3600).await;
    let rig = Rig::new(&db, &fake, true).await;
    let settings = server::config::McpSettings {
        needs_login_notice: "Log in to {server} again ({reason}): {link}".into(),
        ..Default::default()
    };
    rig.manager.set_owner_notices(mcp::OwnerNotices {
        queue: app.state.jobs.clone(),
        public_url: "https://console.example/".into(),
        settings,
    });
    login(&rig.manager).await;
    rig.manager
        .wait_connected("crm", Duration::from_secs(30))
        .await
        .expect("connects");
    rig.call().await.expect("the call works");
    fake.with(|s| {
        s.revoked = true;
        s.reject_refresh = true;
    });
    for _ in 0..3 {
        rig.call().await.expect_err("fails, then withheld");
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(app.gatehouse.worker().run(stopped));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'owner.notify' AND state = 'completed'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
        if done >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the notices were not delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
    let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'owner.notify'")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(jobs, 2, "one notice per owner number, once per change");
    let mut to: Vec<String> = graph
        .sends()
        .iter()
        .map(|b| b["to"].as_str().unwrap_or_default().to_string())
        .collect();
    to.sort();
    assert_eq!(to, vec!["16505550101".to_string(), "16505550102".into()]);
    let texts = graph.texts();
    assert!(
        texts.iter().all(|t| t.starts_with("Log in to crm again (")
            && t.ends_with(": https://console.example/mcp#server-crm")),
        "{texts:?}"
    );
    assert!(
        fake.with(|s| s.issued.clone())
            .iter()
            .all(|token| texts.iter().all(|t| !t.contains(token.as_str()))),
        "no token in a notice"
    );
    rig.manager.shutdown().await;
}
both_backends!(
    mcp_needs_login_notice_on_whatsapp,
    needs_login_is_told_on_whatsapp_once
);

/// A config folder for the binary: `db_url`, debug logs, the fake server.
fn config_dir(db_url: &str, fake: &Fake) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = format!(
        "[server]\npublic_url = \"http://127.0.0.1:3000\"\n[database]\nurl = \"{db_url}\"\n[log]\nfilter = \"debug\"\n"
    );
    std::fs::write(dir.path().join("gatehouse.toml"), toml).expect("config");
    std::fs::write(dir.path().join("mcp.toml"), servers_toml(fake)).expect("mcp.toml");
    dir
}

fn gatehouse(dir: &tempfile::TempDir) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(dir.path().join("gatehouse.toml"))
        .arg("--log-format")
        .arg("json")
        .env(mcp::config::TOKEN_KEY_VAR, KEY)
        .env_remove("RUST_LOG");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_reach_logs_the_database_or_results() {
    let fake = Fake::start(0).await;
    let data = tempfile::tempdir().expect("tempdir");
    let db_url = format!("sqlite://{}", data.path().join("gatehouse.db").display());
    let dir = config_dir(&db_url, &fake);

    // `gatehouse mcp login crm`: the address to open, then the address the browser landed on.
    // The debug log goes to a file: a full stderr pipe would block the child before it prints.
    let log_path = dir.path().join("login.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = gatehouse(&dir)
        .args(["mcp", "login", "crm"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut url = String::new();
    stdout.read_line(&mut url).expect("the address");
    let landed = follow(url.trim()).await;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{landed}\n").as_bytes())
        .expect("paste");
    let out = child.wait_with_output().expect("login");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("rest");
    let login_text = format!(
        "{url}{rest}{}",
        std::fs::read_to_string(&log_path).expect("login log")
    );
    assert!(out.status.success(), "{login_text}");

    // A call (the token is refreshed first), with debug logs.
    let call = gatehouse(&dir)
        .args(["tools", "call", "crm__whoami", "--as", "owner"])
        .output()
        .expect("call");
    let call_out = String::from_utf8_lossy(&call.stdout).to_string();
    let call_text = format!("{call_out}{}", String::from_utf8_lossy(&call.stderr));
    assert!(call.status.success(), "{call_text}");
    let result: Value = serde_json::from_str(&call_out).expect("the result as JSON");
    assert_eq!(result["output"]["untrusted"], json!(true));
    assert!(call_out.contains("you are the CRM owner (request headers: Authorization: Bearer [REDACTED])"), "the echoed token is blanked: {call_out}");

    let issued = fake.with(|s| s.issued.clone());
    assert!(
        issued.len() >= 4 && fake.with(|s| s.refresh_grants) == 1,
        "a login and a refresh happened: {issued:?}"
    );
    // Every text of every table (the sealed credentials too: sealed, no token shows).
    let db = Db::connect(&server::config::DatabaseSettings {
        url: db_url,
        ..Default::default()
    })
    .await
    .expect("db");
    let mut conn = db.pool.acquire().await.expect("conn");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&mut *conn)
            .await
            .expect("tables");
    let mut everything = String::new();
    for table in tables {
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info($1)")
            .bind(&table)
            .fetch_all(&mut *conn)
            .await
            .expect("columns");
        for column in columns {
            let texts: Vec<Option<String>> = sqlx::query_scalar(&format!("SELECT CASE WHEN typeof(\"{column}\") = 'blob' THEN hex(\"{column}\") ELSE CAST(\"{column}\" AS TEXT) END FROM \"{table}\"")).fetch_all(&mut *conn).await.expect("texts");
            for text in texts.into_iter().flatten() {
                everything.push_str(&text);
                everything.push('\n');
            }
        }
    }
    assert!(
        everything.contains("mcp_server_logged_in"),
        "the audit was read"
    );
    for token in &issued {
        assert!(
            !login_text.contains(token.as_str()),
            "a token in the login's output or logs"
        );
        assert!(
            !call_text.contains(token.as_str()),
            "a token in the call's result or logs"
        );
        assert!(
            !everything.contains(token.as_str()),
            "a token in the database (audit, traces, notices, ...)"
        );
        assert!(
            !everything.contains(&hex::encode_upper(token)),
            "a token in a blob of the database"
        );
    }
}

async fn two_processes_share_one_token(test_db: TestDb) {
    let fake = Fake::start(0).await;
    // Without the lease both processes would refresh inside this window, and the second would
    // spend a refresh token the first had already rotated.
    fake.with(|s| s.hold_first_refresh = Some(Duration::from_secs(3)));
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    login(&Rig::new(&db, &fake, false).await.manager).await;
    let dir = config_dir(&test_db.url, &fake);
    let children: Vec<_> = (0..2)
        .map(|_| {
            gatehouse(&dir)
                .args(["tools", "call", "crm__whoami", "--as", "owner"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("call");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        fake.with(|s| s.refresh_grants),
        1,
        "one refresh for both processes"
    );
    assert_eq!(fake.with(|s| s.tool_calls), 2);
    assert_eq!(stored(&db).await.1, "connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_postgres_share_one_token_and_refresh_it_once() {
    if let Some(db) = TestDb::postgres().await {
        crate::support::within_limit(
            "two_processes_on_postgres_share_one_token",
            two_processes_share_one_token(db),
        )
        .await;
    }
}
