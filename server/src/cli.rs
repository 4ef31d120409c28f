//! The `gatehouse` command line. Exit codes: 0 success, 2 bad usage or bad config, 1 runtime
//! failure.

use std::{
    io::{IsTerminal, Read},
    path::PathBuf,
    process::ExitCode,
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use secrecy::SecretString;

use crate::{
    config::{self, DEFAULT_CONFIG_PATH, LoadedConfig, LogFormat},
    db::{self, Db},
    jobs::{self, JobQueue, Worker},
    owners::{self, ValidOwner},
    telemetry,
    web::{self, AppState},
};

#[derive(Debug, Parser)]
#[command(name = "gatehouse", version, about = "Gatehouse: a WhatsApp assistant with an owner console")]
pub struct Cli {
    /// Main config file; the other config files are read from the same folder.
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Log format; overrides `log.format`.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormatArg>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server and console (the default).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Check every config file and report every problem at once, without starting.
    CheckConfig,
    /// Manage owner accounts.
    #[command(subcommand)]
    Owner(OwnerCommand),
    /// Run a job worker alone (scale-out: several processes share one PostgreSQL database).
    Worker,
    /// Inspect and enqueue jobs.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// List tools, or call one through the checkpoint.
    #[command(subcommand)]
    Tools(ToolsCommand),
    /// MCP servers: status, tools and quarantine decisions.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Measure performance.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// The catalog: name, provider, audience, risk, approval, version.
    List,
    /// Call a tool through the same checkpoint the assistant uses (audited).
    Call(ToolsCall),
}

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Servers with transport, trust, health, tool counts and tools waiting for approval.
    List,
    /// A server's tools (as last discovered) with their quarantine state.
    Tools { server: String },
    /// Connect to a server now, discover its tools and store them (new ones wait for approval).
    Refresh { server: String },
    /// Approve a tool's current definition (by its catalog name, `<server>__<tool>`).
    Approve { tool: String },
    /// Reject a tool (by its catalog name); calls to it fail with TOOL_REJECTED.
    Reject { tool: String },
    /// Enable a server (overrides config/mcp.toml).
    Enable { server: String },
    /// Disable a server (overrides config/mcp.toml).
    Disable { server: String },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ActorArg {
    Owner,
    Customer,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ChatTypeArg {
    Direct,
    Group,
}

#[derive(Debug, Args)]
pub struct ToolsCall {
    pub name: String,
    /// Arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// Call as an owner or as a customer.
    #[arg(long = "as", value_enum, default_value = "owner")]
    pub actor: ActorArg,
    #[arg(long, value_enum, default_value = "direct")]
    pub chat_type: ChatTypeArg,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Enqueue a job (e.g. `system.echo` to check the queue end to end).
    Enqueue(JobsEnqueue),
    /// List recent jobs, newest first.
    List(JobsList),
}

#[derive(Debug, Args)]
pub struct JobsEnqueue {
    /// Job kind, such as system.echo.
    pub kind: String,
    /// Arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    pub args: String,
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Run no earlier than this from now, e.g. 10m.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub delay: Option<std::time::Duration>,
    #[arg(long)]
    pub dedupe_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct JobsList {
    /// Only jobs in this state.
    #[arg(long)]
    pub state: Option<String>,
    #[arg(long, default_value_t = 20)]
    pub limit: i64,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Enqueue and run no-op jobs; print enqueue/s, completed/s and enqueue-to-start latency.
    Jobs(crate::bench::JobsBench),
    /// Call a no-op tool through the checkpoint; print its overhead and calls/s with audit.
    Checkpoint(crate::bench::CheckpointBench),
    /// MCP discovery time and per-call overhead with server-everything over stdio and HTTP.
    Mcp(crate::tools::mcp::bench::McpBench),
    /// Post signed WhatsApp webhooks over loopback; print requests/s and latency percentiles.
    Webhook(crate::bench::webhook::WebhookBench),
}

#[derive(Debug, Subcommand)]
pub enum OwnerCommand {
    /// Add an owner.
    Add(OwnerAdd),
    /// Set a new password for an owner; their sessions end.
    ResetPassword(ResetPassword),
    /// List owners and their WhatsApp numbers.
    List,
}

#[derive(Debug, Args)]
pub struct OwnerAdd {
    /// Login name for the console.
    #[arg(long)]
    pub login: String,
    /// Display name.
    #[arg(long)]
    pub name: String,
    /// WhatsApp number in E.164 form; repeat or comma-separate for several.
    #[arg(long = "whatsapp", value_name = "E164")]
    pub whatsapp: Vec<String>,
    /// Read the password from standard input instead of prompting.
    #[arg(long)]
    pub password_stdin: bool,
}

#[derive(Debug, Args)]
pub struct ResetPassword {
    #[arg(long)]
    pub login: String,
    /// Read the password from standard input instead of prompting.
    #[arg(long)]
    pub password_stdin: bool,
}

/// A failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self { code: 2, message: message.into() }
    }
    fn runtime(message: impl std::fmt::Display) -> Self {
        Self { code: 1, message: message.to_string() }
    }
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("gatehouse: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn load_config(cli: &Cli) -> Result<LoadedConfig, Failure> {
    config::load(&cli.config).map_err(|e| Failure::usage(e.to_string()))
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(Failure::runtime)
}

pub fn run(cli: Cli) -> Result<(), Failure> {
    let command = cli.command.as_ref().map_or(&Command::Serve, |c| c);
    if let Command::CheckConfig = command {
        return check_config(&cli);
    }
    let cfg = load_config(&cli)?;
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Text) => LogFormat::Text,
        None => cfg.settings.log.format,
    };
    telemetry::init(format, &cfg.settings.log.filter);
    let rt = runtime()?;
    rt.block_on(async move {
        match command {
            Command::Serve => serve(cfg).await,
            Command::Migrate => migrate(&cfg).await,
            Command::CheckConfig => Ok(()),
            Command::Owner(cmd) => owner(&cfg, cmd).await,
            Command::Worker => worker(cfg).await,
            Command::Jobs(cmd) => jobs_command(&cfg, cmd).await,
            Command::Tools(cmd) => tools_command(&cfg, cmd).await,
            Command::Mcp(cmd) => mcp_command(&cfg, cmd).await,
            Command::Bench(BenchCommand::Jobs(args)) => crate::bench::jobs(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Checkpoint(args)) => crate::bench::checkpoint(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Mcp(args)) => crate::tools::mcp::bench::run(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Webhook(args)) => crate::bench::webhook::run(args).await.map_err(Failure::runtime),
        }
    })
}

