//! `gatehouse eval` (regression cases: add, list, run, import, export) and `gatehouse repair`
//! (configuration diffs for failing cases: propose, list, show, approve, reject, roll back).
//! Both follow the console's rules: a repair is applied only by an explicit approve, once, and
//! one that breaks a passing case only with `--confirm-regressions`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use server::{
    bootstrap::Gatehouse,
    config::LoadedConfig,
    db::evals as store,
    evals::{Case, CaseResult, Expect, Origin, case, findings},
    repairs::{self, Decider, Workspace},
    tools::ToolFiles,
};

use super::{Failure, Situation, tools::read_contexts, with_cached_tools};

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Add a case by hand, or from a trace (`--from-trace ID`).
    Add(EvalAdd),
    /// The cases: name, expectation, actor, chat type, origin, message.
    List {
        /// One JSON object a line (the same form `export` writes).
        #[arg(long)]
        json: bool,
    },
    /// Replay every case and print a pass/fail table; exits 1 when a case fails. The detector
    /// level needs no model; the plan level replays the planner's recorded answers.
    Run {
        /// Ask the configured model instead of replaying recorded answers.
        #[arg(long)]
        live: bool,
        /// One JSON object a line per case.
        #[arg(long)]
        json: bool,
    },
    /// Write every case to a JSON-lines file (default: `evals.cases_file`).
    Export { file: Option<PathBuf> },
    /// Read cases from a JSON-lines file (default: `evals.cases_file`); a case with a stored
    /// name replaces it. A file with a bad line is refused whole.
    Import { file: Option<PathBuf> },
    /// Remove a case by name.
    Remove { name: String },
}

