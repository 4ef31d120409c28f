//! The `gatehouse` binary: exit codes, config errors, secrets never printed, owner commands,
//! migration failures, JSON logs and graceful shutdown.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const BIN: &str = env!("CARGO_BIN_EXE_gatehouse");
const SECRET: &str = "sk-ant-test-7f3a9c1e-never-print-me";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Out {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn gatehouse");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A config file (the shipped one plus `extra`) pointing at a fresh SQLite file.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml")).expect("shipped config");
    let db = dir.join("data/gatehouse.db");
    let text = shipped.replace("url = \"sqlite://data/gatehouse.db\"", &format!("url = \"sqlite://{}\"", db.display())) + extra;
    let path = dir.join("gatehouse.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// [`config`], with the shipped tool files beside it.
fn config_with_tools(dir: &Path) -> PathBuf {
    let path = config(dir, "");
    for name in ["tools.toml", "connectors.toml"] {
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/").to_string() + name, dir.join(name)).expect("copy tool files");
    }
    path
}

#[test]
fn help_for_every_command_and_bad_usage() {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["migrate", "--help"],
        vec!["check-config", "--help"],
        vec!["owner", "--help"],
        vec!["owner", "add", "--help"],
        vec!["owner", "reset-password", "--help"],
        vec!["owner", "list", "--help"],
    ] {
        let out = run(&args, &[], None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.all());
        assert!(out.stdout.contains("Usage"), "{args:?}");
    }
    let out = run(&["frobnicate"], &[], None);
    assert_eq!(out.code, 2, "{}", out.all());
    let out = run(&["owner", "add"], &[], None);
    assert_eq!(out.code, 2, "missing --login: {}", out.all());
}

#[test]
fn shipped_config_is_valid_and_secrets_are_never_printed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("ANTHROPIC_API_KEY", SECRET), ("WHATSAPP_APP_SECRET", SECRET)], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("ANTHROPIC_API_KEY: set"), "{}", out.stdout);
    assert!(out.stdout.contains("OPENAI_API_KEY: unset"), "{}", out.stdout);
    assert!(!out.all().contains(SECRET), "secret printed");
    assert!(!out.stdout.contains("approvals.ttl is"), "the shipped ttl fits WhatsApp's window: {}", out.stdout);
    // A request that outlives the person's 24-hour window could end unheard: said, not refused.
    let day = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE__APPROVALS__TTL", "24h"), ("ANTHROPIC_API_KEY", SECRET)], None);
    assert_eq!(day.code, 0, "{}", day.all());
    assert!(day.stdout.contains("note: approvals.ttl is 1day") && day.stdout.contains("whatsapp.window_template"), "{}", day.stdout);
}

#[test]
fn every_config_problem_is_reported_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "\n[surprise]\nkey = 1\n");
    let text = std::fs::read_to_string(&path).expect("read").replace("strict_port = false", "strict_port = \"sometimes\"").replace("login_max_failures = 5", "login_max_failures = 5\nlogin_max_failure = 3");
    std::fs::write(&path, text).expect("write");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE__SERVER__ADDR", "not-an-address"), ("ANTHROPIC_API_KEY", SECRET)], None);
    assert_eq!(out.code, 2, "{}", out.all());
    let err = out.stderr;
    let file = path.display().to_string();
    assert!(err.contains(&format!("CONFIG_KEY_UNKNOWN surprise.key: unknown key (from {file})")), "{err}");
    assert!(err.contains("auth.login_max_failure: unknown key; did you mean `auth.login_max_failures`?"), "{err}");
    assert!(err.contains("CONFIG_VALUE_INVALID server.strict_port: invalid type") && err.contains(&file), "{err}");
    assert!(err.contains("server.addr") && err.contains("environment variable GATEHOUSE__SERVER__ADDR"), "{err}");
    assert!(!err.contains(SECRET));
}

/// A job of a kind this build has no worker for would wait unclaimed: refused by name, with
/// the kinds it runs; one it runs is queued.
#[test]
fn jobs_enqueue_takes_only_kinds_this_build_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_with_tools(dir.path());
    let path = path.to_str().expect("utf8");
    let out = run(&["--config", path, "jobs", "enqueue", "system.ecko"], &[], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("unknown job kind \"system.ecko\"") && out.stderr.contains("system.echo"), "{}", out.stderr);
    let out = run(&["--config", path, "jobs", "enqueue", "system.echo", "--args", "{\"message\":\"hi\"}"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("enqueued"), "{}", out.stdout);
}

