//! `gatehouse bench webhook`: WhatsApp webhook intake (signature, dedupe, store, enqueue, 200)
//! on the real router over loopback TCP. Phase 1 sends as fast as `--concurrency` connections
//! allow; phase 2 sends at a steady `--rate` and measures latency from each request's scheduled
//! time, so a stall is not hidden by requests that were never sent (coordinated omission).
//! No worker runs: the jobs stay queued and only intake is measured.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use secrecy::SecretString;

use crate::{
    channel::whatsapp::signature,
    config::{LoadedConfig, Secrets, Settings},
    db::Db,
    web::{self, AppState},
};

#[derive(Debug, clap::Args)]
pub struct WebhookBench {
    /// Database URL (sqlite://... or postgres://...); a fresh SQLite file in the temp folder when omitted.
    #[arg(long)]
    pub database: Option<String>,
    /// Requests in the maximum-throughput phase.
    #[arg(long, default_value_t = 20_000)]
    pub requests: usize,
    /// Connections sending at once in that phase.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Requests per second in the steady phase.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Length of the steady phase, in seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

/// A signed notification carrying one new text message.
fn signed_body(secret: &[u8], n: usize) -> (String, String) {
    let body = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{ "id": "bench", "changes": [{ "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": { "display_phone_number": "0", "phone_number_id": "0" },
            "contacts": [{ "profile": { "name": "Bench" }, "wa_id": format!("bench-{}", n % 500) }],
            "messages": [{ "from": format!("bench-{}", n % 500), "id": format!("wamid.bench.{}.{n}", std::process::id()),
                "timestamp": "1739321024", "type": "text", "text": { "body": "How late are you open today?" } }]
        } }] }]
    })
    .to_string();
    let sig = signature::sign(secret, body.as_bytes());
    (body, sig)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    super::percentile(sorted, p)
}

struct Phase {
    sent: usize,
    failed: usize,
    secs: f64,
    latencies_ms: Vec<f64>,
}

impl Phase {
    fn print(&self, name: &str) {
        println!(
            "{name:<22} {:>7.0} req/s  p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  ({} requests, {} failed, {:.1} s)",
            self.sent as f64 / self.secs,
            percentile(&self.latencies_ms, 0.50),
            percentile(&self.latencies_ms, 0.95),
            percentile(&self.latencies_ms, 0.99),
            self.sent,
            self.failed,
            self.secs
        );
    }
}

async fn post(client: &reqwest::Client, url: &str, body: String, sig: String) -> bool {
    client
        .post(url)
        .header("content-type", "application/json")
        .header(signature::SIGNATURE_HEADER, sig)
        .body(body)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

pub async fn run(args: &WebhookBench) -> anyhow::Result<()> {
    let temp = std::env::temp_dir().join(format!("gatehouse-bench-{}", uuid::Uuid::new_v4().simple()));
    let url = args.database.clone().unwrap_or_else(|| format!("sqlite://{}", temp.join("bench.db").display()));
    let mut settings = Settings::default();
    settings.database.url = url;
    settings.database.max_connections = 16;
    settings.server.site_root = PathBuf::from("/nonexistent");
    settings.server.public_url = "http://127.0.0.1".into();
    let db = Db::connect(&settings.database).await?;
    db.migrate().await?;
    // A secret for this run only.
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let secrets = Secrets { whatsapp_app_secret: Some(SecretString::from(secret.clone())), ..Default::default() };
    let config = LoadedConfig { settings, secrets, path: "bench.toml".into(), dir: ".".into(), catalog: Arc::default(), mcp: Arc::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let state = AppState::new(config, db.clone(), addr, web::ops::metrics_handle())?;
    let router = web::router(state);
    let server = tokio::spawn(async move { axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await });
    let endpoint = format!("http://{addr}/webhooks/whatsapp");
    let client = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency.max(64)).build()?;

    // Phase 1: maximum throughput.
    let bodies: Vec<(String, String)> = (0..args.requests).map(|n| signed_body(secret.as_bytes(), n)).collect();
    let bodies = Arc::new(std::sync::Mutex::new(bodies));
    let t = Instant::now();
    let tasks: Vec<_> = (0..args.concurrency.max(1))
        .map(|_| {
            let (client, endpoint, bodies) = (client.clone(), endpoint.clone(), bodies.clone());
            tokio::spawn(async move {
                let (mut lat, mut failed) = (Vec::new(), 0usize);
                loop {
                    let next = bodies.lock().ok().and_then(|mut b| b.pop());
                    let Some((body, sig)) = next else { break };
                    let t0 = Instant::now();
                    if !post(&client, &endpoint, body, sig).await {
                        failed += 1;
                    }
                    lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                (lat, failed)
            })
        })
        .collect();
    let mut max = Phase { sent: 0, failed: 0, secs: 0.0, latencies_ms: Vec::new() };
    for task in tasks {
        let (lat, failed) = task.await?;
        max.sent += lat.len();
        max.failed += failed;
        max.latencies_ms.extend(lat);
    }
    max.secs = t.elapsed().as_secs_f64();
    max.latencies_ms.sort_by(f64::total_cmp);

    // Phase 2: a steady rate, open loop.
    let total = usize::try_from(u64::from(args.rate) * args.seconds).unwrap_or(usize::MAX);
    let offset = args.requests;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
    let start = Instant::now() + Duration::from_millis(50);
    let t = Instant::now();
    let mut handles = Vec::with_capacity(total);
    for i in 0..total {
        let scheduled = start + interval.mul_f64(i as f64);
        let (body, sig) = signed_body(secret.as_bytes(), offset + i);
        tokio::time::sleep_until(scheduled.into()).await;
        let (client, endpoint) = (client.clone(), endpoint.clone());
        handles.push(tokio::spawn(async move {
            let ok = post(&client, &endpoint, body, sig).await;
            (ok, scheduled.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    let mut steady = Phase { sent: 0, failed: 0, secs: 0.0, latencies_ms: Vec::with_capacity(total) };
    for h in handles {
        let (ok, ms) = h.await?;
        steady.sent += 1;
        steady.failed += usize::from(!ok);
        steady.latencies_ms.push(ms);
    }
    steady.secs = t.elapsed().as_secs_f64();
    steady.latencies_ms.sort_by(f64::total_cmp);

    let (stored,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM whatsapp_inbound").fetch_one(&db.pool).await?;
    let (queued,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&db.pool).await?;
    server.abort();
    db.close().await;
    let _ = std::fs::remove_dir_all(&temp);

    println!("backend                {}", db.backend.as_str());
    println!("what                   signed POST /webhooks/whatsapp, one new text message each: verify, dedupe, store, enqueue, 200");
    max.print(&format!("max ({} connections)", args.concurrency));
    steady.print(&format!("steady {} req/s", args.rate));
    println!("stored                 {stored} messages, {queued} jobs queued");
    Ok(())
}
