//! `gatehouse bench webhook`: WhatsApp webhook intake (signature, dedupe, store, enqueue, 200)
//! on the real router over loopback TCP. Phase 1 sends as fast as `--concurrency` connections
//! allow; phase 2 sends at a steady `--rate` and measures latency from each request's scheduled
//! time, so a stall is not hidden by requests that were never sent (coordinated omission).
//! No worker runs: the jobs stay queued and only intake is measured. Its ceiling, in the same
//! run: the same requests to a route that only checks the signature and answers 200.
//!
//! The load generator is deliberately lean so that it measures the server, not itself: it runs
//! on one thread of its own (like `wrk -t1`), keeps its connections alive, and writes
//! pre-rendered HTTP/1.1 requests, reading back only the status line and `Content-Length`.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use secrecy::SecretString;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use server::{
    bootstrap::Gatehouse,
    channel::whatsapp::{signature, webhook},
    config::{LoadedConfig, Secrets, Settings},
    db::Db,
    tools::ToolFiles,
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
    /// Send the steady load to a separate `gatehouse serve` process instead (worker on, answering
    /// through a fake model and Graph API in this process), and report its memory (RSS) idle and
    /// under the load.
    #[arg(long)]
    pub serve: bool,
    /// With --serve: the configuration that process starts with (default config/gatehouse.toml).
    #[arg(long, requires = "serve")]
    pub config: Option<PathBuf>,
}

/// The business number the notifications are addressed to.
pub(super) const PHONE_NUMBER_ID: &str = "100000000000001";

/// A signed notification carrying one new text message, as the bytes of a whole HTTP/1.1 request.
pub(super) fn signed_request(secret: &[u8], host: &str, n: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{ "id": "bench", "changes": [{ "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": { "display_phone_number": "15550000001", "phone_number_id": PHONE_NUMBER_ID },
            "contacts": [{ "profile": { "name": "Bench" }, "wa_id": format!("bench-{}", n % 500) }],
            "messages": [{ "from": format!("bench-{}", n % 500), "id": format!("wamid.bench.{}.{n}", std::process::id()),
                "timestamp": "1739321024", "type": "text", "text": { "body": "How late are you open today?" } }]
        } }] }]
    })
    .to_string();
    let sig = signature::sign(secret, body.as_bytes());
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{}: {sig}\r\nContent-Length: {}\r\n\r\n",
        webhook::PATH,
        signature::SIGNATURE_HEADER,
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request
}

/// One keep-alive HTTP/1.1 connection sending one request at a time.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, buf: Vec::with_capacity(1024) })
    }

    /// Sends `request` and reads the whole response; returns its status code.
    async fn send(&mut self, request: &[u8]) -> std::io::Result<u16> {
        self.stream.write_all(request).await?;
        loop {
            if let Some((status, len)) = parse_response(&self.buf)? {
                self.buf.drain(..len);
                return Ok(status);
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The status and total length of the response at the start of `buf`, once it is complete.
fn parse_response(buf: &[u8]) -> std::io::Result<Option<(u16, usize)>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return Ok(None) };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("response head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).ok_or_else(|| bad("no status line"))?;
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or_else(|| bad("response without Content-Length"))?;
    let total = end + 4 + length;
    Ok((buf.len() >= total).then_some((status, total)))
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    super::percentile(sorted, p)
}

pub(super) struct Phase {
    pub(super) sent: usize,
    failed: usize,
    secs: f64,
    latencies_ms: Vec<f64>,
}

impl Phase {
    pub(super) fn print(&self, name: &str) {
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

/// Phase 1: `concurrency` connections each send their next request as soon as the last is answered.
async fn max_throughput(addr: SocketAddr, requests: Arc<Vec<Vec<u8>>>, concurrency: usize) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let tasks: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (requests, next) = (requests.clone(), next.clone());
            tokio::spawn(async move {
                let (mut lat, mut failed) = (Vec::new(), 0usize);
                let mut conn = Conn::open(addr).await?;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else { break };
                    let t0 = Instant::now();
                    if conn.send(request).await? != 200 {
                        failed += 1;
                    }
                    lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                Ok::<_, std::io::Error>((lat, failed))
            })
        })
        .collect();
    let mut phase = Phase { sent: 0, failed: 0, secs: 0.0, latencies_ms: Vec::new() };
    for task in tasks {
        let (lat, failed) = task.await??;
        phase.sent += lat.len();
        phase.failed += failed;
        phase.latencies_ms.extend(lat);
    }
    phase.secs = t.elapsed().as_secs_f64();
    phase.latencies_ms.sort_by(f64::total_cmp);
    Ok(phase)
}

/// Phase 2: requests at fixed times, open loop. Each takes an idle connection or opens one, so
/// a slow answer delays no later request; latency counts from the scheduled time, so a stall is
/// not hidden by requests that were never sent (coordinated omission).
/// Also returns how late each request started (the generator's timer lag, included in its latency).
pub(super) async fn steady(addr: SocketAddr, requests: Vec<Vec<u8>>, rate: u32) -> anyhow::Result<(Phase, Vec<f64>)> {
    let idle: Arc<std::sync::Mutex<Vec<Conn>>> = Arc::default();
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now() + Duration::from_millis(50);
    let t = Instant::now();
    let mut handles = Vec::with_capacity(requests.len());
    // The pace comes from a thread of its own sleeping to each scheduled time: the runtime's
    // timer has millisecond granularity, which would add up to a millisecond to every latency.
    let (tick, mut ticks) = tokio::sync::mpsc::unbounded_channel();
    let count = requests.len();
    std::thread::Builder::new().name("bench-pace".into()).spawn(move || {
        for i in 0..count {
            let scheduled = start + interval.mul_f64(i as f64);
            if let Some(wait) = scheduled.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if tick.send(scheduled).is_err() {
                return;
            }
        }
    })?;
    for request in requests {
        let Some(scheduled) = ticks.recv().await else { break };
        let idle = idle.clone();
        handles.push(tokio::spawn(async move {
            let lag = scheduled.elapsed().as_secs_f64() * 1000.0;
            let pooled = idle.lock().ok().and_then(|mut idle| idle.pop());
            let mut conn = match pooled {
                Some(conn) => conn,
                None => Conn::open(addr).await?,
            };
            let status = conn.send(&request).await?;
            let ms = scheduled.elapsed().as_secs_f64() * 1000.0;
            if let Ok(mut idle) = idle.lock() {
                idle.push(conn);
            }
            Ok::<_, std::io::Error>((status == 200, ms, lag))
        }));
    }
    let mut phase = Phase { sent: 0, failed: 0, secs: 0.0, latencies_ms: Vec::with_capacity(handles.len()) };
    let mut lags = Vec::with_capacity(handles.len());
    for h in handles {
        let (ok, ms, lag) = h.await??;
        phase.sent += 1;
        phase.failed += usize::from(!ok);
        phase.latencies_ms.push(ms);
        lags.push(lag);
    }
    phase.secs = t.elapsed().as_secs_f64();
    phase.latencies_ms.sort_by(f64::total_cmp);
    lags.sort_by(f64::total_cmp);
    Ok((phase, lags))
}

/// The intake ceiling: verify the signature, answer 200 (401 when it does not match), nothing else.
fn ceiling_router(secret: Vec<u8>) -> axum::Router {
    let secret = Arc::new(secret);
    axum::Router::new().route(
        webhook::PATH,
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let secret = secret.clone();
            async move {
                let given = headers.get(signature::SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
                match signature::verify(&secret, given, &body) {
                    Ok(()) => axum::http::StatusCode::OK,
                    Err(_) => axum::http::StatusCode::UNAUTHORIZED,
                }
            }
        }),
    )
}