/// A reason's words can be set from the environment like any other setting: its code stays in
/// capitals (figment's `Env` lower-cases keys, and a lower-cased code is no code).
#[test]
fn a_reason_code_can_be_overridden_from_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE__APPROVALS__REASONS__APPROVAL_RISK", "it can change money"), ("ANTHROPIC_API_KEY", SECRET)], None);
    assert_eq!(out.code, 0, "{}", out.all());
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE__APPROVALS__REASONS__APPROVAL_RISK", " "), ("ANTHROPIC_API_KEY", SECRET)], None);
    assert_eq!(out.code, 2, "the override is read: {}", out.all());
    assert!(out.stderr.contains("approvals.reasons.APPROVAL_RISK: must not be empty"), "{}", out.stderr);
}

/// What `serve` would refuse, `check-config` does not call valid: strict mode without the
/// provider's key. An override whose prefix is one underscore short is named with the name it
/// was meant to have (it used to be skipped, and the server started on the shipped database).
#[test]
fn check_config_refuses_what_serve_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE_STRICT", "1"), ("ANTHROPIC_API_KEY", "")], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("CONFIG_VALUE_INVALID server.strict") && out.stderr.contains("ANTHROPIC_API_KEY"), "{}", out.stderr);
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE_DATABASE__URL", "postgres://db.example/gh")], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("CONFIG_KEY_UNKNOWN") && out.stderr.contains("did you mean GATEHOUSE__DATABASE__URL?"), "{}", out.stderr);
}

/// The keys operators and tests set from the environment. A phone number id is all digits and a
/// model name may be: they stay text, while number and bool settings still read digits and
/// `true` from a variable.
#[test]
fn environment_overrides_reach_every_documented_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let vars = [
        ("GATEHOUSE__WHATSAPP__GRAPH_BASE_URL", "http://127.0.0.1:9/graph"),
        ("GATEHOUSE__WHATSAPP__GRAPH_VERSION", "v99.0"),
        ("GATEHOUSE__WHATSAPP__PHONE_NUMBER_ID", "106540352242922"),
        ("GATEHOUSE__LLM__PROVIDER", "openai"),
        ("GATEHOUSE__LLM__ANTHROPIC__BASE_URL", "http://127.0.0.1:8/anthropic"),
        ("GATEHOUSE__LLM__OPENAI__BASE_URL", "http://127.0.0.1:7/v1"),
        ("GATEHOUSE__MODELS__CHAT", "chat-model-a"),
        ("GATEHOUSE__MODELS__PLANNER", "planner-model-b"),
        ("GATEHOUSE__MODELS__SUMMARIZER", "summarizer-model-c"),
        ("GATEHOUSE__MODELS__COMPACTION", "2025"),
        ("GATEHOUSE__DATABASE__MAX_CONNECTIONS", "3"),
        ("GATEHOUSE__SERVER__STRICT_PORT", "true"),
    ];
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &vars, None);
    assert_eq!(out.code, 0, "{}", out.all());
    for line in [
        "whatsapp.graph_base_url = http://127.0.0.1:9/graph",
        "whatsapp.graph_version = v99.0",
        "whatsapp.phone_number_id = 106540352242922",
        "llm.provider = openai",
        "llm.anthropic.base_url = http://127.0.0.1:8/anthropic",
        "llm.openai.base_url = http://127.0.0.1:7/v1",
        "models.chat = chat-model-a",
        "models.planner = planner-model-b",
        "models.summarizer = summarizer-model-c",
        "models.compaction = 2025",
        "database.max_connections = 3",
        "server.strict_port = true",
    ] {
        assert!(out.stdout.contains(line), "missing {line:?} in:\n{}", out.stdout);
    }
}

#[test]
fn tool_catalog_problems_are_reported_with_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "\n[nope]\nx = 1\n");
    std::fs::write(
        dir.path().join("tools.toml"),
        "[[tool]]\nname = \"bad name\"\ntitle = \"t\"\ndescription = \"d\"\nprovider = \"connector\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = { type = \"object\" }\n",
    )
    .expect("write tools");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("nope.x: unknown key"), "{}", out.stderr);
    assert!(out.stderr.contains("tool[0] (bad name).name") && out.stderr.contains("tools.toml"), "{}", out.stderr);
}

