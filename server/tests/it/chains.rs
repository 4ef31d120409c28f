//! Controlled chaining (seed 000 §13, milestone 5) through the webhook: search -> open as one
//! request with one reply, its session and steps stored and each step audited; a failed first
//! step stops the chain; more calls than steps left stop it safely; a write in a chain waits for
//! an owner; a customer cannot chain into an owner-only tool.

use crate::{
    both_backends,
    lane::PLANNER_MODEL,
    lane_e2e::{Rig, rig},
    support::TestDb,
};

async fn session(r: &Rig) -> (String, i64, Vec<(String, String)>) {
    let pool = &r.app.state.db.pool;
    let (id, status, count): (i64, String, i64) = sqlx::query_as("SELECT id, status, step_count FROM tool_sessions ORDER BY id DESC LIMIT 1").fetch_one(pool).await.expect("session");
    let steps: Vec<(String, String)> = sqlx::query_as("SELECT tool, status FROM tool_session_steps WHERE session_id = $1 ORDER BY step_index").bind(id).fetch_all(pool).await.expect("steps");
    (status, count, steps)
}

fn planner_calls(r: &Rig) -> usize {
    r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == PLANNER_MODEL).count()
}

async fn search_then_open_is_one_request_with_one_reply(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C1", "Find the returns page and open it, please")], 1).await;
    let texts = r.graph.texts();
    assert_eq!(texts.len(), 1, "one reply for the chain: {texts:?}");
    assert!(texts[0].starts_with("Returns are free within 30 days"), "the final summary: {texts:?}");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()]);
    assert_eq!(planner_calls(&r), 2, "the second step was planned from the first's result");
    let second = r.llm.seen.lock().expect("lock").iter().filter(|b| b["model"] == PLANNER_MODEL).nth(1).cloned().expect("second plan");
    assert!(second["messages"].to_string().contains("Returns policy"), "the planner saw step 1's result");
    assert!(!second["messages"].to_string().contains(crate::lane_e2e::CUSTOMER), "cleaned as the summarizer's copy: no sender's number");
    assert_eq!(second["tool_choice"]["disable_parallel_tool_use"], true, "no parallel calls");
    let (status, count, steps) = session(&r).await;
    assert_eq!((status.as_str(), count), ("answered", 2));
    assert_eq!(steps, vec![("page_search".to_string(), "answered".to_string()), ("open_page".to_string(), "answered".to_string())]);
    r.app.state.tools.audit().flush().await;
    let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit WHERE tool IN ('page_search', 'open_page') AND decision = 'allow'").fetch_one(&r.app.state.db.pool).await.expect("audit");
    assert_eq!(audited, 2, "each step audited");
    let steps = r.steps("wamid.C1").await;
    assert_eq!(steps.iter().filter(|(s, _, _)| s == "AgentToolChainStep").count(), 2, "{steps:?}");
}
both_backends!(chain_search_open, search_then_open_is_one_request_with_one_reply);

