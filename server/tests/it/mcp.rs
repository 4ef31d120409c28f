//! MCP servers as tool sources, against real servers installed at pinned versions by
//! scripts/test (mcp-test-servers/: npm server-everything and server-memory, PyPI
//! mcp-server-time) and our own misbehaving fixture (mcp-test-servers/fixture.mjs).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use server::{
    domain::Role,
    db::Db,
    tools::{
        ApprovedCall, CallContext, Catalog, Checkpoint, ToolCall,
        catalog::{Approval, ChatKind, Operation, Provider, Risk},
        checkpoint::{AuditWriter, SecretSource, ToolCode, ToolFailure, ToolSuccess},
        mcp::{self, AuditActor, McpManager},
    },
};
use sqlx::Row;

use crate::{both_backends, support::TestDb};

fn servers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp-test-servers").canonicalize().expect("mcp-test-servers installed (scripts/test)")
}

fn npm_server(package: &str) -> String {
    let path = servers_dir().join("node_modules/@modelcontextprotocol").join(package).join("dist/index.js");
    assert!(path.is_file(), "{} missing: run scripts/test (npm install in mcp-test-servers)", path.display());
    path.display().to_string()
}

pub(crate) fn fixture() -> String {
    servers_dir().join("fixture.mjs").display().to_string()
}

fn time_server() -> String {
    let path = servers_dir().join(".venv/bin/mcp-server-time");
    assert!(path.is_file(), "{} missing: run scripts/test (pip install in mcp-test-servers/.venv)", path.display());
    path.display().to_string()
}

fn no_secrets() -> SecretSource {
    SecretSource::empty()
}

pub(crate) struct Rig {
    pub(crate) checkpoint: Arc<Checkpoint>,
    pub(crate) manager: McpManager,
    pub(crate) db: Db,
    _test_db: TestDb,
}

impl Rig {
    pub(crate) async fn new(test_db: TestDb, servers: &str) -> Self {
        let db = test_db.connect().await;
        db.migrate().await.expect("migrate");
        Self::on(test_db, db, servers).await
    }

    async fn on(test_db: TestDb, db: Db, servers: &str) -> Self {
        Self::on_with(test_db, db, servers, no_secrets()).await
    }

    async fn on_with(test_db: TestDb, db: Db, servers: &str, secrets: SecretSource) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mcp.toml");
        std::fs::write(&path, servers).expect("write mcp.toml");
        let config = mcp::config::load(&path, &|_| true).expect("valid mcp.toml");
        let manager = McpManager::new(db.clone(), &config, secrets);
        let checkpoint = Checkpoint::new(db.clone(), Arc::new(Catalog::default()), AuditWriter::spawn(db.clone(), server::jobs::JobQueue::new(db.clone())), no_secrets());
        let checkpoint = manager.install(checkpoint, Arc::new(Catalog::default()));
        manager.start().await.expect("start");
        Self { checkpoint, manager, db, _test_db: test_db }
    }

    pub(crate) async fn connected(&self, server: &str) {
        self.manager.wait_connected(server, Duration::from_secs(30)).await.expect("server connects");
    }

    pub(crate) async fn call(&self, name: &str, args: Value) -> Result<ToolSuccess, ToolFailure> {
        self.call_as(Role::Owner, name, args).await
    }

    async fn call_as(&self, actor: Role, name: &str, args: Value) -> Result<ToolSuccess, ToolFailure> {
        self.call_with(actor, false, name, args).await
    }

    /// A call an owner approved (for tools whose policy asks).
    async fn call_approved(&self, name: &str, args: Value) -> Result<ToolSuccess, ToolFailure> {
        self.call_with(Role::Owner, true, name, args).await
    }

    async fn call_with(&self, actor: Role, approved: bool, name: &str, args: Value) -> Result<ToolSuccess, ToolFailure> {
        let approved = approved.then(|| {
            let version = self.checkpoint.catalog().get(name).map(|t| t.version.clone()).unwrap_or_default();
            ApprovedCall::bind(1, &version, &args)
        });
        let ctx = CallContext { actor, chat_type: ChatKind::Direct, chat_id: Some("chat-1".into()), sender_id: None, correlation_id: "mcp-test".into(), approved, trace_id: None };
        self.checkpoint.execute(ToolCall { name: name.into(), args }, &ctx).await
    }

    async fn approve(&self, tool: &str) {
        self.manager.approve(tool, mcp::Reviewed::Current, &AuditActor { owner_id: None, login: Some("test-owner".into()), ip: None }).await.expect("approve");
    }
}

fn code_of(r: Result<ToolSuccess, ToolFailure>) -> ToolFailure {
    r.expect_err("the call must fail")
}