/// A builtin tool naming a handler this build does not have, and an always-offered name no
/// tool has, are config problems: the one would fail every call, the other be offered to nobody.
#[test]
fn unknown_handlers_and_always_offered_names_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_with_tools(dir.path());
    let text = std::fs::read_to_string(&path).expect("config").replace("always_offered = []", "always_offered = [\"web_fetch\", \"page_fetch\", \"docs__search\"]");
    std::fs::write(&path, text).expect("write config");
    let tools = std::fs::read_to_string(dir.path().join("tools.toml")).expect("tools").replacen("handler = \"web_fetch\"", "handler = \"web_fetchh\"", 1);
    std::fs::write(dir.path().join("tools.toml"), tools).expect("write tools");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("tool (web_fetch).handler: names no builtin this build has"), "{}", out.stderr);
    assert!(out.stderr.contains("lane.always_offered: names \"page_fetch\""), "{}", out.stderr);
    assert!(!out.stderr.contains("\"web_fetch\", which") && !out.stderr.contains("docs__search"), "a file tool and an MCP tool are known: {}", out.stderr);
}

#[test]
fn check_config_notes_enabled_tools_the_detector_has_no_phrases_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tools.toml")).expect("shipped tools");
    let quiet = "\n[[tool]]\nname = \"page_reader\"\ntitle = \"Read a page\"\ndescription = \"Reads a public web page.\"\nprovider = \"builtin\"\nhandler = \"web_fetch\"\n\
                 operation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = { type = \"object\", required = [\"url\"], properties = { url = { type = \"string\" } } }\n";
    std::fs::write(dir.path().join("tools.toml"), format!("{shipped}{quiet}")).expect("write tools");
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("note: page_reader has no triggers or aliases"), "{}", out.stdout);
    // The shipped tools all have phrases.
    assert_eq!(out.stdout.matches("has no triggers or aliases").count(), 1, "{}", out.stdout);
}

