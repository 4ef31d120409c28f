//! Follow-ups of tool results (seed 000 §11, §12) through the webhook: every summarised result
//! is kept as its chat's tool context; "what about tomorrow?" calls the same tool with the
//! changed date, a question the result answers is answered from it, a memory question stays in
//! normal chat; another chat never sees the context, contexts are bounded per chat, and an
//! expired one is never used (FOLLOWUP_CONTEXT_EXPIRED) and is swept.

use serde_json::Value;

use crate::{
    both_backends,
    lane::PLANNER_MODEL,
    lane_e2e::{CUSTOMER, rig},
    support::TestDb,
    whatsapp::{envelope, post_signed, text_message},
};

const OTHER: &str = "16505550199";

async fn contexts_of(r: &crate::lane_e2e::Rig, chat: &str) -> Vec<(String, String, String, String)> {
    sqlx::query_as("SELECT tool, args, summary, entities FROM tool_contexts WHERE channel = 'whatsapp' AND chat_id = $1 ORDER BY id")
        .bind(chat)
        .fetch_all(&r.app.state.db.pool)
        .await
        .expect("contexts")
}

fn has_step(steps: &[(String, String, String)], step: &str, decision: &str, code: &str) -> bool {
    steps.iter().any(|(s, d, c)| s == step && d == decision && c == code)
}

/// The detail of the step named `step` in the trace of message `wamid`.
async fn step_detail(r: &crate::lane_e2e::Rig, wamid: &str, step: &str) -> Value {
    let detail: String = sqlx::query_scalar("SELECT s.detail FROM trace_steps s JOIN traces t ON t.id = s.trace_id WHERE t.message_id = $1 AND s.step = $2")
        .bind(wamid)
        .bind(step)
        .fetch_one(&r.app.state.db.pool)
        .await
        .unwrap_or_else(|e| panic!("{step} of {wamid}: {e}"));
    serde_json::from_str(&detail).expect("json detail")
}

async fn a_follow_up_reuses_the_tool_context(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.F1", "What's the weather in Lisbon today?")], 1).await;
    assert_eq!(r.graph.texts(), vec!["Today: sunny in Lisbon, 24°C.".to_string()], "{:?}", r.steps("wamid.F1").await);
    let kept = contexts_of(&r, CUSTOMER).await;
    assert_eq!(kept.len(), 1, "the summarised result is the chat's context");
    let (tool, args, summary, entities) = &kept[0];
    assert_eq!((tool.as_str(), summary.as_str()), ("forecast", "Today: sunny in Lisbon, 24°C."));
    assert_eq!(serde_json::from_str::<Value>(args).expect("json"), serde_json::json!({ "date": "today", "place": "Lisbon" }));
    assert!(entities.contains("Lisbon"), "{entities}");
    // The trace names the context it stored, and the follow-up names the context it read.
    let context_id: i64 = sqlx::query_scalar("SELECT id FROM tool_contexts").fetch_one(&r.app.state.db.pool).await.expect("context id");
    assert_eq!(step_detail(&r, "wamid.F1", "AgentToolContextStored").await["context_id"], context_id.to_string());

    // "What about tomorrow?": the same tool, the same place, the changed date.
    r.exchange(&[("wamid.F2", "And what about tomorrow?")], 2).await;
    assert_eq!(r.graph.texts()[1], "Tomorrow: rain in Lisbon.");
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Lisbon/today".to_string(), "forecast/Lisbon/tomorrow".to_string()]);
    let steps = r.steps("wamid.F2").await;
    assert!(has_step(&steps, "AgentToolFollowupResolved", "call_same_tool", "FOLLOWUP_CONTEXT"), "{steps:?}");
    assert_eq!(step_detail(&r, "wamid.F2", "AgentToolFollowupResolved").await["context_id"], context_id.to_string());
    // An eval case made from this trace keeps the context, its personal-data fields replaced.
    let trace_id: i64 = sqlx::query_scalar("SELECT id FROM traces WHERE message_id = 'wamid.F2'").fetch_one(&r.app.state.db.pool).await.expect("trace");
    let mut conn = r.app.state.db.pool.acquire().await.expect("conn");
    let case = server::evals::findings::case_from_trace(&mut conn, trace_id, "normal_chat".parse().expect("expect"), server::evals::Origin::default(), 6, &["place".to_string()]).await.expect("case");
    drop(conn);
    assert_eq!(case.contexts.len(), 1);
    assert_eq!(case.contexts[0].args, serde_json::json!({ "date": "today", "place": "[PII]" }));
    let planned = r.llm.seen.lock().expect("lock").iter().rfind(|b| b["model"] == PLANNER_MODEL).cloned().expect("planner request");
    let said = planned.to_string();
    assert!(said.contains("recent_tool_results") && said.contains("same_tool"), "the planner got the context and the hint: {said}");

    // A question the result answers is answered from it, without a call.
    r.exchange(&[("wamid.F3", "So will it be sunny then?")], 3).await;
    assert_eq!(r.graph.texts()[2], "Yes: the forecast said sunny in Lisbon today.");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 2, "no tool call for an answer from context");
    let steps = r.steps("wamid.F3").await;
    assert!(has_step(&steps, "AgentToolPlannerResult", "answer_from_context", "FROM_CONTEXT"), "{steps:?}");
    // trace_text is off: the planner's answer for the person is not kept in its step.
    let planned = step_detail(&r, "wamid.F3", "AgentToolPlannerResult").await.to_string();
    assert!(!planned.contains("sunny in Lisbon") && planned.contains("[text not kept]"), "{planned}");

    // A memory question stays in normal chat, even right after a tool result.
    r.exchange(&[("wamid.F4", "Do you remember my name?")], 4).await;
    assert_eq!(r.graph.texts()[3], "a chat reply");
    let steps = r.steps("wamid.F4").await;
    assert!(has_step(&steps, "AgentToolCandidate", "normal_chat", "MEMORY_QUESTION"), "{steps:?}");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 2);
}
both_backends!(followup_same_tool, a_follow_up_reuses_the_tool_context);