pub(crate) fn text_of(out: &Value) -> String {
    out["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect::<Vec<_>>().join("\n")
}

/// Calls of the fixture server as it recorded them.
fn recorded(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter_map(|v| v["name"].as_str().map(str::to_string)).collect()
}

pub(crate) fn stdio(id: &str, extra: &str, command: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let args = args.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ");
    let env = env.iter().map(|(k, v)| format!("{k} = {v:?}")).collect::<Vec<_>>().join(", ");
    format!("[[server]]\nid = \"{id}\"\n{extra}\n[server.transport]\ntype = \"stdio\"\ncommand = {command:?}\nargs = [{args}]\nenv = {{ {env} }}\n\n")
}

pub(crate) const TRUSTED_OPEN: &str = "trust = \"trusted\"\ndefault_audience = \"public\"\ndefault_risk = \"low\"\napproval = \"never\"\ndestructive_needs_approval = false";

async fn everything_over_stdio(db: TestDb) {
    let rig = Rig::new(db, &stdio("everything", TRUSTED_OPEN, "node", &[&npm_server("server-everything"), "stdio"], &[])).await;
    rig.connected("everything").await;
    let catalog = rig.checkpoint.catalog();
    let echo = catalog.get("everything__echo").expect("a trusted server's first tools are approved and offered");
    assert_eq!(echo.spec.provider, Provider::Mcp);
    assert!(catalog.all().filter(|t| t.spec.provider == Provider::Mcp).count() >= 8, "the whole list was discovered");
    let sum = catalog.get("everything__get-sum").expect("get-sum");
    assert_eq!(sum.spec.operation, Operation::Read, "readOnlyHint maps to a read");

    let out = rig.call("everything__echo", json!({"message": "hello gatehouse"})).await.expect("echo").output;
    assert_eq!(out["untrusted"], true, "every result is marked untrusted");
    assert!(text_of(&out).contains("hello gatehouse"), "{out}");
    let sum = rig.call("everything__get-sum", json!({"a": 2, "b": 40})).await.expect("sum").output;
    assert!(text_of(&sum).contains("42"), "{sum}");
    let structured = rig.call("everything__get-structured-content", json!({"location": "Chicago"})).await.expect("structured").output;
    assert!(structured["structured"].is_object(), "structuredContent passed on and valid against its outputSchema: {structured}");
    let bad = code_of(rig.call("everything__get-sum", json!({"a": "two", "b": 40})).await);
    assert_eq!(bad.code, ToolCode::SchemaInvalid.as_str(), "the checkpoint checks the server's inputSchema");

    let servers = rig.manager.servers().await.expect("servers");
    assert_eq!(servers[0].health, "connected");
    assert!(servers[0].tool_count >= 8 && servers[0].last_seen_at.is_some(), "{servers:?}");
    rig.manager.shutdown().await;
    // One process stopping (a `gatehouse mcp refresh` from a shell, a worker redeployed) does
    // not mark the server down for the processes still connected to it.
    let health: String = sqlx::query_scalar("SELECT health FROM mcp_servers WHERE id = 'everything'").fetch_one(&rig.db.pool).await.expect("health");
    assert_eq!(health, "connected");
    // Read as `gatehouse mcp list` does (no session of its own): connected, as lately seen; then
    // unknown once no process has seen it for three pings (every process that was connected
    // stopped or died), where it used to say connected for ever.
    assert_eq!(rig.manager.servers().await.expect("servers")[0].health, "connected");
    sqlx::query("UPDATE mcp_servers SET last_seen_at = last_seen_at - 3600000 WHERE id = 'everything'").execute(&rig.db.pool).await.expect("age");
    assert_eq!(rig.manager.servers().await.expect("servers")[0].health, "unknown");
}
both_backends!(mcp_everything_stdio, everything_over_stdio);

/// A tool that echoes its server's environment (the reference server's `get-env`) returns the
/// secret the server was given as `[REDACTED]`: a successful result is data for the summarizer,
/// the person and the context store, and the server's own secrets never travel in it.
async fn a_server_echoing_its_secret_returns_it_redacted(test_db: TestDb) {
    const TOKEN: &str = "tok-9f8e7d6c5b4a-everything";
    let servers = format!(
        "[[server]]\nid = \"everything\"\n{TRUSTED_OPEN}\n[server.transport]\ntype = \"stdio\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nenv = {{ CRM_TOKEN = {{ secret = \"EVERYTHING_TOKEN\" }} }}\n",
        npm_server("server-everything")
    );
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    let secrets = SecretSource::from_fn(|name| (name == "EVERYTHING_TOKEN").then(|| TOKEN.to_string()));
    let rig = Rig::on_with(test_db, db, &servers, secrets).await;
    rig.connected("everything").await;
    let out = rig.call("everything__get-env", json!({})).await.expect("get-env").output;
    let text = text_of(&out);
    assert!(text.contains("CRM_TOKEN") && text.contains("[REDACTED]"), "the server had the variable: {text}");
    assert!(!out.to_string().contains(TOKEN), "{out}");
    rig.manager.shutdown().await;
}
both_backends!(mcp_result_secrets_redacted, a_server_echoing_its_secret_returns_it_redacted);

fn start_http_everything(port: u16) -> std::process::Child {
    let child = std::process::Command::new("node")
        .args([npm_server("server-everything").as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start server-everything over HTTP");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server-everything did not listen on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http_survives_a_server_restart() {
    // Restarted on the same port: one no other test can be handed meanwhile.
    let port = crate::support::quiet_port(0);
    let mut http = KillOnDrop(start_http_everything(port));
    let servers = format!("[[server]]\nid = \"web\"\n{TRUSTED_OPEN}\ncall_timeout = \"3s\"\ndiscovery = {{ timeout = \"5s\" }}\n[server.transport]\ntype = \"http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n");
    let rig = Rig::new(TestDb::sqlite(), &servers).await;
    rig.connected("web").await;
    let out = rig.call("web__echo", json!({"message": "over http"})).await.expect("echo over HTTP").output;
    assert!(text_of(&out).contains("over http"), "{out}");

    // A new server process knows nothing of our session: its 404 makes the client initialize
    // again (or the supervisor reconnects); either way calls work again without a restart of ours.
    drop(http);
    http = KillOnDrop(start_http_everything(port));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        match rig.call("web__echo", json!({"message": "after restart"})).await {
            Ok(ok) => {
                last = Some(ok.output);
                break;
            }
            Err(e) => {
                assert!(e.message.contains("MCP_SERVER_UNAVAILABLE") || e.code == ToolCode::Timeout.as_str() || e.code == ToolCode::CircuitOpen.as_str() || e.code == ToolCode::ProviderError.as_str(), "{e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let out = last.expect("calls work again after the HTTP server restarted");
    assert!(text_of(&out).contains("after restart"), "{out}");
    rig.manager.shutdown().await;
    drop(http);
}

async fn memory_server_starts_quarantined(db: TestDb) {
    let dir = tempfile::tempdir().expect("tempdir");
    let memory_file = dir.path().join("memory.jsonl");
    let servers = stdio("memory", "default_audience = \"public\"\ndefault_risk = \"low\"\napproval = \"never\"", "node", &[&npm_server("server-memory")], &[("MEMORY_FILE_PATH", &memory_file.display().to_string())]);
    let rig = Rig::new(db, &servers).await;
    rig.connected("memory").await;
    assert!(rig.checkpoint.catalog().get("memory__read_graph").is_none(), "an untrusted server's tools are not offered");
    let held = code_of(rig.call("memory__create_entities", json!({"entities": []})).await);
    assert_eq!(held.code, ToolCode::Quarantined.as_str(), "{held}");
    let tools = rig.manager.tools("memory").await.expect("tools");
    assert!(tools.len() >= 9 && tools.iter().all(|t| t.state == "pending" && !t.usable), "{tools:?}");

    rig.approve("memory__create_entities").await;
    rig.approve("memory__read_graph").await;
    let catalog = rig.checkpoint.catalog();
    let create = catalog.get("memory__create_entities").expect("approved and offered");
    assert_eq!(create.spec.operation, Operation::Write, "not read-only");
    assert_eq!(catalog.get("memory__read_graph").expect("read_graph").spec.operation, Operation::Read);
    let entities = json!({"entities": [{"name": "Gatehouse", "entityType": "project", "observations": ["speaks MCP"]}]});
    rig.call("memory__create_entities", entities).await.expect("create");
    let graph = rig.call("memory__read_graph", json!({})).await.expect("read").output;
    assert_eq!(graph["structured"]["entities"][0]["name"], "Gatehouse", "{graph}");
    assert_eq!(code_of(rig.call("memory__delete_entities", json!({"entityNames": ["Gatehouse"]})).await).code, ToolCode::Quarantined.as_str(), "still pending");

    let rows = sqlx::query("SELECT event, login, detail FROM owner_audit ORDER BY id").fetch_all(&rig.db.pool).await.expect("audit");
    assert_eq!(rows.len(), 2, "one owner audit row per decision");
    assert_eq!(rows[0].get::<String, _>(0), "mcp_tool_approved");
    assert_eq!(rows[0].get::<String, _>(1), "test-owner");
    assert!(rows[0].get::<String, _>(2).contains("create_entities"));
    rig.manager.shutdown().await;
}
both_backends!(mcp_memory_quarantine, memory_server_starts_quarantined);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_time_server() {
    let rig = Rig::new(TestDb::sqlite(), &stdio("time", TRUSTED_OPEN, &time_server(), &["--local-timezone", "UTC"], &[])).await;
    rig.connected("time").await;
    let out = rig.call("time__get_current_time", json!({"timezone": "Europe/London"})).await.expect("time").output;
    assert_eq!(out["structured"]["timezone"], "Europe/London", "{out}");
    let converted = rig.call("time__convert_time", json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})).await.expect("convert").output;
    assert!(converted.to_string().contains("21:00"), "{converted}");
    rig.manager.shutdown().await;
}

struct Fixture {
    _dir: tempfile::TempDir,
    record: PathBuf,
    state: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (record, state) = (dir.path().join("calls.jsonl"), dir.path().join("state"));
        std::fs::create_dir_all(&state).expect("state dir");
        Self { _dir: dir, record, state }
    }

    /// A fixture server; unless `extra` says otherwise its tools are low risk and need no
    /// approval, so tests reach the behaviour they are about.
    fn server(&self, id: &str, extra: &str, many: usize) -> String {
        let mut extra = extra.to_string();
        for (key, line) in [("approval", "approval = \"never\""), ("default_risk", "default_risk = \"low\"")] {
            if !extra.contains(key) {
                extra = format!("{extra}\n{line}");
            }
        }
        let extra = extra.as_str();
        let env = [("FIXTURE_RECORD", self.record.display().to_string()), ("FIXTURE_STATE", self.state.display().to_string()), ("FIXTURE_MANY", many.to_string())];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        stdio(id, extra, "node", &[&fixture()], &env)
    }
}

async fn denied_and_quarantined_tools_never_reach_the_server(db: TestDb) {
    let fx = Fixture::new();
    // The config's defaults: medium risk, approval "ask" (under approval mode "auto": ask).
    let rig = Rig::new(db, &fx.server("fx", "deny_tools = [\"fails\"]\ncall_timeout = \"2s\"\napproval = \"ask\"\ndefault_risk = \"medium\"", 0)).await;
    rig.connected("fx").await;

    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "x"})).await).code, ToolCode::Quarantined.as_str());
    assert_eq!(code_of(rig.call("fx__fails", json!({})).await).code, ToolCode::Unknown.as_str(), "a denied tool is not in the catalog at all");
    rig.manager.reject("fx__inject", mcp::Reviewed::Current, &AuditActor::default()).await.expect("reject");
    assert_eq!(code_of(rig.call("fx__inject", json!({})).await).code, ToolCode::Rejected.as_str());
    rig.approve("fx__echo").await;
    // Owner-only by default: a customer is refused by the checkpoint.
    assert_eq!(code_of(rig.call_as(Role::Customer, "fx__echo", json!({"text": "x"})).await).code, ToolCode::NotAllowedForActor.as_str());
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": 7})).await).code, ToolCode::SchemaInvalid.as_str());
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "x"})).await).code, ToolCode::NeedsApproval.as_str(), "medium risk under \"ask\"");
    assert_eq!(recorded(&fx.record), Vec::<String>::new(), "nothing denied, quarantined or waiting reached the server");

    let ok = rig.call_approved("fx__echo", json!({"text": "through"})).await.expect("approved echo").output;
    assert_eq!(ok["structured"]["echo"], "through");
    assert_eq!(recorded(&fx.record), vec!["echo"], "exactly the allowed call reached the server");

    rig.checkpoint.audit().flush().await;
    let reasons: Vec<String> = sqlx::query("SELECT reason_code FROM tool_audit ORDER BY id").fetch_all(&rig.db.pool).await.expect("audit").iter().map(|r| r.get(0)).collect();
    assert_eq!(reasons, vec![ToolCode::Quarantined.as_str(), ToolCode::Unknown.as_str(), ToolCode::Rejected.as_str(), ToolCode::NotAllowedForActor.as_str(), ToolCode::SchemaInvalid.as_str(), ToolCode::NeedsApproval.as_str(), "OK"]);
    rig.manager.shutdown().await;
}
both_backends!(mcp_never_reaches_server, denied_and_quarantined_tools_never_reach_the_server);