fn check_config(cli: &Cli) -> Result<(), Failure> {
    let cfg = match config::load(&cli.config) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return Err(Failure::usage(format!("{} is not valid", cli.config.display())));
        }
    };
    println!("config: {} (valid)", cfg.path.display());
    for entry in web::backend::effective_entries(&cfg.settings) {
        println!("  {} = {}", entry.key, entry.value);
    }
    println!("tools: {} in the catalog (approval mode {:?})", cfg.catalog.len(), cfg.catalog.approval_mode);
    println!("mcp servers: {} in {}", cfg.mcp.servers.len(), cfg.dir.join("mcp.toml").display());
    for s in &cfg.mcp.servers {
        println!("  {} ({}, {:?}, {}) {}", s.id, s.transport.kind(), s.trust, if s.enabled { "enabled" } else { "disabled" }, s.transport.target());
    }
    println!("secrets (from the environment; values never shown):");
    for (name, set) in cfg.secrets.presence() {
        println!("  {name}: {}", if set { "set" } else { "unset" });
    }
    Ok(())
}

async fn connect(cfg: &LoadedConfig) -> Result<Db, Failure> {
    let db = Db::connect(&cfg.settings.database).await.map_err(|e| {
        tracing::error!(error = %e, database = %config::load::display_url(&cfg.settings.database.url), "database connection failed");
        Failure::runtime(e)
    })?;
    match db.migrate().await {
        Ok(applied) => {
            for m in &applied {
                tracing::info!(version = m.version, description = %m.description, "migration applied");
            }
            Ok(db)
        }
        Err(e) => {
            tracing::error!(error = %e, "migration failed; Gatehouse will not start on a half-migrated database");
            Err(Failure::runtime(e))
        }
    }
}