async fn a_failed_or_overlong_or_forbidden_step_stops_the_chain(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.customer_max_risk = server::config::lane::RiskCeiling::High;
        // Offered, so a refund in a chain is a candidate and meets the approval rule.
        s.lane.always_offered = vec!["refund_order".into()];
    })
    .await;
    // Two calls where one step is left: stopped safely with step 1's answer.
    r.exchange(&[("wamid.C3", "Find the returns page and open both")], 1).await;
    assert!(r.graph.texts()[0].starts_with("I found two pages"), "{:?}", r.graph.texts());
    let steps = r.steps("wamid.C3").await;
    assert!(steps.iter().any(|(s, d, _)| s == "AgentToolChainStopped" && d == "stopped"), "{steps:?}");
    assert!(!r.shop.requests.lock().expect("lock").iter().any(|q| q.starts_with("pages/")), "no page opened");

    // A customer cannot chain into an owner-only tool.
    r.exchange(&[("wamid.C4", "Find the returns page and show sales")], 2).await;
    assert!(!r.shop.requests.lock().expect("lock").contains(&"sales".to_string()));
    assert_eq!(session(&r).await.0, "stopped");

    // A write in a chain waits for an owner; nothing is refunded. (Not offered, it would be
    // refused as LANE_TOOL_NOT_CANDIDATE.)
    r.exchange(&[("wamid.C5", "Find the returns page and refund it")], 3).await;
    let last = r.graph.texts()[2].clone();
    assert!(last.starts_with("I found two pages") && last.ends_with(&r.app.state.config.settings.lane.approval_reply), "{last} {:?}", r.steps("wamid.C5").await);
    let (status, _, steps) = session(&r).await;
    assert_eq!(status, "stopped");
    assert_eq!(steps.last().map(|(t, s)| (t.as_str(), s.as_str())), Some(("refund_order", "approval")));
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals WHERE tool = 'refund_order' AND state = 'pending'").fetch_one(&r.app.state.db.pool).await.expect("approval");
    assert_eq!(pending, 1);
    assert!(!r.shop.requests.lock().expect("lock").iter().any(|q| q.starts_with("refunds/")));

    // Step 1 fails (the shop answers 400: a definite answer, said at once and not retried) and
    // step 2 is never planned or run.
    let lane = r.app.state.config.settings.lane.clone();
    let planned = planner_calls(&r);
    r.exchange(&[("wamid.C2", "Find the returns page and break it")], 4).await;
    assert_eq!(r.graph.texts()[3..].to_vec(), vec![lane.failed_reply.clone()], "no 'looking it up' first");
    let runs: i64 = sqlx::query_scalar("SELECT MAX(attempt) FROM jobs WHERE kind = 'tool.call' AND tool_name = 'page_search' AND state = 'discarded'").fetch_one(&r.app.state.db.pool).await.expect("job");
    assert_eq!(runs, 1, "a 400 is not retried");
    assert_eq!(planner_calls(&r), planned + 1, "only the first step was planned");
    assert_eq!(session(&r).await.0, "stopped");

    // Step 2 lacks an argument: the person gets step 1's answer and the question, not the
    // question alone (step 1's job no longer sends its answer: the lane took it).
    r.exchange(&[("wamid.C6", "Find the returns page and open the one I mean")], 5).await;
    let last = r.graph.texts()[4].clone();
    assert!(last.starts_with("I found two pages") && last.contains("\n\n") && !last.ends_with("I found two pages"), "{last} {:?}", r.steps("wamid.C6").await);
    let steps = r.steps("wamid.C6").await;
    assert!(steps.iter().any(|(s, d, _)| s == "AgentToolChainStopped" && d == "clarify"), "{steps:?}");
}
both_backends!(chain_stops, a_failed_or_overlong_or_forbidden_step_stops_the_chain);

/// A low-risk write that policy alone would let run waits for an owner as a chain's step
/// (`APPROVAL_CHAIN_WRITE`), and the owner is told why in the configured words, not a code.
async fn a_low_risk_write_in_a_chain_waits_with_its_reason_in_words(db: TestDb) {
    let tools = format!(
        "{}{}",
        crate::lane_e2e::TOOLS,
        r#"
[[tool]]
name = "flag_page"
title = "Flag a page"
description = "Flags a shop page for the team to review."
triggers = ["flag it", "flag the page"]
provider = "connector"
operation = "write"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["page"], properties = { page = { type = "string", maxLength = 40 } } }
"#
    );
    let action = "\n[[connector.action]]\ntool = \"flag_page\"\nmethod = \"POST\"\npath = \"pages/{{page}}\"\n";
    let r = crate::lane_e2e::rig_with(db, &tools, action, |_| {}).await;
    r.exchange(&[("wamid.C8", "Find the returns page and flag it")], 1).await;
    let steps = r.steps("wamid.C8").await;
    let pending: Vec<(String, String)> = sqlx::query_as("SELECT reason_code, reason FROM approvals WHERE tool = 'flag_page' AND state = 'pending'").fetch_all(&r.app.state.db.pool).await.expect("approval");
    let words = r.app.state.config.settings.approvals.reason_words("APPROVAL_CHAIN_WRITE").expect("shipped words");
    assert_eq!(pending, vec![("APPROVAL_CHAIN_WRITE".to_string(), words)], "{steps:?}");
    assert!(!r.shop.requests.lock().expect("lock").iter().any(|q| q == "pages/returns"), "the write never ran");
}
both_backends!(chain_write_reason, a_low_risk_write_in_a_chain_waits_with_its_reason_in_words);

