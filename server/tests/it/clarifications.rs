//! A clarifying question's answer through the webhook: the lane keeps the question it asked, and
//! the asked person's next message ("Porto") is planned with the request it answers, instead of
//! alone in normal chat. Once, for that person only, while the question is open; a message
//! handled again takes the same question; an eval case made from the answer replays with it.

use std::sync::Arc;

use serde_json::Value;

use crate::{
    both_backends,
    lane::PLANNER_MODEL,
    lane_e2e::{CUSTOMER, rig},
    support::TestDb,
    whatsapp::{envelope, post_signed, text_message},
};

const REQUEST: &str = "What's the weather forecast there tomorrow?";
const QUESTION: &str = "Which place do you mean?";

fn has_step(steps: &[(String, String, String)], step: &str, decision: &str, code: &str) -> bool {
    steps.iter().any(|(s, d, c)| s == step && d == decision && c == code)
}

/// The planner's latest request.
fn last_plan(r: &crate::lane_e2e::Rig) -> Value {
    r.llm.seen.lock().expect("lock").iter().rfind(|b| b["model"] == PLANNER_MODEL).cloned().expect("a plan")
}

fn planned_with_question(plan: &Value) -> bool {
    plan["messages"].to_string().contains(r#"kind=\"clarification\""#)
}

async fn an_answer_is_planned_with_the_question_it_answers(db: TestDb) {
    // No recent turns: the request reaches the planner only as the question's.
    let r = rig(db, |s| s.lane.planner_recent_turns = 0).await;
    r.exchange(&[("wamid.C1", REQUEST)], 1).await;
    assert_eq!(r.graph.texts(), vec![QUESTION.to_string()]);
    let steps = r.steps("wamid.C1").await;
    assert!(has_step(&steps, "AgentToolClarificationKept", "kept", "OK"), "{steps:?}");

    r.exchange(&[("wamid.C2", "Porto")], 2).await;
    let steps = r.steps("wamid.C2").await;
    assert!(has_step(&steps, "AgentToolCandidate", "plan", "CLARIFICATION_ANSWER"), "{steps:?}");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Porto/tomorrow".to_string()], "{steps:?}");
    assert_eq!(r.graph.texts().len(), 2);
    // The planner read the request and its question as data, and the answer as the message.
    let plan = last_plan(&r);
    let said = plan["messages"].to_string();
    let block = said.split(r#"kind=\"clarification\""#).nth(1).and_then(|rest| rest.split("untrusted_data>").next()).unwrap_or_default();
    assert!(block.contains(&format!("person: {REQUEST}")) && block.contains(&format!("assistant: {QUESTION}")), "{said}");
    assert!(said.contains(r#"kind=\"message\">\nPorto\n"#), "{said}");
    assert!(plan["system"].to_string().contains(r#"\"answers_clarification\":true"#), "{}", plan["system"]);

    // Handled again (its first run stopped before its reply was recorded): the same question.
    r.handle_again("wamid.C2").await;
    let candidates = r.steps("wamid.C2").await.into_iter().filter(|(s, _, _)| s == "AgentToolCandidate").count();
    assert!(candidates >= 2, "handled twice");
    assert!(r.steps("wamid.C2").await.iter().filter(|(s, _, _)| s == "AgentToolCandidate").all(|(_, d, c)| d == "plan" && c == "CLARIFICATION_ANSWER"));

    // An eval case made from the answer's trace replays with the question, and plans the call.
    let trace_id: i64 = sqlx::query_scalar("SELECT MIN(id) FROM traces WHERE message_id = 'wamid.C2'").fetch_one(&r.app.state.db.pool).await.expect("trace");
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    let case = server::evals::findings::case_from_trace(&mut conn, trace_id, "tool:forecast".parse().expect("expect"), server::evals::Origin::default(), 0, &[]).await.expect("case");
    drop(conn);
    let asked = case.clarification.clone().expect("the case keeps the question");
    assert_eq!(asked.render(), format!("person: {REQUEST}\nassistant: {QUESTION}"));
    let judge = server::evals::Judge::new(Arc::new(r.app.state.config.settings.clone()), r.app.state.tools.catalog());
    let result = judge.judge(&case, None).await;
    assert!(result.detector.pass, "{:?}", result.detector);
    let plan = result.plan.expect("replayed");
    assert!(plan.pass && plan.observed.route == "tool", "{plan:?}");
    let alone = server::evals::Case { clarification: None, ..case };
    assert!(!judge.judge(&alone, None).await.detector.pass, "without its question the answer stays in chat");

    // The question was answered: the same word again answers nothing (it names the result the
    // answer brought, so it is a follow-up of that).
    r.exchange(&[("wamid.C3", "Porto")], 3).await;
    let steps = r.steps("wamid.C3").await;
    assert!(!steps.iter().any(|(_, _, c)| c == "CLARIFICATION_ANSWER"), "{steps:?}");
    assert!(!planned_with_question(&last_plan(&r)), "the planner was not told of an answered question");
}
both_backends!(clarify_answer_planned, an_answer_is_planned_with_the_question_it_answers);

/// Without kept questions (`clarification_ttl = "0s"`), and once a question has expired, the
/// answer is detected on its own and stays in normal chat.
async fn an_unkept_question_is_not_answered(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.planner_recent_turns = 0;
        s.lane.clarification_ttl = std::time::Duration::ZERO;
    })
    .await;
    r.exchange(&[("wamid.N1", REQUEST)], 1).await;
    r.exchange(&[("wamid.N2", "Porto")], 2).await;
    assert!(r.shop.requests.lock().expect("lock").is_empty());
    assert_eq!(r.graph.texts(), vec![QUESTION.to_string(), "a chat reply".to_string()]);
    assert!(!r.steps("wamid.N1").await.iter().any(|(s, _, _)| s == "AgentToolClarificationKept"));
}
both_backends!(clarify_not_kept, an_unkept_question_is_not_answered);

async fn an_expired_question_is_not_answered(db: TestDb) {
    let r = rig(db, |s| s.lane.planner_recent_turns = 0).await;
    r.exchange(&[("wamid.E1", REQUEST)], 1).await;
    sqlx::query("UPDATE lane_clarifications SET expires_at = 1").execute(&r.app.state.db.pool).await.expect("expire");
    r.exchange(&[("wamid.E2", "Porto")], 2).await;
    let steps = r.steps("wamid.E2").await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "{steps:?}");
    assert_eq!(r.graph.texts()[1], "a chat reply");
    // Keeping the question queued the sweep, which deletes it (an expired question is kept one
    // context_ttl more, as contexts are: here it expired long ago).
    let pool = &r.app.state.db.pool;
    sqlx::query("UPDATE jobs SET scheduled_at = 0 WHERE kind = 'lane.context_sweep'").execute(pool).await.expect("due now");
    r.exchange(&[], 2).await;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM lane_clarifications").fetch_one(pool).await.expect("count");
    assert_eq!(left, 0, "swept");
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'lane.context_sweep'").fetch_one(pool).await.expect("sweep");
    assert_eq!(state, "completed", "nothing left: it stops");
}
both_backends!(clarify_expired, an_expired_question_is_not_answered);

/// In a group the question is the asked member's: another member's "Porto" is their own message.
async fn in_a_group_only_the_asked_member_answers(db: TestDb) {
    let r = rig(db, |s| {
        s.lane.planner_recent_turns = 0;
        s.conversation.mention_names = vec!["@assistant".into()];
    })
    .await;
    let say = |from: &str, wamid: &str, text: &str| {
        let mut m = text_message(from, wamid, text);
        m["group_id"] = "g-clarify".into();
        m
    };
    let post = async |m: Value| assert_eq!(post_signed(&r.app, &envelope(vec![vec![m]])).await.status, axum::http::StatusCode::OK);
    post(say(CUSTOMER, "wamid.G1", &format!("@assistant {REQUEST}"))).await;
    r.exchange(&[], 1).await;
    assert_eq!(r.graph.texts().last().map(String::as_str), Some(QUESTION));
    post(say("16505550199", "wamid.G2", "@assistant Porto")).await;
    r.exchange(&[], 2).await;
    let steps = r.steps("wamid.G2").await;
    assert!(r.shop.requests.lock().expect("lock").is_empty(), "another member did not answer: {steps:?}");
    post(say(CUSTOMER, "wamid.G3", "@assistant Porto")).await;
    r.exchange(&[], 3).await;
    let steps = r.steps("wamid.G3").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Porto/tomorrow".to_string()], "{steps:?}");
}
both_backends!(clarify_group_member, in_a_group_only_the_asked_member_answers);

/// A plan that leaves out a required argument is asked about (`lane.clarify_reply`), and that
/// question is kept too: the answer gives the argument.
async fn a_missing_argument_is_answered(db: TestDb) {
    let r = rig(db, |s| s.lane.planner_recent_turns = 0).await;
    r.exchange(&[("wamid.M1", "Can you track my order please?")], 1).await;
    let asked = r.app.state.config.settings.lane.clarify_reply.replace("{argument}", "order id");
    assert_eq!(r.graph.texts(), vec![asked.clone()], "{:?}", r.steps("wamid.M1").await);
    let steps = r.steps("wamid.M1").await;
    assert!(has_step(&steps, "AgentToolPlanRejected", "clarify", "MISSING_ARGUMENT") && has_step(&steps, "AgentToolClarificationKept", "kept", "OK"), "{steps:?}");
    r.exchange(&[("wamid.M2", "It's A-77")], 2).await;
    let steps = r.steps("wamid.M2").await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["orders/A-77".to_string()], "{steps:?}");
    let said = last_plan(&r)["messages"].to_string();
    assert!(said.contains(&format!("assistant: {asked}")), "{said}");
}
both_backends!(clarify_missing_argument, a_missing_argument_is_answered);

/// An answer that still leaves a detail out is asked about again, with everything so far; its
/// message handled again takes the question it answered the first time and asks its own again
/// (once); and a question an earlier run of a message asked is withdrawn when the message is
/// handled again and asks nothing (that question may never have been sent).
async fn asked_again_and_handled_again(db: TestDb) {
    let r = rig(db, |s| s.lane.planner_recent_turns = 0).await;
    let pool = r.app.state.db.pool.clone();
    let open = async || -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT asked_by, answered_by FROM lane_clarifications ORDER BY id").fetch_all(&pool).await.expect("rows")
    };
    r.exchange(&[("wamid.A1", "Can you track my order please?")], 1).await;
    r.exchange(&[("wamid.A2", "hmm, let me look")], 2).await;
    let asked = r.app.state.config.settings.lane.clarify_reply.replace("{argument}", "order id");
    assert_eq!(r.graph.texts(), vec![asked.clone(), asked.clone()]);
    let rows = vec![("wamid.A1".to_string(), Some("wamid.A2".to_string())), ("wamid.A2".to_string(), None)];
    assert_eq!(open().await, rows);
    r.handle_again("wamid.A2").await;
    let runs: Vec<(String, String, String)> = r.steps("wamid.A2").await.into_iter().filter(|(s, _, _)| s == "AgentToolCandidate").collect();
    assert!(runs.len() >= 2 && runs.iter().all(|(_, _, c)| c == "CLARIFICATION_ANSWER"), "{runs:?}");
    assert_eq!(open().await, rows, "the same question taken, its own asked once");
    r.exchange(&[("wamid.A3", "It's A-77")], 3).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["orders/A-77".to_string()]);
    let said = last_plan(&r)["messages"].to_string();
    let block = said.split(r#"kind=\"clarification\""#).nth(1).and_then(|rest| rest.split("untrusted_data>").next()).unwrap_or_default();
    assert!(block.contains("person: Can you track my order please?") && block.contains("person: hmm, let me look"), "{said}");

    // A question left by an earlier run of a message that now asks nothing.
    sqlx::query("INSERT INTO lane_clarifications (channel, chat_id, requester, turns, tools, asked_by, trace_id, created_at, expires_at) VALUES ('whatsapp', $1, $1, '[]', '[\"forecast\"]', 'wamid.W1', NULL, 0, $2)")
        .bind(CUSTOMER)
        .bind(server::db::now_ms() + 600_000)
        .execute(&r.app.state.db.pool)
        .await
        .expect("left over");
    r.exchange(&[("wamid.W1", "What's the weather in Lisbon today?")], 4).await;
    let steps = r.steps("wamid.W1").await;
    assert!(!steps.iter().any(|(_, _, c)| c == "CLARIFICATION_ANSWER"), "{steps:?}");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM lane_clarifications WHERE asked_by = 'wamid.W1'").fetch_one(&r.app.state.db.pool).await.expect("count");
    assert_eq!(left, 0, "withdrawn");
}
both_backends!(clarify_again, asked_again_and_handled_again);
