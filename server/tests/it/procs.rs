//! `gatehouse` as real processes for crash tests: `serve` started and killed with SIGKILL, and
//! the command line run against the same database and config directory.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::support::TestDb;

const BIN: &str = env!("CARGO_BIN_EXE_gatehouse");

/// A config directory (the shipped gatehouse.toml plus the given tool files) and the
/// environment every process of one test runs with.
pub(crate) struct Gatehouse {
    config: PathBuf,
    env: Vec<(String, String)>,
    /// Where the last `serve` listens, as it logged it.
    addr: Mutex<String>,
}

pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Gatehouse {
    /// `env` comes after the defaults: a port the system picks for each `serve` (a port chosen
    /// here and bound later could be taken in between by another test), a short lease (a killed
    /// worker's job is rescued two seconds later), quick polling, no model key.
    pub(crate) fn new(dir: &Path, db: &TestDb, tools: &str, connectors: &str, env: &[(&str, &str)]) -> Self {
        let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml")).expect("shipped config");
        let config = dir.join("gatehouse.toml");
        std::fs::write(&config, shipped).expect("config");
        std::fs::write(dir.join("tools.toml"), tools).expect("tools");
        std::fs::write(dir.join("connectors.toml"), connectors).expect("connectors");
        let defaults = [
            ("GATEHOUSE__DATABASE__URL", db.url.as_str()),
            ("GATEHOUSE__SERVER__ADDR", "127.0.0.1:0"),
            ("GATEHOUSE__SERVER__STRICT_PORT", "true"),
            ("GATEHOUSE__JOBS__LEASE", "2s"),
            ("GATEHOUSE__JOBS__MAINTENANCE_INTERVAL", "500ms"),
            ("GATEHOUSE__JOBS__POLL_INTERVAL", "200ms"),
            ("ANTHROPIC_API_KEY", ""),
            ("RUST_LOG", "info"),
        ];
        let env = defaults.iter().chain(env).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { config, env, addr: Mutex::default() }
    }

    /// Where the running `serve` listens.
    pub(crate) fn addr(&self) -> String {
        self.addr.lock().expect("lock").clone()
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        self.command_via(&[], args)
    }

    /// `gatehouse` run by `wrapper` (a program and its arguments, given the binary's command line
    /// after them), or directly when `wrapper` is empty.
    fn command_via(&self, wrapper: &[&str], args: &[&str]) -> tokio::process::Command {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(rest).arg(BIN);
                cmd
            }
            None => tokio::process::Command::new(BIN),
        };
        cmd.arg("--config").arg(&self.config).args(args).envs(self.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    pub(crate) async fn run(&self, args: &[&str]) -> Ran {
        let out = self.command(args).env("RUST_LOG", "warn").output().await.expect("run gatehouse");
        Ran { code: out.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&out.stdout).into_owned(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
    }

    /// `gatehouse worker`, its logs appended to `log`, started (not waited on).
    pub(crate) fn worker(&self, log: &Path) -> tokio::process::Child {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
        let err = file.try_clone().expect("log");
        self.command(&["worker"]).stdout(file).stderr(err).spawn().expect("spawn worker")
    }

    /// `gatehouse serve`, its logs appended to `log`; returns once it has logged where it
    /// listens and answers there.
    pub(crate) async fn serve(&self, log: &Path) -> tokio::process::Child {
        self.serve_via(&[], log).await
    }

    /// [`Gatehouse::serve`], started by `wrapper` (which must end by exec-ing its arguments, so
    /// that the child is `gatehouse` itself).
    pub(crate) async fn serve_via(&self, wrapper: &[&str], log: &Path) -> tokio::process::Child {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
        let before = file.metadata().expect("log").len() as usize;
        let err = file.try_clone().expect("log");
        let mut child = self.command_via(wrapper, &["serve"]).stdout(file).stderr(err).spawn().expect("spawn serve");
        let logged = || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(!text.contains('\u{1b}'), "a log file gets no colour codes: {text}");
            text.get(before..).and_then(listening_addr)
        };
        let mut addr = None;
        wait_for("serve to log where it listens", Duration::from_secs(60), async || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("serve exited with {status}: {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            addr = logged();
            addr.is_some()
        })
        .await;
        let addr = addr.expect("logged");
        wait_for("serve to answer", Duration::from_secs(30), async || tokio::net::TcpStream::connect(&addr).await.is_ok()).await;
        *self.addr.lock().expect("lock") = addr;
        child
    }
}

/// A WhatsApp webhook post to `serve` at `addr`, signed with the tests' app secret.
pub(crate) async fn post_signed(addr: &str, body: String) -> reqwest::Response {
    let signature = server::channel::whatsapp::signature::sign(crate::whatsapp::APP_SECRET.as_bytes(), body.as_bytes());
    reqwest::Client::new()
        .post(format!("http://{addr}/webhooks/whatsapp"))
        .header("content-type", "application/json")
        .header("X-Hub-Signature-256", signature)
        .body(body)
        .send()
        .await
        .expect("post webhook")
}

/// The address in the "Gatehouse listening" line of `logs` (text format: `addr=127.0.0.1:41453`).
fn listening_addr(logs: &str) -> Option<String> {
    let line = logs.lines().find(|l| l.contains("Gatehouse listening"))?;
    let addr = line.split_whitespace().find_map(|field| field.strip_prefix("addr="))?;
    Some(addr.to_string())
}

pub(crate) async fn wait_for(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILL, as a crash: no shutdown, no lease released.
pub(crate) async fn kill_nine(child: &mut tokio::process::Child) {
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
}