/// Runs `work` on a thread of its own with a single-threaded runtime: the load generator.
pub(super) async fn on_load_thread<T: Send + 'static>(work: impl Future<Output = anyhow::Result<T>> + Send + 'static) -> anyhow::Result<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("bench-load".into()).spawn(move || {
        let outcome = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(work));
        let _ = done.send(outcome);
    })?;
    result.await?
}

pub async fn run(args: &WebhookBench) -> anyhow::Result<()> {
    if args.serve {
        return super::serve::run(args).await;
    }
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
    let config = LoadedConfig::new(settings, secrets, "bench.toml".into());
    let gatehouse = Gatehouse::build(config, ToolFiles::default(), db.clone())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let state = AppState::new(&gatehouse, addr, web::ops::metrics_handle());
    let intake = state.webhook.intake.clone();
    let router = web::router(state);
    let server = tokio::spawn(async move { axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await });
    let host = addr.to_string();

    let requests: Arc<Vec<Vec<u8>>> = Arc::new((0..args.requests).map(|n| signed_request(secret.as_bytes(), &host, n)).collect());
    let max = on_load_thread(max_throughput(addr, requests.clone(), args.concurrency)).await?;
    let grouped = intake.counts();
    // The ceiling: the same signed requests, over the same kind of connections, to a route that
    // checks the signature and answers 200 without parsing or storing anything.
    let ceiling_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ceiling_addr = ceiling_listener.local_addr()?;
    let ceiling_app = ceiling_router(secret.clone().into_bytes());
    let ceiling_server = tokio::spawn(async move { axum::serve(ceiling_listener, ceiling_app).await });
    let ceiling = on_load_thread(max_throughput(ceiling_addr, requests, args.concurrency)).await?;
    ceiling_server.abort();
    anyhow::ensure!(ceiling.failed == 0, "the ceiling route refused {} of its requests", ceiling.failed);

    let total = usize::try_from(u64::from(args.rate) * args.seconds).unwrap_or(usize::MAX);
    let requests: Vec<Vec<u8>> = (0..total).map(|i| signed_request(secret.as_bytes(), &host, args.requests + i)).collect();
    let (steady, lags) = on_load_thread(steady(addr, requests, args.rate)).await?;

    let (stored,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM whatsapp_inbound").fetch_one(&db.pool).await?;
    let (queued,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE kind = 'whatsapp.inbound'").fetch_one(&db.pool).await?;
    server.abort();
    db.close().await;
    let _ = std::fs::remove_dir_all(&temp);

    println!("backend                {}", db.backend.as_str());
    println!("what                   signed POST /webhooks/whatsapp, one new text message each: verify, dedupe, store, enqueue, 200");
    max.print(&format!("max ({} connections)", args.concurrency));
    println!(
        "ceiling                {:>7.0} req/s  (the same requests to a route that checks the signature and answers 200, storing nothing); intake is {:.2}x of it",
        ceiling.sent as f64 / ceiling.secs,
        (max.sent as f64 / max.secs) / (ceiling.sent as f64 / ceiling.secs)
    );
    println!(
        "group commit           {} transactions held the max phase's {} posts: {:.1} a transaction",
        grouped.groups,
        grouped.batches,
        grouped.batches as f64 / grouped.groups.max(1) as f64
    );
    steady.print(&format!("steady {} req/s", args.rate));
    println!(
        "generator lag          p50 {:.2} ms  p99 {:.2} ms  (how late steady requests started; counted in their latency)",
        percentile(&lags, 0.50),
        percentile(&lags, 0.99)
    );
    println!("stored                 {stored} messages, {queued} jobs queued");
    Ok(())
}
