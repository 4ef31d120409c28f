//! Live events: their order per chat, a subscriber that falls behind, two processes on one
//! PostgreSQL database, the console's stream resuming after a reconnect, the stream limit, and
//! streams ending with their session.
//! Every wait here awaits an event; none sleeps.

use std::process::Stdio;

use axum::{
    body::Body,
    extract::ConnectInfo,
    http::{Request, StatusCode, header},
};
use http_body_util::BodyExt;
use serde_json::Value;
use server::{
    channel::simulator::SimMessage,
    events::{Envelope, Event, EventId, Replay, Subscription},
    web,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tower::ServiceExt;

use crate::{
    both_backends,
    support::{PUBLIC_URL, TestApp, TestDb},
};

async fn simulate(app: &TestApp, chat: &str, text: &str) -> i64 {
    let message = SimMessage { from: "+15550109999".into(), text: text.into(), chat_id: Some(chat.into()), ..Default::default() };
    let outcome = app.gatehouse.simulator.send(message).await.expect("simulate");
    assert_eq!(outcome.chat_id, format!("sim-{chat}"), "the simulator's chat id");
    outcome.handled.trace_id.expect("a traced message")
}

/// Events until the reply to `trace_id` is delivered (the simulator's last step).
async fn until_delivered(sub: &mut Subscription, trace_id: i64) -> Vec<Envelope> {
    let mut seen = Vec::new();
    loop {
        let envelope = sub.recv().await.expect("bus open");
        let done = matches!(&envelope.event, Event::ReplyDelivered(d) if d.trace_id == Some(trace_id));
        seen.push((*envelope).clone());
        if done {
            return seen;
        }
    }
}

fn step_of(e: &Envelope) -> Option<(i64, i64)> {
    match &e.event {
        Event::Received(s) | Event::Routed(s) | Event::LaneStage(s) | Event::ApprovalRequested(s) | Event::ApprovalDecided(s) | Event::ReplyQueued(s) => {
            Some((s.trace_id, s.seq))
        }
        Event::ReplySent(d) | Event::ReplyDelivered(d) | Event::ReplyRead(d) | Event::ReplyFailed(d) => d.trace_id.zip(d.seq),
        _ => None,
    }
}

async fn events_of_one_chat_arrive_in_order(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut sub = app.state.events.subscribe().await;
    let first = simulate(&app, "order-chat", "hello").await;
    let second = simulate(&app, "order-chat", "and again").await;
    let mut seen = until_delivered(&mut sub, first).await;
    seen.extend(until_delivered(&mut sub, second).await);

    let ids: Vec<EventId> = seen.iter().filter_map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[1].is_after(w[0]) && !w[0].is_after(w[1])), "ids only grow: {ids:?}");
    let steps: Vec<(i64, i64)> = seen.iter().filter(|e| e.chat_id.as_deref() == Some("sim-order-chat")).filter_map(step_of).collect();
    let mut sorted = steps.clone();
    sorted.sort_unstable();
    assert_eq!(steps, sorted, "the first message's steps, then the second's, each in order");
    assert_eq!(steps.first(), Some(&(first, 0)));
    assert!(matches!(seen.iter().find(|e| step_of(e) == Some((second, 0))).map(|e| &e.event), Some(Event::Received(_))));

    // The live events are the database's rows: a page resuming from before them reads the same.
    let Replay::Events(replayed) = app.state.events.replay(EventId::default()).await.expect("replay") else { panic!("within the resume limit") };
    let replayed: Vec<(i64, i64)> = replayed.iter().filter(|e| e.chat_id.as_deref() == Some("sim-order-chat")).filter_map(step_of).collect();
    assert_eq!(replayed, steps);
}
both_backends!(events_ordered_per_chat, events_of_one_chat_arrive_in_order);

