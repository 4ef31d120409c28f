//! Self-improvement (seed 000 §18, milestone 8): traces become findings and eval cases, cases
//! replay deterministically, repairs are proposed as config diffs with a before/after table,
//! and nothing changes until an owner approves.

use std::{path::Path, sync::Arc};

use serde_json::{Value, json};
use server::{
    db::evals as store,
    domain::{ChatKind, Role},
    evals::{Case, Expect, Origin, findings},
    repairs::{self, Decider, RepairError, Workspace, cycle::CycleJob},
};

use crate::{
    both_backends,
    lane::{anthropic, tool_use},
    lane_e2e::{CUSTOMER, rig},
    support::{TestApp, TestDb},
    whatsapp::count,
};

/// A message the shipped configuration leaves to normal chat although it asks what a page says.
const MISROUTED: &str = "what does the menu on bistro-example.com say";

/// A copy of the shipped config folder, so a test may let a repair write to it.
/// A copy of the shipped config folder, an app on it with the shipped lane, and the workspace
/// repairs are proposed, replayed and applied in.
async fn repair_rig(db: TestDb) -> (tempfile::TempDir, TestApp, Workspace) {
    let dir = shipped_config_copy();
    let app = TestApp::in_dir_with(db, dir.path(), server::config::Secrets::default(), |s| s.lane = shipped_lane()).await;
    let ws = Workspace { config_dir: dir.path().to_path_buf(), secrets: server::config::SecretSource::empty(), settings: Arc::new(app.state.config.settings.clone()), live: app.state.tools.catalog() };
    (dir, app, ws)
}

fn shipped_config_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config"));
    for name in ["gatehouse.toml", "tools.toml", "connectors.toml", "mcp.toml"] {
        std::fs::copy(shipped.join(name), dir.path().join(name)).expect("copy config");
    }
    dir
}

fn shipped_lane() -> server::config::LaneSettings {
    server::config::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml"))).expect("shipped").settings.lane
}

fn case(name: &str, message: &str, expect: &str) -> Case {
    Case {
        name: name.into(),
        message: message.into(),
        actor: Role::Customer,
        chat_type: ChatKind::Direct,
        contexts: Vec::new(),
        memory_summary: None,
        clarification: None,
        expect: expect.parse().expect("expectation"),
        origin: Origin { kind: "manual".into(), ..Origin::default() },
        recorded: Vec::new(),
    }
}