/// A connected server is pinged: each answer is when it was last seen, and one that stops
/// answering between calls (it freezes after answering one) is found by its ping and
/// restarted, with no call made meanwhile; before, it stayed "connected" until a call timed out.
async fn a_server_that_stops_answering_between_calls_is_restarted(db: TestDb) {
    let fx = Fixture::new();
    let (record, state) = (fx.record.display().to_string(), fx.state.display().to_string());
    let extra = "ping_interval = \"200ms\"\ncall_timeout = \"1s\"\napproval = \"never\"\ndefault_risk = \"low\"";
    let rig = Rig::new(db, &stdio("fx", extra, "node", &[&fixture()], &[("FIXTURE_RECORD", &record), ("FIXTURE_STATE", &state), ("FIXTURE_FREEZE", "1")])).await;
    rig.connected("fx").await;
    rig.approve("fx__freeze").await;
    rig.approve("fx__echo").await;
    let last_seen = || async { sqlx::query_scalar::<_, Option<i64>>("SELECT last_seen_at FROM mcp_servers WHERE id = 'fx'").fetch_one(&rig.db.pool).await.expect("seen").expect("seen at connect") };
    let at_connect = last_seen().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while last_seen().await == at_connect {
        assert!(Instant::now() < deadline, "no ping was answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let connections = rig.manager.live("fx").expect("live").connections;
    rig.call("fx__freeze", json!({})).await.expect("it answers, then stops answering");
    let deadline = Instant::now() + Duration::from_secs(20);
    while rig.manager.live("fx").expect("live").connections == connections || rig.manager.live("fx").expect("live").peer.is_none() {
        assert!(Instant::now() < deadline, "the frozen server was not found and restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rig.call("fx__echo", json!({"text": "back"})).await.is_ok(), "the restarted server answers");
    rig.manager.shutdown().await;
}
both_backends!(mcp_pinged, a_server_that_stops_answering_between_calls_is_restarted);

/// The fixture server, connected, with its two tools approved by an owner.
async fn approved_fixture(db: TestDb) -> (Fixture, Rig) {
    let fx = Fixture::new();
    let rig = Rig::new(db, &fx.server("fx", "", 0)).await;
    rig.connected("fx").await;
    rig.approve("fx__echo").await;
    rig.approve("fx__mutate").await;
    (fx, rig)
}

async fn a_changed_tool_list_quarantines_until_approved(db: TestDb) {
    let (fx, rig) = approved_fixture(db).await;
    let before = rig.checkpoint.catalog().get("fx__echo").expect("echo").version.clone();
    let reviewed = rig.manager.tools("fx").await.expect("tools").into_iter().find(|t| t.name == "echo").expect("echo").definition_hash;
    assert!(rig.call("fx__echo", json!({"text": "a"})).await.is_ok());

    // The server changes echo's description, adds a tool, and sends tools/list_changed.
    rig.call("fx__mutate", json!({})).await.expect("mutate ran");
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.checkpoint.catalog().get("fx__echo").is_some() {
        assert!(Instant::now() < deadline, "list_changed did not lead to a refresh that quarantined the changed tool");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "b"})).await).code, ToolCode::Quarantined.as_str());
    assert_eq!(code_of(rig.call("fx__added_later", json!({})).await).code, ToolCode::Quarantined.as_str(), "a new tool waits too");
    let tools = rig.manager.tools("fx").await.expect("tools");
    let echo = tools.iter().find(|t| t.name == "echo").expect("echo");
    assert_eq!(echo.state, "pending");
    assert_eq!(echo.previous_definition.as_ref().and_then(|d| d["description"].as_str()), Some("Echoes its text."), "the old definition is kept for the diff");
    assert!(echo.definition["description"].as_str().unwrap_or_default().contains("changed"));
    assert_eq!(recorded(&fx.record).iter().filter(|n| *n == "echo").count(), 1, "the quarantined echo never reached the server");

    // An owner who reviewed the old definition cannot approve the new one by accident: the
    // decision is bound to the hash they saw.
    let by = AuditActor { owner_id: None, login: Some("test-owner".into()), ip: None };
    let stale = rig.manager.approve("fx__echo", mcp::Reviewed::Definition(&reviewed), &by).await;
    assert!(matches!(stale, Err(mcp::McpError::DefinitionChanged(_))), "{stale:?}");
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "b"})).await).code, ToolCode::Quarantined.as_str(), "still waiting");
    assert_ne!(echo.definition_hash, reviewed);
    rig.manager.approve("fx__echo", mcp::Reviewed::Definition(&echo.definition_hash), &by).await.expect("the shown definition");
    let after = rig.call("fx__echo", json!({"text": "c"})).await.expect("approved again");
    assert_ne!(after.version, before, "the approved definition is the new one");
    rig.manager.shutdown().await;
}
both_backends!(mcp_list_changed, a_changed_tool_list_quarantines_until_approved);