async fn a_subscriber_that_falls_behind_is_told_and_resyncs(db: TestDb) {
    let app = TestApp::with(db, |s| s.events.capacity = 16).await;
    let mut slow = app.state.events.subscribe().await;
    let mut fast = app.state.events.subscribe().await;
    let mut traces = Vec::new();
    for n in 0..3 {
        let trace = simulate(&app, "lag-chat", &format!("message {n}")).await;
        until_delivered(&mut fast, trace).await;
        traces.push(trace);
    }
    let told = slow.recv().await.expect("bus open");
    let Event::Resync { reason, missed } = &told.event else { panic!("expected a resync first, got {told:?}") };
    assert_eq!(reason, "lagged");
    assert!(*missed > 0);
    // It resynchronises from the database, and then follows live events again.
    let Replay::Events(all) = app.state.events.replay(EventId::default()).await.expect("replay") else { panic!("within the resume limit") };
    for trace in &traces {
        assert!(all.iter().any(|e| matches!(&e.event, Event::ReplyDelivered(d) if d.trace_id == Some(*trace))), "trace {trace} is in the database");
    }
    let next = simulate(&app, "lag-chat", "after the resync").await;
    let after = until_delivered(&mut slow, next).await;
    assert!(after.iter().any(|e| step_of(e) == Some((next, 0))));
}
both_backends!(events_lagging_subscriber, a_subscriber_that_falls_behind_is_told_and_resyncs);

/// Two processes on one PostgreSQL database: this one (the test) and `events_probe`, neither
/// reading on a timer, see each other's events through LISTEN/NOTIFY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_postgres_see_each_others_events() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    crate::support::within_limit("events::two_processes", async move {
        let app = TestApp::with(db, |s| s.events.poll_interval = std::time::Duration::from_secs(3600)).await;
        let mut sub = app.state.events.subscribe().await;
        let exe = std::env::current_exe().expect("test exe");
        let probe = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples").join("events_probe");
        let mut child = tokio::process::Command::new(probe)
            .arg(&app.db.url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn events_probe (cargo build -p server --examples)");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stdin = child.stdin.take().expect("stdin");
        assert_eq!(lines.next_line().await.expect("read").as_deref(), Some("ready"));

        // This process's message reaches the other one.
        let trace = simulate(&app, "pg-chat", "hello from one process").await;
        loop {
            let line = lines.next_line().await.expect("read").expect("the probe runs");
            let e: Envelope = serde_json::from_str(&line).expect("an event");
            if matches!(&e.event, Event::ReplyDelivered(d) if d.trace_id == Some(trace)) {
                break;
            }
        }
        // The other one's job and receipt reach this one.
        stdin.write_all(b"enqueue probe-chat\nreceipt wamid.probe\n").await.expect("write");
        let (mut job, mut receipt) = (false, false);
        while !(job && receipt) {
            let e = sub.recv().await.expect("bus open");
            match &e.event {
                Event::JobChanged(j) if j.job_kind == "probe.noop" && e.chat_id.as_deref() == Some("probe-chat") => job = true,
                Event::ReplyRead(d) if d.wamid.as_deref() == Some("wamid.probe") => receipt = true,
                _ => {}
            }
        }
        let _ = child.kill().await;
    })
    .await;
}

/// A console event stream read as it arrives.
struct Sse {
    body: Body,
    buf: String,
}

impl Sse {
    /// The next event's id and data (keep-alive comments skipped).
    async fn next(&mut self) -> (Option<String>, Value) {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if !data.is_empty() {
                    return (id, serde_json::from_str(&data).expect("json data"));
                }
                continue;
            }
            let frame = self.body.frame().await.expect("the stream stays open").expect("frame");
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
}