/// Links sent to owners on WhatsApp are only as good as `server.public_url`: without it they
/// point at the listening address, and `check-config` says so.
#[test]
fn check_config_notes_an_empty_public_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let cfg = path.to_str().expect("utf8");
    let out = run(&["--config", cfg, "check-config"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("note: server.public_url is empty, so links sent to owners on WhatsApp (repair proposals) point at http://127.0.0.1:3000"), "{}", out.stdout);
    let out = run(&["--config", cfg, "check-config"], &[("GATEHOUSE__SERVER__PUBLIC_URL", "https://console.example")], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(!out.stdout.contains("server.public_url is empty"), "{}", out.stdout);
}

#[test]
fn tools_list_and_call_go_through_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tools.toml"), dir.path().join("tools.toml")).expect("copy tools");
    let cfg = path.to_str().expect("utf8");
    let out = run(&["--config", cfg, "tools", "list"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("web_fetch\tBuiltin\tPublic\tLow"), "{}", out.stdout);

    let out = run(&["--config", cfg, "tools", "call", "no_such_tool"], &[], None);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stdout.contains("TOOL_UNKNOWN"), "{}", out.stdout);
    // Loopback is refused before any connection is made.
    let out = run(&["--config", cfg, "tools", "call", "web_fetch", "--args", r#"{"url":"http://127.0.0.1:9/admin"}"#, "--as", "customer"], &[], None);
    assert_eq!(out.code, 1, "{}", out.all());
    // A refusal is the checkpoint's answer, with the guard's own code (not a provider failure).
    assert!(out.stdout.contains("FETCH_ADDRESS_FORBIDDEN") && !out.stdout.contains("TOOL_PROVIDER_ERROR"), "{}", out.stdout);
    let out = run(&["--config", cfg, "tools", "call", "web_fetch", "--args", r#"{"url":"http://example.com","extra":1}"#], &[], None);
    assert!(out.stdout.contains("TOOL_SCHEMA_INVALID"), "{}", out.stdout);
}

#[test]
fn bad_config_stops_serve_with_exit_code_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let out = run(&["--config", path.to_str().expect("utf8"), "serve"], &[("GATEHOUSE__DATABASE__MAX_CONNECTIONS", "many")], None);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("database.max_connections") && out.stderr.contains("GATEHOUSE__DATABASE__MAX_CONNECTIONS"), "{}", out.stderr);
    let missing = run(&["--config", "/nonexistent/gatehouse.toml", "serve"], &[], None);
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("config file not found"), "{}", missing.stderr);
}

#[test]
fn owner_commands_from_scripts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let cfg = path.to_str().expect("utf8");
    let out = run(&["--config", cfg, "owner", "list"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("no owners yet"));

    let add = ["--config", cfg, "owner", "add", "--login", "ada", "--name", "Ada Lovelace", "--whatsapp", "+15550001111", "--password-stdin"];
    let out = run(&add, &[], Some("a very long password\n"));
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(!out.all().contains("a very long password"));
    let out = run(&add, &[], Some("a very long password\n"));
    assert_eq!(out.code, 2, "duplicate login: {}", out.all());
    let out = run(&["--config", cfg, "owner", "add", "--login", "bob", "--name", "Bob", "--whatsapp", "+15550002222", "--password-stdin"], &[], Some("short\n"));
    assert_eq!(out.code, 2, "short password: {}", out.all());
    assert!(out.stderr.contains("at least 12"), "{}", out.stderr);
    let out = run(&["--config", cfg, "owner", "add", "--login", "bob", "--name", "Bob", "--whatsapp", "555", "--password-stdin"], &[], Some("a very long password\n"));
    assert_eq!(out.code, 2, "bad number: {}", out.all());

    let out = run(&["--config", cfg, "owner", "list"], &[], None);
    assert!(out.stdout.contains("ada\tAda Lovelace\t+15550001111"), "{}", out.stdout);

    let out = run(&["--config", cfg, "owner", "reset-password", "--login", "ada", "--password-stdin"], &[], Some("another long password\n"));
    assert_eq!(out.code, 0, "{}", out.all());
    let out = run(&["--config", cfg, "owner", "reset-password", "--login", "nobody", "--password-stdin"], &[], Some("another long password\n"));
    assert_eq!(out.code, 2, "{}", out.all());
    let out = run(&["--config", cfg, "owner", "reset-password", "--login", "ada"], &[], None);
    assert_eq!(out.code, 2, "no terminal and no --password-stdin: {}", out.all());
}

#[test]
fn migrate_is_idempotent_and_a_failing_migration_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let cfg = path.to_str().expect("utf8");
    let out = run(&["--config", cfg, "migrate"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("0001 foundation"), "{}", out.stdout);
    let again = run(&["--config", cfg, "migrate"], &[], None);
    assert_eq!(again.code, 0);
    assert!(!again.stderr.contains("migration applied"), "second run applies nothing: {}", again.stderr);

    // A database where the first migration cannot run: a table of the same name exists.
    let broken = tempfile::tempdir().expect("tempdir");
    let path = config(broken.path(), "");
    std::fs::create_dir_all(broken.path().join("data")).expect("mkdir");
    let db = broken.path().join("data/gatehouse.db");
    let status = Command::new("python3")
        .args(["-c", &format!("import sqlite3; c=sqlite3.connect({:?}); c.execute('CREATE TABLE owners (x INTEGER)'); c.commit()", db.display().to_string())])
        .status()
        .expect("python3 creates the conflicting table");
    assert!(status.success());
    let out = run(&["--config", path.to_str().expect("utf8"), "serve"], &[], None);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stderr.contains("migration 1 (foundation) failed"), "{}", out.stderr);
    assert!(out.stderr.contains("gatehouse migrate"), "hint: {}", out.stderr);
}

#[test]
fn strict_port_taken_is_a_runtime_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = run(&["--config", path.to_str().expect("utf8"), "serve"], &[("GATEHOUSE__SERVER__ADDR", &addr), ("GATEHOUSE__SERVER__STRICT_PORT", "true")], None);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stderr.contains("cannot listen"), "{}", out.stderr);
}

