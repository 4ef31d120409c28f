//! `gatehouse bench mcp`: discovery time and per-call overhead of MCP tools, against
//! server-everything over stdio and over Streamable HTTP. The overhead is the round trip through
//! the checkpoint minus the raw MCP round trip of the same call on the same session (which is
//! the server's own time plus the transport), so it is what Gatehouse adds.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use serde_json::json;

use server::{
    config::{DatabaseSettings, SecretSource},
    db::Db,
    domain::{ChatKind, Role},
    tools::{
        CallContext, Catalog, Checkpoint, ToolCall,
        checkpoint::AuditWriter,
        mcp::{McpManager, config, session},
    },
};

#[derive(Debug, clap::Args)]
pub struct McpBench {
    /// server-everything's entry point (installed by scripts/test).
    #[arg(long, default_value = "mcp-test-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js")]
    pub everything: PathBuf,
    /// Calls per transport.
    #[arg(long, default_value_t = 300)]
    pub calls: usize,
    /// Fresh connect + initialize + tools/list runs per transport.
    #[arg(long, default_value_t = 5)]
    pub discoveries: usize,
    /// Port for the HTTP run.
    #[arg(long, default_value_t = 3901)]
    pub port: u16,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

struct StopOnDrop(std::process::Child);
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn run(args: &McpBench) -> anyhow::Result<()> {
    let entry = args.everything.canonicalize().with_context(|| format!("{} not found: run scripts/test to install the MCP test servers", args.everything.display()))?;
    let entry = entry.display().to_string();
    let stdio = format!("[[server]]\nid = \"everything\"\ntrust = \"trusted\"\ndefault_audience = \"public\"\ndefault_risk = \"low\"\napproval = \"never\"\ndestructive_needs_approval = false\n[server.transport]\ntype = \"stdio\"\ncommand = \"node\"\nargs = [{entry:?}, \"stdio\"]\n");
    measure("stdio", &stdio, args).await?;

    let http = std::process::Command::new("node")
        .args([entry.as_str(), "streamableHttp"])
        .env("PORT", args.port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting server-everything over HTTP")?;
    let _http = StopOnDrop(http);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", args.port)).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "server-everything did not listen on port {}", args.port);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let http = stdio.replace(&format!("type = \"stdio\"\ncommand = \"node\"\nargs = [{entry:?}, \"stdio\"]\n"), &format!("type = \"http\"\nurl = \"http://127.0.0.1:{}/mcp\"\n", args.port));
    measure("http", &http, args).await
}

async fn measure(label: &str, servers: &str, args: &McpBench) -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let path = dir.join("mcp.toml");
    std::fs::write(&path, servers)?;
    let cfg = config::load(&path, &|_| true).map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let server = cfg.servers.first().context("one server")?.clone();
    let secrets = SecretSource::empty();

    let mut discovery = Vec::new();
    for _ in 0..args.discoveries {
        let (refresh, _rx) = tokio::sync::mpsc::unbounded_channel();
        let t0 = Instant::now();
        let s = session::connect(&server, &secrets, session::Handler::new(refresh), None).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let (found, _) = session::discover(&server, s.peer()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        discovery.push(t0.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(!found.is_empty(), "no tools discovered");
        let _ = s.cancel().await;
    }
    discovery.sort_by(f64::total_cmp);

    let db = Db::connect(&DatabaseSettings { url: format!("sqlite://{}", dir.join("bench.db").display()), ..Default::default() }).await?;
    db.migrate().await?;
    let manager = McpManager::new(db.clone(), &cfg, secrets.clone());
    let checkpoint = manager.install(Checkpoint::new(db.clone(), Arc::new(Catalog::default()), AuditWriter::spawn(db.clone(), server::jobs::JobQueue::new(db.clone())), secrets), Arc::new(Catalog::default()));
    manager.start().await?;
    manager.wait_connected(&server.id, Duration::from_secs(30)).await?;
    let peer = manager.live(&server.id)?.peer.context("connected")?;
    let ctx = CallContext { actor: Role::Owner, chat_type: ChatKind::Direct, chat_id: Some("bench".into()), sender_id: None, correlation_id: "bench".into(), approved: None, trace_id: None };
    let tool = format!("{}__echo", server.id);
    let (mut raw, mut gated) = (Vec::with_capacity(args.calls), Vec::with_capacity(args.calls));
    for i in 0..args.calls {
        // Interleaved, so both see the same server and machine conditions.
        let message = format!("bench {i}");
        let t0 = Instant::now();
        let params = rmcp::model::CallToolRequestParams::new("echo").with_arguments(json!({ "message": message }).as_object().cloned().unwrap_or_default());
        peer.call_tool(params).await?;
        raw.push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = Instant::now();
        checkpoint.execute(ToolCall { name: tool.clone(), args: json!({ "message": message }) }, &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        gated.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    checkpoint.audit().flush().await;
    manager.shutdown().await;
    db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    raw.sort_by(f64::total_cmp);
    gated.sort_by(f64::total_cmp);
    println!("[{label}] discovery (connect + initialize + tools/list), {} runs: p50 {:.1} ms  max {:.1} ms", discovery.len(), percentile(&discovery, 0.5), percentile(&discovery, 1.0));
    println!("[{label}] raw MCP round trip (server time + transport), {} calls: p50 {:.0} µs  p95 {:.0} µs", raw.len(), percentile(&raw, 0.5), percentile(&raw, 0.95));
    println!("[{label}] through the checkpoint, {} calls: p50 {:.0} µs  p95 {:.0} µs", gated.len(), percentile(&gated, 0.5), percentile(&gated, 0.95));
    println!("[{label}] Gatehouse overhead per call (p50 difference): {:.0} µs", percentile(&gated, 0.5) - percentile(&raw, 0.5));
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gatehouse-bench-mcp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