/// In a group, a member's follow-up reads only the results their own messages brought: a
/// result holds more than the summary the group read, and another member's "and where is it
/// delivered?" must not reach it.
async fn in_a_group_a_follow_up_reads_only_the_members_own_results(db: TestDb) {
    let r = rig(db, |s| s.conversation.mention_names = vec!["@assistant".into()]).await;
    let say = |from: &str, wamid: &str, text: &str| {
        let mut m = text_message(from, wamid, text);
        m["group_id"] = "g-follow".into();
        m
    };
    let post = async |m: serde_json::Value| assert_eq!(post_signed(&r.app, &envelope(vec![vec![m]])).await.status, axum::http::StatusCode::OK);
    post(say(CUSTOMER, "wamid.GF1", "@assistant What's the weather in Lisbon today?")).await;
    r.exchange(&[], 1).await;
    post(say(OTHER, "wamid.GF2", "@assistant And what about tomorrow?")).await;
    r.exchange(&[], 2).await;
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["forecast/Lisbon/today".to_string()], "another member's follow-up did not reach the result");
    let steps = r.steps("wamid.GF2").await;
    assert!(!steps.iter().any(|(s, _, c)| s == "AgentToolFollowupResolved" && c == "FOLLOWUP_CONTEXT"), "{steps:?}");
    post(say(CUSTOMER, "wamid.GF3", "@assistant And what about tomorrow?")).await;
    r.exchange(&[], 3).await;
    assert_eq!(r.shop.requests.lock().expect("lock").last().map(String::as_str), Some("forecast/Lisbon/tomorrow"), "the member who asked follows their own result up");
    // Once the results have expired, only the member whose result it was hears that it has.
    sqlx::query("UPDATE tool_contexts SET expires_at = 1").execute(&r.app.state.db.pool).await.expect("age");
    post(say(OTHER, "wamid.GF4", "@assistant And what about tomorrow?")).await;
    r.exchange(&[], 4).await;
    let steps = r.steps("wamid.GF4").await;
    assert!(!steps.iter().any(|(_, _, c)| c == "FOLLOWUP_CONTEXT_EXPIRED"), "that member never had one: {steps:?}");
    post(say(CUSTOMER, "wamid.GF5", "@assistant And what about tomorrow?")).await;
    r.exchange(&[], 5).await;
    let steps = r.steps("wamid.GF5").await;
    assert!(has_step(&steps, "AgentToolFollowupResolved", "expired", "FOLLOWUP_CONTEXT_EXPIRED"), "{steps:?}");
}
both_backends!(followup_group_members, in_a_group_a_follow_up_reads_only_the_members_own_results);