fn server_fn_json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The loop on the shipped configuration, through the console: a misrouted message is marked
/// wrong, becomes a case, a proposal fixes it with no regression, nothing changes until the
/// owner approves, and then the same message routes to the tool; a rollback restores the file.
async fn a_marked_trace_becomes_a_repair_the_owner_approves(db: TestDb) {
    let dir = shipped_config_copy();
    let app = TestApp::in_dir_with(db, dir.path(), server::config::Secrets::default(), |s| s.lane = shipped_lane()).await;
    let mut owner = app.with_owner("owner", "correct horse battery staple").await;
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("tools.toml");

    let sent = owner.post_form("/api/simulate_message", &[("from", "+15550100000"), ("text", MISROUTED), ("chat_id", "")]).await;
    let trace = server_fn_json(&sent.body)["trace_id"].as_i64().unwrap_or_else(|| panic!("a trace: {}", sent.body));
    let first: String = sqlx::query_scalar("SELECT decision FROM trace_steps WHERE trace_id = $1 AND step = 'AgentToolCandidate'").bind(trace).fetch_one(&app.state.db.pool).await.expect("step");
    assert_eq!(first, "normal_chat", "the shipped config misroutes it");

    // A case that passes today, so the table has something a careless repair could break.
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    store::upsert_case(&mut conn, &case("thanks", "thanks, see you tomorrow", "normal_chat").to_row()).await.expect("case");
    drop(conn);

    let marked = owner.post_form("/api/mark_trace", &[("trace_id", &trace.to_string()), ("expect", "tool:web_fetch"), ("pattern", ""), ("note", "it asks what a page says")]).await;
    assert!(marked.body.contains("TOOL_NOT_CALLED"), "the pattern follows from the expectation: {}", marked.body);
    let bad = owner.post_form("/api/mark_trace", &[("trace_id", &trace.to_string()), ("expect", "tool"), ("pattern", ""), ("note", "")]).await;
    assert!(bad.body.contains("EVAL_EXPECT_INVALID"), "{}", bad.body);

    let cycle = owner.post_form("/api/run_repair_cycle", &[]).await;
    assert!(cycle.body.contains("1 of 2 case(s) failing; 1 new proposal(s)"), "{}", cycle.body);
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "a proposal changes no file");
    // A second cycle finds the same proposal open and proposes nothing new.
    let again = owner.post_form("/api/run_repair_cycle", &[]).await;
    assert!(again.body.contains("0 new proposal(s)"), "{}", again.body);

    let page = server_fn_json(&owner.post_form("/api/list_repairs", &[]).await.body);
    let repair = &page["repairs"][0];
    assert_eq!((repair["state"].as_str(), repair["fixes"].as_i64(), repair["regressions"].as_i64()), (Some("proposed"), Some(1), Some(0)), "{repair}");
    assert!(repair["diff"].as_str().expect("diff").contains("+triggers = ["), "{repair}");
    let rows = repair["table"].as_array().expect("table");
    assert!(rows.iter().any(|r| r["case"] == format!("trace-{trace}") && r["before_pass"] == false && r["after_pass"] == true), "{rows:?}");
    assert!(rows.iter().any(|r| r["case"] == "thanks" && r["before_pass"] == true && r["after_pass"] == true), "{rows:?}");
    assert_eq!(repair["findings"][0]["trace_id"].as_i64(), Some(trace), "the finding behind it");
    let notices = count(&app, "SELECT COUNT(*) FROM owner_notifications WHERE reason_code = 'REPAIR_PROPOSED'").await;
    assert_eq!(notices, 1, "one notice per new proposal");
    let id = repair["id"].as_i64().expect("id").to_string();
    let (message,): (String,) = sqlx::query_as("SELECT message FROM owner_notifications WHERE reason_code = 'REPAIR_PROPOSED'").fetch_one(&app.state.db.pool).await.expect("notice");
    let link = format!("{}/repairs#repair-{id}", app.state.config.settings.server.console_url());
    assert!(link.starts_with("http") && message.ends_with(&link), "the owner's WhatsApp gets a link a browser opens, not a bare path: {message}");

    // A cycle brings the open proposal up to date in place (as when its file changed since): the
    // approval of the diff the owner was shown is refused, and nothing is applied unseen.
    let shown = repair["seen"].as_str().expect("seen").to_string();
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let row = store::get_repair(&mut conn, id.parse().expect("id")).await.expect("get").expect("row");
    bring_up_to_date(&mut conn, &row).await;
    drop(conn);
    let unseen = owner.post_form("/api/decide_repair", &[("id", &id), ("action", "approve"), ("seen", &shown)]).await;
    assert_eq!(unseen.status, axum::http::StatusCode::CONFLICT, "{}", unseen.body);
    assert!(unseen.body.contains("REPAIR_CHANGED"), "{}", unseen.body);
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "nothing applied");
    let page = server_fn_json(&owner.post_form("/api/list_repairs", &[]).await.body);
    let seen = page["repairs"][0]["seen"].as_str().expect("seen").to_string();
    assert_ne!(seen, shown, "the page shows the new diff");

    // The owner's browser goes away once the approval is stored, while the file is committed
    // to git (the config folder is a working tree): the approval still ends with the catalog
    // reloaded, so the bot does not run on the old one with the repair applied in the file.
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["-c", "user.name=Setup", "-c", "user.email=setup@example.invalid", "commit", "-qm", "shipped config"]);
    let repair_id: i64 = id.parse().expect("id");
    let stored = async {
        loop {
            let state: String = sqlx::query_scalar("SELECT state FROM repairs WHERE id = $1").bind(repair_id).fetch_one(&app.state.db.pool).await.expect("state");
            if state == "applied" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    };
    let before = app.state.tools.catalog();
    let fields = [("id", id.as_str()), ("action", "approve"), ("seen", seen.as_str())];
    tokio::select! {
        answered = owner.post_form("/api/decide_repair", &fields) => {
            assert!(answered.body.contains("applied") && answered.body.contains("reloaded"), "{}", answered.body);
        }
        () = stored => {}
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while Arc::ptr_eq(&before, &app.state.tools.catalog()) {
        assert!(std::time::Instant::now() < deadline, "the catalog was not reloaded after the approval");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let applied = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    assert!(applied.ends_with("# brought up to date\n"), "the diff the owner was shown");
    assert_ne!(applied, original);
    let unnamed = owner.post_form("/api/decide_repair", &[("id", &id), ("action", "approve")]).await;
    assert_eq!(unnamed.status, axum::http::StatusCode::BAD_REQUEST, "an approval names the diff it was shown: {}", unnamed.body);
    let twice = owner.post_form("/api/decide_repair", &[("id", &id), ("action", "approve"), ("seen", &seen)]).await;
    assert!(twice.body.contains("REPAIR_ALREADY_DECIDED"), "decided once: {}", twice.body);

    let resent = owner.post_form("/api/simulate_message", &[("from", "+15550100000"), ("text", MISROUTED), ("chat_id", "")]).await;
    let retrace = server_fn_json(&resent.body)["trace_id"].as_i64().expect("trace");
    let (decision, detail): (String, String) =
        sqlx::query_as("SELECT decision, detail FROM trace_steps WHERE trace_id = $1 AND step = 'AgentToolCandidate'").bind(retrace).fetch_one(&app.state.db.pool).await.expect("step");
    assert_eq!(decision, "plan", "the same message now reaches the tool lane: {detail}");
    assert!(detail.contains("\"web_fetch\""), "{detail}");
    let audited = count(&app, "SELECT COUNT(*) FROM owner_audit WHERE event = 'repair_approved'").await;
    assert_eq!(audited, 1);

    let rolled = owner.post_form("/api/decide_repair", &[("id", &id), ("action", "rollback")]).await;
    assert!(rolled.body.contains("rolled back"), "{}", rolled.body);
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "the file as it was");
    let row = store::get_repair(&mut app.state.db.pool.acquire().await.expect("conn"), id.parse().expect("id")).await.expect("get").expect("row");
    assert_eq!((row.state.as_str(), row.rolled_back_by.as_deref()), ("rolled_back", row.decided_by.as_deref()), "the rollback's owner is kept, beside the approval's");
    assert!(row.rolled_back_at.is_some_and(|at| at >= row.decided_at.unwrap_or_default()));
}
both_backends!(evals_repair_loop, a_marked_trace_becomes_a_repair_the_owner_approves);

/// A proposal that breaks a passing case cannot be approved without a second, explicit
/// confirmation; a rejection needs a reason and touches nothing; a file edited since the
/// proposal is not overwritten.
async fn regressions_ask_twice_and_nothing_is_applied_without_an_owner(db: TestDb) {
    let (dir, app, ws) = repair_rig(db).await;
    // The same words, two expectations: whatever routes one to the tool routes the other too.
    let cases = vec![case("wants-page", MISROUTED, "tool:web_fetch"), case("just-chat", &format!("{MISROUTED}!"), "normal_chat")];
    let proposals = repairs::propose(&ws, &cases, None).await.expect("propose");
    let p = proposals.iter().find(|p| p.case_ids == vec!["wants-page".to_string()]).expect("a proposal for the failing case");
    assert_eq!((p.fixes(), p.regressions()), (1, 1), "{:?}", p.table);
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    // Stored, as the cycle's cases are: an approval replays the stored cases.
    for c in &cases {
        store::upsert_case(&mut conn, &c.to_row()).await.expect("case");
    }
    let (row, _) = repairs::store(&mut conn, p).await.expect("store");
    let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };

    let refused = repairs::approve(&mut conn, &ws, row.id, &owner, false, None).await;
    assert!(matches!(refused, Err(RepairError::NeedsConfirmation(_))), "{refused:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "asked, not applied");
    assert_eq!(store::get_repair(&mut conn, row.id).await.expect("get").expect("row").state.as_str(), "proposed");

    // Another proposal for the same failing case, rejected: a reason is required.
    let (other, _) =
        repairs::store(&mut conn, &repairs::Proposal { summary: "another".into(), change: repairs::FileChange { after: format!("{original}\n# another\n"), ..p.change.clone() }, ..p.clone() })
            .await
            .expect("store");
    assert!(matches!(repairs::reject(&mut conn, dir.path(), other.id, &owner, "  ").await, Err(RepairError::ReasonRequired)));
    repairs::reject(&mut conn, dir.path(), other.id, &owner, "too broad").await.expect("reject");
    assert!(matches!(repairs::approve(&mut conn, &ws, other.id, &owner, true, None).await, Err(RepairError::Decided { .. })), "a rejected repair stays rejected");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "a rejection touches nothing");

    // A file edited by hand since the proposal is not overwritten.
    std::fs::write(dir.path().join("tools.toml"), format!("{original}\n# edited by hand\n")).expect("edit");
    assert!(matches!(repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await, Err(RepairError::Stale(_))));
    assert_eq!(store::get_repair(&mut conn, row.id).await.expect("get").expect("row").state.as_str(), "proposed", "still open after a refused write");
    // Edited by hand to hold the repair's change and more: refused as stale before any replay,
    // so the table the owner saw stays (a replay over the newer file would count the file's
    // own state as the repair's doing, and store that).
    let seen = store::get_repair(&mut conn, row.id).await.expect("get").expect("row").results;
    std::fs::write(dir.path().join("tools.toml"), format!("{}\n# edited by hand too\n", p.change.after)).expect("edit");
    assert!(matches!(repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await, Err(RepairError::Stale(_))));
    assert_eq!(store::get_repair(&mut conn, row.id).await.expect("get").expect("row").results, seen, "no replay over the newer file");
    std::fs::write(dir.path().join("tools.toml"), &original).expect("restore");

    // The config folder is a git working tree: the applied change is committed, the owner its author.
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["-c", "user.name=Setup", "-c", "user.email=setup@example.invalid", "commit", "-qm", "shipped config"]);
    // The repository signs its commits and has a hook that refuses every commit: the server's
    // own commit is neither signed (no key here; a passphrase prompt would hold the request)
    // nor run through the hooks.
    git(&["config", "commit.gpgsign", "true"]);
    let hook = dir.path().join(".git").join("hooks").join("pre-commit");
    std::fs::write(&hook, "#!/bin/sh\nexit 1\n").expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    // An approval that wrote the file but died before its transaction committed left the
    // repair proposed with the file in place: approving again completes it.
    std::fs::write(dir.path().join("tools.toml"), &p.change.after).expect("as a crash left it");
    // Rejected now, the edit would stay in the file and go live at the next reload: refused.
    let half = repairs::reject(&mut conn, dir.path(), row.id, &owner, "changed my mind").await;
    assert!(matches!(half, Err(RepairError::HalfApplied(id)) if id == row.id), "{half:?}");
    let applied = repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await.expect("confirmed");
    assert_eq!((applied.state.as_str(), applied.decided_by.as_deref()), ("applied", Some("Ada")));
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), p.change.after);
    let log = String::from_utf8_lossy(&git(&["log", "-1", "--format=%an <%ae>|%s"]).stdout).into_owned();
    assert!(log.starts_with("Ada <ada@gatehouse.invalid>|Repair #"), "{log}");
    assert!(git(&["status", "--porcelain"]).stdout.is_empty(), "committed whole");
}
both_backends!(evals_repair_regressions, regressions_ask_twice_and_nothing_is_applied_without_an_owner);