impl Sse {
    /// Whether the server ends the stream within `wait` (events and keep-alives read past).
    async fn ends_within(&mut self, wait: std::time::Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(until, self.body.frame()).await {
                Err(_) => return false,
                Ok(None | Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}

async fn open(app: &TestApp, cookie: &str, last_event_id: Option<&str>) -> Result<Sse, (StatusCode, Value)> {
    open_at(app, "/api/events?topics=message", cookie, last_event_id).await
}

async fn open_at(app: &TestApp, uri: &str, cookie: &str, last_event_id: Option<&str>) -> Result<Sse, (StatusCode, Value)> {
    let mut req = Request::builder()
        .uri(uri)
        .header(header::ORIGIN, PUBLIC_URL)
        .header(header::COOKIE, format!("{}={cookie}", web::SESSION_COOKIE));
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let mut req = req.body(Body::empty()).expect("request");
    req.extensions_mut().insert(ConnectInfo("10.0.0.1:50000".parse::<std::net::SocketAddr>().expect("addr")));
    let res = app.router.clone().oneshot(req).await.expect("infallible");
    if res.status() != StatusCode::OK {
        let status = res.status();
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        return Err((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)));
    }
    Ok(Sse { body: res.into_body(), buf: String::new() })
}

/// Reads the stream until the reply to `trace` is delivered; returns the (trace, seq) of each
/// step event and the last id.
async fn read_trace(stream: &mut Sse, trace: i64) -> (Vec<(i64, i64)>, String) {
    let mut steps = Vec::new();
    let mut last = String::new();
    loop {
        let (id, data) = stream.next().await;
        if let Some(id) = id {
            last = id;
        }
        if data["trace_id"] == trace {
            steps.push((trace, data["seq"].as_i64().expect("seq")));
            if data["kind"] == "reply_delivered" {
                return (steps, last);
            }
        }
    }
}

async fn a_reconnecting_page_gets_what_it_missed(db: TestDb) {
    let app = TestApp::new(db).await;
    let owner = app.with_owner("ada", "correct horse battery").await;
    let cookie = owner.cookie.clone().expect("session");
    let mut stream = open(&app, &cookie, None).await.expect("stream");
    let (_, hello) = stream.next().await;
    assert_eq!((hello["kind"].as_str(), hello["reason"].as_str()), (Some("resync"), Some("connected")), "a fresh page reloads once");

    let first = simulate(&app, "resume-chat", "one").await;
    let (_, last_id) = read_trace(&mut stream, first).await;
    drop(stream);
    // Missed while disconnected:
    let second = simulate(&app, "resume-chat", "two").await;
    let mut again = open(&app, &cookie, Some(&last_id)).await.expect("reconnect");
    let (steps, _) = read_trace(&mut again, second).await;
    let Some((_, stored)) = server::db::traces::get(&mut app.state.db.pool.acquire().await.expect("conn"), second).await.expect("read") else {
        panic!("trace stored")
    };
    let expected: Vec<(i64, i64)> = (0..stored.len() as i64).map(|seq| (second, seq)).collect();
    assert_eq!(steps, expected, "every step of the missed message, in order, with no resync");
    // A position past the newest record (a database restored from an older copy, a made-up
    // id) would mute the stream until the records caught up: the page reloads instead.
    let mut ahead = open(&app, &cookie, Some("999999999-999999999")).await.expect("reconnect from ahead");
    let (_, first) = ahead.next().await;
    assert_eq!((first["kind"].as_str(), first["reason"].as_str()), (Some("resync"), Some("unknown_position")), "{first}");
    let third = simulate(&app, "resume-chat", "three").await;
    let (steps, _) = read_trace(&mut ahead, third).await;
    assert!(!steps.is_empty(), "and it follows what comes next");
}
both_backends!(events_resume_after_reconnect, a_reconnecting_page_gets_what_it_missed);

/// A stream asked for some job kinds leaves the other kinds' job events out: the Repairs page
/// follows the cycle and the marks, not every job of a busy queue.
async fn a_stream_follows_only_the_job_kinds_it_asks_for(db: TestDb) {
    use server::{conversation::MarkTraceJob, jobs::{JobKind, echo::Echo}, repairs::cycle::CycleJob};
    let repairs_live = app::live::REPAIRS_LIVE;
    assert!(repairs_live.contains(CycleJob::KIND) && repairs_live.contains(MarkTraceJob::KIND), "{repairs_live}");
    let app = TestApp::new(db).await;
    let owner = app.with_owner("ada", "correct horse battery").await;
    let cookie = owner.cookie.clone().expect("session");
    let mut stream = open_at(&app, repairs_live, &cookie, None).await.expect("stream");
    assert_eq!(stream.next().await.1["kind"], "resync");
    let queue = &app.gatehouse.jobs;
    queue.enqueue(&queue.job(&Echo { message: "busy".into(), fail_with: None })).await.expect("echo");
    let cycle = queue.enqueue(&queue.job(&CycleJob {})).await.expect("cycle").job.id;
    let (_, event) = stream.next().await;
    assert_eq!((event["job_kind"].as_str(), event["job_id"].as_i64()), (Some(CycleJob::KIND), Some(cycle)), "the echo job's event is left out: {event}");
    // Without kinds, every job's events come.
    let mut all = open_at(&app, "/api/events?topics=job", &cookie, None).await.expect("stream");
    assert_eq!(all.next().await.1["kind"], "resync");
    queue.enqueue(&queue.job(&Echo { message: "busy again".into(), fail_with: None })).await.expect("echo");
    assert_eq!(all.next().await.1["job_kind"], Echo::KIND);
}
both_backends!(events_job_kinds, a_stream_follows_only_the_job_kinds_it_asks_for);

async fn an_owner_session_holds_a_limited_number_of_streams(db: TestDb) {
    let app = TestApp::with(db, |s| s.events.max_streams_per_session = 2).await;
    let owner = app.with_owner("ada", "correct horse battery").await;
    let cookie = owner.cookie.clone().expect("session");
    let one = open(&app, &cookie, None).await.expect("first");
    let _two = open(&app, &cookie, None).await.expect("second");
    let Err((status, body)) = open(&app, &cookie, None).await else { panic!("a third stream is refused") };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["code"], "TOO_MANY_STREAMS");
    drop(one);
    let mut three = open(&app, &cookie, None).await.expect("a closed stream frees its slot");
    assert_eq!(three.next().await.1["kind"], "resync");
    // Another session has its own streams.
    let mut other = app.client();
    let login = other.post_form("/api/login", &[("login", "ada"), ("password", "correct horse battery"), ("next", "/")]).await;
    assert_eq!(login.status, StatusCode::OK, "{}", login.body);
    open(&app, &other.cookie.clone().expect("second session"), None).await.expect("another session's stream");

    // The MCP servers page's stream reads the database every second: it has a limit of its
    // own, which the event streams above do not use up.
    let mcp = app::pages::mcp::MCP_STREAM;
    let first = open_at(&app, mcp, &cookie, None).await.expect("an MCP stream beside two event streams");
    let _second = open_at(&app, mcp, &cookie, None).await.expect("second MCP stream");
    let Err((status, body)) = open_at(&app, mcp, &cookie, None).await else { panic!("a third MCP stream is refused") };
    assert_eq!((status, body["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TOO_MANY_STREAMS")));
    drop(first);
    open_at(&app, mcp, &cookie, None).await.expect("a closed MCP stream frees its slot");
}
both_backends!(events_stream_limit, an_owner_session_holds_a_limited_number_of_streams);

/// A live stream outlives the request the guard let in, so it checks its session again: a
/// logout, or a password reset (which ends every session of that owner), ends the open
/// streams of the session too, and a stolen cookie's stream with them.
async fn a_stream_ends_with_its_session(db: TestDb) {
    let app = TestApp::new(db).await;
    let wait = web::live::SESSION_RECHECK * 3;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let cookie = owner.cookie.clone().expect("session");
    let mut events = open(&app, &cookie, None).await.expect("events");
    assert_eq!(events.next().await.1["kind"], "resync");
    let mut mcp = open_at(&app, app::pages::mcp::MCP_STREAM, &cookie, None).await.expect("mcp stream");
    let out = owner.post_form("/api/logout", &[]).await;
    assert_eq!(out.location(), Some("/login"));
    assert!(events.ends_within(wait).await, "the event stream outlived the logout");
    assert!(mcp.ends_within(wait).await, "the MCP stream outlived the logout");

    let mut again = app.client();
    let login = again.post_form("/api/login", &[("login", "ada"), ("password", "correct horse battery"), ("next", "/")]).await;
    assert_eq!(login.status, StatusCode::OK, "{}", login.body);
    let mut events = open(&app, &again.cookie.clone().expect("session"), None).await.expect("events");
    assert_eq!(events.next().await.1["kind"], "resync");
    assert!(!events.ends_within(web::live::SESSION_RECHECK + std::time::Duration::from_secs(1)).await, "a signed-in owner's stream stays open past a check");
    server::owners::reset_password(&app.state.db, "ada", secrecy::SecretString::from("a brand new password"), 12).await.expect("reset");
    assert!(events.ends_within(wait).await, "the event stream outlived the password reset");
}
both_backends!(events_stream_session_ends, a_stream_ends_with_its_session);

async fn the_dashboard_charts_replies_job_waits_approvals_and_mcp_health(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    simulate(&app, "chart-chat", "hello").await;
    let job = app.state.jobs.enqueue(&app.state.jobs.job(&server::jobs::echo::Echo { message: "x".into(), fail_with: None })).await.expect("enqueue");
    sqlx::query("UPDATE jobs SET started_at = scheduled_at + 1500 WHERE id = $1").bind(job.job.id).execute(&app.state.db.pool).await.expect("start");

    let facts = owner.post_form("/api/dashboard_facts", &[]).await;
    assert_eq!(facts.status, StatusCode::OK, "{}", facts.body);
    let charts = facts.json()["charts"].as_array().cloned().expect("charts");
    let chart = |id: &str| charts.iter().find(|c| c["id"] == id).cloned().unwrap_or_else(|| panic!("chart {id}"));
    let total = |c: &Value, series: &str| -> i64 {
        let Some(j) = c["series"].as_array().expect("series").iter().position(|s| s["name"] == series) else { return 0 };
        c["bars"].as_array().expect("bars").iter().map(|b| b["values"][j].as_i64().unwrap_or(0)).sum()
    };
    let replies = chart("replies");
    assert_eq!(total(&replies, "delivered"), 1, "the simulated reply: {replies}");
    assert_eq!(replies["series"][0]["link"], "/conversations");
    assert_eq!(total(&chart("job_wait"), "average wait"), 1500);
    let approvals = chart("approvals_waiting");
    assert_eq!(approvals["bars"].as_array().map(Vec::len), Some(4), "four age buckets");
    assert_eq!(approvals["link"], "/approvals");
    assert_eq!(chart("mcp_health")["link"], "/mcp");
    assert_eq!(chart("tool_outcomes")["link"], "/tools");
}
both_backends!(dashboard_new_charts, the_dashboard_charts_replies_job_waits_approvals_and_mcp_health);

/// A trace step for chat `early` in a transaction left open (returned), and one for chat `late`
/// committed after it: the later ids commit first.
async fn out_of_order(app: &TestApp, early: &str, late: &str) -> sqlx::Transaction<'static, sqlx::Any> {
    let subject = |chat: &str| server::traces::Subject { correlation_id: chat.into(), channel: "simulator".into(), chat_id: chat.into(), message_id: format!("m-{chat}"), sender: None };
    let mut first = app.state.db.begin_write().await.expect("begin");
    let mut open = server::traces::begin(&mut first, subject(early)).await.expect("trace");
    open.step("dedupe", "new", "FIRST_DELIVERY", serde_json::json!({}));
    let _written = open.flush(&mut first).await.expect("steps");
    let mut second = app.state.db.begin_write().await.expect("begin");
    let mut done = server::traces::begin(&mut second, subject(late)).await.expect("trace");
    done.step("dedupe", "new", "FIRST_DELIVERY", serde_json::json!({}));
    let _written = done.flush(&mut second).await.expect("steps");
    second.commit().await.expect("commit");
    first
}

