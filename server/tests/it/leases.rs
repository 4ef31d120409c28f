//! Leases across machines: processes on several hosts share one PostgreSQL database, and their
//! clocks differ. Every lease (a job's run, a WhatsApp send in flight) is set and checked by the
//! server's clock, so a host whose clock runs ahead does not take a live run from its holder (it
//! would run twice), and a host whose clock runs behind does not set a lease that has already
//! run out. SQLite's processes share one machine and its clock, so this is PostgreSQL's alone.

use server::{
    db::{
        self, Db,
        jobs::{self as store, JobState, NewJob},
        mcp_oauth::{self, Connected},
        whatsapp::{self as ledger, NewOutbound},
    },
    jobs::JobQueue,
};

use crate::support::{TestDb, within_limit};

/// How far the simulated hosts' clocks are off: ten minutes, either way.
const SKEW: i64 = 600_000;
const LEASE: i64 = 30_000;

async fn server_clock(pool: &Db) -> i64 {
    let mut conn = pool.pool.acquire().await.expect("conn");
    sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT").fetch_one(&mut *conn).await.expect("clock")
}

/// Whether `at` is a lease's end about `LEASE` from the server's clock (`before` and `after`
/// read it around the statement that set it).
fn one_lease_from(at: Option<i64>, before: i64, after: i64) -> bool {
    at.is_some_and(|at| at >= before + LEASE - 1 && at <= after + LEASE + 1)
}