/// The table an owner approves from may be older than the cases: a case added since, which
/// the repair breaks, stops the approval (`REPAIR_REPLAY_CHANGED`) and shows in the stored
/// table; approving again then asks for the confirmation that every regression needs.
async fn a_repair_is_replayed_again_when_approved(db: TestDb) {
    let (dir, app, ws) = repair_rig(db).await;
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    store::upsert_case(&mut conn, &case("wants-page", MISROUTED, "tool:web_fetch").to_row()).await.expect("case");
    let cases = findings::cases(&mut conn).await.expect("cases");
    let p = repairs::propose(&ws, &cases, None).await.expect("propose").into_iter().next().expect("a proposal");
    assert_eq!((p.fixes(), p.regressions()), (1, 0), "{:?}", p.table);
    let (row, _) = repairs::store(&mut conn, &p).await.expect("store");
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");

    // Later, a case the same edit breaks.
    store::upsert_case(&mut conn, &case("just-chat", &format!("{MISROUTED}!"), "normal_chat").to_row()).await.expect("case");
    let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };
    let refused = repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await;
    assert!(matches!(refused, Err(RepairError::ReplayChanged { regressions: 1, .. })), "{refused:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "nothing applied");
    let stored = store::get_repair(&mut conn, row.id).await.expect("get").expect("row");
    assert_eq!((stored.state.as_str(), stored.regressions), ("proposed", 1));
    assert!(repairs::table_of(&stored).iter().any(|t| t.case == "just-chat" && t.regressed()), "{:?}", repairs::table_of(&stored));

    let unconfirmed = repairs::approve(&mut conn, &ws, row.id, &owner, false, None).await;
    assert!(matches!(unconfirmed, Err(RepairError::NeedsConfirmation(_))), "{unconfirmed:?}");
    // That case removed again, the replay breaks nothing, and no confirmation is asked.
    assert!(store::delete_case(&mut conn, "just-chat").await.expect("delete"));
    let applied = repairs::approve(&mut conn, &ws, row.id, &owner, false, None).await.expect("nothing to confirm");
    assert_eq!((applied.state.as_str(), applied.regressions), ("applied", 0));
}
both_backends!(evals_repair_replayed_on_approval, a_repair_is_replayed_again_when_approved);

