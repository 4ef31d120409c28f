//! Exactly-once effects under concurrency: the maintenance statements (rescue, expire) racing a
//! worker's own transaction, and two runs of one job sending the same reply part.
//!
//! The interleavings are forced, not hoped for: one connection holds a transaction open while the
//! other statement starts, and the test waits until PostgreSQL shows that statement waiting on the
//! row lock (or already finished) before it commits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Json, Router, extract::State, routing::post};
use serde_json::{Value, json};
use server::{
    channel::whatsapp::{Recipient, SendOutcome, WhatsAppSender, graph::GraphClient, sender::SEND_IN_PROGRESS},
    config::WhatsAppSettings,
    db::{
        self, Backend, Db,
        jobs::{self as store, Finished, JobState, NewJob},
    },
    jobs::JobQueue,
};
use sqlx::Row;
use tokio::{sync::Notify, task::JoinHandle};

use crate::{both_backends, support::TestDb};

fn job() -> NewJob {
    NewJob { kind: "noop".into(), max_attempts: 3, correlation_id: "race".into(), args: json!({}), ..Default::default() }
}

async fn fresh(db: &TestDb) -> Db {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    pool
}

/// Returns once `task` is either finished or, on PostgreSQL, waiting for a lock held by another
/// transaction of this database. (SQLite has one writer: its statement simply waits its turn.)
async fn blocked_or_done<T>(pool: &Db, task: &JoinHandle<T>) {
    if pool.backend != Backend::Postgres {
        tokio::task::yield_now().await;
        return;
    }
    loop {
        let waiting: i64 = sqlx::query("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            .fetch_one(&pool.pool)
            .await
            .expect("activity")
            .get(0);
        if waiting > 0 || task.is_finished() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A rescue that starts while the job's worker is committing its completion must not turn the
/// completed job back into `retryable` (it would run again and repeat its effects).
async fn rescue_racing_a_completion(db: TestDb) {
    let pool = fresh(&db).await;
    let id = JobQueue::new(pool.clone()).enqueue(&job()).await.expect("enqueue").job.id;
    // After the enqueue, so the job is due.
    let t0 = db::now_ms();
    let mut conn = pool.pool.acquire().await.expect("conn");
    // Claimed with a lease that has already run out: the worker is late, but alive.
    store::claim(&mut conn, pool.backend, "default", "w1", 1, t0, t0 - 1000).await.expect("claim");
    drop(conn);

    let mut worker = pool.begin_write().await.expect("begin");
    let done = store::complete(&mut worker, &[Finished { id, attempt: 1, preview: None }], "w1", t0 + 20).await.expect("complete");
    assert_eq!(done, vec![(id, 1)]);

    let rescuer_pool = pool.clone();
    let rescuer = tokio::spawn(async move {
        let mut tx = rescuer_pool.begin_write().await.expect("begin");
        let rescued = store::rescue(&mut tx, rescuer_pool.backend, t0 + 1000).await.expect("rescue");
        tx.commit().await.expect("commit");
        rescued
    });
    blocked_or_done(&pool, &rescuer).await;
    worker.commit().await.expect("commit");
    let rescued = rescuer.await.expect("rescuer");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let job = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!(job.state, JobState::Completed, "the completion stands (rescued: {rescued:?}, error: {:?})", job.last_error_code);
    assert!(rescued.is_empty(), "{rescued:?}");
}
both_backends!(jobs_rescue_races_completion, rescue_racing_a_completion);

/// An expiry that starts while a worker is claiming the job must not cancel the job it claimed.
async fn expire_racing_a_claim(db: TestDb) {
    let pool = fresh(&db).await;
    let ttl_end = db::now_ms() + 60_000;
    let id = JobQueue::new(pool.clone()).enqueue(&NewJob { expires_at: Some(ttl_end), ..job() }).await.expect("enqueue").job.id;
    let t0 = db::now_ms();

    let mut worker = pool.begin_write().await.expect("begin");
    let claimed = store::claim(&mut worker, pool.backend, "default", "w1", 1, t0, t0 + 60_000).await.expect("claim");
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);

    let expirer_pool = pool.clone();
    let expirer = tokio::spawn(async move {
        let mut tx = expirer_pool.begin_write().await.expect("begin");
        let expired = store::expire(&mut tx, expirer_pool.backend, ttl_end + 1).await.expect("expire");
        tx.commit().await.expect("commit");
        expired
    });
    blocked_or_done(&pool, &expirer).await;
    worker.commit().await.expect("commit");
    let expired = expirer.await.expect("expirer");

    let mut conn = pool.pool.acquire().await.expect("conn");
    let job = store::get(&mut conn, id).await.expect("get").expect("job");
    assert_eq!((job.state, job.lease_owner.as_deref()), (JobState::Running, Some("w1")), "the claim stands (expired: {expired:?})");
    assert!(expired.is_empty(), "{expired:?}");
    // Its worker's result still counts.
    assert_eq!(store::complete(&mut conn, &[Finished { id, attempt: 1, preview: None }], "w1", ttl_end + 2).await.expect("complete"), vec![(id, 1)]);
}
both_backends!(jobs_expire_races_claim, expire_racing_a_claim);

/// A Graph API that counts sends per idempotency key and can hold the first send until released.
#[derive(Clone, Default)]
pub struct GatedGraph {
    pub base_url: String,
    sends: Arc<Mutex<HashMap<String, usize>>>,
    gate: Arc<Mutex<Option<Arc<Notify>>>>,
    arrived: Arc<Notify>,
}

impl GatedGraph {
    /// Starts the fake; when `hold_first`, the first send waits for [`GatedGraph::release`].
    pub async fn start(hold_first: bool) -> Self {
        let mut graph = GatedGraph::default();
        if hold_first {
            *graph.gate.lock().expect("gate") = Some(Arc::new(Notify::new()));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        graph.base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = Router::new().route("/{version}/{phone}/messages", post(Self::answer)).with_state(graph.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        graph
    }

    async fn answer(State(graph): State<GatedGraph>, Json(body): Json<Value>) -> Json<Value> {
        let key = body["biz_opaque_callback_data"].as_str().unwrap_or_default().to_string();
        let n = {
            let mut sends = graph.sends.lock().expect("sends");
            let n = sends.entry(key.clone()).or_default();
            *n += 1;
            *n
        };
        let gate = graph.gate.lock().expect("gate").take();
        if let Some(gate) = gate {
            graph.arrived.notify_one();
            gate.notified().await;
        }
        Json(json!({ "messaging_product": "whatsapp", "messages": [{ "id": format!("wamid.{key}.{n}") }] }))
    }

    /// Waits until the held first send has arrived.
    pub async fn first_arrived(&self) {
        self.arrived.notified().await;
    }

    pub fn release(&self, held: &Arc<Notify>) {
        held.notify_one();
    }

    /// The gate of the first send, taken before starting the senders.
    pub fn held(&self) -> Option<Arc<Notify>> {
        self.gate.lock().expect("gate").clone()
    }

    pub fn sends(&self) -> HashMap<String, usize> {
        self.sends.lock().expect("sends").clone()
    }
}

/// Settings that point a sender at `graph` with no pacing in the way.
pub fn sender_settings(graph: &GatedGraph) -> WhatsAppSettings {
    WhatsAppSettings {
        graph_base_url: graph.base_url.clone(),
        phone_number_id: "106540352242922".into(),
        send_attempts: 1,
        pair_burst: 100,
        pair_interval: Duration::from_millis(1),
        global_rate_per_second: 1000,
        ..Default::default()
    }
}

fn sender(pool: &Db, graph: &GatedGraph) -> WhatsAppSender {
    let settings = sender_settings(graph);
    let client = GraphClient::new(&settings, Some("test-access-token".to_string().into())).expect("client");
    WhatsAppSender::new(pool.clone(), client, settings)
}

/// Two runs of one job (a rescued lease, a second process) send its reply at the same time:
/// the part the first run has in flight is not sent by the second.
async fn two_runs_send_each_part_once(db: TestDb) {
    let pool = fresh(&db).await;
    let graph = GatedGraph::start(true).await;
    let held = graph.held().expect("gate");
    let (first, second) = (Arc::new(sender(&pool, &graph)), sender(&pool, &graph));
    let to = Recipient { id: "16505551234".into(), group: false };

    let first_run = {
        let (first, to) = (first.clone(), to.clone());
        tokio::spawn(async move { first.send_text(900, &to, "Your order has shipped.", None).await })
    };
    graph.first_arrived().await;
    // The first run's part is in flight at Meta. The second run must not send it too.
    let overlapping = second.send_text(900, &to, "Your order has shipped.", None).await;
    graph.release(&held);
    let first_outcome = first_run.await.expect("join").expect("first run sends");
    assert_eq!(first_outcome, SendOutcome::Sent { parts: 1, already_sent: 0 });
    match overlapping {
        Err(server::channel::whatsapp::sender::SendError::Retry { code, .. }) => assert_eq!(code, SEND_IN_PROGRESS),
        other => panic!("the overlapping run must back off, not send: {other:?} (sends: {:?})", graph.sends()),
    }
    // Its retry finds the part sent.
    assert_eq!(second.send_text(900, &to, "Your order has shipped.", None).await.expect("retry"), SendOutcome::Sent { parts: 1, already_sent: 1 });
    assert_eq!(graph.sends(), HashMap::from([("job:900:part:0".to_string(), 1)]), "one send per part");
}
both_backends!(whatsapp_two_runs_one_send, two_runs_send_each_part_once);
