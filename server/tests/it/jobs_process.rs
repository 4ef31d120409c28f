//! Crash safety and scale-out with real processes: kill -9 mid-run, two processes on one
//! PostgreSQL database, and a database outage under a running worker.

use std::{
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use server::{
    db::{
        Db,
        jobs::{self as store, JobState, NewJob},
    },
    jobs::{JobContext, JobError, JobHandler, JobOutput, JobQueue, Registry, Worker, WorkerSettings},
};
use sqlx::Row;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{both_backends, support::TestDb};

fn probe_bin() -> std::path::PathBuf {
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/job_probe
    let exe = std::env::current_exe().expect("test exe");
    exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples").join("job_probe")
}

/// A lease this short lets the crash test rescue quickly; the scale-out test uses a long one, so
/// that only a real double claim (not a stall on a loaded machine) can run a job twice.
const SHORT_LEASE: Duration = Duration::from_secs(2);
const LONG_LEASE: Duration = Duration::from_secs(30);

fn spawn_probe(url: &str, sleep_ms: u64, lease: Duration, concurrency: u32) -> Child {
    spawn_probe_with(url, sleep_ms, lease, concurrency, &[])
}

fn spawn_probe_with(url: &str, sleep_ms: u64, lease: Duration, concurrency: u32, env: &[(&str, &str)]) -> Child {
    Command::new(probe_bin())
        .args([url, &sleep_ms.to_string(), &lease.as_millis().to_string(), &concurrency.to_string()])
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn job_probe (built by cargo test as an example)")
}

async fn prepare(db: &TestDb, jobs: usize) -> Db {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE probe_runs (job_id BIGINT NOT NULL, pid BIGINT NOT NULL)").execute(&pool.pool).await.expect("table");
    sqlx::query("CREATE TABLE probe_effects (idempotency_key TEXT PRIMARY KEY, pid BIGINT NOT NULL)").execute(&pool.pool).await.expect("table");
    let queue = JobQueue::new(pool.clone());
    let mut tx = pool.begin_write().await.expect("begin");
    for _ in 0..jobs {
        let job = NewJob { kind: "probe".into(), max_attempts: 5, correlation_id: "t".into(), args: serde_json::json!({}), ..Default::default() };
        queue.enqueue_in(&mut tx, &job).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
    pool
}

async fn scalar(pool: &Db, sql: &str) -> i64 {
    sqlx::query(sql).fetch_one(&pool.pool).await.expect(sql).get::<i64, _>(0)
}

async fn wait_completed(pool: &Db, total: i64, within: Duration) -> i64 {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let done = scalar(pool, "SELECT COUNT(*) FROM jobs WHERE state = 'completed'").await;
        if done >= total || tokio::time::Instant::now() > deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn stop(mut child: Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
}

async fn kill_9_mid_run_then_restart(db: TestDb) {
    let total = 300;
    let pool = prepare(&db, total).await;
    let mut first = spawn_probe(&db.url, 40, SHORT_LEASE, 16);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while scalar(&pool, "SELECT COUNT(*) FROM probe_runs").await < 40 {
        assert!(tokio::time::Instant::now() < deadline, "probe never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    // On PostgreSQL a COMMIT the process sent just before it died may still be applied by its
    // server backend; count the jobs it held once its backends are gone.
    if db.url.starts_with("postgres") {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while scalar(&pool, "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()").await > i64::from(pool.pool.size()) {
            assert!(tokio::time::Instant::now() < deadline, "the dead process's connections never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let running = scalar(&pool, "SELECT COUNT(*) FROM jobs WHERE state = 'running'").await;
    assert!(running > 0, "jobs were mid-run when the process died");

    let second = spawn_probe(&db.url, 40, SHORT_LEASE, 16);
    let done = wait_completed(&pool, total as i64, Duration::from_secs(90)).await;
    stop(second);
    assert_eq!(done, total as i64, "every job completes after the restart");
    let effects = scalar(&pool, "SELECT COUNT(*) FROM probe_effects").await;
    assert_eq!(effects, total as i64, "each job's effect happened exactly once");
    let runs = scalar(&pool, "SELECT COUNT(*) FROM probe_runs").await;
    assert!(runs > total as i64, "interrupted jobs ran again (at least once): {runs} runs");
    let rescued = scalar(&pool, "SELECT COUNT(DISTINCT job_id) FROM job_events WHERE error_code = 'JOB_LEASE_EXPIRED'").await;
    assert!(rescued >= running, "the jobs the dead process held were rescued: {rescued} < {running}");
}
both_backends!(jobs_survive_kill_9, kill_9_mid_run_then_restart);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_postgres_without_double_runs() {
    let Some(db) = TestDb::postgres().await else { return };
    let total = 10_000;
    let pool = prepare(&db, total).await;
    let a = spawn_probe(&db.url, 0, LONG_LEASE, 32);
    let b = spawn_probe(&db.url, 0, LONG_LEASE, 32);
    let done = wait_completed(&pool, total as i64, Duration::from_secs(180)).await;
    stop(a);
    stop(b);
    assert_eq!(done, total as i64);
    let rescued = scalar(&pool, "SELECT COUNT(*) FROM job_events WHERE error_code = 'JOB_LEASE_EXPIRED'").await;
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM probe_runs").await, total as i64, "no job ran twice ({rescued} leases expired)");
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM (SELECT job_id FROM probe_runs GROUP BY job_id HAVING COUNT(*) > 1) dup").await, 0);
    let per_process = sqlx::query("SELECT pid, COUNT(*) FROM probe_runs GROUP BY pid").fetch_all(&pool.pool).await.expect("per pid");
    assert_eq!(per_process.len(), 2, "both processes did work");
}

/// Two worker processes, one reply: the process sending it loses its job lease mid-send (the
/// rescuer is run with a clock past the lease), the other process claims the job and runs it
/// while the first send is still in flight at Meta. Each part goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_send_each_reply_part_once() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = prepare(&db, 0).await;
    let graph = crate::jobs_race::GatedGraph::start(true).await;
    let held = graph.held().expect("gate");
    let text = ["First part of a long answer. ".repeat(100), "Second part, still going. ".repeat(100), "Third and last part. ".repeat(100)].join("\n\n");
    let job = NewJob { kind: "probe_send".into(), max_attempts: 20, correlation_id: "t".into(), args: serde_json::json!({ "text": text }), ..Default::default() };
    let id = JobQueue::new(pool.clone()).enqueue(&job).await.expect("enqueue").job.id;
    // A lease this long never lapses on its own, and its heartbeat does not notice the rescue
    // before the held send is released.
    // One slot: it stays taken until the first run's outcome is recorded, so the run after the
    // rescue is the other process's (a worker that claims its own stalled job again waits for
    // the earlier run, which here is held until another run is fenced).
    let env = [("PROBE_GRAPH_URL", graph.base_url.as_str())];
    let a = spawn_probe_with(&db.url, 0, Duration::from_secs(3600), 1, &env);
    tokio::time::timeout(Duration::from_secs(60), graph.first_arrived()).await.expect("the first process starts sending");
    let b = spawn_probe_with(&db.url, 0, Duration::from_secs(3600), 4, &env);

    // Forced lease expiry, and the rescuer's round, in one transaction (the first process's
    // heartbeat cannot extend the lease in between).
    let mut tx = pool.begin_write().await.expect("begin");
    sqlx::query("UPDATE jobs SET lease_expires_at = 0 WHERE id = $1").bind(id).execute(&mut *tx).await.expect("expire the lease");
    assert_eq!(store::rescue(&mut tx, pool.backend, server::db::now_ms()).await.expect("rescue"), vec![id]);
    tx.commit().await.expect("commit");
    // Another run starts while part 0 is still in flight: it backs off, or (the bug) sends.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let fenced = scalar(&pool, "SELECT COUNT(*) FROM job_events WHERE error_code = 'WHATSAPP_SEND_IN_PROGRESS'").await;
        if fenced > 0 || graph.sends().get(&format!("job:{id}:part:0")).is_some_and(|n| *n > 1) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    graph.release(&held);
    let done = wait_completed(&pool, 1, Duration::from_secs(60)).await;
    stop(a);
    stop(b);
    let events: Vec<String> = sqlx::query(&format!("SELECT state || ' ' || COALESCE(error_code, '') || ' ' || COALESCE(message, '') FROM job_events WHERE job_id = {id} ORDER BY id"))
        .fetch_all(&pool.pool)
        .await
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(done, 1, "the reply job completes: {events:#?}, sends {:?}", graph.sends());
    let runs = scalar(&pool, &format!("SELECT COUNT(*) FROM job_events WHERE job_id = {id} AND state = 'running'")).await;
    assert!(runs >= 2, "the job ran more than once ({runs} runs)");
    let sends = graph.sends();
    let parts = server::channel::whatsapp::split::split(&text, server::channel::whatsapp::split::MAX_CHARS).len();
    assert!(parts > 1, "a reply of several parts");
    let expected: std::collections::HashMap<String, usize> = (0..parts).map(|n| (format!("job:{id}:part:{n}"), 1)).collect();
    assert_eq!(sends, expected, "one send per part");
}

/// Forwards TCP to PostgreSQL and can cut every connection for a while.
struct FlakyProxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
}

impl FlakyProxy {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (up2, conns2) = (up.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused in effect
                }
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns2.lock().expect("lock").push(task);
            }
        });
        Self { port, up, conns }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().expect("lock").drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

struct Counter(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait::async_trait]
impl JobHandler for Counter {
    async fn run(&self, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(JobOutput::default())
    }
}

async fn outage_backs_off_and_resumes(db: TestDb) {
    let total = 400;
    let pool = prepare(&db, total).await;
    let is_pg = pool.backend == server::db::Backend::Postgres;
    let mut proxy = None;
    let worker_db = if is_pg {
        let url = url::Url::parse(&db.url).expect("url");
        let target = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432));
        let p = FlakyProxy::start(target).await;
        let mut via = url.clone();
        via.set_port(Some(p.port)).expect("port");
        proxy = Some(p);
        Db::connect(&server::config::DatabaseSettings { url: via.to_string(), acquire_timeout: Duration::from_millis(500), ..Default::default() }).await.expect("connect")
    } else {
        Db::connect(&server::config::DatabaseSettings { url: db.url.clone(), busy_timeout: Duration::from_millis(20), ..Default::default() }).await.expect("connect")
    };
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = Registry::new();
    registry.register("probe", Arc::new(Counter(runs.clone())));
    let settings = WorkerSettings { concurrency: 4, poll_interval: Duration::from_millis(50), lease: Duration::from_secs(30), ..Default::default() };
    let (stop_tx, stop_rx) = watch::channel(false);
    let queue = JobQueue::new(worker_db.clone());
    let worker = tokio::spawn(Worker::new(worker_db.clone(), registry, settings, queue.waker()).run(stop_rx));

    while runs.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The outage: PostgreSQL's connections are cut and refused; SQLite is locked by another writer.
    let lock_holder = if let Some(p) = &proxy {
        p.cut();
        None
    } else {
        let mut conn = pool.pool.acquire().await.expect("conn").detach();
        sqlx::query("BEGIN EXCLUSIVE").execute(&mut conn).await.expect("lock");
        Some(conn)
    };
    let during = runs.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let completed_during = scalar(&pool, "SELECT COUNT(*) FROM jobs WHERE state = 'completed'").await;
    if let Some(p) = &proxy {
        p.restore();
    }
    if let Some(mut conn) = lock_holder {
        sqlx::query("COMMIT").execute(&mut conn).await.expect("unlock");
    }
    assert!(completed_during < total as i64, "the outage happened mid-run");
    let done = wait_completed(&pool, total as i64, Duration::from_secs(60)).await;
    stop_tx.send(true).expect("stop");
    worker.await.expect("worker");
    assert_eq!(done, total as i64, "nothing lost: every job completed after the outage");
    assert!(runs.load(Ordering::SeqCst) >= total, "every job ran");
    assert!(runs.load(Ordering::SeqCst) > during, "work resumed after the outage");
    let mut conn = pool.pool.acquire().await.expect("conn");
    let counts = store::counts_by_state(&mut conn).await.expect("counts");
    assert!(counts.iter().all(|(s, _)| *s == JobState::Completed), "{counts:?}");
}
both_backends!(jobs_survive_db_outage, outage_backs_off_and_resumes);

/// Counts the runs of its job going on at once.
struct Concurrent {
    active: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    started: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl JobHandler for Concurrent {
    async fn run(&self, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        struct Leaving<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leaving<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        let _leaving = Leaving(&self.active);
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(6)).await;
        Ok(JobOutput::default())
    }
}

/// A worker that cannot reach the database to renew a run's lease stops the run before the
/// lease runs out: another worker rescues the job once it has, and the two never run it at
/// once. (The run used to go on for its whole budget beside the rescuer's.) PostgreSQL: two
/// processes' workers, one of them behind a connection that is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_run_that_cannot_renew_its_lease_stops_before_it_runs_out() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = prepare(&db, 1).await;
    let url = url::Url::parse(&db.url).expect("url");
    let proxy = FlakyProxy::start(format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432))).await;
    let mut via = url.clone();
    via.set_port(Some(proxy.port)).expect("port");
    let cut_off = Db::connect(&server::config::DatabaseSettings { url: via.to_string(), acquire_timeout: Duration::from_millis(200), ..Default::default() }).await.expect("connect");
    let handler = Arc::new(Concurrent { active: Default::default(), most: Default::default(), started: Default::default() });
    let settings = WorkerSettings {
        concurrency: 1,
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(1),
        job_timeout: Duration::from_secs(20),
        maintenance_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let start = |db: Db| {
        let mut registry = Registry::new();
        registry.register("probe", handler.clone());
        let (stop, stopped) = watch::channel(false);
        let queue = JobQueue::new(db.clone());
        (stop, tokio::spawn(Worker::new(db, registry, settings.clone(), queue.waker()).run(stopped)))
    };
    let (stop_a, worker_a) = start(cut_off);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while handler.started.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the first worker did not start the job");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.cut();
    let (stop_b, worker_b) = start(pool.clone());
    while handler.started.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the job was not rescued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(handler.most.load(Ordering::SeqCst), 1, "the cut-off run stopped before the rescuer's began");
    proxy.restore();
    let _ = (stop_a.send(true), stop_b.send(true));
    let _ = worker_b.await;
    worker_a.abort();
}