/// "Open the second one" after a search: the context keeps the listed links in order, and the
/// follow-up opens the second with another tool.
async fn the_second_one_opens_the_second_listed_link(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.N1", "Please search the shop for returns")], 1).await;
    let first = r.graph.texts();
    assert!(first.len() == 1 && first[0].starts_with("I found two pages") && first[0].contains("https://shop.example/pages/returns"), "the sources are kept: {first:?}");
    let kept = contexts_of(&r, CUSTOMER).await;
    let entities: Vec<String> = serde_json::from_str(&kept[0].3).expect("entities");
    let hours = entities.iter().position(|e| e.ends_with("/hours")).expect("first link kept");
    let returns = entities.iter().position(|e| e.ends_with("/returns")).expect("second link kept");
    assert!(hours < returns, "in result order: {entities:?}");
    let citations: String = sqlx::query_scalar("SELECT citations FROM tool_contexts WHERE tool = 'page_search'").fetch_one(&r.app.state.db.pool).await.expect("citations");
    let citations: Value = serde_json::from_str(&citations).expect("json");
    assert_eq!(
        citations,
        serde_json::json!([
            { "title": "Opening hours", "url": "https://shop.example/pages/hours" },
            { "title": "Returns policy", "url": "https://shop.example/pages/returns" },
        ]),
        "each listed page is a citation"
    );
    r.exchange(&[("wamid.N2", "Open the second one")], 2).await;
    assert!(r.graph.texts()[1].starts_with("Returns are free within 30 days"), "{:?}", r.graph.texts());
    assert_eq!(*r.shop.requests.lock().expect("lock"), vec!["search".to_string(), "pages/returns".to_string()]);
    let steps = r.steps("wamid.N2").await;
    assert!(steps.iter().any(|(s, _, c)| s == "AgentToolFollowupResolved" && c == "FOLLOWUP_CONTEXT"), "{steps:?}");
}
both_backends!(followup_second_one, the_second_one_opens_the_second_listed_link);