/// PostgreSQL takes ids at insert, not at commit: a step whose transaction commits after a
/// later step's is still published once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_committed_after_a_later_one_is_still_published() {
    let Some(db) = TestDb::postgres().await else { return };
    crate::support::within_limit("events::late_commit", async move {
        let app = TestApp::new(db).await;
        let mut sub = app.state.events.subscribe().await;
        let first = out_of_order(&app, "late-a", "late-b").await;
        while sub.recv().await.expect("bus open").chat_id.as_deref() != Some("late-b") {}
        first.commit().await.expect("commit");
        while sub.recv().await.expect("bus open").chat_id.as_deref() != Some("late-a") {}
    })
    .await;
}

/// A page's position given while an earlier row may still commit (PostgreSQL takes ids at
/// insert, not at commit) is no safe point to resume from: its id says so, and a page that
/// reconnects from it reloads. Before, the replay read only later ids, so the row committed
/// while the page was away never reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_does_not_resume_past_a_row_that_may_still_commit() {
    let Some(db) = TestDb::postgres().await else { return };
    crate::support::within_limit("events::unsettled_resume", async move {
        let app = TestApp::new(db).await;
        let owner = app.with_owner("ada", "correct horse battery").await;
        let cookie = owner.cookie.clone().expect("session");
        let mut stream = open(&app, &cookie, None).await.expect("stream");
        let (_, hello) = stream.next().await;
        assert_eq!(hello["reason"], "connected");
        let first = out_of_order(&app, "open-a", "open-b").await;
        let id = loop {
            let (id, data) = stream.next().await;
            if data["chat_id"] == "open-b" {
                break id.expect("a row's event has an id");
            }
        };
        assert!(id.ends_with("-u"), "the id says an earlier row may still commit: {id}");
        drop(stream);
        // Committed while the page is away.
        first.commit().await.expect("commit");
        let mut again = open(&app, &cookie, Some(&id)).await.expect("reconnect");
        let (_, told) = again.next().await;
        assert_eq!((told["kind"].as_str(), told["reason"].as_str()), (Some("resync"), Some("unsettled_position")), "{told}");
    })
    .await;
}