/// The owner confirms the cases a repair breaks by name, not by number: a replay that breaks as
/// many cases as the table said, but another among them, is refused (`REPAIR_REPLAY_CHANGED`),
/// and an approval made from the table before that replay then finds the repair changed
/// (`REPAIR_CHANGED`). Before, the count alone was compared and the repair applied.
async fn a_repair_that_breaks_another_case_than_shown_is_not_applied(db: TestDb) {
    let (dir, app, ws) = repair_rig(db).await;
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    store::upsert_case(&mut conn, &case("wants-page", MISROUTED, "tool:web_fetch").to_row()).await.expect("case");
    store::upsert_case(&mut conn, &case("just-chat", &format!("{MISROUTED}!"), "normal_chat").to_row()).await.expect("case");
    let cases = findings::cases(&mut conn).await.expect("cases");
    let p = repairs::propose(&ws, &cases, None).await.expect("propose").into_iter().next().expect("a proposal");
    assert_eq!((p.fixes(), p.regressions()), (1, 1), "{:?}", p.table);
    let (row, _) = repairs::store(&mut conn, &p).await.expect("store");
    let shown = repairs::fingerprint(&row);
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");

    // The broken case goes, another the same edit breaks comes: still one.
    assert!(store::delete_case(&mut conn, "just-chat").await.expect("delete"));
    store::upsert_case(&mut conn, &case("just-ask", &format!("{MISROUTED}?"), "normal_chat").to_row()).await.expect("case");
    let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };
    let refused = repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await;
    assert!(matches!(refused, Err(RepairError::ReplayChanged { regressions: 1, .. })), "{refused:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "nothing applied");
    let stored = store::get_repair(&mut conn, row.id).await.expect("get").expect("row");
    assert!(repairs::table_of(&stored).iter().any(|t| t.case == "just-ask" && t.regressed()), "{:?}", repairs::table_of(&stored));
    // Approved from the table shown before: changed since.
    let stale = repairs::approve(&mut conn, &ws, row.id, &owner, true, Some(&shown)).await;
    assert!(matches!(stale, Err(RepairError::Changed(_))), "{stale:?}");
    // From the table as it is now: applied.
    let applied = repairs::approve(&mut conn, &ws, row.id, &owner, true, Some(&repairs::fingerprint(&stored))).await.expect("confirmed as shown");
    assert_eq!((applied.state.as_str(), applied.regressions), ("applied", 1));
}
both_backends!(evals_repair_other_regression, a_repair_that_breaks_another_case_than_shown_is_not_applied);

/// Deciding a repair and storing a proposal wait for each other, across connections and
/// processes: two approvals of different repairs made from the same file cannot both pass the
/// stale check (on PostgreSQL each locks only its own row), and two cycles storing one proposal
/// make one row. While another transaction holds the repairs, both wait; then the approval is
/// applied and the proposal stored.
async fn repair_writers_wait_for_each_other(db: TestDb) {
    let (dir, app, ws) = repair_rig(db).await;
    let p = repairs::propose(&ws, &[case("wants-page", MISROUTED, "tool:web_fetch")], None).await.expect("propose").into_iter().next().expect("a proposal");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let (row, _) = repairs::store(&mut conn, &p).await.expect("store");
    drop(conn);

    let mut holder = app.state.db.begin_write().await.expect("tx");
    store::lock_repairs(&mut holder).await.expect("lock");
    let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };
    let (pool, ws) = (app.state.db.pool.clone(), ws.clone());
    let approve = tokio::spawn(async move {
        let mut conn = pool.acquire().await.expect("conn");
        repairs::approve(&mut conn, &ws, row.id, &owner, true, None).await
    });
    let other = repairs::Proposal { summary: "another".into(), change: repairs::FileChange { after: format!("{}\n# another\n", p.change.before), ..p.change.clone() }, ..p.clone() };
    let db = app.state.db.clone();
    let stored = tokio::spawn(async move {
        let mut tx = db.begin_write().await.expect("tx");
        let stored = repairs::store(&mut tx, &other).await;
        tx.commit().await.expect("commit");
        stored
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(!approve.is_finished() && !stored.is_finished(), "both wait for the holder");
    holder.commit().await.expect("release");
    assert_eq!(approve.await.expect("task").expect("approved").state.as_str(), "applied");
    assert!(stored.await.expect("task").expect("stored").1, "stored after it");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), p.change.after);
}
both_backends!(evals_repair_writers_serialised, repair_writers_wait_for_each_other);

/// A proposal gone stale (its file was edited since) is brought up to date when the same edit
/// is proposed again, wherever the edit now lands in the file, and can then be approved; a
/// rejected edit is not proposed again because lines above it moved.
async fn the_same_edit_proposed_again_updates_a_stale_proposal(db: TestDb) {
    let (dir, app, ws) = repair_rig(db).await;
    let cases = vec![case("wants-page", MISROUTED, "tool:web_fetch")];
    let propose = async || repairs::propose(&ws, &cases, None).await.expect("propose").into_iter().find(|p| p.case_ids == vec!["wants-page".to_string()]).expect("a proposal");

    // A proposal made before the file changed (an approval, or the owner's edit, while the
    // cycle ran) is not stored: it could not be applied as it reads.
    let before_the_change = propose().await;
    let shipped = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    std::fs::write(dir.path().join("tools.toml"), format!("# Edited while the cycle ran.\n{shipped}")).expect("edit");
    assert_eq!(app.gatehouse.cycle.store_and_notify(&before_the_change).await.expect("store"), None);
    assert_eq!(count(&app, "SELECT COUNT(*) FROM repairs").await, 0, "nothing stored, no notice");
    std::fs::write(dir.path().join("tools.toml"), &shipped).expect("restore");

    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let (first, new) = repairs::store(&mut conn, &propose().await).await.expect("store");
    assert!(new);
    let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };

    // Lines added above every tool: the proposal is stale, and the same edit now lands lower.
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    std::fs::write(dir.path().join("tools.toml"), format!("# Kept by the shop.\n# Reviewed monthly.\n{original}")).expect("edit");
    assert!(matches!(repairs::approve(&mut conn, &ws, first.id, &owner, true, None).await, Err(RepairError::Stale(_))));
    let again = propose().await;
    let (updated, new) = repairs::store(&mut conn, &again).await.expect("store");
    assert_eq!((updated.id, new), (first.id, false), "the open proposal of the same edit, not a second one");
    assert_ne!(updated.files, first.files, "made from the file as it is now");
    let applied = repairs::approve(&mut conn, &ws, updated.id, &owner, true, None).await.expect("approvable again");
    assert_eq!(applied.state.as_str(), "applied");
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), again.change.after);

    // Rejected, then lines move again: the owner's no stands.
    repairs::rollback(&mut conn, dir.path(), applied.id, &owner).await.expect("rollback");
    let (second, new) = repairs::store(&mut conn, &propose().await).await.expect("store");
    assert!(new, "a rolled-back edit may be proposed again");
    repairs::reject(&mut conn, dir.path(), second.id, &owner, "not this way").await.expect("reject");
    let text = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    std::fs::write(dir.path().join("tools.toml"), format!("# One more note.\n{text}")).expect("edit");
    let (same, new) = repairs::store(&mut conn, &propose().await).await.expect("store");
    assert_eq!((same.id, new, same.state.as_str()), (second.id, false, "rejected"));

    // An owner's note right above the line the edit changes: the lines around the edit differ,
    // the edit does not, and the owner's no still stands.
    let rejected = propose().await;
    let text = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(first_changed_line(&rejected.diff()), "# The shop's own note.");
    std::fs::write(dir.path().join("tools.toml"), lines.join("\n") + "\n").expect("edit");
    let nearby = propose().await;
    assert_ne!(nearby.diff().lines().filter(|l| !l.starts_with("@@")).collect::<Vec<_>>(), rejected.diff().lines().filter(|l| !l.starts_with("@@")).collect::<Vec<_>>(), "the lines around it moved");
    let (same, new) = repairs::store(&mut conn, &nearby).await.expect("store");
    assert_eq!((same.id, new, same.state.as_str()), (second.id, false, "rejected"), "the same edit with other lines around it");
}
both_backends!(evals_repair_updated_when_stale, the_same_edit_proposed_again_updates_a_stale_proposal);