#[test]
fn serve_logs_json_with_request_ids_without_secrets_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    // Ports the system picks: one chosen here and bound later could be taken in between.
    let stderr = dir.path().join("serve.log");
    let mut child = Command::new(BIN)
        .args(["--config", path.to_str().expect("utf8"), "--log-format", "json", "serve"])
        .env("GATEHOUSE__SERVER__ADDR", "127.0.0.1:0")
        .env("GATEHOUSE__SERVER__METRICS_ADDR", "127.0.0.1:0")
        .env("GATEHOUSE__SERVER__STRICT_PORT", "true")
        // Read at start-up (the provider is anthropic, so Gatehouse still runs degraded).
        .env("OPENAI_API_KEY", SECRET)
        .env("ANTHROPIC_API_KEY", "")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("log file"))
        .spawn()
        .expect("spawn");
    // Where it listens, from the JSON lines it logged.
    let logged = |message: &str| {
        let text = std::fs::read_to_string(&stderr).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|l| l["message"] == message).and_then(|l| l["addr"].as_str().map(str::to_string))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (addr, metrics_addr) = loop {
        if let (Some(addr), Some(metrics)) = (logged("Gatehouse listening"), logged("metrics listening")) {
            break (addr, metrics);
        }
        assert!(Instant::now() < deadline && child.try_wait().expect("status").is_none(), "serve logged no addresses: {}", std::fs::read_to_string(&stderr).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!addr.ends_with(":0") && !metrics_addr.ends_with(":0") && addr != metrics_addr, "the bound ports are logged: {addr} {metrics_addr}");
    // What is built names the console where it listens (an OAuth login's redirect, owners'
    // links), not the configured port 0.
    let text = std::fs::read_to_string(&stderr).unwrap_or_default();
    let listening = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|l| l["message"] == "Gatehouse listening").expect("logged");
    assert_eq!(listening["links"].as_str(), Some(format!("http://{addr}").as_str()), "{listening}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered = None;
    while Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            answered = Some(text);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let answer = answered.expect("server answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let request_id = answer.lines().find_map(|l| l.strip_prefix("x-request-id: ")).expect("x-request-id header").trim().to_string();
    // server.metrics_addr: the metrics are there, and not beside the console.
    let get = |at: &str, path: &str| {
        let mut stream = std::net::TcpStream::connect(at).expect("connect");
        let _ = stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    };
    let scraped = get(&metrics_addr, "/metrics");
    assert!(scraped.starts_with("HTTP/1.1 200") && scraped.contains("gatehouse_uptime_seconds"), "{scraped}");
    assert!(get(&addr, "/metrics").starts_with("HTTP/1.1 404"), "/metrics is not on the console's address");

    // SIGHUP reloads the tool catalog; a broken file is refused and the old catalog kept.
    let tools = dir.path().join("tools.toml");
    std::fs::write(&tools, "approval_mode = \"ask\"\n").expect("write tools");
    let _ = Command::new("kill").args(["-HUP", &child.id().to_string()]).status();
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&tools, "approval_mode = \"nonsense\"\n").expect("write tools");
    let _ = Command::new("kill").args(["-HUP", &child.id().to_string()]).status();
    std::thread::sleep(Duration::from_millis(500));

    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0");
    let logs = std::fs::read_to_string(&stderr).expect("read logs");
    let lines: Vec<serde_json::Value> = logs.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(!lines.is_empty(), "JSON logs: {logs}");
    assert_eq!(lines.len(), logs.lines().count(), "every line is JSON: {logs}");
    assert!(logs.contains(&request_id), "request id {request_id} in the logs");
    assert!(logs.contains("degraded mode") && logs.contains("ANTHROPIC_API_KEY"), "one degraded-mode warning naming the variable");
    assert_eq!(logs.matches("degraded mode").count(), 1);
    assert!(logs.contains("shutdown signal received"));
    assert!(logs.contains("tool catalog reloaded"), "SIGHUP reload: {logs}");
    assert!(logs.contains("tool catalog reload failed; keeping the current catalog"), "bad file refused: {logs}");
    assert!(!logs.contains(SECRET), "secret in logs");
}

