//! `gatehouse bench webhook --serve`: the steady webhook load against a separate `gatehouse
//! serve` process (this binary, the shipped configuration, a fresh SQLite file), whose worker
//! answers every message through a fake model (Anthropic Messages API) and a fake Graph API
//! served on loopback by this process. Reports that process's resident memory when idle and
//! under the load, and how many messages it answered. The load generator and the fakes live in
//! this process, so the server's figure holds only the server.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Json, Router, routing::post};

use super::webhook::{WebhookBench, percentile, signed_request, steady};

/// What the fakes were asked.
#[derive(Default)]
struct Calls {
    model: AtomicUsize,
    /// Graph API sends of a text reply (read receipts and typing indicators are not counted).
    replies: AtomicUsize,
}

/// A fake Anthropic Messages API and a fake Graph API on one loopback listener.
fn fakes(calls: Arc<Calls>) -> Router {
    let model = {
        let calls = calls.clone();
        post(move |Json(req): Json<serde_json::Value>| {
            let calls = calls.clone();
            async move {
                calls.model.fetch_add(1, Ordering::Relaxed);
                Json(serde_json::json!({
                    "id": format!("msg_bench_{}", uuid::Uuid::new_v4().simple()),
                    "type": "message",
                    "role": "assistant",
                    "model": req["model"],
                    "content": [{ "type": "text", "text": "We are open until 8 pm today." }],
                    "stop_reason": "end_turn",
                    "stop_sequence": null,
                    "usage": { "input_tokens": 120, "output_tokens": 12 }
                }))
            }
        })
    };
    let graph = post(move |Json(req): Json<serde_json::Value>| {
        let calls = calls.clone();
        async move {
            if req["type"] == "text" {
                calls.replies.fetch_add(1, Ordering::Relaxed);
            }
            let to = req["to"].as_str().unwrap_or_default().to_string();
            Json(serde_json::json!({
                "messaging_product": "whatsapp",
                "contacts": [{ "input": to, "wa_id": to }],
                "messages": [{ "id": format!("wamid.bench.reply.{}", uuid::Uuid::new_v4().simple()) }]
            }))
        }
    });
    Router::new().route("/v1/messages", model).route("/{version}/{phone}/messages", graph)
}

/// Resident set size of a process, in bytes (`VmRSS`), or its peak (`VmHWM`).
fn rss(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn ready(addr: SocketAddr, child: &mut tokio::process::Child) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("gatehouse serve exited before it was ready ({status})");
        }
        if client.get(format!("http://{addr}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < give_up, "gatehouse serve was not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn run(args: &WebhookBench) -> anyhow::Result<()> {
    let calls = Arc::new(Calls::default());
    let fake_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let fake_addr = fake_listener.local_addr()?;
    let fake_server = tokio::spawn(axum::serve(fake_listener, fakes(calls.clone())).into_future());

    let temp = std::env::temp_dir().join(format!("gatehouse-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&temp)?;
    let url = args.database.clone().unwrap_or_else(|| format!("sqlite://{}", temp.join("bench.db").display()));
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(&exe)
        .arg("--config")
        .arg(args.config.clone().unwrap_or_else(|| PathBuf::from(server::config::DEFAULT_CONFIG_PATH)))
        .arg("serve")
        .env("GATEHOUSE__DATABASE__URL", &url)
        .env("GATEHOUSE__SERVER__ADDR", addr.to_string())
        .env("GATEHOUSE__SERVER__STRICT_PORT", "true")
        .env("GATEHOUSE__LLM__PROVIDER", "anthropic")
        .env("GATEHOUSE__LLM__ANTHROPIC__BASE_URL", format!("http://{fake_addr}"))
        .env("GATEHOUSE__WHATSAPP__GRAPH_BASE_URL", format!("http://{fake_addr}"))
        .env("GATEHOUSE__WHATSAPP__PHONE_NUMBER_ID", super::webhook::PHONE_NUMBER_ID)
        .env("ANTHROPIC_API_KEY", "bench")
        .env("WHATSAPP_APP_SECRET", &secret)
        .env("WHATSAPP_ACCESS_TOKEN", "bench")
        .env("WHATSAPP_VERIFY_TOKEN", "bench")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or_else(|| anyhow::anyhow!("gatehouse serve has no process id"))?;
    let outcome = async {
        ready(addr, &mut child).await?;
        // Idle: started, migrated, worker polling, nothing received.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = rss(pid, "VmRSS:").unwrap_or_default();

        let total = usize::try_from(u64::from(args.rate) * args.seconds).unwrap_or(usize::MAX);
        let host = addr.to_string();
        let requests: Vec<Vec<u8>> = (0..total).map(|i| signed_request(secret.as_bytes(), &host, i)).collect();
        let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let sampling = sampling.clone();
            tokio::spawn(async move {
                let mut peak = 0;
                while sampling.load(Ordering::Relaxed) {
                    peak = peak.max(rss(pid, "VmRSS:").unwrap_or_default());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                peak
            })
        };
        let (load, lags) = super::webhook::on_load_thread(steady(addr, requests, args.rate)).await?;
        let replies_in_load = calls.replies.load(Ordering::Relaxed);
        // Let the worker catch up (bounded), still sampling.
        let catch_up = Instant::now() + Duration::from_secs(120);
        let mut last = usize::MAX;
        while Instant::now() < catch_up {
            let now = calls.replies.load(Ordering::Relaxed);
            if now >= load.sent || now == last {
                break;
            }
            last = now;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        sampling.store(false, Ordering::Relaxed);
        let peak = sampler.await?;
        let hwm = rss(pid, "VmHWM:").unwrap_or_default();
        Ok::<_, anyhow::Error>((idle, peak, hwm, load, lags, replies_in_load))
    }
    .await;
    // SIGTERM: a graceful stop, as an operator's would be.
    let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
    fake_server.abort();
    let _ = std::fs::remove_dir_all(&temp);
    let (idle, peak, hwm, load, lags, replies_in_load) = outcome?;

    println!("what                   gatehouse serve (shipped config, worker on) answering through a fake model and Graph API; signed webhook posts at a steady rate");
    load.print(&format!("steady {} req/s", args.rate));
    println!("generator lag          p50 {:.2} ms  p99 {:.2} ms", percentile(&lags, 0.50), percentile(&lags, 0.99));
    println!("rss idle               {:.1} MiB", mib(idle));
    println!("rss under load         {:.1} MiB peak sampled every 200 ms (VmHWM {:.1} MiB)", mib(peak), mib(hwm));
    println!(
        "answered               {} replies sent during the load, {} in all ({} model calls) for {} messages",
        replies_in_load,
        calls.replies.load(Ordering::Relaxed),
        calls.model.load(Ordering::Relaxed),
        load.sent
    );
    Ok(())
}