/// What a cycle does to an open proposal when it proposes the same edit (the same strategy and
/// summary) from a file that changed: here, the same change with one more line after it. Returns
/// the stored files.
async fn bring_up_to_date(conn: &mut sqlx::AnyConnection, row: &store::RepairRow) -> String {
    let mut files = repairs::files_of(row);
    for f in files.iter_mut().filter(|f| f.before != f.after) {
        f.after.push_str("# brought up to date\n");
    }
    let (files, diff) = (serde_json::to_string(&files).expect("files"), format!("{}+# brought up to date\n", row.diff));
    let refreshed = store::NewRepair { strategy: &row.strategy, summary: &row.summary, diff: &diff, files: &files, results: &row.results, fixes: row.fixes, regressions: row.regressions, case_ids: &row.case_ids, created_at: row.created_at };
    let (same, new) = store::insert_repair(conn, &refreshed).await.expect("refresh");
    assert_eq!((same.id, new), (row.id, false), "brought up to date in place");
    files
}

/// An approval replays every case before it writes, which takes a while; a cycle that brings
/// the proposal up to date meanwhile (it holds the repairs lock, the approval waits for it)
/// makes the approval refuse, not write the change it checked over the one now stored.
/// PostgreSQL only: SQLite runs one write transaction at a time, so nothing can come between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_brought_up_to_date_during_its_approval_is_not_applied() {
    let Some(db) = TestDb::postgres().await else { return };
    let (dir, app, ws) = repair_rig(db).await;
    let cases = vec![case("wants-page", MISROUTED, "tool:web_fetch")];
    let proposal = repairs::propose(&ws, &cases, None).await.expect("propose").into_iter().find(|p| p.case_ids == vec!["wants-page".to_string()]).expect("a proposal");
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    let (row, _) = repairs::store(&mut app.state.db.pool.acquire().await.expect("conn"), &proposal).await.expect("store");

    let mut cycle = app.state.db.pool.begin().await.expect("begin");
    store::lock_repairs(&mut cycle).await.expect("lock");
    let approving = tokio::spawn({
        let (db, ws, id) = (app.state.db.clone(), ws.clone(), row.id);
        async move {
            let owner = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };
            repairs::approve(&mut db.pool.acquire().await.expect("conn"), &ws, id, &owner, true, None).await
        }
    });
    let waiting = "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>(waiting).fetch_one(&app.state.db.pool).await.expect("locks") == 0 {
        assert!(std::time::Instant::now() < deadline, "the approval never waited for the lock");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let files = bring_up_to_date(&mut cycle, &row).await;
    cycle.commit().await.expect("commit");

    let approved = approving.await.expect("task");
    assert!(matches!(approved, Err(RepairError::Changed(_))), "{:?}", approved.map(|r| r.state));
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "nothing written");
    let now = store::get_repair(&mut app.state.db.pool.acquire().await.expect("conn"), row.id).await.expect("get").expect("row");
    assert_eq!((now.state.as_str(), now.files.as_str()), ("proposed", files.as_str()), "still open, as brought up to date");
}

/// The index (from 0) of the first line a unified diff removes or adds, in the file before it.
fn first_changed_line(diff: &str) -> usize {
    let mut line = 0;
    for l in diff.lines() {
        if let Some(header) = l.strip_prefix("@@ -") {
            line = header.split([',', ' ']).next().and_then(|n| n.parse::<usize>().ok()).expect("hunk start") - 1;
        } else if l.starts_with(' ') {
            line += 1;
        } else if !l.starts_with("---") && !l.starts_with("+++") && (l.starts_with('-') || l.starts_with('+')) {
            return line;
        }
    }
    panic!("no changed line in {diff}")
}

/// The detector found the right tool as its best candidate, just short of the plan threshold:
/// the first proposal is that tool's own `plan_threshold` (not a phrase of this one message),
/// replayed with no regression; once approved, the same message plans with that tool.
async fn a_right_tool_short_of_the_threshold_gets_its_own(db: TestDb) {
    let (_dir, app, ws) = repair_rig(db).await;
    let message = "the web page about cats";
    let cases = vec![case("cats-page", message, "tool:web_fetch"), case("goodbye", "thanks, see you tomorrow", "normal_chat")];
    let before = repairs::run_all(&ws.judge().expect("judge"), &cases).await;
    let o = &before[0].detector.observed;
    assert!(!o.should_plan && o.code == "BELOW_THRESHOLD" && o.candidates.first().map(String::as_str) == Some("web_fetch"), "the shipped config: {o:?}");

    let proposals = repairs::propose(&ws, &cases, None).await.expect("propose");
    let [p] = proposals.as_slice() else { panic!("one proposal: {proposals:?}") };
    assert_eq!((p.strategy.as_str(), p.fixes(), p.regressions()), ("adjust_threshold", 1, 0), "{:?}", p.table);
    let expected = format!("{:.2}", (o.confidence * 100.0).floor() / 100.0);
    assert!(p.diff().contains(&format!("+plan_threshold = {expected}")), "{}", p.diff());
    assert!(p.summary.contains("plan threshold of web_fetch"), "{}", p.summary);

    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    let (row, _) = repairs::store(&mut conn, p).await.expect("store");
    repairs::approve(&mut conn, &ws, row.id, &Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() }, false, None).await.expect("approve");
    let after = repairs::run_all(&ws.judge().expect("judge"), &cases).await;
    assert!(after.iter().all(|r| r.pass()), "{after:?}");
    assert_eq!(after[0].detector.observed.code, "CANDIDATES_FOUND");
}
both_backends!(evals_threshold_repair, a_right_tool_short_of_the_threshold_gets_its_own);