/// A listing the database refuses to store (a full disk, say) still stops a changed tool: a
/// call runs only when the definition its server lists now is the one an owner approved.
async fn a_changed_tool_stops_even_when_its_listing_cannot_be_stored(db: TestDb) {
    let (fx, rig) = approved_fixture(db).await;
    assert!(rig.call("fx__echo", json!({"text": "a"})).await.is_ok());
    let refuse = match rig.db.backend {
        server::db::Backend::Sqlite => vec![
            "CREATE TRIGGER refuse_tool_updates BEFORE UPDATE ON mcp_tools BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
            "CREATE TRIGGER refuse_tool_inserts BEFORE INSERT ON mcp_tools BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        ],
        server::db::Backend::Postgres => vec![
            "CREATE FUNCTION refuse_tools() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_tools BEFORE INSERT OR UPDATE ON mcp_tools FOR EACH ROW EXECUTE FUNCTION refuse_tools()",
        ],
    };
    for statement in refuse {
        sqlx::query(statement).execute(&rig.db.pool).await.expect("refuse writes to mcp_tools");
    }
    rig.call("fx__mutate", json!({})).await.expect("mutate ran");
    let refused = rig.manager.refresh("fx", None).await;
    assert!(refused.is_err(), "the listing could not be stored: {refused:?}");
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "b"})).await).code, ToolCode::Quarantined.as_str(), "the changed echo does not run under the old approval");

    let allow = match rig.db.backend {
        server::db::Backend::Sqlite => vec!["DROP TRIGGER refuse_tool_updates", "DROP TRIGGER refuse_tool_inserts"],
        server::db::Backend::Postgres => vec!["DROP TRIGGER refuse_tools ON mcp_tools", "DROP FUNCTION refuse_tools()"],
    };
    for statement in allow {
        sqlx::query(statement).execute(&rig.db.pool).await.expect("allow writes again");
    }
    rig.manager.refresh("fx", None).await.expect("stored now");
    let echo = rig.manager.tools("fx").await.expect("tools").into_iter().find(|t| t.name == "echo").expect("echo");
    assert_eq!(echo.state, "pending", "the change waits for an owner");
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "c"})).await).code, ToolCode::Quarantined.as_str());
    assert_eq!(recorded(&fx.record).iter().filter(|n| *n == "echo").count(), 1, "the changed echo never reached the server");
    rig.manager.shutdown().await;
}
both_backends!(mcp_unstored_change, a_changed_tool_stops_even_when_its_listing_cannot_be_stored);

