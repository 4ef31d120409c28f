//! A full disk loses nothing. `gatehouse serve` keeps its SQLite file on a small tmpfs of its own
//! (mounted in a private mount namespace, so nothing changes for the rest of the machine), and
//! the test fills that disk through `/proc/<pid>/root`: the webhook refuses what it cannot store
//! with 503 `STORAGE_FULL`, the owner is told, and once there is room again every message,
//! including the ones Meta delivers again, is answered exactly once.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    procs::{Gatehouse, kill_nine, wait_for},
    support::TestDb,
    whatsapp::{ACCESS_TOKEN, APP_SECRET, FakeGraph, PHONE_NUMBER_ID, VERIFY_TOKEN, VERSION, envelope, text_message},
};

/// The tmpfs: room for the migrated database and some traffic, small enough to fill at once.
const DISK: &str = "size=8m";

/// `unshare` runs the rest of the command line in a new mount namespace, where `sh` mounts the
/// tmpfs over `folder` and then becomes `gatehouse` (exec), so the child's pid is Gatehouse's.
/// Without root, a user namespace maps this user to root inside it.
fn wrapper(folder: &Path) -> Vec<String> {
    let mut w: Vec<String> = ["unshare", "--mount", "--propagation", "private"].map(String::from).to_vec();
    if !is_root() {
        w.push("--map-root-user".into());
    }
    let script = format!("mount -t tmpfs -o {DISK} gatehouse-test \"$1\" && shift && exec \"$@\"");
    w.extend(["sh".into(), "-c".into(), script, "sh".into(), folder.display().to_string()]);
    w
}

fn is_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Writes zeros to `path` until the file system refuses (ENOSPC).
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the disk failed otherwise: {e}"),
        }
    }
    // What is left is less than a chunk; fill it too.
    let mut byte = [0u8; 1];
    while file.write_all(&byte).is_ok() {
        byte[0] = 0;
    }
}