/// `gatehouse worker` reloads its catalog on SIGHUP as `serve` does, and goes on running (a
/// hangup without a handler would end it with its jobs' leases held).
#[test]
fn a_worker_reloads_its_catalog_on_sighup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_with_tools(dir.path());
    let stderr = dir.path().join("worker.log");
    let mut child = Command::new(BIN)
        .args(["--config", path.to_str().expect("utf8"), "--log-format", "json", "worker"])
        .env("ANTHROPIC_API_KEY", "")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("log file"))
        .spawn()
        .expect("spawn");
    let logs = || std::fs::read_to_string(&stderr).unwrap_or_default();
    let wait_for = |needle: &str, child: &mut std::process::Child| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !logs().contains(needle) {
            assert!(Instant::now() < deadline && child.try_wait().expect("status").is_none(), "waiting for {needle:?}: {}", logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("worker process starting", &mut child);
    let _ = Command::new("kill").args(["-HUP", &child.id().to_string()]).status();
    wait_for("SIGHUP: tool catalog reloaded", &mut child);
    assert!(child.try_wait().expect("status").is_none(), "still running after the hangup");
    // A reload made in another process (here `gatehouse tools reload`; the console's button
    // alike) is followed by the worker, which calls tools in its jobs.
    let out = run(&["--config", path.to_str().expect("utf8"), "tools", "reload"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("tools checked; every running Gatehouse process"), "{}", out.stdout);
    wait_for("following a reload in another process", &mut child);
    // A half-done edit of gatehouse.toml does not block a fix of the tool files: the main file's
    // problems are shown, and the tool files are reloaded. One in [database] does block it
    // (the command would reach another database).
    let main = std::fs::read_to_string(&path).expect("read");
    assert!(main.contains("warn_at = [50, 80, 100]"), "the shipped budget warnings");
    std::fs::write(&path, main.replace("warn_at = [50, 80, 100]", "warn_at = [80, 50]")).expect("half-done edit");
    let out = run(&["--config", path.to_str().expect("utf8"), "tools", "reload"], &[], None);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stderr.contains("budget.warn_at") && out.stdout.contains("tools checked"), "{}", out.all());
    let out = run(&["--config", path.to_str().expect("utf8"), "tools", "reload"], &[("GATEHOUSE__DATABASE__MAX_CONNECTIONS", "many")], None);
    assert_eq!(out.code, 2, "a problem in [database]: {}", out.all());
    let out = run(&["--config", path.to_str().expect("utf8"), "tools", "reload"], &[("GATEHOUSE__DATABSE__URL", "postgres://db.example/gh")], None);
    assert_eq!(out.code, 2, "a key no setting has may be [database]'s, misspelled: {}", out.all());
    std::fs::write(&path, main).expect("restore");
    std::fs::write(dir.path().join("tools.toml"), "surprise = 1\n").expect("break");
    let out = run(&["--config", path.to_str().expect("utf8"), "tools", "reload"], &[], None);
    assert_eq!(out.code, 2, "a broken file is a config problem, and nobody is told to reload: {}", out.all());
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert_eq!(child.wait().expect("wait").code(), Some(0), "{}", logs());
}

/// Strict mode (seed 003 WS-1.2): without the provider's key Gatehouse refuses to start with
/// exit code 1 instead of running degraded, from `GATEHOUSE_STRICT` or `server.strict`.
#[test]
fn strict_mode_refuses_to_start_without_a_provider_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let addr = "127.0.0.1:0";
    let env = [("GATEHOUSE__SERVER__ADDR", addr), ("ANTHROPIC_API_KEY", ""), ("GATEHOUSE_STRICT", "true")];
    let out = run(&["--config", path.to_str().expect("utf8"), "serve"], &env, None);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stderr.contains("strict mode") && out.stderr.contains("ANTHROPIC_API_KEY"), "{}", out.stderr);
    let env = [("GATEHOUSE__SERVER__ADDR", addr), ("ANTHROPIC_API_KEY", ""), ("GATEHOUSE__SERVER__STRICT", "true")];
    let out = run(&["--config", path.to_str().expect("utf8"), "worker"], &env, None);
    assert_eq!(out.code, 1, "the worker too: {}", out.all());
    let out = run(&["--config", path.to_str().expect("utf8"), "check-config"], &[("GATEHOUSE_STRICT", "maybe")], None);
    assert_eq!(out.code, 2, "a bad value is a config problem: {}", out.all());
    assert!(out.stderr.contains("server.strict") && out.stderr.contains("GATEHOUSE_STRICT"), "{}", out.stderr);
}