async fn contexts_belong_to_their_chat_are_bounded_and_expire(db: TestDb) {
    let r = rig(db, |s| s.lane.contexts_per_chat = 2).await;
    r.exchange(&[("wamid.E1", "What's the weather in Lisbon today?")], 1).await;

    // Another chat's follow-up finds no context of its own: normal chat, nothing called.
    let other = envelope(vec![vec![text_message(OTHER, "wamid.O1", "And what about tomorrow?")]]);
    assert_eq!(post_signed(&r.app, &other).await.status, axum::http::StatusCode::OK);
    r.exchange(&[], 2).await;
    assert_eq!(r.graph.texts()[1], "a chat reply");
    let steps = r.steps("wamid.O1").await;
    assert!(steps.iter().any(|(s, _, c)| s == "AgentToolCandidate" && c == "FOLLOWUP_WITHOUT_CONTEXT"), "{steps:?}");
    assert!(!steps.iter().any(|(_, _, c)| c == "FOLLOWUP_CONTEXT_EXPIRED"), "that chat never had one: {steps:?}");
    assert!(contexts_of(&r, OTHER).await.is_empty());
    assert_eq!(r.shop.requests.lock().expect("lock").len(), 1, "one chat's context never served another");

    // Bounded: the chat keeps its two newest.
    r.exchange(&[("wamid.E2", "What's the weather in Lisbon today, again?")], 3).await;
    r.exchange(&[("wamid.E3", "One more time: the weather in Lisbon today?")], 4).await;
    assert_eq!(contexts_of(&r, CUSTOMER).await.len(), 2);

    // Expired: the follow-up is not answered from the old result. (A day later: the question
    // E3's two results raised, which of them, has expired long before.)
    sqlx::query("UPDATE tool_contexts SET expires_at = 1").execute(&r.app.state.db.pool).await.expect("age");
    sqlx::query("UPDATE lane_clarifications SET expires_at = 1").execute(&r.app.state.db.pool).await.expect("age");
    let before = r.shop.requests.lock().expect("lock").len();
    r.exchange(&[("wamid.E4", "And what about tomorrow?")], 5).await;
    assert_eq!(r.graph.texts()[4], "a chat reply");
    let steps = r.steps("wamid.E4").await;
    assert!(has_step(&steps, "AgentToolFollowupResolved", "expired", "FOLLOWUP_CONTEXT_EXPIRED"), "{steps:?}");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), before, "nothing called from an expired context");

    // Storing contexts queued one sweep; when it runs it deletes them, and with none left it
    // does not run again.
    let (sweeps, state): (i64, String) = sqlx::query_as("SELECT COUNT(*), MAX(state) FROM jobs WHERE kind = 'lane.context_sweep'").fetch_one(&r.app.state.db.pool).await.expect("sweep job");
    assert_eq!((sweeps, state.as_str()), (1, "scheduled"), "one sweep queued for three stored contexts");
    sqlx::query("UPDATE jobs SET scheduled_at = 0 WHERE kind = 'lane.context_sweep'").execute(&r.app.state.db.pool).await.expect("due now");
    r.exchange(&[], 5).await;
    assert!(contexts_of(&r, CUSTOMER).await.is_empty(), "swept");
    let (sweeps, state): (i64, String) = sqlx::query_as("SELECT COUNT(*), MAX(state) FROM jobs WHERE kind = 'lane.context_sweep'").fetch_one(&r.app.state.db.pool).await.expect("sweep job");
    assert_eq!((sweeps, state.as_str()), (1, "completed"), "nothing left to sweep: it stops");
}
both_backends!(followup_contexts_scoped, contexts_belong_to_their_chat_are_bounded_and_expire);

