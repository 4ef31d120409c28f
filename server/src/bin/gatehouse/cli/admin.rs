//! `gatehouse check-config`, `migrate`, `jobs` and `owner`.

use std::{
    io::{IsTerminal, Read},
    path::Path,
};

use secrecy::SecretString;
use server::{
    bootstrap,
    config::LoadedConfig,
    db,
    owners::{self, ValidOwner},
    tools::ToolFiles,
    web,
};

use super::{Failure, JobsCommand, OwnerCommand, build, connect};

/// Reports every problem of every config file at once, or the effective configuration.
pub fn check_config(path: &Path) -> Result<(), Failure> {
    let (cfg, files) = match bootstrap::load_config(path) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("{e}");
            return Err(Failure::usage(format!("{} is not valid", path.display())));
        }
    };
    // What `serve` and `worker` would refuse is not valid here either.
    if cfg.settings.server.strict
        && let Some(d) = server::llm::degraded(&cfg.settings, &cfg.secrets)
    {
        let problem = server::config::Problem::new("server.strict", "server.strict or GATEHOUSE_STRICT", format!("strict mode needs {} for the {} provider, which is not set", d.variable, d.provider));
        eprintln!("{}", server::config::ConfigError(vec![problem]));
        return Err(Failure::usage(format!("{} is not valid", path.display())));
    }
    println!("config: {} (valid)", cfg.path.display());
    for entry in web::console::effective_entries(&cfg.settings) {
        println!("  {} = {}", entry.key, entry.value);
    }
    if let Some(warning) = cfg.settings.approvals.window_warning(&cfg.settings.whatsapp.window_template) {
        println!("  note: {warning}.");
    }
    if cfg.settings.server.public_url.is_empty() {
        println!("  note: server.public_url is empty, so links sent to owners on WhatsApp (repair proposals) point at {}, which a phone cannot open; set it to the console's address.", cfg.settings.server.console_url());
    }
    println!("tools: {} in the catalog (approval mode {:?})", files.catalog.len(), files.catalog.approval_mode);
    for name in files.catalog.without_phrases() {
        println!("  note: {name} has no triggers or aliases. {}", app::pages::tools::NO_PHRASES);
    }
    println!("mcp servers: {} in {}", files.mcp.servers.len(), cfg.dir.join("mcp.toml").display());
    for s in &files.mcp.servers {
        println!("  {} ({}, {:?}, {}) {}", s.id, s.transport.kind(), s.trust, if s.enabled { "enabled" } else { "disabled" }, s.transport.target());
    }
    println!("secrets (from the environment; values never shown):");
    for (name, set) in cfg.secrets.presence() {
        println!("  {name}: {}", if set { "set" } else { "unset" });
    }
    if let Some(problem) = server::owners::setup_token_problem(cfg.secrets.setup_token.as_ref()) {
        println!("  note: {problem}.");
    }
    Ok(())
}


pub async fn migrate(cfg: &LoadedConfig) -> Result<(), Failure> {
    let db = connect(cfg).await?;
    let applied = db.applied_migrations().await.map_err(Failure::runtime)?;
    println!("{} migration(s) applied on {}; the database is current.", applied.len(), db.backend.as_str());
    for m in applied {
        println!("  {:04} {}", m.version, m.description);
    }
    db.close().await;
    Ok(())
}

pub async fn jobs(cfg: LoadedConfig, files: ToolFiles, cmd: &JobsCommand) -> Result<(), Failure> {
    match cmd {
        JobsCommand::Enqueue(a) => {
            let args: serde_json::Value = serde_json::from_str(&a.args).map_err(|e| Failure::usage(format!("--args is not JSON: {e}")))?;
            if !args.is_object() {
                return Err(Failure::usage("--args must be a JSON object"));
            }
            let gatehouse = build(cfg, files).await?;
            // A kind this build has no worker for would wait unclaimed (see `Worker`'s claim).
            let kinds = gatehouse.registry.kinds();
            if !kinds.contains(&a.kind) {
                return Err(Failure::usage(format!("unknown job kind {:?}; this build runs: {}", a.kind, kinds.join(", "))));
            }
            let delay_ms = a.delay.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            // Any kind of this build, by name: the queue fills in this deployment's queue and attempts.
            let job = db::jobs::NewJob {
                kind: a.kind.clone(),
                dedupe_key: a.dedupe_key.clone(),
                args,
                max_attempts: a.max_attempts.map_or(0, i64::from),
                scheduled_at: delay_ms.map(|d| db::now_ms().saturating_add(d)),
                correlation_id: uuid::Uuid::new_v4().to_string(),
                ..Default::default()
            };
            let queued = gatehouse.jobs.enqueue(&job).await.map_err(Failure::runtime)?;
            let how = if queued.deduplicated { "already queued" } else { "enqueued" };
            println!("job {} {how} ({})", queued.job.id, queued.job.state);
            gatehouse.db.close().await;
        }
        JobsCommand::List(a) => {
            let state = match &a.state {
                Some(s) => Some(db::jobs::JobState::parse(s).ok_or_else(|| Failure::usage(format!("unknown state {s:?}")))?),
                None => None,
            };
            let db = connect(&cfg).await?;
            let mut conn = db.pool.acquire().await.map_err(Failure::runtime)?;
            let filter = db::jobs::JobFilter { state, ..Default::default() };
            for j in db::jobs::list(&mut conn, &filter, a.limit).await.map_err(Failure::runtime)? {
                let attempts = app::pages::jobs::attempts(j.attempt, j.max_attempts, "/");
                println!("{}\t{}\t{}\t{attempts}\t{}", j.id, j.kind, j.state, j.last_error_code.unwrap_or_default());
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

pub async fn owner(cfg: &LoadedConfig, cmd: &OwnerCommand) -> Result<(), Failure> {
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