async fn migrate(cfg: &LoadedConfig) -> Result<(), Failure> {
    let db = connect(cfg).await?;
    let applied = db.applied_migrations().await.map_err(Failure::runtime)?;
    println!("{} migration(s) applied on {}; the database is current.", applied.len(), db.backend.as_str());
    for m in applied {
        println!("  {:04} {}", m.version, m.description);
    }
    db.close().await;
    Ok(())
}

async fn serve(cfg: LoadedConfig) -> Result<(), Failure> {
    let db = connect(&cfg).await?;
    let server = &cfg.settings.server;
    let listener = web::serve::bind_with_fallback(server.addr, server.strict_port).await.map_err(|e| {
        tracing::error!(addr = %server.addr, error = %e, "cannot listen");
        Failure::runtime(format!("cannot listen on {}: {e}", server.addr))
    })?;
    let addr = listener.local_addr().map_err(Failure::runtime)?;
    let grace = server.shutdown_grace;
    let state = AppState::new(cfg, db.clone(), addr, web::ops::metrics_handle()).map_err(Failure::runtime)?;
    spawn_catalog_reload(state.clone());
    if let Err(e) = state.mcp.start().await {
        tracing::error!(error = %e, "MCP servers could not start; their tools are not offered");
    }
    if let Some((provider, var)) = state.degraded() {
        tracing::warn!(provider, variable = var, "no LLM provider key: running in degraded mode. Set {var} to enable replies from the model");
    }
    web::session_store::DbSessionStore::new(db.clone()).spawn_cleanup(std::time::Duration::from_secs(600));
    let setup_done = state.setup_done().await.map_err(Failure::runtime)?;
    tracing::info!(addr = %addr, url = %state.public_url, database = db.backend.as_str(), "Gatehouse listening");
    if !setup_done {
        tracing::info!("first run: open {}/setup to create the first owner", state.public_url);
    }
    let router = web::router(state.clone());
    let shutdown = web::serve::shutdown_watch();
    let registry = registry_for(&state.config, &db, state.runtime.clone())?;
    let worker = state.config.settings.jobs.worker_in_serve.then(|| {
        tokio::spawn(Worker::new(db.clone(), registry, state.config.settings.jobs.worker(), state.jobs.waker()).run(shutdown.clone()))
    });
    web::serve::serve(listener, router, grace, shutdown).await.map_err(Failure::runtime)?;
    let _ = tokio::time::timeout(grace, state.mcp.shutdown()).await;
    if let Some(worker) = worker {
        let _ = worker.await;
    }
    if tokio::time::timeout(grace, db.close()).await.is_err() {
        tracing::warn!("database connections still busy after the grace period; exiting anyway");
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGHUP reloads the tool catalog (config/tools.toml) without a restart. Calls in flight keep
/// the version they started with; a file with problems is refused and the current catalog kept.
fn spawn_catalog_reload(state: AppState) {
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hangups.recv().await.is_some() {
            if let Err(e) = crate::tools::reload_catalog(&state.config.path, &state.mcp, &state.tools).await {
                tracing::error!(error = %e, "tool catalog reload failed; keeping the current catalog");
            }
        }
    });
}

/// Every job kind this build runs, with the channels' handlers wired to their dependencies.
/// The conversation runtime over the configured model (every call recorded in `llm_calls`).
fn conversation_runtime(cfg: &LoadedConfig, db: &Db) -> Result<std::sync::Arc<crate::conversation::Runtime>, Failure> {
    Ok(std::sync::Arc::new(crate::conversation::Runtime::from_config(cfg, db).map_err(Failure::runtime)?))
}