/// The dashboard says first what waits for an owner's decision, counting only what an owner can
/// still decide: a decided approval, a quarantined tool its server no longer lists, an expired
/// form and an applied repair are not waiting.
async fn the_dashboard_lists_what_waits_for_the_owner(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    // The counts the navigation and the dashboard both show, read once per page.
    let waiting = |counts: crate::support::Resp| {
        assert_eq!(counts.status, StatusCode::OK, "{}", counts.body);
        counts.json()
    };
    let none = waiting(owner.post_form("/api/waiting", &[]).await);
    assert_eq!(none, serde_json::json!({ "approvals": 0, "oldest_approval_age_ms": null, "mcp_tools": 0, "mcp_forms": 0, "repairs": 0 }));
    assert!(owner.get("/").await.body.contains("Nothing waits for you"), "with nothing waiting, the page says so");

    let now = server::db::now_ms();
    let pool = &app.state.db.pool;
    for (state, asked_at) in [("pending", now - 90_000), ("pending", now - 5_000), ("approved", now - 600_000)] {
        sqlx::query(
            "INSERT INTO approvals (state, tool, tool_version, args, args_hash, call_key, managed_fields, display, risk, reason_code, reason, actor, channel, \
             chat_kind, chat_id, sender, message_id, request, correlation_id, nonce, created_at, expires_at) \
             VALUES ($1, 'refund_order', 'v1', '{}', 'h', $2, '[]', '{}', 'high', 'APPROVAL_RISK', 'r', 'customer', 'whatsapp', 'direct', 'c', 's', 'm', 'q', 'corr', 'n', $3, $4)",
        )
        .bind(state)
        .bind(format!("call-{asked_at}"))
        .bind(asked_at)
        .bind(now + 3_600_000)
        .execute(pool)
        .await
        .expect("approval");
    }
    sqlx::query("INSERT INTO mcp_servers (id, health, updated_at) VALUES ('shop', 'connected', $1)").bind(now).execute(pool).await.expect("server");
    for (name, state, present) in [("new_tool", "pending", 1_i64), ("gone_tool", "pending", 0), ("known_tool", "approved", 1)] {
        sqlx::query("INSERT INTO mcp_tools (server_id, name, catalog_name, definition, definition_hash, state, present, first_seen_at, updated_at) VALUES ('shop', $1, $1, '{}', 'h', $2, $3, $4, $4)")
            .bind(name)
            .bind(state)
            .bind(present)
            .bind(now)
            .execute(pool)
            .await
            .expect("mcp tool");
    }
    for (state, expires_at) in [("pending", now + 60_000), ("pending", now - 1), ("accepted", now + 60_000)] {
        sqlx::query("INSERT INTO mcp_elicitations (server_id, message, schema, state, created_at, expires_at) VALUES ('shop', 'm', '{}', $1, $2, $3)")
            .bind(state)
            .bind(now - 1_000)
            .bind(expires_at)
            .execute(pool)
            .await
            .expect("form");
    }
    for state in ["proposed", "applied"] {
        sqlx::query("INSERT INTO repairs (state, strategy, summary, diff, files, results, fixes, regressions, case_ids, created_at) VALUES ($1, 'add_trigger', 's', $1, '[]', '[]', 1, 0, '[]', $2)")
            .bind(state)
            .bind(now)
            .execute(pool)
            .await
            .expect("repair");
    }

    let w = waiting(owner.post_form("/api/waiting", &[]).await);
    assert_eq!((w["approvals"].as_i64(), w["mcp_tools"].as_i64(), w["mcp_forms"].as_i64(), w["repairs"].as_i64()), (Some(2), Some(1), Some(1), Some(1)), "{w}");
    let age = w["oldest_approval_age_ms"].as_i64().expect("the oldest approval's age");
    assert!((90_000..150_000).contains(&age), "the oldest pending request was asked 90 s ago: {age}");

    // The page says it first, each linked to where it is decided.
    let page = owner.get("/").await;
    assert!(page.body.contains("2 tool calls waiting for your approval (the oldest for 1 min)"), "{}", page.body);
    for link in ["href=\"/approvals\"", "href=\"/mcp\"", "href=\"/repairs\""] {
        assert!(page.body.contains(link), "{link}");
    }
}
both_backends!(dashboard_waiting, the_dashboard_lists_what_waits_for_the_owner);

