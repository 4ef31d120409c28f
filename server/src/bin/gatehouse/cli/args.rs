//! The command line's words: every command, subcommand and flag, as clap parses them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use server::config::DEFAULT_CONFIG_PATH;

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
    /// Tool calls waiting for an owner: list, approve, reject.
    #[command(subcommand)]
    Approvals(ApprovalsCommand),
    /// The tool lane: replay what it decides for a message.
    #[command(subcommand)]
    Lane(LaneCommand),
    /// Regression cases made from traces or by hand, replayed deterministically.
    #[command(subcommand)]
    Eval(super::evals::EvalCommand),
    /// Configuration repairs proposed for failing cases; applied only when an owner approves.
    #[command(subcommand)]
    Repair(super::evals::RepairCommand),
    /// Measure performance.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// Approvals, newest first: id, state, tool, risk, requester, requested and expiry times.
    List {
        /// Only this state: pending, approved, rejected or expired.
        #[arg(long)]
        state: Option<String>,
        /// One JSON object a line (id, state, tool, risk, requested_at, ...).
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Approve a waiting call: it runs once, if it is still exactly the call approved. Exits
    /// 0 only when this command decided it.
    Approve { id: i64 },
    /// Reject a waiting call: it never runs, and the person who asked is told.
    Reject {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum LaneCommand {
    /// What the candidate detector makes of a message, over the live catalog, as JSON: should
    /// it be planned, the candidates with their scores, the reason, the confidence and the
    /// follow-up hint.
    Detect(LaneDetect),
}

#[derive(Debug, Args)]
pub struct LaneDetect {
    /// The message.
    #[arg(long)]
    pub text: String,
    #[command(flatten)]
    pub situation: Situation,
    /// The message answers a clarifying question the lane asked about these tools
    /// (comma-separated, as the question's `AgentToolClarificationKept` step lists them).
    #[arg(long, value_name = "TOOLS", value_delimiter = ',')]
    pub answering: Vec<String>,
}

/// Who sends a message, in which kind of chat, after which tool results: what a detection
/// depends on besides the text, for `lane detect` and for an eval case.
#[derive(Debug, Args)]
pub struct Situation {
    #[arg(long = "as", value_enum, default_value = "customer")]
    pub actor: ActorArg,
    #[arg(long, value_enum, default_value = "direct")]
    pub chat_type: ChatTypeArg,
    /// A JSON array of the chat's recent tool contexts, newest first:
    /// [{"tool", "args", "summary", "entities", "age_secs"}].
    #[arg(long, value_name = "FILE")]
    pub context: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// The catalog: name, provider, audience, risk, approval, version.
    List,
    /// Call a tool through the same checkpoint the assistant uses (audited).
    Call(ToolsCall),
    /// Check the tool files (tools.toml, connectors.toml) and have every running process of
    /// this deployment (`serve`, `worker`) reload them within one `jobs.poll_interval`.
    Reload,
}

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Servers with transport, trust, health, tool counts and tools waiting for approval.
    List,
    /// A server's tools (as last discovered) with their quarantine state.
    Tools { server: String },
    /// Connect to a server now, discover its tools and store them (new ones wait for approval).
    Refresh { server: String },
    /// Approve a tool's definition (by its catalog name, `<server>__<tool>`).
    Approve {
        tool: String,
        /// The definition hash you reviewed (`mcp tools` shows it); a changed definition is refused.
        #[arg(long)]
        hash: Option<String>,
    },
    /// Reject a tool (by its catalog name); calls to it fail with TOOL_REJECTED.
    Reject {
        tool: String,
        #[arg(long)]
        hash: Option<String>,
    },
    /// Log in to a server with `auth = "oauth"`: prints the address to open in a browser, then
    /// reads the address the browser lands on (the console's callback) and stores the tokens,
    /// encrypted with GATEHOUSE_MCP_TOKEN_KEY.
    Login { server: String },
    /// Enable a server (overrides config/mcp.toml).
    Enable { server: String },
    /// Disable a server (overrides config/mcp.toml).
    Disable { server: String },
    /// Forms servers with `elicitation = "owner"` ask the owners to fill in during a call, with
    /// their fields (type, required, default) and the server's message (untrusted text).
    Forms,
    /// Answer a form (as an owner, audited). Accepting takes `--values` (a JSON object) checked
    /// against the form; fields left out take their defaults.
    Answer {
        id: i64,
        #[arg(value_enum)]
        decision: FormDecision,
        #[arg(long)]
        values: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormDecision {
    Accept,
    Decline,
    Cancel,
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

impl ActorArg {
    pub fn role(self) -> server::domain::Role {
        match self {
            Self::Owner => server::domain::Role::Owner,
            Self::Customer => server::domain::Role::Customer,
        }
    }
}

impl ChatTypeArg {
    pub fn kind(self) -> server::domain::ChatKind {
        match self {
            Self::Direct => server::domain::ChatKind::Direct,
            Self::Group => server::domain::ChatKind::Group,
        }
    }
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
    Mcp(crate::bench::mcp::McpBench),
    /// Post signed WhatsApp webhooks over loopback; print requests/s and latency percentiles.
    Webhook(crate::bench::webhook::WebhookBench),
    /// The reads of console pages and message handling on a filled database, and again at ten
    /// times the data: median ms of each and the ratio.
    Console(crate::bench::console::ConsoleBench),
    /// The lane's candidate detector on a JSON-lines catalog and labelled messages: recall@k,
    /// irrelevant messages planned, detection latency.
    Detector(crate::bench::detector::DetectorBench),
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