/// Another process of `rig`'s deployment, whose server (of fixture `fx`) changes echo's
/// definition, which that process stores and an owner approves there.
async fn changed_and_approved_elsewhere(rig: &Rig, fx: &Fixture) -> Rig {
    let other = Rig::on(TestDb::sqlite(), rig.db.clone(), &fx.server("fx", "", 0)).await;
    other.connected("fx").await;
    other.call("fx__mutate", json!({})).await.expect("mutate ran");
    let deadline = Instant::now() + Duration::from_secs(15);
    while other.manager.tools("fx").await.expect("tools").iter().find(|t| t.name == "echo").is_none_or(|t| t.state != "pending") {
        assert!(Instant::now() < deadline, "the other process did not store the change");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    other.approve("fx__echo").await;
    other
}

/// Another process stored a changed definition and an owner approved it: a process whose server
/// listed the old one when it last looked lists it again before the call, and makes the call
/// once its server lists the approved definition (before, the first call was refused).
async fn a_listing_older_than_the_approval_is_listed_again(db: TestDb) {
    let (fx, rig) = approved_fixture(db).await;
    assert!(rig.call("fx__echo", json!({"text": "a"})).await.is_ok());
    let other = changed_and_approved_elsewhere(&rig, &fx).await;

    let called = rig.call("fx__echo", json!({"text": "b"})).await.expect("listed again, then called");
    assert_eq!(called.output["structured"]["echo"], "b");
    assert_eq!(recorded(&fx.record).iter().filter(|n| *n == "echo").count(), 2, "both calls reached the server");
    other.manager.shutdown().await;
    rig.manager.shutdown().await;
}
both_backends!(mcp_listed_again, a_listing_older_than_the_approval_is_listed_again);

/// The same approval, but this process's server still lists the old definition when asked
/// again (another host's server was upgraded, not this one's): the call is refused and never
/// reaches it; the database's word alone never makes a call.
async fn a_server_still_listing_the_old_definition_is_refused(db: TestDb) {
    let (fx, rig) = approved_fixture(db).await;
    assert!(rig.call("fx__echo", json!({"text": "a"})).await.is_ok());
    let upgraded = Fixture::new();
    let other = changed_and_approved_elsewhere(&rig, &upgraded).await;

    let refused = code_of(rig.call("fx__echo", json!({"text": "b"})).await);
    assert_eq!(refused.code, ToolCode::Quarantined.as_str(), "{refused:?}");
    assert_eq!(recorded(&fx.record).iter().filter(|n| *n == "echo").count(), 1, "the refused call never reached this process's server");
    other.manager.shutdown().await;
    rig.manager.shutdown().await;
}
both_backends!(mcp_old_listing_refused, a_server_still_listing_the_old_definition_is_refused);

/// A decision made in another process (`gatehouse mcp reject` or `mcp disable` while `serve`
/// runs, or a second `serve`) holds at once: the call is refused from the database before it
/// reaches the server, and this process's catalog catches up.
async fn a_decision_made_elsewhere_holds_at_once(db: TestDb) {
    use server::db::mcp as store;
    let (fx, rig) = approved_fixture(db).await;
    assert!(rig.call("fx__echo", json!({"text": "a"})).await.is_ok());

    // Another process rejects echo: only the database knows.
    let mut conn = rig.db.pool.acquire().await.expect("conn");
    assert!(matches!(store::decide(&mut conn, "fx__echo", false, None, None).await.expect("reject"), store::Decided::Done(_)));
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "b"})).await).code, ToolCode::Rejected.as_str());
    assert_eq!(recorded(&fx.record).iter().filter(|n| *n == "echo").count(), 1, "the rejected call never reached the server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.checkpoint.catalog().get("fx__echo").is_some() {
        assert!(Instant::now() < deadline, "the catalog did not catch up with the rejection");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another process disables the server.
    store::set_enabled_override(&mut conn, "fx", Some(false)).await.expect("disable");
    drop(conn);
    let refused = code_of(rig.call("fx__mutate", json!({})).await);
    assert_eq!(refused.code, mcp::McpCode::ServerDisabled.as_str(), "{refused:?}");
    assert!(!recorded(&fx.record).iter().any(|n| n == "mutate"), "nothing reached the disabled server");

    // ... then enables it again and approves echo again: this process follows those too, as
    // `serve` and `worker` do (McpManager::follow_decisions): its server reconnects, and the
    // catalog offers echo again.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let following = tokio::spawn(rig.manager.clone().follow_decisions(Duration::from_millis(100), stopping));
    let mut conn = rig.db.pool.acquire().await.expect("conn");
    store::set_enabled_override(&mut conn, "fx", Some(true)).await.expect("enable");
    assert!(matches!(store::decide(&mut conn, "fx__echo", true, None, None).await.expect("approve"), store::Decided::Done(_)));
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.checkpoint.catalog().get("fx__echo").is_none() {
        assert!(Instant::now() < deadline, "the catalog did not follow the approval made elsewhere");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match rig.call("fx__mutate", json!({})).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "still refused after it was enabled elsewhere: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(true);
    let _ = following.await;
    rig.manager.shutdown().await;
}
both_backends!(mcp_decided_elsewhere, a_decision_made_elsewhere_holds_at_once);

/// `gatehouse worker` runs the jobs that call MCP tools (messages, tool calls, the repair
/// cycle's replays), so it keeps its own sessions with the MCP servers, as `serve` does: with
/// only a worker running, the server is connected and its tools discovered.
async fn a_worker_process_connects_the_mcp_servers(db: TestDb) {
    use crate::procs::{Gatehouse, wait_for};
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let gh = Gatehouse::new(dir.path(), &db, "", "", &[]);
    std::fs::write(dir.path().join("mcp.toml"), fx.server("fx", TRUSTED_OPEN, 0)).expect("mcp.toml");
    let log = dir.path().join("worker.log");
    let mut worker = gh.worker(&log);
    let pool = db.connect().await;
    wait_for("the worker to discover the MCP server's tools", Duration::from_secs(60), async || {
        if let Ok(Some(status)) = worker.try_wait() {
            panic!("the worker exited with {status}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        // Until the worker has migrated the database there is no table to read.
        let found: Option<Option<i64>> = sqlx::query_scalar("SELECT discovered_at FROM mcp_servers WHERE id = 'fx'").fetch_optional(&pool.pool).await.ok().flatten();
        found.flatten().is_some()
    })
    .await;
    let approved: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mcp_tools WHERE server_id = 'fx' AND state = 'approved'").fetch_one(&pool.pool).await.expect("tools");
    assert!(approved > 0, "a trusted server's first tools are approved");
    let _ = worker.kill().await;
}
both_backends!(mcp_in_worker, a_worker_process_connects_the_mcp_servers);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn misbehaving_servers_get_clear_errors_and_block_nobody() {
    let (fx, other) = (Fixture::new(), Fixture::new());
    let config = format!(
        "{}{}",
        fx.server("fx", "trust = \"trusted\"\ncall_timeout = \"1s\"\ndiscovery = { max_description_chars = 60 }", 0),
        other.server("other", "trust = \"trusted\"", 0)
    );
    let rig = Rig::new(TestDb::sqlite(), &config).await;
    rig.connected("fx").await;
    rig.connected("other").await;

    // A hung call times out, and meanwhile the other server answers at once.
    let started = Instant::now();
    let (hung, quick) = tokio::join!(rig.call("fx__hang", json!({})), async {
        let r = rig.call("other__echo", json!({"text": "quick"})).await;
        (r, started.elapsed())
    });
    assert_eq!(code_of(hung).code, ToolCode::Timeout.as_str());
    let (quick, took) = quick;
    quick.expect("the other server answers");
    assert!(took < Duration::from_millis(900), "a hung server blocked another: {took:?}");
    assert!(rig.call("fx__echo", json!({"text": "still alive"})).await.is_ok(), "the hung call did not break the session");

    // isError: the server's message, as a provider error. It is the tool's answer about the
    // request, so however often a chat asks, it closes the tool for nobody.
    for _ in 0..4 {
        let failed = code_of(rig.call("fx__fails", json!({})).await);
        assert_eq!(failed.code, ToolCode::ProviderError.as_str());
        assert!(failed.message.contains("MCP_TOOL_ERROR") && failed.message.contains("the upstream said no"), "{failed}");
        assert!(!failed.maybe_applied, "the tool said it did not do it");
    }

    // Structured content that breaks the declared outputSchema.
    assert_eq!(code_of(rig.call("fx__liar", json!({})).await).code, ToolCode::ResultInvalid.as_str());

    // Prompt injection: the description is cut and changes no policy; the result is data.
    let inject = rig.checkpoint.catalog().get("fx__inject").expect("inject");
    assert!(inject.spec.description.chars().count() <= 60, "{}", inject.spec.description);
    assert!(inject.spec.tags.contains(&"untrusted".to_string()));
    assert_eq!((inject.spec.audience, inject.spec.risk, inject.spec.approval), (server::tools::catalog::Audience::OwnerOnly, Risk::Low, Approval::Never), "the config's, whatever the text says");
    let out = rig.call("fx__inject", json!({})).await.expect("inject").output;
    assert_eq!(out["untrusted"], true);
    assert_eq!(out["source"], "mcp:fx");
    assert!(text_of(&out).contains("IGNORE ALL PREVIOUS INSTRUCTIONS"), "kept as data inside the untrusted wrapper");
    assert_eq!(code_of(rig.call_as(Role::Customer, "fx__inject", json!({})).await).code, ToolCode::NotAllowedForActor.as_str(), "policy unchanged");

    // A crash mid-call: a clear error, a restart, and the next call works.
    let connections = rig.manager.live("fx").expect("live").connections;
    let crashed = code_of(rig.call("fx__crash", json!({})).await);
    assert!(crashed.message.contains("MCP_SERVER_UNAVAILABLE") && crashed.message.contains("restarted"), "{crashed}");
    // The server had the request when it went away: what it did is not known, so a write would
    // not be made again on its own.
    assert!(crashed.maybe_applied, "a call cut off by the server's exit may have taken effect");
    let deadline = Instant::now() + Duration::from_secs(20);
    while rig.manager.live("fx").expect("live").connections == connections || rig.manager.live("fx").expect("live").peer.is_none() {
        assert!(Instant::now() < deadline, "the server was not restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back = rig.call("fx__crash", json!({})).await.expect("after the restart").output;
    assert!(text_of(&back).contains("back after a restart"));
    let status = rig.manager.servers().await.expect("servers");
    assert!(status.iter().all(|s| s.health == "connected"), "{status:?}");
    rig.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tools_are_bounded() {
    let fx = Fixture::new();
    let config = format!(
        "{}{}",
        fx.server("capped", "trust = \"trusted\"\nmax_tools = 50", 1_000),
        fx.server("paged", "trust = \"trusted\"\nmax_tools = 1000\ndiscovery = { max_pages = 4 }", 1_000)
    );
    let rig = Rig::new(TestDb::sqlite(), &config).await;
    rig.connected("capped").await;
    rig.connected("paged").await;
    let capped = rig.manager.live("capped").expect("live").last_discovery.expect("report");
    assert_eq!(capped.taken, 50);
    assert!(capped.truncated && capped.pages == 1, "stops reading once max_tools are taken: {capped:?}");
    let paged = rig.manager.live("paged").expect("live").last_discovery.expect("report");
    assert_eq!((paged.pages, paged.listed, paged.taken), (4, 400, 400), "{paged:?}");
    assert!(paged.truncated);
    let catalog = rig.checkpoint.catalog();
    assert_eq!(catalog.all().filter(|t| t.spec.name.starts_with("capped__")).count(), 50);
    assert_eq!(catalog.all().filter(|t| t.spec.name.starts_with("paged__")).count(), 400);
    assert!(rig.call("paged__bulk_0123", json!({"n": 1})).await.is_ok());
    rig.manager.shutdown().await;
}

/// A thousand tools of one MCP server never reach the planner whole: a planning request
/// carries the detector's candidates, the respond tool and the search tool, nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_mcp_tools_never_reach_the_planner_whole() {
    use server::lane::{
        PrivateData,
        adapter::{self, OfferTo},
        detector::Index,
        planner::{PlanInput, Planner},
    };
    let fx = Fixture::new();
    let rig = Rig::new(TestDb::sqlite(), &fx.server("big", "trust = \"trusted\"\nmax_tools = 1000\ndiscovery = { max_pages = 10 }", 1_000)).await;
    rig.connected("big").await;
    let catalog = rig.checkpoint.catalog();
    assert_eq!(catalog.all().filter(|t| t.spec.name.starts_with("big__")).count(), 1000, "max_tools of the server's tools (most of them bulk_NNNN)");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/gatehouse.toml");
    let settings = server::config::load(&path).expect("shipped config").settings;
    let lane = &settings.lane;
    let index = Index::build(server::lane::tool_docs(&catalog), lane.detector.clone());
    let detection = index.detect("Please run bulk tool 0123 with n set to 1", Role::Owner, ChatKind::Direct, &[]);
    let names: Vec<String> = detection.candidates.iter().map(|c| c.name.clone()).collect();
    assert!(!names.is_empty() && names.len() <= lane.detector.max_candidates, "{names:?}");
    let secrets = server::config::Secrets::from_lookup(|n| (n == "ANTHROPIC_API_KEY").then(|| "unused".to_string()));
    let model = server::llm::from_settings(&settings, &secrets).expect("model");
    let planner = Planner::new(model, Arc::new(settings.clone()));
    let input = PlanInput {
        correlation_id: "corr-big".into(),
        message: "Please run bulk tool 0123 with n set to 1".into(),
        actor: Role::Owner,
        chat_kind: ChatKind::Direct,
        memory_summary: None,
        private_data: PrivateData::Unguarded,
        tools: adapter::tool_specs(&adapter::resolve(&catalog, &names), OfferTo { actor: Role::Owner, chat: ChatKind::Direct, strict_supported: false }, lane),
        recent: vec![],
        followup: None,
        clarification: None,
        max_steps: lane.max_steps as usize,
        searches_left: lane.max_search_calls as usize,
        transcript: vec![],
    };
    let request = planner.request(&input);
    assert!(request.tools.len() <= lane.detector.max_candidates + 2, "{} tools in one planning request", request.tools.len());
    assert!(request.tools.iter().any(|t| t.name == lane.search_tool), "the planner can still look up the rest");
    rig.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_with_the_last_known_tools_when_a_server_is_down() {
    let fx = Fixture::new();
    let test_db = TestDb::sqlite();
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    {
        let rig = Rig::on(TestDb::sqlite(), db.clone(), &fx.server("fx", "trust = \"trusted\"", 0)).await;
        rig.connected("fx").await;
        rig.manager.shutdown().await;
    }
    // Same id, but the program is gone: the cached tools are offered, calls say why they fail.
    let down = "[[server]]\nid = \"fx\"\ntrust = \"trusted\"\napproval = \"never\"\ndefault_risk = \"low\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"/nonexistent/mcp-server\"\n";
    let rig = Rig::on(test_db, db, down).await;
    assert!(rig.checkpoint.catalog().get("fx__echo").is_some(), "the last known tools are in the catalog");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.manager.live("fx").expect("live").last_error.is_none() {
        assert!(Instant::now() < deadline, "no error recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed = code_of(rig.call("fx__echo", json!({"text": "x"})).await);
    assert!(failed.message.contains("MCP_SERVER_UNAVAILABLE") && failed.message.contains("cannot start"), "{failed}");
    let status = rig.manager.servers().await.expect("servers");
    assert_eq!(status[0].health, "down");
    assert!(status[0].last_error.as_deref().unwrap_or_default().contains("/nonexistent/mcp-server"), "{status:?}");
    rig.manager.set_enabled("fx", false, &AuditActor::default()).await.expect("disable");
    assert_eq!(code_of(rig.call("fx__echo", json!({"text": "x"})).await).code, ToolCode::Disabled.as_str(), "a disabled server's tools are withheld");
    rig.manager.shutdown().await;
}

/// The `gatehouse` binary: check-config includes mcp.toml; `mcp refresh`, `mcp list`,
/// `mcp tools`, `mcp approve` and `tools call` work for an MCP server.
#[test]
fn the_command_line_lists_approves_and_calls_mcp_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml")).expect("shipped config");
    let db = dir.path().join("data/gatehouse.db");
    let config = dir.path().join("gatehouse.toml");
    std::fs::write(&config, shipped.replace("url = \"sqlite://data/gatehouse.db\"", &format!("url = \"sqlite://{}\"", db.display()))).expect("config");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gatehouse")).arg("--config").arg(&config).args(args).output().expect("run gatehouse");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    std::fs::write(dir.path().join("mcp.toml"), "[[server]]\nid = \"Time\"\nbogus = 1\n[server.transport]\ntype = \"http\"\nurl = \"nope\"\n").expect("bad mcp.toml");
    let (code, _, stderr) = run(&["check-config"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("server[0] (Time)") && stderr.contains("bogus") && stderr.contains("mcp.toml"), "{stderr}");

    let servers = stdio("time", "approval = \"never\"\ndefault_risk = \"low\"", &time_server(), &["--local-timezone", "UTC"], &[]);
    std::fs::write(dir.path().join("mcp.toml"), servers).expect("mcp.toml");
    let (code, stdout, stderr) = run(&["check-config"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("mcp servers: 1") && stdout.contains("time (stdio, Untrusted, enabled)"), "{stdout}");

    let (code, stdout, stderr) = run(&["mcp", "refresh", "time"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\"taken\": 2"), "{stdout}");
    let (_, stdout, _) = run(&["mcp", "list"]);
    assert!(stdout.starts_with("time\tstdio\tUntrusted\tenabled\t"), "{stdout}");
    assert!(stdout.contains("tools=2\tpending=2"), "{stdout}");
    let (_, stdout, _) = run(&["mcp", "tools", "time"]);
    assert!(stdout.contains("time__get_current_time\tpending\tnot offered"), "{stdout}");
    // The hash `mcp tools` shows is the one `--hash` takes, binding the approval to it.
    let shown = stdout.lines().find(|l| l.starts_with("time__get_current_time\t")).and_then(|l| l.split('\t').nth(3)).expect("a hash").to_string();

    let call = ["tools", "call", "time__get_current_time", "--args", r#"{"timezone":"Asia/Tokyo"}"#];
    let (code, stdout, _) = run(&call);
    assert_eq!(code, 1);
    assert!(stdout.contains("TOOL_QUARANTINED"), "{stdout}");
    let (code, stdout, stderr) = run(&["mcp", "approve", "time__get_current_time", "--hash", &shown]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("approved"), "{stdout}");
    let (code, stdout, stderr) = run(&call);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let out: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(out["output"]["structured"]["timezone"], "Asia/Tokyo", "{out}");
    assert_eq!(out["output"]["untrusted"], true);
    let (code, _, stderr) = run(&["mcp", "tools", "nope"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("MCP_UNKNOWN_SERVER"), "{stderr}");
}

fn found(name: &str, version: &str) -> server::db::mcp::Found {
    found_on("srv", name, version)
}

fn found_on(server: &str, name: &str, version: &str) -> server::db::mcp::Found {
    let definition = json!({ "name": name, "description": version, "inputSchema": { "type": "object" } });
    server::db::mcp::Found {
        name: name.into(),
        catalog_name: format!("{server}__{name}"),
        definition_hash: mcp::normalize::definition_hash(&definition),
        definition: definition.to_string(),
    }
}

/// The quarantine rules of the discovery cache, on both backends.
async fn quarantine_rules_in_the_cache(test_db: TestDb) {
    use server::db::mcp::{self as store, ToolState};
    let db = test_db.connect().await;
    db.migrate().await.expect("migrate");
    let mut conn = db.pool.acquire().await.expect("conn");
    store::ensure_server(&mut conn, "srv").await.expect("server");
    let by_name = |rows: &[store::ToolRow], name: &str| rows.iter().find(|t| t.name == name).cloned().expect("row");

    // A trusted server's first discovery is approved; what comes later waits.
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("b", "v1")]).await.expect("first");
    let rows = store::tools(&mut conn, Some("srv")).await.expect("rows");
    assert!(rows.iter().all(store::ToolRow::usable), "{rows:?}");
    let changes = store::apply_discovery(&mut conn, "srv", true, &[found("a", "v2"), found("b", "v1"), found("c", "v1")]).await.expect("second");
    assert_eq!((changes.added, changes.changed), (vec!["c".to_string()], vec!["a".to_string()]));
    let rows = store::tools(&mut conn, Some("srv")).await.expect("rows");
    let a = by_name(&rows, "a");
    assert_eq!(a.state, ToolState::Pending);
    assert!(!a.usable() && a.previous_definition.as_deref().is_some_and(|d| d.contains("v1")), "{a:?}");
    assert!(!by_name(&rows, "c").usable(), "a new tool on a known server waits, trusted or not");
    assert!(by_name(&rows, "b").usable(), "an unchanged tool stays approved");

    // Back to the approved definition: approved again. Gone from the list: not present.
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("c", "v1")]).await.expect("third");
    let rows = store::tools(&mut conn, Some("srv")).await.expect("rows");
    assert!(by_name(&rows, "a").usable(), "the approved hash is approved");
    assert!(!by_name(&rows, "b").present && !by_name(&rows, "b").usable());

    // A rejection holds while the definition stays; a changed definition waits for a new
    // decision. An approval records the hash approved.
    assert!(matches!(store::decide(&mut conn, "srv__c", false, None, None).await.expect("reject"), store::Decided::Done(_)));
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("c", "v1")]).await.expect("fourth");
    assert_eq!(by_name(&store::tools(&mut conn, Some("srv")).await.expect("rows"), "c").state, ToolState::Rejected);
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("c", "v2")]).await.expect("fifth");
    assert_eq!(by_name(&store::tools(&mut conn, Some("srv")).await.expect("rows"), "c").state, ToolState::Pending);
    let store::Decided::Done(c) = store::decide(&mut conn, "srv__c", true, Some(7), None).await.expect("approve") else { panic!("decided") };
    assert!(c.usable() && c.decided_by == Some(7));
    assert_eq!(store::decide(&mut conn, "srv__missing", true, None, None).await.expect("decide"), store::Decided::Missing);

    // A tool approved and then rejected is not approved again when the server changes it and
    // changes it back: the rejection forgot the approved definition.
    store::decide(&mut conn, "srv__c", false, None, None).await.expect("reject");
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("c", "v3")]).await.expect("sixth");
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v1"), found("c", "v2")]).await.expect("seventh");
    let c = by_name(&store::tools(&mut conn, Some("srv")).await.expect("rows"), "c");
    assert!(c.state == ToolState::Pending && !c.usable(), "back to the once-approved definition, still waiting: {c:?}");

    // A change made in two steps while the tool waits is shown against the definition last
    // approved, not against the step between.
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v2"), found("c", "v2")]).await.expect("eighth");
    store::apply_discovery(&mut conn, "srv", true, &[found("a", "v3"), found("c", "v2")]).await.expect("ninth");
    let a = by_name(&store::tools(&mut conn, Some("srv")).await.expect("rows"), "a");
    assert!(a.definition.contains("v3") && a.previous_definition.as_deref().is_some_and(|d| d.contains("v1")), "{a:?}");

    // A listing with a tool whose catalog name another (stored, now unlisted) tool holds is
    // still stored: the clash is left out, and a changed definition beside it still waits.
    let mut clash = found("z", "v1");
    clash.catalog_name = "srv__a".into();
    let changes = store::apply_discovery(&mut conn, "srv", true, &[found("a", "v4"), found("c", "v2"), clash]).await.expect("a clash does not fail the listing");
    assert_eq!((changes.added, changes.changed), (Vec::<String>::new(), vec!["a".to_string()]));
    let rows = store::tools(&mut conn, Some("srv")).await.expect("rows");
    assert!(rows.iter().all(|t| t.name != "z"), "{rows:?}");
    assert_eq!(by_name(&rows, "a").state, ToolState::Pending);

    // An untrusted server's first discovery waits.
    store::ensure_server(&mut conn, "other").await.expect("server");
    store::apply_discovery(&mut conn, "other", false, &[found_on("other", "x", "v1")]).await.expect("untrusted");
    assert_eq!(store::tools(&mut conn, Some("other")).await.expect("rows")[0].state, ToolState::Pending);
}
both_backends!(mcp_quarantine_rules, quarantine_rules_in_the_cache);