/// The dashboard warns of the model spend as the budget's shares are crossed: what was spent of
/// which budget, and at 100% what now happens to customers. The spend is counted as the process
/// does it, from a recorded call.
async fn the_dashboard_warns_of_the_spend_budget(db: TestDb) {
    use server::{config::AtLimit, llm::CallObserver};
    let app = TestApp::with(db, |s| {
        s.budget.daily_usd = 0.05;
        s.budget.at_limit = AtLimit::Degraded;
    })
    .await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let page = owner.get("/").await;
    assert!(page.body.contains("of $0.05"), "the budget is shown: {}", page.body);
    assert!(!page.body.contains("data-testid=\"budget-alert\""), "nothing spent, nothing to warn of");

    let record = |row: server::db::llm_calls::LlmCallRow| {
        let app = &app;
        async move {
            let mut conn = app.state.db.pool.acquire().await.expect("conn");
            let id = server::db::llm_calls::insert(&mut conn, &row).await.expect("call");
            app.state.budget.recorded(id, &row).await;
        }
    };
    record(spend(30_000, "c1")).await;
    let page = owner.get("/").await;
    assert!(page.body.contains("Model spend today is at 60% of its budget: $0.03 of $0.05."), "{}", page.body);

    record(spend(30_000, "c2")).await;
    let page = owner.get("/").await;
    assert!(page.body.contains("Model spend today reached its budget: $0.06 of $0.05; customers get the limit reply until the period ends."), "{}", page.body);
}
both_backends!(dashboard_budget, the_dashboard_warns_of_the_spend_budget);