/// A result too long to pass inline is stored for its chat and read back page by page with
/// `read_result` (the shipped definition): never from another chat, never with a chat id the
/// caller names, and not after it expired.
async fn a_long_result_is_read_back_in_pages_by_its_own_chat(db: TestDb) {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tools.toml")).expect("shipped tools");
    let start = shipped.find("name = \"read_result\"").expect("read_result is shipped");
    let from = shipped[..start].rfind("[[tool]]").expect("its table");
    let to = shipped[start..].find("\n\n").map_or(shipped.len(), |i| start + i);
    let tools = format!(
        "{}\n{}\n\n[[tool]]\nname = \"big_report\"\ntitle = \"Yearly report\"\ndescription = \"The yearly report.\"\nprovider = \"connector\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\nmax_result_bytes = 500\ninput_schema = {{ type = \"object\", additionalProperties = false, properties = {{}} }}\n",
        crate::lane_e2e::TOOLS,
        &shipped[from..to]
    );
    let actions = "\n[[connector.action]]\ntool = \"big_report\"\nmethod = \"GET\"\npath = \"report\"\n";
    let r = crate::lane_e2e::rig_with(db, &tools, actions, |_| {}).await;
    let checkpoint = &r.app.state.tools;
    let ctx = |chat: &str| server::tools::CallContext {
        actor: server::domain::Role::Customer,
        chat_type: server::domain::ChatKind::Direct,
        chat_id: Some(chat.into()),
        sender_id: Some(chat.into()),
        correlation_id: "corr-big".into(),
        approved: None,
        trace_id: None,
    };
    let call = |name: &str, args: Value| server::tools::ToolCall { name: name.into(), args };
    let big = checkpoint.execute(call("big_report", serde_json::json!({})), &ctx("chat-a")).await.expect("big report");
    let reference = big.output["result_ref"].as_str().expect("stored under a reference").to_string();
    let first = checkpoint.execute(call("read_result", serde_json::json!({ "result_ref": reference })), &ctx("chat-a")).await.expect("page 1");
    let pages = first.output["pages"].as_u64().expect("pages");
    assert!(pages >= 3 && first.output["text"].as_str().is_some_and(|t| t.contains("line 001")), "{}", first.output);
    let last = checkpoint.execute(call("read_result", serde_json::json!({ "result_ref": reference, "page": pages })), &ctx("chat-a")).await.expect("last page");
    assert!(last.output["text"].as_str().is_some_and(|t| t.contains("line 400")), "{}", last.output);

    let other = checkpoint.execute(call("read_result", serde_json::json!({ "result_ref": reference })), &ctx("chat-b")).await.expect_err("another chat's result");
    assert_eq!(other.code, "RESULT_NOT_FOUND");
    let forged = checkpoint.execute(call("read_result", serde_json::json!({ "result_ref": reference, "chat_id": "chat-a" })), &ctx("chat-b")).await.expect_err("a named chat");
    assert_eq!(forged.code, "TOOL_MANAGED_FIELD_SUPPLIED");

    // Expired with the contexts: the sweep deletes it.
    sqlx::query("UPDATE tool_results SET created_at = 0").execute(&r.app.state.db.pool).await.expect("age");
    let mut sweep = r.app.gatehouse.jobs.job(&server::lane::context::SweepContexts {});
    sweep.dedupe_key = Some(server::lane::context::SweepContexts::DEDUPE_KEY.into());
    r.app.gatehouse.jobs.enqueue(&sweep).await.expect("sweep");
    r.exchange(&[], 0).await;
    let gone = checkpoint.execute(call("read_result", serde_json::json!({ "result_ref": reference })), &ctx("chat-a")).await.expect_err("expired");
    assert_eq!(gone.code, "RESULT_NOT_FOUND");

    // A long result that cannot be stored is the database's failure, worth another attempt,
    // not the provider's: the call happened.
    let pool = &r.app.state.db.pool;
    sqlx::query("ALTER TABLE tool_results RENAME TO tool_results_away").execute(pool).await.expect("away");
    let unstored = checkpoint.execute(call("big_report", serde_json::json!({})), &ctx("chat-a")).await.expect_err("not stored");
    sqlx::query("ALTER TABLE tool_results_away RENAME TO tool_results").execute(pool).await.expect("back");
    assert_eq!((unstored.code.as_str(), unstored.retryable, unstored.maybe_applied), ("DATABASE_ERROR", true, true), "{unstored:?}");
}
both_backends!(followup_read_result, a_long_result_is_read_back_in_pages_by_its_own_chat);