async fn leases_follow_the_servers_clock(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let queue = JobQueue::new(pool.clone());
    let noop = NewJob { kind: "noop".into(), queue: "default".into(), max_attempts: 3, correlation_id: "corr-1".into(), args: serde_json::json!({}), ..Default::default() };
    // Due long ago, so that a host behind finds it due too.
    let id = queue.enqueue(&NewJob { scheduled_at: Some(db::now_ms() - 2 * SKEW), ..noop.clone() }).await.expect("enqueue").job.id;
    let mut conn = pool.pool.acquire().await.expect("conn");

    // A host whose clock runs behind claims the job: its lease runs one lease from the server's
    // clock, not to a time already past.
    let behind = db::now_ms() - SKEW;
    let before = server_clock(&pool).await;
    let claimed = store::claim(&mut conn, pool.backend, "default", "w-behind", 1, behind, behind + LEASE).await.expect("claim");
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
    let after = server_clock(&pool).await;
    assert!(one_lease_from(claimed[0].lease_expires_at, before, after), "{:?} against {before}..{after}", claimed[0].lease_expires_at);

    // A host ten minutes ahead runs maintenance: the lease has not run out.
    let ahead = db::now_ms() + SKEW;
    assert_eq!(store::rescue(&mut conn, pool.backend, ahead).await.expect("rescue"), Vec::<i64>::new(), "a clock ahead rescued a live run");

    // The holder's heartbeat extends the lease by one lease from the server's clock too.
    let behind = db::now_ms() - SKEW;
    let before = server_clock(&pool).await;
    assert_eq!(store::heartbeat(&mut conn, &[id], "w-behind", behind, behind + LEASE).await.expect("heartbeat"), vec![id]);
    let after = server_clock(&pool).await;
    let job = store::get(&mut conn, id).await.expect("get").expect("job");
    assert!(one_lease_from(job.lease_expires_at, before, after), "{:?} against {before}..{after}", job.lease_expires_at);
    assert_eq!(store::rescue(&mut conn, pool.backend, db::now_ms()).await.expect("rescue"), Vec::<i64>::new(), "a heartbeat by a clock behind let the lease run out");

    // An owner cancels the running job; a retry from a host ahead waits for the run to stop.
    assert!(store::cancel(&mut conn, id, "owner cancelled", db::now_ms()).await.expect("cancel"));
    assert!(!store::retry_now(&mut conn, id, db::now_ms() + SKEW).await.expect("retry"), "retried while the cancelled run may still be going");
    assert_eq!(store::get(&mut conn, id).await.expect("get").expect("job").state, JobState::Cancelled);
    assert_eq!(store::release_cancelled_leases(&mut conn, pool.backend, db::now_ms() + SKEW).await.expect("release"), 0, "a clock ahead let go a lease still running");

    // A chat's messages run one at a time: while its cancelled run may still be going, a host
    // ahead does not start the chat's next one.
    let inbound = |n: &str| NewJob { kind: "inbound".into(), chat_id: Some("chat-1".into()), dedupe_key: Some(n.into()), ..noop.clone() };
    let first = queue.enqueue(&inbound("first")).await.expect("enqueue").job.id;
    let next = queue.enqueue(&inbound("next")).await.expect("enqueue").job.id;
    let kinds = ["inbound".to_string()];
    let now = db::now_ms();
    let claim = |owner, now: i64| store::Claim { queue: "default", owner, limit: 1, now, lease_until: now + LEASE, kinds: None, one_per_chat: &kinds };
    let claimed = store::claim_in_order(&mut conn, pool.backend, claim("w-true", now)).await.expect("claim");
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![first]);
    assert!(store::cancel(&mut conn, first, "owner cancelled", db::now_ms()).await.expect("cancel"));
    let claimed = store::claim_in_order(&mut conn, pool.backend, claim("w-ahead", db::now_ms() + SKEW)).await.expect("claim");
    assert!(claimed.is_empty(), "a clock ahead started {next} beside its chat's cancelled run: {claimed:?}");

    // The lane's run at once, claimed by a host behind: one lease from the server's clock.
    let alone = queue.enqueue(&NewJob { dedupe_key: Some("alone".into()), ..noop.clone() }).await.expect("enqueue").job.id;
    let behind = db::now_ms() - SKEW;
    let before = server_clock(&pool).await;
    let claimed = store::claim_one(&mut conn, alone, "inline-behind", behind, behind + LEASE).await.expect("claim").expect("claimed");
    let after = server_clock(&pool).await;
    assert!(one_lease_from(claimed.lease_expires_at, before, after), "{:?} against {before}..{after}", claimed.lease_expires_at);

    // One process at a time refreshes an MCP server's OAuth token: a host ahead waits too.
    let server = Connected { server_id: "crm", resource: "https://crm.example/mcp", metadata: "{}", client_id: "gatehouse", client_secret: None, credentials: "sealed" };
    mcp_oauth::connect(&mut conn, &server).await.expect("connect");
    let behind = db::now_ms() - SKEW;
    assert!(mcp_oauth::take_lease(&mut conn, "crm", "refresh-behind", behind, behind + LEASE).await.expect("lease"));
    let ahead = db::now_ms() + SKEW;
    assert!(!mcp_oauth::take_lease(&mut conn, "crm", "refresh-ahead", ahead, ahead + LEASE).await.expect("lease"), "a clock ahead took the refresh lease");

    // A WhatsApp part in flight: a sender on a host ahead does not take it over and send it again.
    let row = ledger::reserve_outbound(&mut conn, &NewOutbound {
        idempotency_key: "job:1:part:0", job_id: Some(1), part: 0, recipient: "16505551234", is_group: false, kind: "text", body: "On its way.", quoted_id: None,
    }, db::now_ms()).await.expect("reserve");
    let behind = db::now_ms() - SKEW;
    assert!(ledger::mark_sending(&mut conn, row.id, "run-behind", behind, behind + LEASE).await.expect("sending"));
    let ahead = db::now_ms() + SKEW;
    assert!(!ledger::mark_sending(&mut conn, row.id, "run-ahead", ahead, ahead + LEASE).await.expect("sending"), "a clock ahead took a send in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_follow_the_servers_clock() {
    if let Some(db) = TestDb::postgres().await {
        within_limit("leases::postgres_leases_follow_the_servers_clock", leases_follow_the_servers_clock(db)).await;
    }
}