/// A recorded model call, as the recording model writes it.
fn spend(cost: i64, id: &str) -> server::db::llm_calls::LlmCallRow {
    server::db::llm_calls::LlmCallRow {
        at: server::db::now_ms(),
        provider: "anthropic".into(),
        model: "m".into(),
        purpose: "chat".into(),
        correlation_id: id.into(),
        input_tokens: 1,
        output_tokens: 1,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        cost_micro_usd: Some(cost),
        latency_ms: 1,
        outcome: "ok".into(),
        stop_reason: None,
        http_status: Some(200),
        attempts: 1,
        request_id: None,
    }
}

/// A call counts once in the spend, also when a read of the spend that already holds the
/// call's row lands before the process counts the call itself (before, the call then counted
/// twice, and kept counting twice until the period ended).
async fn a_call_counts_once_when_a_read_holds_it_first(db: TestDb) {
    use server::llm::CallObserver;
    let app = TestApp::with(db, |s| {
        s.budget.daily_usd = 1.0;
        s.budget.monthly_usd = 20.0;
        s.budget.refresh = std::time::Duration::from_millis(1);
    })
    .await;
    let budget = &app.state.budget;
    let spent = || async { budget.status().await.expect("spend").iter().map(|p| p.spent_micro_usd).collect::<Vec<_>>() };
    assert_eq!(spent().await, [0, 0], "nothing spent today or this month");
    let row = spend(30_000, "once");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let id = server::db::llm_calls::insert(&mut conn, &row).await.expect("call");
    drop(conn);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(spent().await, [30_000, 30_000], "a read holds the row");
    budget.recorded(id, &row).await;
    assert_eq!(spent().await, [30_000, 30_000], "and the call it held is not added again");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(spent().await, [30_000, 30_000], "nor on the next read");
    // A call counted before any read holds it is counted once too.
    let row = spend(20_000, "then");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let id = server::db::llm_calls::insert(&mut conn, &row).await.expect("call");
    drop(conn);
    budget.recorded(id, &row).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(spent().await, [50_000, 50_000]);
}
both_backends!(budget_counted_once, a_call_counts_once_when_a_read_holds_it_first);