/// A heartbeat whose statement hangs (here: it waits on a lock another connection holds; in
/// life, a connection whose peer went silent) counts as failed once the next beat is due, so the
/// run is stopped before its lease runs out. (It used to wait as long as the statement did,
/// and the run went on past its lease, beside the run of whoever rescued the job.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_run_whose_heartbeat_hangs_stops_before_its_lease_runs_out() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = prepare(&db, 1).await;
    let handler = Arc::new(Concurrent { active: Default::default(), most: Default::default(), started: Default::default() });
    let settings = WorkerSettings { concurrency: 1, poll_interval: Duration::from_millis(50), lease: Duration::from_secs(1), job_timeout: Duration::from_secs(20), ..Default::default() };
    let mut registry = Registry::new();
    registry.register("probe", handler.clone());
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Worker::new(pool.clone(), registry, settings, JobQueue::new(pool.clone()).waker()).run(stopped));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while handler.started.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the worker did not start the job");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut holder = pool.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE").execute(&mut *holder).await.expect("lock");
    let locked = std::time::Instant::now();
    while handler.active.load(Ordering::SeqCst) > 0 {
        assert!(locked.elapsed() < Duration::from_millis(1500), "the run went on past its lease while its heartbeat hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.rollback().await.expect("unlock");
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), worker).await;
}