/// Two processes discovering one server at once, as when both start: the second's transaction
/// waits for the first's and finds its tools known, instead of inserting them again and failing
/// on the primary key (which left that process without the server's tools).
async fn concurrent_discoveries_store_a_server_once(test_db: TestDb) {
    use server::db::mcp as store;
    let first = test_db.connect().await;
    first.migrate().await.expect("migrate");
    let second = test_db.connect().await;
    let mut conn = first.pool.acquire().await.expect("conn");
    store::ensure_server(&mut conn, "srv").await.expect("server");
    drop(conn);
    let tools = [found("a", "v1"), found("b", "v1")];

    let mut tx = first.begin_write().await.expect("begin");
    let changes = store::apply_discovery(&mut tx, "srv", true, &tools).await.expect("first discovery");
    assert_eq!(changes.added, ["a", "b"]);
    let again = tools.clone();
    let later = tokio::spawn(async move {
        let mut tx = second.begin_write().await?;
        let changes = store::apply_discovery(&mut tx, "srv", true, &again).await?;
        tx.commit().await?;
        Ok::<_, server::db::DbError>(changes)
    });
    // Long enough for the second to read the tools it would find missing.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    tx.commit().await.expect("commit");
    let changes = later.await.expect("task").expect("the second discovery is stored too");
    assert_eq!(changes, store::Changes::default(), "the second finds the first's tools");
    let mut conn = first.pool.acquire().await.expect("conn");
    let rows = store::tools(&mut conn, Some("srv")).await.expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(store::ToolRow::usable), "a trusted server's first discovery is approved: {rows:?}");
}
both_backends!(mcp_concurrent_discoveries, concurrent_discoveries_store_a_server_once);
