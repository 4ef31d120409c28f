//! The composition root: every part of Gatehouse is built here, once, in this order:
//!
//! config (settings, secrets, tool files) -> database -> OpenTelemetry export -> job queue and event bus -> checkpoint and MCP ->
//! spend budget -> model (every call recorded and counted against the budget) -> WhatsApp channel -> owner approvals -> tool lane (detector, planner, validator,
//! tool-call processor answering through the channels) -> conversation runtime -> simulator ->
//! self-improvement cycle -> retention -> job registry.
//!
//! `serve`, `worker`, every CLI command, the benchmarks and the test support all start from
//! [`Gatehouse::build`]; the web layer's state is made from the result. Reading this file shows
//! every part and how the parts are connected.

use std::{path::Path, sync::Arc};

use crate::{
    approvals::{
        Approvals,
        jobs::{AskOwner, AskOwnerHandler, Settle, SettleHandler},
    },
    budget::Budget,
    channel::{
        InboundHandler, Outbound, Outbox,
        simulator::Simulator,
        whatsapp::{
            WhatsApp,
            intake::ProcessInbound,
            unhandled::{Unhandled, UnhandledNotice},
            window::SendWindowTemplate,
        },
    },
    config::{self, ConfigError, LoadedConfig},
    conversation::{self, Runtime, RuntimeParts, ToolLane},
    lane::{self, processor::stopped::CallStopped},
    db::{Db, DbError, jobs::Waiting},
    events::Events,
    jobs::{self, JobCode, JobQueue, Registry, Worker, WorkerSettings},
    llm::{self, CallObserver, ChatModel, Observers},
    owners::notices::DeliverNotice,
    repairs::{
        Workspace,
        cycle::{Cycle, CycleJob},
    },
    retention::{PruneJob, Retention},
    telemetry::Telemetry,
    tools::{self, Checkpoint, Reloads, ToolFiles, mcp::McpManager},
};

/// The attempts of a job that keeps itself going (the prune, the self-improvement cycle): as
/// good as never out of them (the Jobs page says "no limit").
const PERIODIC_ATTEMPTS: u32 = app::pages::jobs::NO_ATTEMPT_LIMIT;

/// Everything Gatehouse is made of, built once.
pub struct Gatehouse {
    pub config: Arc<LoadedConfig>,
    pub tool_files: ToolFiles,
    pub db: Db,
    /// Enqueues jobs and wakes this process's workers.
    pub jobs: JobQueue,
    /// The live view: typed events for what happens to messages and calls.
    pub events: Events,
    /// The one checkpoint every tool call passes.
    pub tools: Arc<Checkpoint>,
    /// MCP servers: their tools join the checkpoint's catalog; `start()` runs them.
    pub mcp: McpManager,
    /// Catalog reloads: made here and told to the other processes, or followed from them.
    pub reloads: Reloads,
    /// The configured model, every call recorded in `llm_calls`.
    pub model: Arc<dyn ChatModel>,
    pub runtime: Arc<Runtime>,
    /// Owner approvals of tool calls: requested by the lane, the console and the CLI, decided
    /// on WhatsApp, in the console and with the CLI.
    pub approvals: Arc<Approvals>,
    /// The model spend budget: warnings to owners, and the customers' limit.
    pub budget: Arc<Budget>,
    pub whatsapp: WhatsApp,
    pub simulator: Arc<Simulator>,
    /// Self-improvement: the scan of traces, eval cases and repair proposals (the periodic
    /// `evals.cycle` job, the console and the CLI run it).
    pub cycle: Cycle,
    /// The periodic `retention.prune` job (`serve` queues it).
    pub retention: Retention,
    /// Every job kind this build runs, with its handler.
    pub registry: Registry,
    /// OpenTelemetry export (off unless `[telemetry] otlp_endpoint` is set); shut it down
    /// before the process ends so nothing queued is lost.
    pub telemetry: Telemetry,
}

impl std::fmt::Debug for Gatehouse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gatehouse").field("database", &self.db.backend).finish_non_exhaustive()
    }
}

