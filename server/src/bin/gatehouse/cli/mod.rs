//! The `gatehouse` command line. Exit codes: 0 success, 2 bad usage or bad config, 1 runtime
//! failure.

mod admin;
mod approvals;
mod args;
mod evals;
mod serve;
mod tools;

pub use args::*;
use std::process::ExitCode;

use clap::Parser;
use server::{
    bootstrap::{self, Gatehouse},
    config::{ConfigError, LoadedConfig, LogFormat},
    db::Db,
    telemetry,
    tools::ToolFiles,
};

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

pub fn run(cli: Cli) -> Result<(), Failure> {
    let command = cli.command.as_ref().map_or(&Command::Serve, |c| c);
    if let Command::CheckConfig = command {
        return admin::check_config(&cli.config);
    }
    let (cfg, files) = if let Command::Tools(ToolsCommand::Reload) = command {
        // A half-done edit of gatehouse.toml does not block a fix of the tool files: the running
        // processes keep the settings they started with, and reload only the tool files.
        let (cfg, files, problems) = bootstrap::load_for_catalog(&cli.config).map_err(|e| Failure::usage(e.to_string()))?;
        if !problems.is_empty() {
            eprintln!("note: {} is not valid, which reloading the tool files does not need:\n{}", cli.config.display(), ConfigError(problems));
        }
        (cfg, files)
    } else {
        bootstrap::load_config(&cli.config).map_err(|e| Failure::usage(e.to_string()))?
    };
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Text) => LogFormat::Text,
        None => cfg.settings.log.format,
    };
    telemetry::init(format, &cfg.settings.log.filter);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(Failure::runtime)?;
    rt.block_on(async move {
        match command {
            Command::Serve => serve::serve(cfg, files).await,
            Command::Migrate => admin::migrate(&cfg).await,
            Command::CheckConfig => Ok(()),
            Command::Owner(cmd) => admin::owner(&cfg, cmd).await,
            Command::Worker => serve::worker(cfg, files).await,
            Command::Jobs(cmd) => admin::jobs(cfg, files, cmd).await,
            Command::Tools(cmd) => tools::tools(cfg, files, cmd).await,
            Command::Mcp(cmd) => tools::mcp(cfg, files, cmd).await,
            Command::Approvals(cmd) => approvals::run(cfg, files, cmd).await,
            Command::Lane(LaneCommand::Detect(args)) => tools::lane_detect(cfg, files, args).await,
            Command::Eval(cmd) => evals::eval(cfg, files, cmd).await,
            Command::Repair(cmd) => evals::repair(cfg, files, cmd).await,
            Command::Bench(BenchCommand::Jobs(args)) => crate::bench::jobs(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Checkpoint(args)) => crate::bench::checkpoint(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Mcp(args)) => crate::bench::mcp::run(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Webhook(args)) => crate::bench::webhook::run(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Console(args)) => crate::bench::console::run(args).await.map_err(Failure::runtime),
            Command::Bench(BenchCommand::Detector(args)) => crate::bench::detector::command(args).map_err(Failure::runtime),
        }
    })
}

/// The database, migrated; every failure is logged where it happened.
async fn connect(cfg: &LoadedConfig) -> Result<Db, Failure> {
    bootstrap::connect(cfg).await.map_err(Failure::runtime)
}

/// Every part of Gatehouse over the migrated database, for a one-shot command: it exports no
/// OpenTelemetry data (only `serve` and `worker` do, see [`build_service`]).
async fn build(mut cfg: LoadedConfig, files: ToolFiles) -> Result<Gatehouse, Failure> {
    cfg.settings.telemetry.otlp_endpoint.clear();
    build_service(cfg, files).await
}

/// Runs a one-shot command over the catalog the server would use (the tool files and the MCP
/// tools last discovered; no MCP server is started), and closes the database whatever it returns.
async fn with_cached_tools<T>(cfg: LoadedConfig, files: ToolFiles, command: impl AsyncFnOnce(&Gatehouse) -> Result<T, Failure>) -> Result<T, Failure> {
    let gatehouse = build(cfg, files).await?;
    gatehouse.mcp.load_cached().await.map_err(Failure::runtime)?;
    let result = command(&gatehouse).await;
    gatehouse.db.close().await;
    result
}

/// Every part of Gatehouse over the migrated database, exporting OpenTelemetry data when
/// `[telemetry]` says so; the caller shuts the export down before it returns.
async fn build_service(cfg: LoadedConfig, files: ToolFiles) -> Result<Gatehouse, Failure> {
    let db = connect(&cfg).await?;
    Gatehouse::build(cfg, files, db).map_err(Failure::runtime)
}