/// Milestone 8's traces: the planner's decision is stored with its answer (secrets replaced),
/// a rejected plan leaves its step, the scan turns a plan naming an unknown tool into a
/// finding, and a case made from the trace replays the recorded answer with no model.
async fn traces_record_planner_answers_that_replay_offline(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.EV1", "Where is my order 4821?")], 1).await;
    let planned: String = sqlx::query_scalar("SELECT s.detail FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = 'wamid.EV1' AND s.step = 'AgentToolPlannerResult'")
        .fetch_one(&r.app.state.db.pool)
        .await
        .expect("planner step");
    let planned: Value = serde_json::from_str(&planned).expect("json");
    assert_eq!(planned["response"]["content"][0]["name"], "order_status", "the planner's answer is kept: {planned}");

    // A plan with a secret-looking argument, and one naming a tool that does not exist.
    r.llm.then(|_| anthropic(json!([tool_use("t1", "order_status", json!({ "order_id": "4821", "api_token": "sk-live-never-stored" }))]), "tool_use"));
    r.exchange(&[("wamid.EV2", "Where is my order 4821 please?")], 2).await;
    r.llm.then(|_| anthropic(json!([tool_use("t1", "delete_everything", json!({}))]), "tool_use"));
    r.exchange(&[("wamid.EV3", "Track my order 4821")], 3).await;
    let leaked = count(&r.app, "SELECT COUNT(*) FROM trace_steps WHERE detail LIKE '%sk-live-never-stored%'").await;
    assert_eq!(leaked, 0, "a secret never reaches a trace");
    let redacted = count(&r.app, "SELECT COUNT(*) FROM trace_steps WHERE step = 'AgentToolPlannerResult' AND detail LIKE '%[REDACTED]%'").await;
    assert_eq!(redacted, 1);
    for (wamid, codes) in [("wamid.EV2", ["TOOL_EXTRA_ARGUMENTS", "TOOL_SCHEMA_INVALID"]), ("wamid.EV3", ["TOOL_UNKNOWN", "TOOL_UNKNOWN"])] {
        let steps = r.steps(wamid).await;
        assert!(steps.iter().any(|(s, _, c)| s == "AgentToolPlanRejected" && codes.contains(&c.as_str())), "{wamid}: {steps:?}");
    }

    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    let report = findings::scan(&mut conn, &r.app.state.tools.catalog(), &r.app.state.config.settings.evals, 100).await.expect("scan");
    assert_eq!(report.traces, 3);
    let found: Vec<(i64, String)> = sqlx::query_as("SELECT trace_id, pattern FROM findings").fetch_all(&mut *conn).await.expect("findings");
    let ev3: i64 = sqlx::query_scalar("SELECT id FROM traces WHERE message_id = 'wamid.EV3'").fetch_one(&mut *conn).await.expect("trace");
    assert_eq!(found, vec![(ev3, "WRONG_TOOL".to_string())]);
    let again = findings::scan(&mut conn, &r.app.state.tools.catalog(), &r.app.state.config.settings.evals, 100).await.expect("scan");
    assert_eq!((again.traces, again.findings), (0, 0), "the cursor moved on");
    // A trace its message gave up on long ago stays running: the scan reads past it.
    sqlx::query("INSERT INTO traces (correlation_id, channel, chat_id, message_id, actor, route, outcome, started_at, duration_us) VALUES ('gave-up', 'whatsapp', 'c', 'wamid.GAVEUP', 'customer', 'chat', 'running', 0, 0)")
        .execute(&mut *conn)
        .await
        .expect("an abandoned trace");
    drop(conn);
    r.exchange(&[("wamid.EV4", "Where is my order 4821?")], 4).await;
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    let past = findings::scan(&mut conn, &r.app.state.tools.catalog(), &r.app.state.config.settings.evals, 100).await.expect("scan");
    assert_eq!(past.traces, 2, "the abandoned trace and the one after it");

    let ev1: i64 = sqlx::query_scalar("SELECT id FROM traces WHERE message_id = 'wamid.EV1'").fetch_one(&mut *conn).await.expect("trace");
    let right = findings::case_from_trace(&mut conn, ev1, "tool:order_status".parse().expect("expect"), Origin::default(), 6, &[]).await.expect("case");
    assert_eq!((right.message.as_str(), right.recorded.len()), ("Where is my order 4821?", 1));
    drop(conn);
    let hits = r.llm.hits();
    let ws = Workspace {
        config_dir: r.dir.path().to_path_buf(),
        secrets: r.app.state.config.secrets.source.clone(),
        settings: Arc::new(r.app.state.config.settings.clone()),
        live: r.app.state.tools.catalog(),
    };
    let judge = ws.judge().expect("judge");
    let result = judge.judge(&right, None).await;
    assert!(result.pass(), "{result:?}");
    assert_eq!(result.plan.as_ref().map(|p| p.observed.tools.clone()), Some(vec!["order_status".to_string()]));
    let wrong = Case { expect: "tool:refund_order".parse().expect("expect"), ..right.clone() };
    let result = judge.judge(&wrong, None).await;
    assert!(!result.pass() && result.plan.as_ref().is_some_and(|p| !p.pass), "the replay checks the recorded plan: {result:?}");
    assert_eq!(r.llm.hits(), hits, "a replay asks no model");
}
both_backends!(evals_planner_traces_replay, traces_record_planner_answers_that_replay_offline);