/// `gatehouse lane detect` prints the detection as JSON over the live catalog, and replays a
/// follow-up with recorded contexts and an answer with the question's tools.
#[test]
fn lane_detect_prints_the_detection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_with_tools(dir.path());
    let config = path.to_str().expect("utf8");
    let detect = |args: &[&str]| {
        let mut all = vec!["--config", config, "lane", "detect"];
        all.extend_from_slice(args);
        let out = run(&all, &[], None);
        assert_eq!(out.code, 0, "{}", out.all());
        serde_json::from_str::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let thanks = detect(&["--text", "Thanks!"]);
    assert_eq!(thanks["should_plan"], false, "{thanks}");
    assert_eq!(thanks["reason"], "CONVERSATIONAL", "{thanks}");
    let link = detect(&["--text", "What does this page say? https://example.com/menu", "--as", "owner"]);
    assert_eq!(link["should_plan"], true, "{link}");
    assert!(link["candidates"].as_array().is_some_and(|c| c.iter().any(|c| c["name"] == "web_fetch")), "{link}");
    let contexts = dir.path().join("contexts.json");
    std::fs::write(&contexts, r#"[{"tool": "web_fetch", "args": {"url": "https://example.com/menu"}, "summary": "The lunch menu.", "entities": ["Soup", "Bread"], "age_secs": 60}]"#).expect("contexts");
    let followup = detect(&["--text", "what about the second one?", "--context", contexts.to_str().expect("utf8")]);
    assert!(followup["followup"]["possible"] == true, "{followup}");
    let none = detect(&["--text", "what about the second one?"]);
    assert_eq!(none["should_plan"], false, "a vague follow-up without context stays in chat: {none}");
    // The answer to a clarifying question about a tool plans, with that tool first.
    let alone = detect(&["--text", "the lunch one", "--as", "owner"]);
    assert_eq!(alone["should_plan"], false, "{alone}");
    let answer = detect(&["--text", "the lunch one", "--as", "owner", "--answering", "web_fetch"]);
    assert_eq!((answer["should_plan"].clone(), answer["reason"].clone()), (true.into(), "CLARIFICATION_ANSWER".into()), "{answer}");
    assert_eq!(answer["candidates"][0]["name"], "web_fetch", "{answer}");
}

/// `gatehouse eval` and `gatehouse repair`: cases replay with a pass/fail table and an exit
/// code; a proposal changes no file until it is approved; a rejection needs a reason; a
/// rollback restores the file; bad input is refused with a stable code.
#[test]
fn eval_and_repair_commands_replay_propose_and_decide() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_with_tools(dir.path());
    let config = path.to_str().expect("utf8");
    let gh = |args: &[&str]| {
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        run(&all, &[], None)
    };
    let misrouted = "what does the menu on bistro-example.com say";
    assert_eq!(gh(&["eval", "add", "--message", misrouted, "--expect", "tool:web_fetch"]).code, 0);
    assert_eq!(gh(&["eval", "add", "--message", "thanks, see you tomorrow", "--expect", "normal_chat"]).code, 0);
    let no_tool = gh(&["eval", "add", "--message", "hi", "--expect", "normal_chat", "--arg", "url=x"]);
    assert!(no_tool.code == 2 && no_tool.stderr.contains("EVAL_ARGS_NEED_TOOL"), "{}", no_tool.all());
    let not_pair = gh(&["eval", "add", "--message", "hi", "--expect", "tool:web_fetch", "--arg", "url"]);
    assert!(not_pair.code == 2 && not_pair.stderr.contains("EVAL_ARG_INVALID"), "{}", not_pair.all());
    let bad = gh(&["eval", "add", "--message", "hi", "--expect", "tool"]);
    assert_eq!(bad.code, 2, "{}", bad.all());
    assert!(bad.stderr.contains("EVAL_EXPECT_INVALID"), "{}", bad.all());

    let failing = gh(&["eval", "run"]);
    assert_eq!(failing.code, 1, "a failing case fails the run: {}", failing.all());
    assert!(failing.stdout.contains("FAIL") && failing.stdout.contains("1 of 2 case(s) pass"), "{}", failing.stdout);
    let listed = gh(&["eval", "list", "--json"]);
    assert_eq!(listed.stdout.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()).count(), 2, "{}", listed.all());
    // The arguments that matter: a third case, failing at the planner when one is replayed.
    let with_args = gh(&["eval", "add", "--message", misrouted, "--expect", "tool:web_fetch", "--arg", "url=https://bistro-example.com/menu", "--arg", "max_chars=2000"]);
    assert_eq!(with_args.code, 0, "{}", with_args.all());
    let listed = gh(&["eval", "list", "--json"]);
    let args: Vec<serde_json::Value> = listed.stdout.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter_map(|c| c["expect"].get("args").cloned()).collect();
    assert_eq!(args, vec![serde_json::json!({ "url": "https://bistro-example.com/menu", "max_chars": 2000 })], "{}", listed.stdout);
    let case = listed.stdout.lines().find(|l| l.contains("max_chars")).and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok()).expect("the case");
    assert_eq!(gh(&["eval", "remove", case["name"].as_str().expect("name")]).code, 0);

    let file = dir.path().join("cases.jsonl");
    assert_eq!(gh(&["eval", "export", file.to_str().expect("utf8")]).code, 0);
    assert_eq!(std::fs::read_to_string(&file).expect("export").lines().count(), 2);
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(&broken, format!("{}not a case\n", std::fs::read_to_string(&file).expect("read"))).expect("write");
    let refused = gh(&["eval", "import", broken.to_str().expect("utf8")]);
    assert!(refused.code == 2 && refused.stderr.contains("EVAL_FILE_INVALID: line 3"), "{}", refused.all());
    assert_eq!(gh(&["eval", "import", file.to_str().expect("utf8")]).code, 0);
    assert_eq!(gh(&["eval", "list", "--json"]).stdout.lines().count(), 2, "an import replaces cases by name");

    let tools = dir.path().join("tools.toml");
    let original = std::fs::read_to_string(&tools).expect("tools.toml");
    let proposed = gh(&["repair", "propose"]);
    assert!(proposed.code == 0 && proposed.stdout.contains("1 new proposal(s): #1"), "{}", proposed.all());
    assert_eq!(std::fs::read_to_string(&tools).expect("read"), original, "proposing changes no file");
    let shown = gh(&["repair", "show", "1"]);
    assert!(shown.stdout.contains("+triggers = [") && shown.stdout.contains("fixed"), "{}", shown.stdout);
    let no_reason = gh(&["repair", "reject", "1", "--reason", " "]);
    assert!(no_reason.code == 2 && no_reason.stderr.contains("REPAIR_REASON_REQUIRED"), "{}", no_reason.all());

    // Approved by what `show` printed: a value for another diff or table is refused.
    let seen = shown.stdout.lines().find_map(|l| l.strip_prefix("seen: ")).expect("show names what it shows").to_string();
    let other = gh(&["repair", "approve", "1", "--seen", &"0".repeat(64)]);
    assert!(other.code == 2 && other.stderr.contains("REPAIR_CHANGED"), "{}", other.all());
    assert_eq!(std::fs::read_to_string(&tools).expect("read"), original, "nothing applied");
    assert_eq!(gh(&["repair", "approve", "1", "--seen", &seen]).code, 0);
    assert_ne!(std::fs::read_to_string(&tools).expect("read"), original);
    let again = gh(&["repair", "approve", "1"]);
    assert!(again.code == 2 && again.stderr.contains("REPAIR_ALREADY_DECIDED"), "{}", again.all());
    let passing = gh(&["eval", "run"]);
    assert!(passing.code == 0 && passing.stdout.contains("2 of 2 case(s) pass"), "{}", passing.all());
    assert_eq!(gh(&["repair", "rollback", "1"]).code, 0);
    assert_eq!(std::fs::read_to_string(&tools).expect("read"), original, "rolled back");
    // Each decision made here is in the owner audit, as the console's are.
    let url = format!("sqlite://{}", dir.path().join("data/gatehouse.db").display());
    let audited: Vec<(String, Option<String>)> = tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        sqlx::any::install_default_drivers();
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url).await.expect("open the database");
        sqlx::query_as("SELECT event, login FROM owner_audit WHERE event LIKE 'repair_%' ORDER BY id").fetch_all(&mut conn).await.expect("audit")
    });
    let cli = Some("cli".to_string());
    assert_eq!(audited, vec![("repair_approved".to_string(), cli.clone()), ("repair_rolled_back".to_string(), cli)]);
}

/// Processes starting at once on a new SQLite file take turns migrating it: each succeeds, and
/// every migration is applied once.
#[test]
fn processes_migrating_a_new_sqlite_file_at_once_take_turns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path(), "");
    let children: Vec<_> = (0..8)
        .map(|_| std::process::Command::new(BIN).args(["--config", path.to_str().expect("utf8"), "migrate"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn"))
        .collect();
    let mut applied = 0;
    for child in children {
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}{stderr}", String::from_utf8_lossy(&out.stdout));
        applied += stderr.matches("migration applied").count();
    }
    let listed = run(&["--config", path.to_str().expect("utf8"), "migrate"], &[], None);
    let known = listed.stdout.lines().filter(|l| l.starts_with("  0")).count();
    assert!(known > 20, "{}", listed.stdout);
    assert_eq!(applied, known, "each migration was applied by one process only");
}