fn registry_for(cfg: &LoadedConfig, db: &Db, runtime: std::sync::Arc<crate::conversation::Runtime>) -> Result<jobs::Registry, Failure> {
    let mut registry = jobs::registry();
    crate::channel::whatsapp::register(&mut registry, cfg, db, runtime).map_err(Failure::runtime)?;
    Ok(registry)
}

async fn worker(cfg: LoadedConfig) -> Result<(), Failure> {
    let db = connect(&cfg).await?;
    let queue = JobQueue::new(db.clone());
    let settings = cfg.settings.jobs.worker();
    tracing::info!(database = db.backend.as_str(), queue = %settings.queue, "worker process starting");
    let registry = registry_for(&cfg, &db, conversation_runtime(&cfg, &db)?)?;
    Worker::new(db.clone(), registry, settings, queue.waker()).run(web::serve::shutdown_watch()).await;
    db.close().await;
    Ok(())
}

async fn tools_command(cfg: &LoadedConfig, cmd: &ToolsCommand) -> Result<(), Failure> {
    use crate::tools::{CallContext, ToolCall, catalog::ChatType, policy::Actor};
    match cmd {
        ToolsCommand::List => {
            let db = connect(cfg).await?;
            let (checkpoint, mcp) = crate::tools::checkpoint_with_mcp(cfg, &db).map_err(Failure::runtime)?;
            mcp.load_cached().await.map_err(Failure::runtime)?;
            let catalog = checkpoint.catalog();
            if catalog.is_empty() {
                println!("no tools in {} or from MCP servers", cfg.dir.join("tools.toml").display());
            }
            for t in catalog.all() {
                let s = &t.spec;
                println!(
                    "{}\t{:?}\t{:?}\t{:?}\t{:?}\t{}\t{}",
                    s.name, s.provider, s.audience, s.risk, s.approval, if s.enabled { "enabled" } else { "disabled" }, &t.version[..19]
                );
            }
            db.close().await;
            Ok(())
        }
        ToolsCommand::Call(c) => {
            let args: serde_json::Value = serde_json::from_str(&c.args).map_err(|e| Failure::usage(format!("--args is not JSON: {e}")))?;
            let db = connect(cfg).await?;
            let (checkpoint, mcp) = crate::tools::checkpoint_with_mcp(cfg, &db).map_err(Failure::runtime)?;
            // Only a call of an MCP tool connects to the MCP servers; any other call leaves them
            // (and the health a running server recorded) alone.
            let server = mcp.server_of(&c.name);
            if server.is_some() {
                mcp.start().await.map_err(Failure::runtime)?;
            } else {
                mcp.load_cached().await.map_err(Failure::runtime)?;
            }
            // An MCP tool needs its server: wait for it to connect (bounded), then call.
            if let Some(server) = server {
                let bound = cfg.mcp.get(&server).map_or(std::time::Duration::from_secs(20), |s| s.discovery.timeout);
                if let Err(e) = mcp.wait_connected(&server, bound).await {
                    tracing::warn!(mcp.server = %server, error = %e, "MCP server not connected; the call will say so");
                }
            }
            let ctx = CallContext {
                actor: match c.actor {
                    ActorArg::Owner => Actor::Owner,
                    ActorArg::Customer => Actor::Customer,
                },
                chat_type: match c.chat_type {
                    ChatTypeArg::Direct => ChatType::Direct,
                    ChatTypeArg::Group => ChatType::Group,
                },
                chat_id: Some("cli".into()),
                sender_id: None,
                correlation_id: uuid::Uuid::new_v4().to_string(),
                approved: false,
            };
            let result = checkpoint.execute(ToolCall { name: c.name.clone(), args }, &ctx).await;
            checkpoint.audit().flush().await;
            mcp.shutdown().await;
            db.close().await;
            match result {
                Ok(ok) => {
                    let out = serde_json::json!({ "tool": ok.tool, "version": ok.version, "attempts": ok.attempts, "output": ok.output });
                    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
                    Ok(())
                }
                Err(f) => {
                    println!("{}", serde_json::json!({ "error": { "code": f.code, "message": f.message } }));
                    Err(Failure { code: 1, message: format!("{}: {}", f.code, f.message) })
                }
            }
        }
    }
}

