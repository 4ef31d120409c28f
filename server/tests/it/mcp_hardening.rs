//! A hostile or careless MCP server: secrets in its stderr stay out of our logs, a server that
//! cannot be listed is logged as `AgentToolMcpDiscoveryFailed`, and a flood of
//! `tools/list_changed` costs a bounded number of rediscoveries.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde_json::json;
use server::domain::{ChatKind, Role};
use server::tools::{
    CallContext, Catalog, Checkpoint, ToolCall,
    checkpoint::{AuditWriter, SecretSource},
    mcp::{self, McpManager},
};

use crate::{
    both_backends,
    support::{Captured, TestDb},
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp-test-servers/fixture.mjs").canonicalize().expect("mcp-test-servers installed (scripts/test)")
}

const STDERR_SECRET: &str = "env-secret-Q7v9-never-logged";

fn secrets() -> SecretSource {
    SecretSource::from_fn(|var: &str| (var == "TEST_MCP_STDERR_SECRET").then(|| STDERR_SECRET.to_string()))
}

async fn manager(db: &TestDb, toml: &str) -> (McpManager, Arc<Checkpoint>) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp.toml");
    std::fs::write(&path, toml).expect("write mcp.toml");
    let config = mcp::config::load(&path, &|_| true).expect("valid mcp.toml");
    let manager = McpManager::new(pool.clone(), &config, secrets());
    let checkpoint = Checkpoint::new(pool.clone(), Arc::new(Catalog::default()), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets());
    let checkpoint = manager.install(checkpoint, Arc::new(Catalog::default()));
    manager.start().await.expect("start");
    (manager, checkpoint)
}

/// A server that prints its configuration and a request's headers to stderr when it starts:
/// the secret it was given and anything token-like are scrubbed before the line is logged.
#[tokio::test(flavor = "current_thread")]
async fn stderr_of_a_stdio_server_is_scrubbed() {
    let (captured, _guard) = Captured::start();
    let leaks = [
        "echo \"config: FIXTURE_KEY=$FIXTURE_KEY\" >&2",
        "echo \"the key again: $FIXTURE_KEY.\" >&2",
        "echo 'request headers: Authorization: Bearer abcDEF0123456789ghiJKL' >&2",
        "echo 'loaded token ghp_0123456789abcdefghijABCDEFGHIJklmn' >&2",
        "echo 'db url postgres://app:password=hunter2hunter2@db/x' >&2",
        "echo 'ready on stdio' >&2",
    ]
    .join("; ");
    let script = format!("{leaks}; exec node {}", fixture().display());
    let toml = format!(
        "[[server]]\nid = \"leaky\"\ntrust = \"trusted\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nenv = {{ FIXTURE_KEY = {{ secret = \"TEST_MCP_STDERR_SECRET\" }} }}\n"
    );
    let db = TestDb::sqlite();
    let (manager, _checkpoint) = manager(&db, &toml).await;
    manager.wait_connected("leaky", Duration::from_secs(30)).await.expect("server connects");
    // Every line the server printed before it answered has been read by now or shortly after.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while captured.text().matches("mcp server stderr").count() < 6 {
        assert!(tokio::time::Instant::now() < deadline, "stderr lines were not logged:\n{}", captured.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    manager.shutdown().await;
    let logs = captured.text();
    for leaked in [STDERR_SECRET, "abcDEF0123456789ghiJKL", "ghp_0123456789", "hunter2hunter2"] {
        assert!(!logs.contains(leaked), "{leaked} reached the log:\n{logs}");
    }
    assert!(logs.contains("ready on stdio") && logs.contains("[REDACTED]"), "ordinary lines stay readable:\n{logs}");
}

/// A server that exits before it answers is logged with the seed's `AgentToolMcpDiscoveryFailed`
/// event, naming the server and (scrubbed) why, and its health is down.
#[tokio::test(flavor = "current_thread")]
async fn a_server_that_cannot_be_listed_is_logged_as_a_failed_discovery() {
    let (captured, _guard) = Captured::start();
    let script = "echo \"key $FIXTURE_KEY\" >&2; exit 3";
    let toml = format!(
        "[[server]]\nid = \"broken\"\ntrust = \"trusted\"\n[server.transport]\ntype = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nenv = {{ FIXTURE_KEY = {{ secret = \"TEST_MCP_STDERR_SECRET\" }} }}\n"
    );
    let db = TestDb::sqlite();
    let (manager, _checkpoint) = manager(&db, &toml).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let line = loop {
        if let Some(line) = captured.text().lines().find(|l| l.contains("AgentToolMcpDiscoveryFailed")).map(str::to_string) {
            break line;
        }
        assert!(tokio::time::Instant::now() < deadline, "no failed discovery was logged:\n{}", captured.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    manager.shutdown().await;
    assert!(line.contains("WARN") && line.contains("mcp.server=broken") && line.contains("health=\"down\""), "{line}");
    assert!(!captured.text().contains(STDERR_SECRET), "the secret stays out of the log:\n{}", captured.text());
}

/// A server that sends `tools/list_changed` in a burst gets a bounded number of rediscoveries,
/// not one per notification.
async fn a_list_changed_flood_is_debounced(db: TestDb) {
    let dir = tempfile::tempdir().expect("tempdir");
    let lists = dir.path().join("lists.txt");
    let toml = format!(
        "[[server]]\nid = \"noisy\"\ntrust = \"trusted\"\ndefault_audience = \"public\"\ndefault_risk = \"low\"\napproval = \"never\"\n\
         [server.transport]\ntype = \"stdio\"\ncommand = \"node\"\nargs = [{:?}]\nenv = {{ FIXTURE_FLOOD = \"1\", FIXTURE_LISTS = {:?}, FIXTURE_STATE = {:?} }}\n",
        fixture().display().to_string(),
        lists.display().to_string(),
        dir.path().display().to_string(),
    );
    let (manager, checkpoint) = manager(&db, &toml).await;
    manager.wait_connected("noisy", Duration::from_secs(30)).await.expect("server connects");
    let count = || std::fs::read_to_string(&lists).unwrap_or_default().lines().count();
    let before = count();
    let ctx = CallContext { actor: Role::Owner, chat_type: ChatKind::Direct, chat_id: None, sender_id: None, correlation_id: "flood".into(), approved: None, trace_id: None };
    checkpoint.execute(ToolCall { name: "noisy__flood".into(), args: json!({ "count": 500 }) }, &ctx).await.expect("flood ran");
    // An owner's refresh queues behind whatever the flood asked for, and is answered after it.
    manager.refresh("noisy", None).await.expect("refresh");
    let after = count();
    assert!(after - before <= 3, "500 notifications caused {} tool listings", after - before);
    manager.refresh("noisy", None).await.expect("refresh");
    assert!(count() - before <= 4, "{} tool listings", count() - before);
    manager.shutdown().await;
}
both_backends!(mcp_list_changed_flood, a_list_changed_flood_is_debounced);