/// The scan's patterns a trace shows by itself: a provider error behind the fallback reply and
/// a reply that promises work with no job behind it.
async fn the_scan_finds_hidden_provider_errors_and_empty_promises(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.llm.then(|_| (500, json!({ "type": "error", "error": { "type": "api_error", "message": "boom" } })));
    r.exchange(&[("wamid.SC1", "tell me a joke")], 1).await;
    r.llm.then(|_| anthropic(json!([{ "type": "text", "text": "Sure, I'll check with the kitchen and get back to you." }]), "end_turn"));
    r.exchange(&[("wamid.SC2", "can you ask the kitchen about gluten")], 2).await;
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    findings::scan(&mut conn, &r.app.state.tools.catalog(), &r.app.state.config.settings.evals, 100).await.expect("scan");
    let found: Vec<(String, String)> = sqlx::query_as("SELECT t.message_id, f.pattern FROM findings f JOIN traces t ON t.id = f.trace_id ORDER BY f.id").fetch_all(&mut *conn).await.expect("findings");
    assert_eq!(found, vec![("wamid.SC1".to_string(), "PROVIDER_ERROR_HIDDEN".to_string()), ("wamid.SC2".to_string(), "PROMISE_WITHOUT_JOB".to_string())]);
    let no_case = count(&r.app, "SELECT COUNT(*) FROM eval_cases").await;
    assert_eq!(no_case, 0, "a scan finding becomes a case once someone says what should have happened");
}
both_backends!(evals_scan_patterns, the_scan_finds_hidden_provider_errors_and_empty_promises);

/// An owner's `/wrong` on WhatsApp marks the chat's previous answer through a durable job.
async fn an_owners_wrong_command_marks_the_previous_answer(db: TestDb) {
    let r = rig(db, |_| {}).await;
    let owner = server::owners::ValidOwner::parse("Ada", "ada", secrecy::SecretString::from("correct horse battery staple"), &format!("+{CUSTOMER}"), 8).expect("owner");
    server::owners::add_owner(&r.app.state.db, owner).await.expect("add owner");
    r.exchange(&[("wamid.W1", "tell me a joke")], 1).await;
    r.exchange(&[("wamid.W2", "/wrong nonsense")], 2).await;
    assert!(r.graph.texts().last().is_some_and(|t| t.contains("/wrong tool:NAME")), "usage: {:?}", r.graph.texts());
    // The /wrong's first run failed after its trace was written (a crash, a full disk): handled
    // again, it still marks the answer before it, not its own failed run.
    sqlx::query("INSERT INTO traces (correlation_id, channel, chat_id, message_id, actor, route, outcome, error_code, started_at, duration_us) \
                 SELECT correlation_id || '-first-run', channel, chat_id, 'wamid.W3', actor, 'error', 'failed', 'DATABASE_ERROR', started_at, 0 FROM traces WHERE message_id = 'wamid.W2'")
        .execute(&r.app.state.db.pool)
        .await
        .expect("the failed first run's trace");
    r.exchange(&[("wamid.W3", "/wrong normal_chat keep it short")], 3).await;
    assert!(r.graph.texts().last().is_some_and(|t| t.starts_with("Noted: trace #")), "{:?}", r.graph.texts());
    let marked: (String, String, String) =
        sqlx::query_as("SELECT t.message_id, f.pattern, f.expect FROM findings f JOIN traces t ON t.id = f.trace_id").fetch_one(&r.app.state.db.pool).await.expect("finding");
    assert_eq!(marked, ("wamid.W1".to_string(), "MEMORY_REGRESSION".to_string(), "normal_chat".to_string()), "the last answer that was not a command");
    let cases = count(&r.app, "SELECT COUNT(*) FROM eval_cases WHERE name LIKE 'trace-%'").await;
    assert_eq!(cases, 1);
}
both_backends!(evals_wrong_command, an_owners_wrong_command_marks_the_previous_answer);

/// Eval cases round-trip through a JSON-lines file; a file with a bad line is refused whole.
#[tokio::test]
async fn eval_cases_export_and_import() {
    let text = server::evals::case::to_jsonl(&[case("a", "hi", "normal_chat"), case("b", MISROUTED, "tool:web_fetch")]);
    let back = server::evals::case::parse_jsonl(&text).expect("parse");
    assert_eq!(back.iter().map(|c| (c.name.as_str(), c.expect.clone())).collect::<Vec<_>>(), vec![("a", Expect::NormalChat), ("b", "tool:web_fetch".parse().expect("e"))]);
    assert!(server::evals::case::parse_jsonl(&format!("{text}{{\"name\": 1}}\n")).is_err());
}