async fn mcp_command(cfg: &LoadedConfig, cmd: &McpCommand) -> Result<(), Failure> {
    use crate::tools::mcp::{Actor, McpError};
    let db = connect(cfg).await?;
    let (_checkpoint, mcp) = crate::tools::checkpoint_with_mcp(cfg, &db).map_err(Failure::runtime)?;
    let fail = |e: McpError| match e {
        McpError::UnknownServer(_) | McpError::UnknownTool(_) => Failure::usage(e.to_string()),
        other => Failure::runtime(other),
    };
    let cli_owner = Actor { owner_id: None, login: Some("cli".into()), ip: None };
    let when = |ms: Option<i64>| ms.map_or_else(|| "never".to_string(), |ms| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)).to_string());
    let result = async {
        match cmd {
            McpCommand::List => {
                mcp.load_cached().await.map_err(fail)?;
                if cfg.mcp.servers.is_empty() {
                    println!("no MCP servers in {}", cfg.dir.join("mcp.toml").display());
                }
                for s in mcp.servers().await.map_err(fail)? {
                    println!(
                        "{}	{}	{:?}	{}	{}	tools={}	pending={}	last_seen={}	{}	{}",
                        s.id,
                        s.transport,
                        s.trust,
                        if s.enabled { "enabled" } else { "disabled" },
                        s.health,
                        s.tool_count,
                        s.pending,
                        when(s.last_seen_at),
                        s.target,
                        s.last_error.unwrap_or_default()
                    );
                }
            }
            McpCommand::Tools { server } => {
                for t in mcp.tools(server).await.map_err(fail)? {
                    let listed = if t.present { "" } else { "	(no longer listed)" };
                    println!("{}	{}	{}	{}{listed}", t.catalog_name, t.state, if t.usable { "offered" } else { "not offered" }, &t.definition_hash[..19.min(t.definition_hash.len())]);
                }
            }
            McpCommand::Refresh { server } => {
                mcp.start().await.map_err(fail)?;
                let bound = cfg.mcp.get(server).map_or(std::time::Duration::from_secs(20), |s| s.discovery.timeout);
                let outcome = match mcp.wait_connected(server, bound).await {
                    Ok(()) => mcp.live(server).map_err(fail)?.last_discovery.ok_or_else(|| Failure::runtime("no discovery result")),
                    Err(e) => Err(fail(e)),
                };
                mcp.shutdown().await;
                let report = outcome?;
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            }
            McpCommand::Approve { tool } => {
                let t = mcp.approve(tool, &cli_owner).await.map_err(fail)?;
                println!("{} approved ({})", t.catalog_name, t.definition_hash);
            }
            McpCommand::Reject { tool } => {
                let t = mcp.reject(tool, &cli_owner).await.map_err(fail)?;
                println!("{} rejected", t.catalog_name);
            }
            McpCommand::Enable { server } | McpCommand::Disable { server } => {
                let enable = matches!(cmd, McpCommand::Enable { .. });
                mcp.set_enabled(server, enable, &cli_owner).await.map_err(fail)?;
                println!("{server} {}", if enable { "enabled" } else { "disabled" });
            }
        }
        Ok(())
    }
    .await;
    db.close().await;
    result
}