/// What a context keeps: the arguments without managed fields and with secret-named ones
/// replaced, a preview without personal data or secrets; and nothing at all for a tool tagged
/// as reaching private data, or for a call asked in the console.
async fn contexts_keep_no_secrets_managed_fields_or_private_data(db: TestDb) {
    let extra = r#"
[[tool]]
name = "account_lookup"
title = "Account lookup"
description = "Looks up an account."
provider = "builtin"
handler = "read_result"
operation = "read"
audience = "public"
risk = "low"
managed_fields = ["chat_id"]
input_schema = { type = "object", properties = { account = { type = "string" }, chat_id = { type = "string" }, api_token = { type = "string" } } }

[[tool]]
name = "account_balance"
title = "Account balance"
description = "The balance of an account."
provider = "builtin"
handler = "read_result"
operation = "read"
audience = "public"
risk = "low"
tags = ["private_data"]
input_schema = { type = "object", properties = { account = { type = "string" } } }
"#;
    let r = crate::lane_e2e::rig_with(db, &format!("{}{extra}", crate::lane_e2e::TOOLS), "", |_| {}).await;
    let state = &r.app.state;
    let store = server::lane::context::ContextStore::new(state.db.clone(), r.app.gatehouse.jobs.clone(), std::sync::Arc::new(state.config.settings.clone()));
    let catalog = state.tools.catalog();
    let job = |tool: &str, channel: &str| server::lane::job::ToolCallJob {
        tool: tool.into(),
        version: String::new(),
        args: serde_json::json!({ "account": "A-1", "chat_id": "chat-x", "api_token": "tok_live_9f" }),
        actor: server::domain::Role::Customer,
        chat_kind: server::domain::ChatKind::Direct,
        sender: CUSTOMER.into(),
        request: "my account".into(),
        reply_to: server::channel::ReplyTo { channel: channel.into(), chat_id: CUSTOMER.into(), chat_kind: server::domain::ChatKind::Direct, message_id: "wamid.P".into() },
        trace_id: None,
        approval: None,
        again_of: None,
    };
    // The sender's own number, and a field the tool manages, are never a context's either: the
    // summary leaves them out, and the planner reads the context in later turns (in a group,
    // turns of other members).
    let output = serde_json::json!({ "owner": "Ana", "email": "ana@example.com", "session_token": "sess_77", "url": "https://bank.example/a-1",
        "contact": format!("call {CUSTOMER}"), "chat_id": "chat-managed" });
    let pii = vec!["email".to_string()];
    let lookup = catalog.get("account_lookup").expect("tool");
    assert!(store.keep(&job("account_lookup", "whatsapp"), "corr-p1", &lookup, &output, "Account A-1 belongs to Ana.", &pii).await.expect("keep").is_some());
    let kept: (String, String, String) = sqlx::query_as("SELECT args, preview, entities FROM tool_contexts WHERE tool = 'account_lookup'").fetch_one(&state.db.pool).await.expect("row");
    let args: Value = serde_json::from_str(&kept.0).expect("json");
    assert_eq!(args, serde_json::json!({ "account": "A-1", "api_token": "[REDACTED]" }), "no managed field, no secret");
    for hidden in ["ana@example.com", "sess_77", "tok_live_9f", "chat-x", CUSTOMER, "chat-managed"] {
        assert!(!kept.1.contains(hidden) && !kept.2.contains(hidden), "{hidden} kept: {kept:?}");
    }
    assert!(kept.1.contains("https://bank.example/a-1"), "the rest of the preview stays: {}", kept.1);

    let balance = catalog.get("account_balance").expect("tool");
    assert!(store.keep(&job("account_balance", "whatsapp"), "corr-p2", &balance, &output, "Balance: 12.", &pii).await.expect("keep").is_none(), "a private-data result is never kept");
    assert!(store.keep(&job("account_lookup", "console"), "corr-p3", &lookup, &output, "From the console.", &pii).await.expect("keep").is_none(), "a console call has no chat");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_contexts").fetch_one(&state.db.pool).await.expect("count");
    assert_eq!(rows, 1);
}
both_backends!(followup_context_privacy, contexts_keep_no_secrets_managed_fields_or_private_data);

/// Two recent results of different tools and a vague follow-up: the trace says it is ambiguous
/// and the person is asked which one, nothing is called.
async fn an_ambiguous_follow_up_is_asked_about(db: TestDb) {
    let r = rig(db, |_| {}).await;
    r.exchange(&[("wamid.A1", "What's the weather in Lisbon today?")], 1).await;
    r.exchange(&[("wamid.A2", "Where is my order 4821?")], 2).await;
    let calls = r.shop.requests.lock().expect("lock").len();
    r.exchange(&[("wamid.A3", "What about it?")], 3).await;
    assert_eq!(r.graph.texts()[2], "Do you mean the weather or your order?");
    let steps = r.steps("wamid.A3").await;
    assert!(has_step(&steps, "AgentToolFollowupClarify", "clarify", "FOLLOWUP_AMBIGUOUS"), "{steps:?}");
    assert_eq!(r.shop.requests.lock().expect("lock").len(), calls, "nothing called");
}
both_backends!(followup_ambiguous, an_ambiguous_follow_up_is_asked_about);