/// The repair model (`models.repair`) is asked only for a case no deterministic edit fixes; its
/// edit is checked (a key a repair may not touch is ignored) and replayed like any other, and
/// the person's message reaches it as untrusted data.
#[tokio::test]
async fn the_repair_model_proposes_only_allowed_edits_that_replay_green() {
    let dir = shipped_config_copy();
    let (fake, base) = crate::lane::Fake::start().await;
    let mut settings = crate::lane::settings(server::config::LlmProvider::Anthropic, &base);
    settings.models.repair = "test-repair-model".into();
    // The tool it answers through is config's, and so is its name in the prompt.
    settings.evals.repair_tool = "suggest_change".into();
    let model = crate::lane::model(&settings);
    let live = server::tools::ToolFiles::load(dir.path(), &server::config::SecretSource::empty()).expect("tool files").catalog;
    let ws = Workspace { config_dir: dir.path().to_path_buf(), secrets: server::config::SecretSource::empty(), settings: Arc::new(settings), live };
    // Only short filler words: no phrase for a deterministic trigger.
    let cases = vec![case("is-it-up", "is it up?", "tool:web_fetch")];

    fake.then(|_| anthropic(json!([tool_use("r1", "suggest_change", json!({ "tool": "web_fetch", "key": "handler", "value": "web_search" }))]), "tool_use"));
    assert!(repairs::propose(&ws, &cases, Some(model.as_ref())).await.expect("propose").is_empty(), "a key a repair may not touch is ignored");

    fake.then(|_| anthropic(json!([tool_use("r2", "suggest_change", json!({ "tool": "web_fetch", "key": "triggers", "value": "is it up" }))]), "tool_use"));
    let proposals = repairs::propose(&ws, &cases, Some(model.as_ref())).await.expect("propose");
    let [p] = proposals.as_slice() else { panic!("one proposal: {proposals:?}") };
    assert_eq!((p.strategy.as_str(), p.fixes(), p.regressions()), ("model", 1, 0));
    assert!(p.diff().contains("\"is it up\""), "{}", p.diff());
    let asked = fake.body(1);
    assert_eq!(asked["model"], "test-repair-model");
    assert_eq!(asked["tool_choice"]["name"], "suggest_change");
    assert!(asked["system"].to_string().contains("Call suggest_change once"), "{}", asked["system"]);
    assert!(asked["messages"].to_string().contains("<untrusted_data kind=\\\"message\\\">"), "{asked}");
    assert_eq!(fake.hits(), 2, "asked once per propose, only for the case nothing else fixes");
    assert_eq!(repairs::propose(&ws, &[case("page", MISROUTED, "tool:web_fetch")], Some(model.as_ref())).await.expect("propose").len(), 1);
    assert_eq!(fake.hits(), 2, "a deterministic fix needs no model");

    // The periodic cycle asks about a case once per question, whatever came of it: an edit that
    // fixes nothing is not asked for again, and paid for again, every ten minutes.
    let app = TestApp::in_dir_with(TestDb::sqlite(), dir.path(), server::config::Secrets::default(), |_| {}).await;
    let cycle = repairs::cycle::Cycle { settings: ws.settings.clone(), workspace: ws.clone(), model: model.clone(), ..app.gatehouse.cycle.clone() };
    let upsert = async |case: &Case| {
        let mut conn = app.state.db.pool.acquire().await.expect("conn");
        store::upsert_case(&mut conn, &case.to_row()).await.expect("case");
    };
    upsert(&cases[0]).await;
    let useless = || anthropic(json!([tool_use("r3", "suggest_change", json!({ "tool": "web_fetch", "key": "handler", "value": "web_search" }))]), "tool_use");
    fake.then(move |_| useless());
    let report = cycle.run().await.expect("cycle");
    assert_eq!((report.failing, report.new_proposals.len(), fake.hits()), (1, 0, 3), "asked, and its edit fixed nothing");
    cycle.run().await.expect("cycle again");
    assert_eq!(fake.hits(), 3, "the same question is not asked again");
    // A new question (the case was edited) is asked.
    let mut edited = cases[0].clone();
    edited.origin.note = Some("edited once".into());
    upsert(&edited).await;
    fake.then(move |_| useless());
    cycle.run().await.expect("cycle after the edit");
    assert_eq!(fake.hits(), 4, "an edited case is a new question");
    // A case an open or rejected proposal was made for is not asked about again: each cycle
    // would word a new edit, and each be a new proposal and notice.
    fake.then(|_| anthropic(json!([tool_use("r4", "suggest_change", json!({ "tool": "web_fetch", "key": "triggers", "value": "is it up" }))]), "tool_use"));
    edited.origin.note = Some("edited twice".into());
    upsert(&edited).await;
    let report = cycle.run().await.expect("cycle proposing");
    assert_eq!((report.new_proposals.len(), fake.hits()), (1, 5), "{report:?}");
    edited.origin.note = Some("edited again".into());
    upsert(&edited).await;
    let report = cycle.run().await.expect("cycle with a proposal open");
    assert_eq!((report.new_proposals.len(), fake.hits()), (0, 5), "not asked while its proposal is open");
}

/// The periodic cycle runs as one durable job (its dedupe key), proposes for a failing case and
/// applies nothing; `evals.scan_every = "0s"` schedules nothing.
async fn the_periodic_cycle_proposes_through_the_queue(db: TestDb) {
    let dir = shipped_config_copy();
    let app = TestApp::in_dir_with(db, dir.path(), server::config::Secrets::default(), |s| {
        s.lane = shipped_lane();
        s.evals.scan_every = std::time::Duration::from_millis(50);
    })
    .await;
    let original = std::fs::read_to_string(dir.path().join("tools.toml")).expect("read");
    let mut conn = app.state.db.pool.acquire().await.expect("conn");
    store::upsert_case(&mut conn, &case("page", MISROUTED, "tool:web_fetch").to_row()).await.expect("case");
    drop(conn);
    app.gatehouse.cycle.schedule().await.expect("schedule");
    app.gatehouse.cycle.schedule().await.expect("schedule again");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'evals.cycle'").await, 1, "one cycle job, whoever schedules it");
    let attempts = count(&app, "SELECT max_attempts FROM jobs WHERE kind = 'evals.cycle'").await;
    assert!(attempts >= i64::from(u32::MAX), "a periodic job does not run out of attempts: {attempts}");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(app.gatehouse.worker().run(stopped));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while count(&app, "SELECT COUNT(*) FROM repairs").await == 0 {
        assert!(std::time::Instant::now() < deadline, "the cycle job proposed nothing");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    let _ = worker.await;
    assert_eq!(count(&app, "SELECT COUNT(*) FROM repairs WHERE state = 'proposed'").await, 1);
    assert_eq!(std::fs::read_to_string(dir.path().join("tools.toml")).expect("read"), original, "a job never applies a repair");
    let (state, attempts): (String, i64) = sqlx::query_as("SELECT state, attempt FROM jobs WHERE kind = 'evals.cycle'").fetch_one(&app.state.db.pool).await.expect("job");
    assert!(state == "scheduled" || state == "running", "it comes back every scan_every: {state}");
    assert!(attempts <= 1, "a snooze is not a failed attempt: {attempts}");

    let mut off = app.state.config.settings.clone();
    off.evals.scan_every = std::time::Duration::ZERO;
    let cycle = repairs::cycle::Cycle { settings: Arc::new(off), ..app.gatehouse.cycle.clone() };
    sqlx::query("DELETE FROM jobs WHERE kind = 'evals.cycle'").execute(&app.state.db.pool).await.expect("delete");
    cycle.schedule().await.expect("schedule");
    assert_eq!(count(&app, "SELECT COUNT(*) FROM jobs WHERE kind = 'evals.cycle'").await, 0);

    // A cycle job queued before the cycle was turned off runs once, also when its turn fails
    // (here: a tool file that does not load), and is not snoozed into a loop.
    std::fs::write(dir.path().join("tools.toml"), "[[tool]\n").expect("break tools.toml");
    let job = app.gatehouse.jobs.enqueue(&app.gatehouse.jobs.job(&CycleJob {})).await.expect("enqueue").job;
    let ctx = server::jobs::JobContext { job, deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(30) };
    let output = server::jobs::Handler::run(&cycle, CycleJob {}, &ctx).await.expect("a failed turn is not a failed job");
    assert!(output.preview.as_deref().is_some_and(|p| !p.is_empty()), "{output:?}");
    assert_eq!(output.snooze, None, "off means no next turn, also after a failed one");
}
both_backends!(evals_periodic_cycle, the_periodic_cycle_proposes_through_the_queue);