struct Post {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

async fn post(addr: &str, from: &str, wamid: &str) -> Post {
    let resp = crate::procs::post_signed(addr, envelope(vec![vec![text_message(from, wamid, "Are you open on Sunday?")]])).await;
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
    Post { status, retry_after, body: resp.text().await.unwrap_or_default() }
}

/// The first owner, set up through the console; returns the session cookie.
async fn setup_owner(addr: &str) -> String {
    let form = [("display_name", "Ada"), ("login", "ada"), ("password", "correct horse battery"), ("password_confirm", "correct horse battery"), ("whatsapp", "+15550001111")];
    let resp = reqwest::Client::new().post(format!("http://{addr}/api/setup_owner")).header("origin", format!("http://{addr}")).header("content-type", "application/x-www-form-urlencoded").body(url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish()).send().await.expect("setup");
    assert_eq!(resp.status().as_u16(), 200);
    let cookie = resp.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find(|c| c.starts_with(server::web::SESSION_COOKIE)).expect("session cookie");
    cookie.split(';').next().unwrap_or_default().to_string()
}

async fn metric(addr: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://{addr}/metrics")).await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// Replies sent, by recipient.
fn replies(graph: &FakeGraph) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for send in graph.sends() {
        *by.entry(send["to"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    by
}

#[tokio::test]
async fn a_full_disk_loses_no_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).expect("mount point");
    // The wrapper must work here, or the test cannot say anything: fail with why.
    let probe = std::process::Command::new(wrapper(&disk)[0].clone()).args(&wrapper(&disk)[1..]).args(["sh", "-c", "true"]).output().expect("run unshare");
    assert!(probe.status.success(), "a private tmpfs needs unshare(1) with root or user namespaces: {}", String::from_utf8_lossy(&probe.stderr));

    let graph = FakeGraph::start().await;
    let url = format!("sqlite://{}", disk.join("gatehouse.db").display());
    let env = [
        ("GATEHOUSE__DATABASE__URL", url.as_str()),
        ("GATEHOUSE__WHATSAPP__GRAPH_BASE_URL", graph.base_url.as_str()),
        ("GATEHOUSE__WHATSAPP__GRAPH_VERSION", VERSION),
        ("GATEHOUSE__WHATSAPP__PHONE_NUMBER_ID", PHONE_NUMBER_ID),
        ("GATEHOUSE__WHATSAPP__TYPING_INDICATOR", "false"),
        ("GATEHOUSE__WHATSAPP__MARK_READ", "false"),
        // Retries come quickly, so the test sees the queue catch up soon after there is room.
        ("GATEHOUSE__JOBS__RETRY_BASE", "100ms"),
        ("GATEHOUSE__JOBS__RETRY_MAX", "1s"),
        ("WHATSAPP_APP_SECRET", APP_SECRET),
        ("WHATSAPP_ACCESS_TOKEN", ACCESS_TOKEN),
        ("WHATSAPP_VERIFY_TOKEN", VERIFY_TOKEN),
    ];
    let placeholder = TestDb::sqlite();
    let gh = Gatehouse::new(dir.path(), &placeholder, "", "", &env);
    let log = dir.path().join("serve.log");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let wrap = wrapper(&disk);
    let wrap: Vec<&str> = wrap.iter().map(String::as_str).collect();
    let mut server = gh.serve_via(&wrap, &log).await;
    let pid = server.id().expect("pid");
    // The tmpfs as Gatehouse sees it.
    let inside: PathBuf = PathBuf::from(format!("/proc/{pid}/root{}", disk.display()));
    assert!(inside.join("gatehouse.db").exists(), "the database is on the private disk: {}", logs());
    assert!(!disk.join("gatehouse.db").exists(), "and nowhere else");

    let first = post(&gh.addr(), "15550001000", "wamid.DF0").await;
    assert_eq!(first.status, 200, "{}", first.body);
    let graph_ref = &graph;
    wait_for("the first reply", Duration::from_secs(30), async || replies(graph_ref).len() == 1).await;

    let cookie = setup_owner(&gh.addr()).await;
    let filled_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64().floor();
    fill(&inside.join("filler"));
    // Writes land in room the write-ahead log already has until it must grow: post until the
    // disk refuses one. Each post that is answered 200 was stored.
    let mut stored = vec!["15550001000".to_string()];
    let mut refused = None;
    for i in 1..2000 {
        let from = format!("1555000{:04}", 1000 + i);
        let answer = post(&gh.addr(), &from, &format!("wamid.DF{i}")).await;
        match answer.status {
            200 => stored.push(from),
            503 => {
                assert!(answer.body.starts_with("STORAGE_FULL:"), "{}", answer.body);
                assert_eq!(answer.retry_after.as_deref(), Some("60"));
                refused = Some((from, format!("wamid.DF{i}")));
                break;
            }
            other => panic!("post {i}: {other} {}\n{}", answer.body, logs()),
        }
    }
    let (from, wamid) = refused.unwrap_or_else(|| panic!("the full disk never refused a post\n{}", logs()));
    // Another write that needs no new room (a job's update) may have cleared the flag since: the
    // time of the last refusal says so for certain.
    let last = metric(&gh.addr(), "database_storage_full_last_seconds").await.expect("the metric says so");
    assert!(last >= filled_at, "the last refusal is after the disk filled: {last} < {filled_at}");
    let free = metric(&gh.addr(), "database_free_bytes").await.expect("free bytes");
    assert!(free < 65_536.0, "{free}");

    // Meta delivers it again while the disk is still full: refused again, and still nothing lost.
    for _ in 0..3 {
        assert_eq!(post(&gh.addr(), &from, &wamid).await.status, 503);
    }
    // The owner can still open the console, and every page says what is wrong.
    let page = reqwest::Client::new().get(format!("http://{}/jobs", gh.addr())).header("cookie", &cookie).send().await.expect("console");
    assert_eq!(page.status().as_u16(), 200, "the console works on a full disk");
    let html = page.text().await.unwrap_or_default();
    assert!(html.contains("data-testid=\"disk-full-banner\"") && html.contains("STORAGE_FULL"), "{html}");
    let said = logs().matches("the database's disk is full").count();
    assert!((1..=2).contains(&said), "said once an episode, not once a post: {said}\n{}", logs());
    assert!(!logs().contains("response failed"), "a refused post is no ERROR line of its own: {}", logs());
    let checkpoints = logs().matches("checkpointing the SQLite write-ahead log failed").count();
    assert!(checkpoints <= 2, "the checkpointer's failing rounds (ten a second) are logged once: {checkpoints}");

    std::fs::remove_file(inside.join("filler")).expect("free the disk");
    let again = post(&gh.addr(), &from, &wamid).await;
    assert_eq!(again.status, 200, "stored once there is room: {}", again.body);
    stored.push(from);
    assert_eq!(metric(&gh.addr(), "database_storage_full").await, Some(0.0));

    let want: BTreeMap<String, usize> = stored.iter().map(|s| (s.clone(), 1)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while replies(&graph).len() < want.len() {
        if std::time::Instant::now() > deadline {
            let got = replies(&graph);
            let missing: Vec<&String> = want.keys().filter(|to| !got.contains_key(*to)).collect();
            panic!("no reply to {missing:?} within 90 s of the disk having room again:\n{}", logs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a second reply, were one on its way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replies(&graph), want, "one reply each, none twice:\n{}", logs());
    assert!(!logs().contains("job discarded"), "a full disk uses up no job's attempts:\n{}", logs());
    kill_nine(&mut server).await;
}

/// Before the disk is full: with SQLite, every console page warns while less than
/// `database.low_space_mib` is free on the database's disk, and the Dashboard shows the free
/// space. PostgreSQL's disk is the server's: no figure, no warning.
async fn little_room_left_is_told_on_every_page(db: TestDb) {
    let sqlite = db.url.starts_with("sqlite:");
    // More than any disk here has: the warning must show.
    let app = crate::support::TestApp::with(db, |s| {
        s.database.low_space_mib = 1 << 40;
        s.database.low_space_notice = "Gatehouse has only {free} left on the disk (it warns below {threshold}).".into();
    })
    .await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    for page in ["/", "/jobs", "/settings"] {
        let html = owner.get(page).await.body;
        assert_eq!(html.contains("data-testid=\"disk-low-banner\""), sqlite, "{page}");
        assert!(!html.contains("disk-full-banner"), "nothing failed to write");
    }
    let facts = owner.post_form("/api/dashboard_facts", &[]).await.json();
    assert_eq!(facts["database_free_bytes"].as_u64().is_some_and(|b| b > 0), sqlite, "{facts}");
    let shell = owner.post_form("/api/current_owner", &[]).await.json();
    assert_eq!(shell["disk"]["low_space_mib"].as_u64(), sqlite.then_some(1 << 40), "{shell}");

    // The owners are told on WhatsApp too, once a UTC day (SQLite only).
    let (db, queue) = (&app.state.db, &app.state.jobs);
    let database = app.state.config.settings.database.clone();
    // Noon of the current UTC day, so that a minute later is the same day whenever this runs.
    let now = server::db::now_ms();
    let now = now - now.rem_euclid(86_400_000) + 43_200_000;
    let told = server::owners::storage_notice::check(db, queue, &database, now).await.expect("check");
    assert_eq!(told, sqlite);
    assert!(!server::owners::storage_notice::check(db, queue, &database, now + 60_000).await.expect("check"), "not again the same day");
    let tomorrow = now - now.rem_euclid(86_400_000) + 86_400_000;
    assert_eq!(server::owners::storage_notice::check(db, queue, &database, tomorrow).await.expect("check"), sqlite, "again the next day");
    let notices: Vec<(String, String)> = sqlx::query_as("SELECT args, kind FROM jobs WHERE kind = 'owner.notify'").fetch_all(&db.pool).await.expect("jobs");
    assert_eq!(notices.len(), if sqlite { 2 } else { 0 }, "{notices:?}");
    if let Some((args, _)) = notices.first() {
        let args: serde_json::Value = serde_json::from_str(args).expect("args");
        assert_eq!(args["to"], "15550001111");
        let text = args["message"].as_str().unwrap_or_default();
        assert!(text.contains(" MiB left on the disk") && text.contains(&format!("{} MiB", 1u64 << 40)) && !text.contains('{'), "{text}");
    }

    // The shipped threshold (1 GiB) against a disk with room: no warning.
    let roomy = crate::support::TestApp::new(TestDb::sqlite()).await;
    let mut owner = roomy.with_owner("ada", "correct horse battery").await;
    let shell = owner.post_form("/api/current_owner", &[]).await.json();
    assert!(shell["disk"].is_null() || shell["disk"]["free_bytes"].as_u64().is_some_and(|b| b < 1 << 30), "{shell}");
}
crate::both_backends!(disk_low_space, little_room_left_is_told_on_every_page);