/// Two calls in one plan (a model that ignores the no-parallel request; the validator accepts
/// it only for chainable tools) run one after the other within max_steps and are stored as a
/// tool session with two steps.
async fn two_calls_in_one_plan_are_a_session(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C6", "Search the shop for returns and open that page, both at once")], 1).await;
    let trace_steps = r.steps("wamid.C6").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()], "in order, one after the other: {trace_steps:?}");
    let (status, count, steps) = session(&r).await;
    assert_eq!((status.as_str(), count), ("answered", 2));
    assert_eq!(steps, vec![("page_search".to_string(), "answered".to_string()), ("open_page".to_string(), "answered".to_string())]);
}
both_backends!(chain_two_calls_session, two_calls_in_one_plan_are_a_session);

/// When the first of two calls in one plan fails, the second never runs (seed §13: a failed
/// step ends the chain), and the person is told of the failure once.
async fn a_failed_first_call_of_a_plan_stops_the_second(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C7", "Search the shop for returns and open that page, both at once (the search may be broken)")], 1).await;
    let trace_steps = r.steps("wamid.C7").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string()], "the page was never opened: {trace_steps:?}");
    let (status, _, steps) = session(&r).await;
    assert_eq!(status, "stopped");
    assert_eq!(steps, vec![("page_search".to_string(), "failed".to_string())]);
    assert_eq!(r.graph.texts(), vec![r.app.state.config.settings.lane.failed_reply.clone()]);
    assert!(trace_steps.iter().any(|(s, _, c)| s == "AgentToolChainStopped" && c != "OK"), "{trace_steps:?}");
}
both_backends!(chain_two_calls_failed_first, a_failed_first_call_of_a_plan_stops_the_second);

/// When the first of two calls in one plan is still running at the lane's deadline, the plan
/// stops there: the second, which may depend on it, is not started beside it. The first's
/// answer comes later, once.
async fn a_pending_first_call_of_a_plan_stops_the_second(db: TestDb) {
    let r = rig(db, |s| s.lane.immediate_deadline = std::time::Duration::from_millis(300)).await;
    *r.shop.slow.lock().expect("lock") = std::time::Duration::from_secs(1);
    r.exchange(&[("wamid.C12", "Search the shop for returns and open that page, both at once (the search is slow)")], 2).await;
    let trace_steps = r.steps("wamid.C12").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string()], "the page was never opened: {trace_steps:?}");
    assert!(trace_steps.iter().any(|(s, _, c)| s == "AgentToolChainStopped" && c == "CHAIN_STEP_PENDING"), "{trace_steps:?}");
    let texts = r.graph.texts();
    assert_eq!(texts.len(), 2, "the acknowledgement, then the search's answer: {texts:?}");
    assert_eq!(texts[0], r.app.state.config.settings.lane.pending_reply);
}
both_backends!(chain_two_calls_pending_first, a_pending_first_call_of_a_plan_stops_the_second);

/// A step's result can carry instructions, so the next step is planned without the chat's
/// memory and earlier tool results: what the person said before, and what earlier lookups found,
/// are not there to be carried into a call a page asked for. The first plan reads them.
async fn a_chain_step_is_planned_without_the_chats_memory(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C9", "Hi! I'm staying in Porto this week.")], 1).await;
    r.exchange(&[("wamid.C10", "Find the returns page and open it, please")], 2).await;
    r.exchange(&[("wamid.C11", "Find the returns page and open it again")], 3).await;
    let plans = r.planner_messages();
    assert_eq!(plans.len(), 4, "two chains of two steps: {plans:?}");
    let (first, step) = (&plans[2], &plans[3]);
    assert!(first.contains("chat_summary") && first.contains("Porto"), "the first plan reads the chat: {first}");
    assert!(first.contains("recent_tool_results"), "and the chat's earlier results: {first}");
    assert!(step.contains("Returns policy"), "the step's plan reads the step's result: {step}");
    for gone in ["chat_summary", "Porto", "recent_tool_results"] {
        assert!(!step.contains(gone), "{gone} reached the plan after a result: {step}");
    }
    assert!(!plans[1].contains("Porto"), "{}", plans[1]);
    assert_eq!(r.graph.texts().len(), 3, "each message answered once");
}
both_backends!(chain_step_without_memory, a_chain_step_is_planned_without_the_chats_memory);