/// A run the lane started at once whose task ends in a panic (outside what its run catches)
/// drops its heartbeat, and the heartbeat stops with it: the lease runs out and the job is
/// rescued, instead of a lease renewed for ever keeping it "running".
#[tokio::test]
async fn an_inline_runs_heartbeat_stops_with_its_task() {
    let db = TestDb::sqlite();
    let pool = prepare(&db, 1).await;
    let id = scalar(&pool, "SELECT MAX(id) FROM jobs").await;
    let settings = server::config::JobSettings { lease: Duration::from_millis(300), ..Default::default() };
    let claimed = server::jobs::inline::claim(&pool, id, &settings).await.expect("claim").expect("claimed");
    let (heartbeat, _lease_lost) = server::jobs::inline::keep_alive(pool.clone(), &claimed);
    let run = tokio::spawn(async move {
        let _held = heartbeat;
        panic!("the run's task panics");
    });
    assert!(run.await.is_err(), "the task panicked");
    let dropped_at = server::db::now_ms();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let lease_until = scalar(&pool, &format!("SELECT lease_expires_at FROM jobs WHERE id = {id}")).await;
    assert!(lease_until <= dropped_at + 300, "no renewal after the task ended: the lease ran out at {lease_until}, the task ended at {dropped_at}");
}