async fn jobs_command(cfg: &LoadedConfig, cmd: &JobsCommand) -> Result<(), Failure> {
    match cmd {
        JobsCommand::Enqueue(a) => {
            let args: serde_json::Value = serde_json::from_str(&a.args).map_err(|e| Failure::usage(format!("--args is not JSON: {e}")))?;
            if !args.is_object() {
                return Err(Failure::usage("--args must be a JSON object"));
            }
            let db = connect(cfg).await?;
            let delay_ms = a.delay.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let job = db::jobs::NewJob {
                kind: a.kind.clone(),
                queue: cfg.settings.jobs.queue.clone(),
                dedupe_key: a.dedupe_key.clone(),
                args,
                max_attempts: i64::from(a.max_attempts.unwrap_or(cfg.settings.jobs.default_max_attempts)),
                scheduled_at: delay_ms.map(|d| db::now_ms().saturating_add(d)),
                correlation_id: uuid::Uuid::new_v4().to_string(),
                ..Default::default()
            };
            let queued = JobQueue::new(db.clone()).enqueue(&job).await.map_err(Failure::runtime)?;
            let how = if queued.deduplicated { "already queued" } else { "enqueued" };
            println!("job {} {how} ({})", queued.job.id, queued.job.state);
            db.close().await;
        }
        JobsCommand::List(a) => {
            let state = match &a.state {
                Some(s) => Some(db::jobs::JobState::parse(s).ok_or_else(|| Failure::usage(format!("unknown state {s:?}")))?),
                None => None,
            };
            let db = connect(cfg).await?;
            let mut conn = db.pool.acquire().await.map_err(Failure::runtime)?;
            let filter = db::jobs::JobFilter { state, ..Default::default() };
            for j in db::jobs::list(&mut conn, &filter, a.limit).await.map_err(Failure::runtime)? {
                println!("{}\t{}\t{}\t{}/{}\t{}", j.id, j.kind, j.state, j.attempt, j.max_attempts, j.last_error_code.unwrap_or_default());
            }
            drop(conn);
            db.close().await;
        }
    }
    Ok(())
}

fn read_password(from_stdin: bool) -> Result<SecretString, Failure> {
    if from_stdin {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(Failure::runtime)?;
        let password = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_string();
        return Ok(SecretString::from(password));
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage("no terminal to prompt on; pass --password-stdin and pipe the password in"));
    }
    let first = rpassword::prompt_password("Password: ").map_err(Failure::runtime)?;
    let second = rpassword::prompt_password("Repeat password: ").map_err(Failure::runtime)?;
    if first != second {
        return Err(Failure::usage("the two passwords differ"));
    }
    Ok(SecretString::from(first))
}

fn owner_failure(e: owners::OwnerError) -> Failure {
    match e {
        owners::OwnerError::Invalid(_) | owners::OwnerError::LoginTaken(_) | owners::OwnerError::NotFound(_) => Failure::usage(e.to_string()),
        other => Failure::runtime(other),
    }
}

async fn owner(cfg: &LoadedConfig, cmd: &OwnerCommand) -> Result<(), Failure> {
    let min = cfg.settings.auth.min_password();
    match cmd {
        OwnerCommand::Add(args) => {
            let password = read_password(args.password_stdin)?;
            let valid = ValidOwner::parse(&args.name, &args.login, password, &args.whatsapp.join(","), min).map_err(owner_failure)?;
            let db = connect(cfg).await?;
            let row = owners::add_owner(&db, valid).await.map_err(owner_failure)?;
            println!("owner {} added (id {})", row.login, row.id);
            db.close().await;
        }
        OwnerCommand::ResetPassword(args) => {
            let password = read_password(args.password_stdin)?;
            owners::check_password(&password, min).map_err(owner_failure)?;
            let db = connect(cfg).await?;
            owners::reset_password(&db, &args.login, password, min).await.map_err(owner_failure)?;
            println!("password of {} reset; their sessions have ended", args.login.trim().to_lowercase());
            db.close().await;
        }
        OwnerCommand::List => {
            let db = connect(cfg).await?;
            let mut conn = db.pool.acquire().await.map_err(Failure::runtime)?;
            let list = db::owners::list(&mut conn).await.map_err(Failure::runtime)?;
            if list.is_empty() {
                println!("no owners yet: open the console's /setup page or run `gatehouse owner add`");
            }
            for o in list {
                let phones = db::owners::phones_of(&mut conn, o.id).await.map_err(Failure::runtime)?;
                println!("{}\t{}\t{}", o.login, o.display_name, phones.join(","));
            }
            drop(conn);
            db.close().await;
        }
    }
    Ok(())
}