/// Parts a test or a benchmark puts in place of the configured ones.
#[derive(Default)]
pub struct Overrides {
    /// Instead of the configured provider (still recorded in `llm_calls`).
    pub model: Option<Arc<dyn ChatModel>>,
    pub lane: Option<Arc<dyn ToolLane>>,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("setting up an HTTP client failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the language model cannot be set up: {0}")]
    Llm(#[from] llm::LlmError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// For a catalog reload (`gatehouse tools reload`): the tool files beside `path`, checked as at
/// start, and `gatehouse.toml` read leniently ([`config::load::load_lenient`]), so a half-done
/// edit of the main file does not block a fix of the tools. Its problems come back beside the
/// configuration, for the command to show.
pub fn load_for_catalog(path: &Path) -> Result<(LoadedConfig, ToolFiles, Vec<config::Problem>), ConfigError> {
    let (cfg, main_problems) = config::load::load_lenient(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let files = ToolFiles::load(dir, &cfg.secrets.source).map_err(ConfigError)?;
    let problems = across_files(&cfg, &files, dir);
    if problems.is_empty() { Ok((cfg, files, main_problems)) } else { Err(ConfigError(problems)) }
}

/// What is wrong only in the tool files and the main file together: MCP calls that do not fit
/// the tool call's time, and the catalog's own cross-checks against the settings.
fn across_files(cfg: &LoadedConfig, files: &ToolFiles, dir: &Path) -> Vec<config::Problem> {
    let mut problems = tools::mcp::config::fits_tool_call_budget(&files.mcp, &dir.join("mcp.toml"), cfg.settings.jobs.timeouts.tool_call, cfg.settings.reply_reserve());
    problems.extend(tools::catalog_problems(&files.catalog, dir, &cfg.settings));
    problems
}

/// Loads `gatehouse.toml` and the tool files beside it, reporting every problem of every file
/// at once.
pub fn load_config(path: &Path) -> Result<(LoadedConfig, ToolFiles), ConfigError> {
    let loaded = config::load(path);
    let dir = path.parent().unwrap_or(Path::new("."));
    let secrets = match &loaded {
        Ok(cfg) => cfg.secrets.source.clone(),
        Err(_) => config::SecretSource::from_env(),
    };
    // A missing main file is reported alone; otherwise the tool files are checked too.
    let files = if path.is_file() { ToolFiles::load(dir, &secrets) } else { Ok(ToolFiles::default()) };
    match (loaded, files) {
        (Ok(cfg), Ok(files)) => {
            let problems = across_files(&cfg, &files, dir);
            if problems.is_empty() { Ok((cfg, files)) } else { Err(ConfigError(problems)) }
        }
        (Err(ConfigError(mut problems)), files) => {
            problems.extend(files.err().unwrap_or_default());
            Err(ConfigError(problems))
        }
        (Ok(_), Err(problems)) => Err(ConfigError(problems)),
    }
}

/// Connects to the configured database and applies pending migrations; a failure is logged
/// with what failed, and nothing starts on a half-migrated database.
pub async fn connect(cfg: &LoadedConfig) -> Result<Db, DbError> {
    let db = Db::connect(&cfg.settings.database).await.inspect_err(|e| {
        tracing::error!(error = %e, database = %config::load::display_url(&cfg.settings.database.url), "database connection failed");
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
            Err(e)
        }
    }
}

impl Gatehouse {
    pub fn build(config: LoadedConfig, tool_files: ToolFiles, db: Db) -> Result<Self, BuildError> {
        Self::build_with(config, tool_files, db, Overrides::default())
    }

    pub fn build_with(config: LoadedConfig, tool_files: ToolFiles, db: Db, overrides: Overrides) -> Result<Self, BuildError> {
        let settings = Arc::new(config.settings.clone());
        // A telemetry setting that cannot work turns the export off; the bot runs on.
        let telemetry = Telemetry::start(&settings.telemetry, &config.secrets.source, db.clone()).unwrap_or_else(|e| {
            tracing::error!(code = e.code(), error = %e, "OpenTelemetry export is off");
            Telemetry::default()
        });
        let attempts = &settings.jobs.attempts;
        let jobs = JobQueue::with_settings(db.clone(), &settings.jobs)
            .attempts_for::<ProcessInbound>(attempts.whatsapp_inbound)
            .attempts_for::<DeliverNotice>(attempts.owner_notify)
            .attempts_for::<AskOwner>(attempts.owner_notify)
            .attempts_for::<Settle>(attempts.owner_notify)
            .attempts_for::<SendWindowTemplate>(attempts.owner_notify)
            .attempts_for::<CallStopped>(attempts.owner_notify)
            .attempts_for::<lane::job::ToolCallJob>(attempts.tool_call)
            // A periodic job keeps itself going by snoozing, and only `serve` queues it at start:
            // out of attempts after one bad patch of the database, it would stop for good (and
            // the tables it prunes grow without end). Its retries keep the backoff's pace.
            .attempts_for::<PruneJob>(PERIODIC_ATTEMPTS)
            .attempts_for::<CycleJob>(PERIODIC_ATTEMPTS)
            .traced(telemetry.clone());
        let events = Events::new(db.clone(), &settings.events);
        let (tools, mcp) = tools::build(&settings, &tool_files, &config.secrets.source, &db, &jobs)?;
        let model = match overrides.model {
            Some(model) => model,
            None => llm::from_settings(&settings, &config.secrets)?,
        };
        let budget = Arc::new(Budget::new(settings.clone(), db.clone(), jobs.clone()));
        // Every recorded model call counts against the budget and, when exported, is a span.
        let mut observers: Vec<Arc<dyn CallObserver>> = vec![budget.clone()];
        if telemetry.is_enabled() {
            observers.push(Arc::new(ModelCallSpans(telemetry.clone())));
        }
        let model = llm::recorded(model, db.clone(), &settings, Some(Arc::new(Observers(observers))));
        let whatsapp = WhatsApp::new(&settings.whatsapp, &config.secrets, &db, &jobs, &events)?;
        // The tool lane: detector, planner, validator, and tool calls as durable jobs whose
        // later answers go out through the channels.
        let outbox: Arc<dyn Outbound> = Arc::new(Outbox::new(db.clone(), whatsapp.sender.clone(), telemetry.clone()));
        let approvals = Arc::new(Approvals::new(db.clone(), jobs.clone(), settings.clone(), tools.clone()));
        let summarizer = lane::summarizer::Summarizer::new(model.clone(), settings.clone());
        let contexts = Arc::new(lane::context::ContextStore::new(db.clone(), jobs.clone(), settings.clone()));
        let processor = Arc::new(lane::processor::Processor::new(jobs.clone(), &settings, tools.clone(), summarizer, outbox.clone(), approvals.clone(), contexts.clone()).traced(telemetry.clone()));
        let lane: Arc<dyn ToolLane> = match overrides.lane {
            Some(lane) => lane,
            None => {
                let planner = lane::planner::Planner::new(model.clone(), settings.clone());
                let strict = model.supports_strict_tools();
                Arc::new(lane::Lane::new(settings.clone(), db.clone(), jobs.clone(), tools.clone(), planner, processor.clone(), approvals.clone(), contexts, strict))
            }
        };
        let runtime = Arc::new(Runtime::new(RuntimeParts {
            db: db.clone(),
            queue: jobs.clone(),
            settings: settings.clone(),
            secrets: config.secrets.clone(),
            model: model.clone(),
            lane,
            approvals: approvals.clone(),
            budget: budget.clone(),
            telemetry: telemetry.clone(),
        }));
        let handler: Arc<dyn InboundHandler> = runtime.clone();
        let simulator = Arc::new(Simulator::new(db.clone(), handler.clone(), telemetry.clone()));
        let mut registry = jobs::registry();
        whatsapp.register(&mut registry, &db, handler, &settings.jobs.timeouts);
        registry.handle_within::<lane::job::ToolCallJob>(processor.clone(), settings.jobs.timeouts.tool_call);
        registry.when_cancelled::<lane::job::ToolCallJob, CallStopped>(&jobs);
        registry.handle_within::<CallStopped>(processor, settings.jobs.timeouts.owner_notify);
        registry.handle_within(Arc::new(AskOwnerHandler::new(approvals.clone(), whatsapp.sender.clone())), settings.jobs.timeouts.owner_notify);
        registry.handle_within(Arc::new(SettleHandler::new(approvals.clone(), outbox)), settings.jobs.timeouts.owner_notify);
        registry.handle_within(Arc::new(lane::context::SweepHandler::new(db.clone(), settings.clone())), settings.jobs.job_timeout);
        registry.handle_within(Arc::new(crate::channel::whatsapp::undelivered::Undelivered::new(db.clone(), jobs.clone(), settings.clone())), settings.jobs.timeouts.owner_notify);
        registry.when_dropped::<ProcessInbound, UnhandledNotice>(&jobs);
        registry.handle_within(Arc::new(Unhandled::new(db.clone(), jobs.clone(), settings.clone())), settings.jobs.timeouts.owner_notify);
        let workspace = Workspace { config_dir: config.dir.clone(), secrets: config.secrets.source.clone(), settings: settings.clone(), live: tools.catalog() };
        let cycle = Cycle { db: db.clone(), queue: jobs.clone(), settings: settings.clone(), workspace, checkpoint: tools.clone(), model: model.clone() };
        registry.handle_within::<CycleJob>(Arc::new(cycle.clone()), settings.jobs.timeouts.evals_cycle);
        registry.handle_within::<conversation::MarkTraceJob>(Arc::new(cycle.clone()), settings.jobs.job_timeout);
        let retention = Retention::new(db.clone(), jobs.clone(), settings.clone());
        registry.handle_within::<PruneJob>(Arc::new(retention.clone()), settings.jobs.job_timeout);
        let config = Arc::new(config);
        let reloads = Reloads::new(config.clone(), mcp.clone(), tools.clone(), db.clone(), tool_files.digest);
        Ok(Self { config, tool_files, db, jobs, events, tools, mcp, reloads, model, runtime, approvals, budget, whatsapp, simulator, cycle, retention, registry, telemetry })
    }

    /// Makes the jobs that wait on the deployment due now (see [`JobQueue::release_waiting`]):
    /// a process starts after an operator freed room on the disk, renewed the WhatsApp access
    /// token, settled the account or set a missing send setting, and the replies go out at once
    /// rather than within the minute. Not those waiting on a refused token while this process
    /// holds that same token: a restart that changed nothing would only be refused again at
    /// once. Returns how many.
    pub async fn release_waiting(&self) -> Result<usize, DbError> {
        let refused_here = self.whatsapp.sender.token_rejected_since().await?.is_some();
        let codes: Vec<&str> =
            JobCode::WAITING_ON_THE_DEPLOYMENT.into_iter().filter(|c| !(refused_here && *c == JobCode::CredentialsRejected)).map(JobCode::as_str).collect();
        let mut released = self.jobs.release_waiting(Waiting::Codes(&codes)).await?;
        if let Some(waiting) = self.whatsapp.waiting_for_a_setting() {
            released += self.jobs.release_waiting(waiting).await?;
        }
        Ok(released)
    }

    /// A worker over this build's job kinds, with the configured settings.
    pub fn worker(&self) -> Worker {
        Worker::new(self.db.clone(), self.registry.clone(), WorkerSettings::from(&self.config.settings.jobs), self.jobs.waker()).with_telemetry(self.telemetry.clone())
    }
}

/// Model calls as spans, told by the recording model.
struct ModelCallSpans(Telemetry);

#[async_trait::async_trait]
impl CallObserver for ModelCallSpans {
    async fn recorded(&self, _id: i64, row: &crate::db::llm_calls::LlmCallRow) {
        self.0.model_call(row);
    }
}
