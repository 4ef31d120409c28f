//! `gatehouse tools` and `gatehouse mcp`: the catalog, calls through the checkpoint, MCP
//! servers and their quarantine.

use std::path::Path;

use server::{
    approvals::{CONSOLE, Requester},
    config::LoadedConfig,
    lane::{
        detector::{Index, RecentContext},
        tool_docs,
    },
    tools::{
        CallContext, ToolCall, ToolFiles,
        checkpoint::Checked,
        mcp::{Answer, AuditActor, McpError, Reviewed},
    },
};

use super::{Failure, LaneDetect, McpCommand, ToolsCommand, build, with_cached_tools};

pub async fn tools(cfg: LoadedConfig, files: ToolFiles, cmd: &ToolsCommand) -> Result<(), Failure> {
    match cmd {
        ToolsCommand::List => {
            let tools_path = cfg.dir.join("tools.toml");
            let gatehouse = build(cfg, files).await?;
            let (checkpoint, mcp) = (&gatehouse.tools, &gatehouse.mcp);
            mcp.load_cached().await.map_err(Failure::runtime)?;
            let catalog = checkpoint.catalog();
            if catalog.is_empty() {
                println!("no tools in {} or from MCP servers", tools_path.display());
            }
            for t in catalog.all() {
                let s = &t.spec;
                println!(
                    "{}\t{:?}\t{:?}\t{:?}\t{:?}\t{}\t{}",
                    s.name, s.provider, s.audience, s.risk, s.approval, if s.enabled { "enabled" } else { "disabled" }, &t.version[..19]
                );
            }
            gatehouse.db.close().await;
            Ok(())
        }
        ToolsCommand::Reload => {
            let gatehouse = build(cfg, files).await?;
            gatehouse.mcp.load_cached().await.map_err(Failure::runtime)?;
            let reloaded = gatehouse.reloads.reload().await;
            gatehouse.db.close().await;
            // A file with problems was refused when the config loaded (exit 2); one that changed
            // since is refused here, and nobody reloads.
            let report = reloaded.map_err(|e| Failure::runtime(format!("not reloaded: {e}")))?;
            if !report.told_others {
                return Err(Failure::runtime("the tool files are fine, but the running processes could not be told to reload them (the database refused the write; the log says why)"));
            }
            let every = humantime::format_duration(gatehouse.config.settings.jobs.poll_interval);
            println!("{} tools checked; every running Gatehouse process on this database reloads its tool files within {every}", report.tools);
            Ok(())
        }
        ToolsCommand::Call(c) => {
            let args: serde_json::Value = serde_json::from_str(&c.args).map_err(|e| Failure::usage(format!("--args is not JSON: {e}")))?;
            let gatehouse = build(cfg, files).await?;
            let (checkpoint, mcp) = (&gatehouse.tools, &gatehouse.mcp);
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
                let bound = gatehouse.tool_files.mcp.get(&server).map_or(std::time::Duration::from_secs(20), |s| s.discovery.timeout);
                if let Err(e) = mcp.wait_connected(&server, bound).await {
                    tracing::warn!(mcp.server = %server, error = %e, "MCP server not connected; the call will say so");
                }
            }
            let ctx = CallContext {
                actor: c.actor.role(),
                chat_type: c.chat_type.kind(),
                trace_id: None,
                chat_id: Some("cli".into()),
                sender_id: None,
                correlation_id: uuid::Uuid::new_v4().to_string(),
                approved: None,
            };
            let call = ToolCall { name: c.name.clone(), args };
            // A call that needs an owner becomes an approval request instead of failing.
            if let Ok(Checked { needs_approval: Some(_), .. }) = checkpoint.check(&call, &ctx) {
                let who = Requester {
                    actor: ctx.actor,
                    channel: CONSOLE.into(),
                    chat_kind: ctx.chat_type,
                    chat_id: "cli".into(),
                    sender: "cli".into(),
                    message_id: format!("cli-{}", ctx.correlation_id),
                    request: format!("gatehouse tools call {}", c.name),
                    correlation_id: ctx.correlation_id.clone(),
                };
                let requested = gatehouse.approvals.request(&call, &who, None, None).await;
                mcp.shutdown().await;
                gatehouse.db.close().await;
                let r = requested.map_err(Failure::runtime)?;
                println!("{}", serde_json::json!({ "approval": { "id": r.id, "state": "pending", "reused": r.reused, "expires_at": r.expires_at } }));
                eprintln!("{} needs an owner's approval: run `gatehouse approvals approve {}` (or use the console's Approvals page)", c.name, r.id);
                return Ok(());
            }
            let result = checkpoint.execute(call, &ctx).await;
            checkpoint.audit().flush().await;
            mcp.shutdown().await;
            gatehouse.db.close().await;
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

pub async fn mcp(cfg: LoadedConfig, files: ToolFiles, cmd: &McpCommand) -> Result<(), Failure> {
    let mcp_path = cfg.dir.join("mcp.toml");
    let gatehouse = build(cfg, files).await?;
    let (mcp, servers) = (&gatehouse.mcp, &gatehouse.tool_files.mcp);
    let fail = |e: McpError| match e {
        McpError::UnknownServer(_) | McpError::UnknownTool(_) | McpError::DefinitionChanged(_) | McpError::FormUnknown(_) | McpError::FormClosed(_) | McpError::FormInvalid(_) => {
            Failure::usage(e.to_string())
        }
        other => Failure::runtime(other),
    };
    let cli_owner = AuditActor { owner_id: None, login: Some("cli".into()), ip: None };
    let when = |ms: Option<i64>| ms.map_or_else(|| "never".to_string(), |ms| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)).to_string());
    let result = async {
        match cmd {
            McpCommand::List => {
                mcp.load_cached().await.map_err(fail)?;
                if servers.servers.is_empty() {
                    println!("no MCP servers in {}", mcp_path.display());
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
                    // The whole hash: `mcp approve --hash` wants the definition the owner saw.
                    println!("{}	{}	{}	{}{listed}", t.catalog_name, t.state, if t.usable { "offered" } else { "not offered" }, t.definition_hash);
                }
            }
            McpCommand::Refresh { server } => {
                mcp.start().await.map_err(fail)?;
                let bound = servers.get(server).map_or(std::time::Duration::from_secs(20), |s| s.discovery.timeout);
                let outcome = match mcp.wait_connected(server, bound).await {
                    Ok(()) => mcp.live(server).map_err(fail)?.last_discovery.ok_or_else(|| Failure::runtime("no discovery result")),
                    Err(e) => Err(fail(e)),
                };
                mcp.shutdown().await;
                let report = outcome?;
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            }
            McpCommand::Approve { tool, hash } => {
                let t = mcp.approve(tool, reviewed(hash), &cli_owner).await.map_err(fail)?;
                println!("{} approved ({})", t.catalog_name, t.definition_hash);
            }
            McpCommand::Reject { tool, hash } => {
                let t = mcp.reject(tool, reviewed(hash), &cli_owner).await.map_err(fail)?;
                println!("{} rejected", t.catalog_name);
            }
            McpCommand::Login { server } => {
                let url = mcp.begin_login(server, None, &cli_owner).await.map_err(fail)?;
                println!("{url}");
                eprintln!(
                    "Open the address above in a browser and allow access. The browser then lands on {}?code=...; paste that whole address here and press Enter:",
                    mcp.callback_url()
                );
                let line = tokio::task::spawn_blocking(|| {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line).map(|_| line)
                })
                .await
                .map_err(Failure::runtime)?
                .map_err(Failure::runtime)?;
                if line.trim().is_empty() {
                    return Err(Failure::usage("no address given; the login was not finished"));
                }
                let server = mcp.finish_login_url(&line, &cli_owner).await.map_err(fail)?;
                println!("{server} connected");
            }
            McpCommand::Forms => {
                for f in mcp.forms().await.map_err(fail)? {
                    println!("form {}	server {}	expires {}", f.id, f.server, when(Some(f.expires_at)));
                    println!("  message from the server (untrusted): {:?}", f.message);
                    for field in &f.fields {
                        let default = field.default.as_ref().map(|d| format!(" default={d}")).unwrap_or_default();
                        println!("  {}	{}{}{default}", field.name, field.kind.label(), if field.required { " required" } else { "" });
                    }
                }
            }
            McpCommand::Answer { id, decision, values } => {
                let answer = match decision {
                    super::FormDecision::Accept => {
                        let values = match values.as_deref() {
                            Some(text) => serde_json::from_str(text).map_err(|e| Failure::usage(format!("--values is not a JSON object: {e}")))?,
                            None => serde_json::Map::new(),
                        };
                        Answer::Accept(values)
                    }
                    super::FormDecision::Decline => Answer::Decline,
                    super::FormDecision::Cancel => Answer::Cancel,
                };
                let state = mcp.answer_form(*id, answer, &cli_owner).await.map_err(fail)?;
                println!("form {id} {state}");
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
    gatehouse.db.close().await;
    result
}

/// `--hash` binds the decision to the definition the owner looked at (`mcp tools` shows it);
/// without it, the current definition is decided on and its hash printed.
fn reviewed(hash: &Option<String>) -> Reviewed<'_> {
    hash.as_deref().map_or(Reviewed::Current, Reviewed::Definition)
}

/// `gatehouse lane detect`: the detection the server would make, over the catalog it would use
/// (the tool files and the MCP tools last discovered), replayable with recorded contexts and as
/// the answer to a clarifying question.
pub async fn lane_detect(cfg: LoadedConfig, files: ToolFiles, args: &LaneDetect) -> Result<(), Failure> {
    let recent = read_contexts(args.situation.context.as_deref())?;
    let settings = cfg.settings.lane.detector.clone();
    let detection = with_cached_tools(cfg, files, async |gatehouse| {
        let index = Index::build(tool_docs(&gatehouse.tools.catalog()), settings);
        let asked = (!args.answering.is_empty()).then_some(args.answering.as_slice());
        Ok(index.detect_answering(&args.text, args.situation.actor.role(), args.situation.chat_type.kind(), &recent, asked))
    })
    .await?;
    println!("{}", serde_json::to_string_pretty(&detection).map_err(Failure::runtime)?);
    Ok(())
}

/// The recent tool contexts of a replayed message: `--context FILE`, a JSON array of
/// `{"tool", "args", "summary", "entities", "age_secs"}`, newest first; none without it.
pub(super) fn read_contexts(path: Option<&Path>) -> Result<Vec<RecentContext>, Failure> {
    let Some(path) = path else { return Ok(Vec::new()) };
    let text = std::fs::read_to_string(path).map_err(|e| Failure::usage(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Failure::usage(format!("{} is not a JSON array of tool contexts: {e}", path.display())))
}