/// Only a chainable tool's result leads to another call. With room for three steps, a second
/// step whose tool is read-only but not chainable ends the chain with its answer: its result is
/// never planned from.
async fn a_step_that_is_not_chainable_ends_the_chain(db: TestDb) {
    let open_page = "name = \"open_page\"\n";
    let at = crate::lane_e2e::TOOLS.find(open_page).expect("open_page");
    let (before, after) = crate::lane_e2e::TOOLS.split_at(at);
    let tools = format!("{before}{}", after.replacen("chainable = true\n", "", 1));
    assert_ne!(tools, crate::lane_e2e::TOOLS);
    let r = crate::lane_e2e::rig_with(db, &tools, "", |s| s.lane.max_steps = 3).await;
    r.exchange(&[("wamid.C12", "Find the returns page and open it, please")], 1).await;
    let trace_steps = r.steps("wamid.C12").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()], "{trace_steps:?}");
    assert_eq!(planner_calls(&r), 2, "open_page's result was not planned from: {trace_steps:?}");
    let (status, count, _) = session(&r).await;
    assert_eq!((status.as_str(), count), ("answered", 2));
    assert!(r.graph.texts()[0].starts_with("Returns are free within 30 days"), "{:?}", r.graph.texts());
}
both_backends!(chain_not_chainable_step, a_step_that_is_not_chainable_ends_the_chain);

/// A chain's message handled again (its first run stopped before its reply was recorded) runs
/// none of its calls again: each step's kept answer is taken again, and the next step is
/// planned from the first step's kept result, so the reply is the chain's last answer.
async fn a_chain_handled_again_runs_nothing_twice(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C13", "Find the returns page and open it, please")], 1).await;
    let reply = r.graph.texts()[0].clone();
    assert!(reply.starts_with("Returns are free within 30 days"), "{reply}");
    let pool = &r.app.state.db.pool;
    r.handle_again("wamid.C13").await;
    let steps = r.steps("wamid.C13").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()], "each call ran once: {steps:?}");
    assert_eq!(steps.iter().filter(|(s, d, _)| s == "AgentToolJobDedupe" && d == "already_answered").count(), 2, "{steps:?}");
    let plans = r.planner_messages();
    assert_eq!(plans.len(), 4, "two plans a run");
    assert!(plans[3].contains("Returns policy"), "the second step planned again from the first's kept result: {}", plans[3]);
    let recorded: String = sqlx::query_scalar("SELECT reply FROM message_replies WHERE message_id = 'wamid.C13'").fetch_one(pool).await.expect("reply");
    assert_eq!(recorded, reply);
    assert_eq!(r.graph.texts(), vec![reply], "sent once");
}
both_backends!(chain_handled_again, a_chain_handled_again_runs_nothing_twice);

/// A chain's next step is planned from its own calls only: the first plan's catalog searches
/// (whose words may quote the chat) are not shown again.
async fn a_chain_step_is_planned_without_the_first_plans_searches(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.C14", "Find the returns page, looking in the catalog first, and open it")], 1).await;
    let steps = r.steps("wamid.C14").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()], "{steps:?}");
    let plans = r.planner_messages();
    assert_eq!(plans.len(), 3, "the search, the first call, the next step: {plans:?}");
    assert!(plans[1].contains("tool_search_results"), "the first plan read its search: {}", plans[1]);
    assert!(plans[2].contains("Returns policy") && !plans[2].contains("tool_search_results"), "the next step's plan: {}", plans[2]);
}
both_backends!(chain_step_without_searches, a_chain_step_is_planned_without_the_first_plans_searches);