/// The same for a run the tool lane starts at once (`jobs::inline`): cut off from the
/// database, its keep-alive says the lease is lost before the lease runs out, and the run stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_inline_run_that_cannot_renew_its_lease_is_told_to_stop() {
    let Some(db) = TestDb::postgres().await else { return };
    let pool = prepare(&db, 1).await;
    let id = scalar(&pool, "SELECT MAX(id) FROM jobs").await;
    let url = url::Url::parse(&db.url).expect("url");
    let proxy = FlakyProxy::start(format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432))).await;
    let mut via = url.clone();
    via.set_port(Some(proxy.port)).expect("port");
    let cut_off = Db::connect(&server::config::DatabaseSettings { url: via.to_string(), acquire_timeout: Duration::from_millis(200), ..Default::default() }).await.expect("connect");
    let settings = server::config::JobSettings { lease: Duration::from_secs(1), ..Default::default() };
    let claimed = server::jobs::inline::claim(&cut_off, id, &settings).await.expect("claim").expect("claimed");
    let (heartbeat, lease_lost) = server::jobs::inline::keep_alive(cut_off.clone(), &claimed);
    proxy.cut();
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), lease_lost).await.expect("told before long").expect("told, not dropped");
    assert!(started.elapsed() < Duration::from_secs(1), "before the lease ran out: {:?}", started.elapsed());
    drop(heartbeat);
    proxy.restore();
}