#[derive(Debug, Args)]
pub struct EvalAdd {
    /// The message.
    #[arg(long, required_unless_present = "from_trace")]
    pub message: Option<String>,
    /// Make the case from a stored trace: its message, actor, chat type, contexts and the
    /// planner's recorded answers.
    #[arg(long, value_name = "ID", conflicts_with = "message")]
    pub from_trace: Option<i64>,
    #[command(flatten)]
    pub situation: Situation,
    /// normal_chat, guard, clarify or tool:NAME[,NAME].
    #[arg(long)]
    pub expect: String,
    /// With tool:NAME, an argument that matters (repeatable): KEY=VALUE, the value read as JSON
    /// when it is JSON (a number, true, an object), else as text. Other arguments may be
    /// anything; text is compared without case.
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum RepairCommand {
    /// Scan new traces, make cases from findings, and propose a repair for each failing case
    /// that an edit fixes (stored for an owner; nothing is applied).
    Propose,
    /// Proposals, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A proposal's diff and its before/after table, and the `seen` value that names them.
    Show { id: i64 },
    /// Apply a proposal: its files are written atomically and committed if the config folder is
    /// a git working tree. The running processes reload the catalog (see `tools reload`).
    Approve {
        id: i64,
        /// Needed for a proposal that breaks a case that passes today.
        #[arg(long)]
        confirm_regressions: bool,
        /// The `seen` value `repair show` printed: a proposal whose diff or table changed since
        /// is refused (REPAIR_CHANGED), never applied unread.
        #[arg(long)]
        seen: Option<String>,
    },
    /// Reject a proposal; its files are never touched.
    Reject {
        id: i64,
        #[arg(long)]
        reason: String,
    },
    /// Put an applied repair's files back as they were before it.
    Rollback { id: i64 },
}

fn usage(e: impl std::fmt::Display) -> Failure {
    Failure::usage(e.to_string())
}

fn runtime(e: impl std::fmt::Display) -> Failure {
    Failure::runtime(e)
}

fn cases_path(gatehouse: &Gatehouse, file: Option<&PathBuf>) -> PathBuf {
    file.cloned().unwrap_or_else(|| gatehouse.config.dir.join(&gatehouse.config.settings.evals.cases_file))
}

fn workspace(gatehouse: &Gatehouse) -> Workspace {
    Workspace { live: gatehouse.tools.catalog(), ..gatehouse.cycle.workspace.clone() }
}

pub async fn eval(cfg: LoadedConfig, files: ToolFiles, cmd: &EvalCommand) -> Result<(), Failure> {
    with_cached_tools(cfg, files, async |gatehouse| eval_with(gatehouse, cmd).await).await
}

async fn eval_with(gatehouse: &Gatehouse, cmd: &EvalCommand) -> Result<(), Failure> {
    let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
    match cmd {
        EvalCommand::Add(add) => {
            let mut expect: Expect = add.expect.parse().map_err(usage)?;
            if !add.args.is_empty() {
                let Expect::Tool { args, .. } = &mut expect else {
                    return Err(usage("EVAL_ARGS_NEED_TOOL: --arg says which arguments of a tool call matter; give --expect tool:NAME"));
                };
                for pair in &add.args {
                    let (key, value) = pair.split_once('=').filter(|(k, _)| !k.trim().is_empty()).ok_or_else(|| usage(format!("EVAL_ARG_INVALID: {pair:?} is not KEY=VALUE")))?;
                    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
                    args.insert(key.trim().to_string(), value);
                }
            }
            let case = match (add.from_trace, &add.message) {
                (Some(trace), _) => findings::case_from_trace(&mut conn, trace, expect, Origin { kind: "trace".into(), ..Origin::default() }, gatehouse.config.settings.lane.planner_recent_turns, &gatehouse.tools.catalog().audit.pii_fields).await.map_err(usage)?,
                (None, Some(message)) => {
                    let contexts = read_contexts(add.situation.context.as_deref())?;
                    let (actor, chat_type) = (add.situation.actor.role(), add.situation.chat_type.kind());
                    let name = case::manual_name(message, actor, chat_type, &expect);
                    Case {
                        name,
                        message: message.clone(),
                        actor,
                        chat_type,
                        contexts,
                        memory_summary: None,
                        clarification: None,
                        expect,
                        origin: Origin { kind: "manual".into(), ..Origin::default() },
                        recorded: Vec::new(),
                    }
                }
                (None, None) => return Err(usage("give --message or --from-trace")),
            };
            let id = store::upsert_case(&mut conn, &case.to_row()).await.map_err(runtime)?;
            println!("case {} (#{id}) expects {}", case.name, case.expect);
        }
        EvalCommand::List { json } => {
            let cases = findings::cases(&mut conn).await.map_err(runtime)?;
            if cases.is_empty() && !json {
                println!("no eval cases; add one with `gatehouse eval add`, or mark a trace wrong on the console's Traces page");
            }
            for c in cases {
                if *json {
                    println!("{}", serde_json::to_string(&c).map_err(runtime)?);
                } else {
                    println!("{}\t{}\t{}\t{}\t{}\t{:?}", c.name, c.expect, c.actor.as_str(), c.chat_type.as_str(), c.origin.kind, c.message);
                }
            }
        }
        EvalCommand::Run { live, json } => {
            let cases = findings::cases(&mut conn).await.map_err(runtime)?;
            drop(conn);
            let judge = workspace(gatehouse).judge().map_err(runtime)?;
            let model = live.then(|| gatehouse.model.clone());
            let mut results = Vec::new();
            for case in &cases {
                results.push(judge.judge(case, model.clone()).await);
            }
            print_results(&results, *json)?;
            let failed = results.iter().filter(|r| !r.pass()).count();
            if failed > 0 {
                return Err(Failure::runtime(format!("{failed} of {} case(s) failed", results.len())));
            }
        }
        EvalCommand::Export { file } => {
            let path = cases_path(gatehouse, file.as_ref());
            let cases = findings::cases(&mut conn).await.map_err(runtime)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| runtime(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::write(&path, case::to_jsonl(&cases)).map_err(|e| runtime(format!("cannot write {}: {e}", path.display())))?;
            println!("{} case(s) written to {}", cases.len(), path.display());
        }
        EvalCommand::Import { file } => {
            let path = cases_path(gatehouse, file.as_ref());
            let text = std::fs::read_to_string(&path).map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
            let cases = case::parse_jsonl(&text).map_err(|errors| usage(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")))?;
            for c in &cases {
                store::upsert_case(&mut conn, &c.to_row()).await.map_err(runtime)?;
            }
            println!("{} case(s) imported from {}", cases.len(), path.display());
        }
        EvalCommand::Remove { name } => {
            if !store::delete_case(&mut conn, name).await.map_err(runtime)? {
                return Err(usage(format!("EVAL_CASE_NOT_FOUND: there is no case {name:?}")));
            }
            println!("case {name} removed");
        }
    }
    Ok(())
}

fn mark(pass: bool) -> &'static str {
    if pass { "pass" } else { "FAIL" }
}

fn print_results(results: &[CaseResult], json: bool) -> Result<(), Failure> {
    if json {
        for r in results {
            println!("{}", serde_json::to_string(r).map_err(runtime)?);
        }
        return Ok(());
    }
    if results.is_empty() {
        println!("no eval cases; add one with `gatehouse eval add`, or mark a trace wrong on the console's Traces page");
        return Ok(());
    }
    println!("{:<6} {:<28} {:<24} {:<10} {:<10} why", "result", "case", "expect", "detector", "plan");
    for r in results {
        let plan = r.plan.as_ref().map_or("-", |p| mark(p.pass));
        let why = if !r.detector.pass { r.detector.why.as_str() } else { r.plan.as_ref().map_or("", |p| p.why.as_str()) };
        println!("{:<6} {:<28} {:<24} {:<10} {:<10} {why}", mark(r.pass()), r.name, r.expect, mark(r.detector.pass), plan);
    }
    let passed = results.iter().filter(|r| r.pass()).count();
    println!("{passed} of {} case(s) pass", results.len());
    Ok(())
}

pub async fn repair(cfg: LoadedConfig, files: ToolFiles, cmd: &RepairCommand) -> Result<(), Failure> {
    with_cached_tools(cfg, files, async |gatehouse| repair_with(gatehouse, cmd).await).await
}

async fn repair_with(gatehouse: &Gatehouse, cmd: &RepairCommand) -> Result<(), Failure> {
    let cli = Decider { name: "cli".into(), login: "cli".into(), ..Decider::default() };
    let dir = gatehouse.config.dir.clone();
    match cmd {
        RepairCommand::Propose => {
            let report = gatehouse.cycle.run().await.map_err(runtime)?;
            println!("{}", report.summary());
        }
        RepairCommand::List { json } => {
            let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
            let rows = store::list_repairs(&mut conn, 200).await.map_err(runtime)?;
            if rows.is_empty() && !json {
                println!("no repairs proposed; `gatehouse repair propose` proposes them for failing eval cases");
            }
            for r in rows {
                if *json {
                    let line = serde_json::json!({ "id": r.id, "state": r.state, "strategy": r.strategy, "summary": r.summary, "fixes": r.fixes, "regressions": r.regressions, "created_at": r.created_at, "decided_by": r.decided_by, "reason": r.reason });
                    println!("{line}");
                } else {
                    println!("#{}\t{}\t{} fixed, {} regressed\t{}", r.id, r.state, r.fixes, r.regressions, r.summary);
                }
            }
        }
        RepairCommand::Show { id } => {
            let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
            let row = store::get_repair(&mut conn, *id).await.map_err(runtime)?.ok_or_else(|| usage(format!("REPAIR_NOT_FOUND: there is no repair {id}")))?;
            println!("repair #{} ({}): {}\nseen: {}\n", row.id, row.state, row.summary, repairs::fingerprint(&row));
            print!("{}", row.diff);
            println!("\n{:<28} {:<24} {:<34} after", "case", "expect", "before");
            for t in repairs::table_of(&row) {
                let flag = if t.regressed() {
                    "  REGRESSION"
                } else if t.fixed() {
                    "  fixed"
                } else {
                    ""
                };
                let before = format!("{} {}", mark(t.before_pass), t.before);
                println!("{:<28} {:<24} {before:<34} {} {}{flag}", t.case, t.expect, mark(t.after_pass), t.after);
            }
        }
        RepairCommand::Approve { id, confirm_regressions, seen } => {
            let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
            let row = repairs::approve(&mut conn, &workspace(gatehouse), *id, &cli, *confirm_regressions, seen.as_deref()).await.map_err(decision)?;
            // The reload needs connections of its own (a pool of one would wait for this one).
            drop(conn);
            println!("repair #{} applied: {}. {}", row.id, row.summary, tell_processes(gatehouse).await);
        }
        RepairCommand::Reject { id, reason } => {
            let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
            repairs::reject(&mut conn, &dir, *id, &cli, reason).await.map_err(decision)?;
            println!("repair #{id} rejected");
        }
        RepairCommand::Rollback { id } => {
            let mut conn = gatehouse.db.pool.acquire().await.map_err(runtime)?;
            repairs::rollback(&mut conn, &dir, *id, &cli).await.map_err(decision)?;
            drop(conn);
            println!("repair #{id} rolled back. {}", tell_processes(gatehouse).await);
        }
    }
    Ok(())
}

/// A refused decision is the caller's mistake (exit 2); a failure to write is the machine's.
fn decision(e: repairs::RepairError) -> Failure {
    match e {
        repairs::RepairError::File(_) | repairs::RepairError::Db(_) => Failure::runtime(e),
        _ => Failure::usage(e.to_string()),
    }
}

/// After a repair changed the tool files: every running process reloads them (as `gatehouse
/// tools reload` has them do), said in words for the command's output.
async fn tell_processes(gatehouse: &Gatehouse) -> String {
    let every = humantime::format_duration(gatehouse.config.settings.jobs.poll_interval);
    match gatehouse.reloads.reload().await {
        Ok(r) if r.told_others => format!("Every running Gatehouse process reloads its catalog within {every}."),
        Ok(_) => "The running processes could not be told to reload (the log says why): run `gatehouse tools reload`.".into(),
        Err(e) => format!("The catalog was not reloaded, so the running processes keep the previous one: {e}"),
    }
}
