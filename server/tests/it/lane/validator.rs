//! The plan validator: the model's proposals (from a fake Anthropic server) checked through the
//! checkpoint's gates on a real database, each refusal with its code, and nothing run.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use serde_json::{Value, json};
use server::{
    config::{LlmProvider, Settings},
    domain::{ChatKind, Role},
    lane::{
        PrivateData,
        planner::{PlanOutcome, Planner, ProposedCall},
        validator::{Advisory, PlanCode, PlanScope, Validation, Validator},
    },
    tools::{CallContext, Checkpoint, ToolDef, ToolError, ToolExecutor, checkpoint::AuditWriter},
};

use super::{Fake, TOOLS, anthropic, catalog, model, planner::input, settings, tool_use};
use crate::{both_backends, support::TestDb};

/// Counts calls: the validator must run none.
struct Counting(Arc<AtomicUsize>);
#[async_trait::async_trait]
impl ToolExecutor for Counting {
    async fn call(&self, _tool: &ToolDef, _args: &Value) -> Result<Value, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(json!({}))
    }
}

struct Rig {
    checkpoint: Checkpoint,
    db: server::db::Db,
    ran: Arc<AtomicUsize>,
    fake: Fake,
    settings: Settings,
    _test_db: TestDb,
}

async fn rig(db: TestDb) -> Rig {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let audit = AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone()));
    let mut checkpoint = Checkpoint::new(pool.clone(), catalog(TOOLS), audit, server::config::SecretSource::from_fn(|_| Some("secret".into())));
    let ran = Arc::new(AtomicUsize::new(0));
    checkpoint.register_builtin("test.echo", Arc::new(Counting(ran.clone())));
    let (fake, base) = Fake::start().await;
    Rig { checkpoint, db: pool, ran, fake, settings: settings(LlmProvider::Anthropic, &base), _test_db: db }
}

fn customer() -> CallContext {
    CallContext { actor: Role::Customer, chat_type: ChatKind::Direct, chat_id: Some("chat-7".into()), sender_id: Some("+15550002222".into()), correlation_id: "corr-v".into(), approved: None, trace_id: None }
}

impl Rig {
    /// Has the fake model answer with `blocks` and returns what the planner made of them.
    async fn plan(&self, blocks: Value) -> PlanOutcome {
        self.fake.then(move |_| anthropic(blocks.clone(), "tool_use"));
        let planner = Planner::new(model(&self.settings), Arc::new(self.settings.clone()));
        let candidates = ["lookup_order", "page_search", "owner_report", "refund"];
        planner.plan(&input(&self.settings, true, Role::Customer, &candidates, "help")).await
    }

    fn validate(&self, calls: &[ProposedCall], advisory: Advisory, candidates: &[&str], max_steps: usize) -> Validation {
        let candidates: Vec<String> = candidates.iter().map(|c| c.to_string()).collect();
        let ctx = customer();
        let scope = PlanScope { candidates: &candidates, ctx: &ctx, private_data: &PrivateData::Clear, max_steps };
        Validator { catalog: &self.checkpoint.catalog(), settings: &self.settings.lane }.validate(calls, advisory, &scope)
    }

    async fn audit_rows(&self) -> i64 {
        self.checkpoint.audit().flush().await;
        sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit").fetch_one(&self.db.pool).await.expect("count")
    }
}

fn calls_of(outcome: PlanOutcome) -> (Vec<ProposedCall>, Advisory) {
    match outcome {
        PlanOutcome::ToolUse { calls, requires_async, requires_owner_approval, .. } => (calls, Advisory { requires_async, requires_owner_approval }),
        other => panic!("expected tool use, got {other:?}"),
    }
}

fn codes(v: &Validation) -> Vec<(&str, &str)> {
    v.rejected.iter().map(|r| (r.tool.as_str(), r.code.as_str())).collect()
}

const ALL: [&str; 4] = ["lookup_order", "page_search", "owner_report", "refund"];

async fn bad_proposals_are_refused_with_their_codes(db: TestDb) {
    let r = rig(db).await;
    let (calls, advisory) = calls_of(
        r.plan(json!([
            tool_use("t1", "nope", json!({})),
            tool_use("t2", "page_search", json!({"query": 5})),
            tool_use("t3", "page_search", json!({"query": "hours", "color": "red"})),
            tool_use("t4", "lookup_order", json!({"order_id": "1", "chat_id": "someone-elses-chat"})),
            tool_use("t5", "lookup_order", json!({"order_id": "1", "api_key": "guessed"})),
            tool_use("t6", "owner_report", json!({})),
        ]))
        .await,
    );
    let v = r.validate(&calls, advisory, &ALL, 10);
    assert_eq!(
        codes(&v),
        [
            ("nope", "TOOL_UNKNOWN"),
            ("page_search", "TOOL_SCHEMA_INVALID"),
            ("page_search", "TOOL_EXTRA_ARGUMENTS"),
            ("lookup_order", "TOOL_MANAGED_FIELD_SUPPLIED"),
            ("lookup_order", "TOOL_SECRET_FIELD_SUPPLIED"),
            ("owner_report", "TOOL_NOT_ALLOWED_FOR_ACTOR"),
        ]
    );
    assert!(v.rejected[2].reason.contains("color"), "{:?}", v.rejected[2]);
    assert!(!v.rejected.iter().any(|x| x.reason.contains("guessed") || x.reason.contains("someone-elses-chat")), "no value in a reason: {:?}", v.rejected);
    assert!(v.accepted.is_empty() && v.clarify.is_none() && !v.runnable());

    // Arguments an OpenAI-compatible model sent as broken JSON arrive as a string.
    let broken = [ProposedCall { id: "c".into(), name: "page_search".into(), args: json!("{not json"), reason: String::new() }];
    assert_eq!(codes(&r.validate(&broken, Advisory::default(), &ALL, 2)), [("page_search", "TOOL_SCHEMA_INVALID")]);
    // A valid call to a tool the detector did not choose.
    let elsewhere = [ProposedCall { id: "c".into(), name: "page_search".into(), args: json!({"query": "hours"}), reason: String::new() }];
    assert_eq!(codes(&r.validate(&elsewhere, Advisory::default(), &["lookup_order"], 2)), [("page_search", PlanCode::NotCandidate.as_str())]);

    assert_eq!(r.ran.load(Ordering::SeqCst), 0, "the validator runs nothing");
    assert_eq!(r.audit_rows().await, 0, "checking writes no audit row");
}
both_backends!(lane_refusals, bad_proposals_are_refused_with_their_codes);

async fn a_missing_argument_is_asked_for_by_name(db: TestDb) {
    let r = rig(db).await;
    let (calls, advisory) = calls_of(r.plan(json!([tool_use("t1", "lookup_order", json!({}))])).await);
    let v = r.validate(&calls, advisory, &ALL, 2);
    let expected = r.settings.lane.clarify_reply.replace("{argument}", "order number");
    assert_eq!(v.clarify.as_deref(), Some(expected.as_str()), "named by its schema title");
    assert_eq!(codes(&v), [("lookup_order", PlanCode::ArgumentMissing.as_str())]);
    assert!(v.accepted.is_empty() && !v.runnable());

    let untitled = [ProposedCall { id: "c".into(), name: "page_search".into(), args: json!({"limit": 3}), reason: String::new() }];
    let v = r.validate(&untitled, Advisory::default(), &ALL, 2);
    assert_eq!(v.clarify, Some(r.settings.lane.clarify_reply.replace("{argument}", "query")));

    // A model that writes `null` for an argument it does not have: a required one is asked
    // for, an optional one is left out of the call.
    let null = [ProposedCall { id: "n".into(), name: "lookup_order".into(), args: json!({"order_id": null}), reason: String::new() }];
    let v = r.validate(&null, Advisory::default(), &ALL, 2);
    assert_eq!(v.clarify.as_deref(), Some(expected.as_str()), "{v:?}");
    assert_eq!(codes(&v), [("lookup_order", PlanCode::ArgumentMissing.as_str())]);
    let optional = [ProposedCall { id: "o".into(), name: "page_search".into(), args: json!({"query": "hours", "limit": null}), reason: String::new() }];
    let v = r.validate(&optional, Advisory::default(), &ALL, 2);
    assert!(v.runnable(), "{v:?}");
    assert_eq!(v.accepted[0].canonical_args, r#"{"query":"hours"}"#);
}
both_backends!(lane_clarify, a_missing_argument_is_asked_for_by_name);

async fn approval_and_async_follow_policy_not_the_model(db: TestDb) {
    let r = rig(db).await;
    let respond = |needs: bool| tool_use("tr", &r.settings.lane.respond_tool, json!({"decision": "use_tools", "reply": "", "reason": "r", "requires_async": needs, "requires_owner_approval": needs}));

    let (calls, advisory) = calls_of(r.plan(json!([tool_use("t1", "refund", json!({"order_id": "42"})), respond(false)])).await);
    assert_eq!(advisory, Advisory { requires_async: false, requires_owner_approval: false }, "the model says no approval and no job");
    let v = r.validate(&calls, advisory, &ALL, 2);
    assert!(v.runnable(), "{v:?}");
    assert_eq!(v.accepted.len(), 1);
    let refund = &v.accepted[0];
    assert_eq!((refund.needs_approval.as_deref(), refund.run_async), (Some("APPROVAL_ALWAYS"), true), "the catalog says both");
    assert!(v.requires_owner_approval && v.requires_async);
    assert_eq!(refund.canonical_args, r#"{"order_id":"42"}"#);
    assert!(refund.version.starts_with("sha256:"));

    let (calls, advisory) = calls_of(r.plan(json!([tool_use("t1", "page_search", json!({"limit": 2, "query": "hours"})), respond(true)])).await);
    assert_eq!(advisory, Advisory { requires_async: true, requires_owner_approval: true }, "the model asks for both");
    let v = r.validate(&calls, advisory, &ALL, 2);
    assert_eq!((v.accepted[0].needs_approval.as_deref(), v.accepted[0].run_async), (None, false), "a low-risk read runs now, unasked");
    assert!(!v.requires_owner_approval && !v.requires_async);
    assert_eq!(v.accepted[0].canonical_args, r#"{"limit":2,"query":"hours"}"#);

    assert_eq!(r.ran.load(Ordering::SeqCst), 0, "accepted is not run: the refund waits for an owner");
    assert_eq!(r.audit_rows().await, 0);
}
both_backends!(lane_policy_decides, approval_and_async_follow_policy_not_the_model);

async fn more_calls_than_max_steps_stop_the_whole_plan(db: TestDb) {
    let r = rig(db).await;
    let search = |id: &str, q: &str| tool_use(id, "page_search", json!({"query": q}));
    let (calls, advisory) = calls_of(r.plan(json!([search("t1", "a"), search("t2", "b"), search("t3", "c")])).await);
    let v = r.validate(&calls, advisory, &ALL, r.settings.lane.max_steps as usize);
    assert!(v.accepted.is_empty() && !v.runnable(), "no part of the plan runs");
    assert_eq!(codes(&v), [("page_search", "LANE_TOO_MANY_STEPS"); 3]);

    let (calls, advisory) = calls_of(r.plan(json!([search("t1", "a"), tool_use("t2", "refund", json!({"order_id": "1"}))])).await);
    let v = r.validate(&calls, advisory, &ALL, 2);
    assert_eq!(codes(&v), [("refund", "LANE_NOT_CHAINABLE")], "two steps only of chainable tools");
    assert!(!v.runnable());
}
both_backends!(lane_max_steps, more_calls_than_max_steps_stop_the_whole_plan);

/// Property: whatever the model proposes (known, unknown or owner-only tools, any arguments, any
/// number of calls), a customer's plan is validated without panicking and without running
/// anything, and a plan is runnable only when every call is a candidate the customer may use,
/// within `max_steps`, without a managed or secret field, and passes the checkpoint's gates.
#[test]
fn any_proposal_is_validated_without_running_anything() {
    use proptest::{prelude::*, test_runner::Config};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let db = TestDb::sqlite();
    let ran = Arc::new(AtomicUsize::new(0));
    let checkpoint = rt.block_on(async {
        let pool = db.connect().await;
        pool.migrate().await.expect("migrate");
        let audit = AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone()));
        let mut cp = Checkpoint::new(pool, catalog(TOOLS), audit, server::config::SecretSource::from_fn(|_| Some("secret".into())));
        cp.register_builtin("test.echo", Arc::new(Counting(ran.clone())));
        cp
    });
    let s = settings(LlmProvider::Anthropic, "http://127.0.0.1:9");
    let candidates: Vec<String> = ["lookup_order", "page_search", "owner_report", "refund"].map(String::from).to_vec();
    let ctx = customer();
    let leaf = prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::from), (-5i64..50).prop_map(Value::from), "[a-z0-9 ]{0,12}".prop_map(Value::from)];
    let value = leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from), prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect()))]
    });
    let key = prop_oneof![Just("order_id"), Just("query"), Just("limit"), Just("period"), Just("chat_id"), Just("api_key"), Just("extra")];
    let args = prop_oneof![
        1 => value.clone(),
        4 => prop::collection::btree_map(key.prop_map(String::from), value, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
    ];
    let name = prop_oneof![Just("lookup_order"), Just("page_search"), Just("owner_report"), Just("refund"), Just("no_such_tool"), Just("respond_without_tool")];
    let valid = prop_oneof![
        "[0-9]{1,6}".prop_map(|id| ("lookup_order", serde_json::json!({ "order_id": id }))),
        ("[a-z ]{1,10}", proptest::option::of(1i64..20)).prop_map(|(q, l)| ("page_search", match l { Some(l) => serde_json::json!({ "query": q, "limit": l }), None => serde_json::json!({ "query": q }) })),
        "[0-9]{1,6}".prop_map(|id| ("refund", serde_json::json!({ "order_id": id }))),
    ];
    let calls = prop::collection::vec(prop_oneof![3 => valid, 2 => (name, args)], 0..4);
    let (runnable, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    proptest!(Config { cases: 400, failure_persistence: None, ..Config::default() }, |(proposed in calls, advice in any::<(bool, bool)>())| {
        let calls: Vec<ProposedCall> = proposed.iter().enumerate().map(|(i, (n, a))| ProposedCall { id: format!("t{i}"), name: n.to_string(), args: a.clone(), reason: String::new() }).collect();
        let scope = PlanScope { candidates: &candidates, ctx: &ctx, private_data: &PrivateData::Clear, max_steps: 2 };
        let advisory = Advisory { requires_async: advice.0, requires_owner_approval: advice.1 };
        let v = Validator { catalog: &checkpoint.catalog(), settings: &s.lane }.validate(&calls, advisory, &scope);
        prop_assert_eq!(ran.load(Ordering::SeqCst), 0, "the validator ran a tool");
        if v.runnable() {
            runnable.set(runnable.get() + 1);
            prop_assert!(calls.len() <= 2 && v.accepted.len() == calls.len());
            for call in &v.accepted {
                prop_assert!(candidates.contains(&call.tool) && call.tool != "owner_report", "{} accepted for a customer", call.tool);
                prop_assert!(call.args.get("chat_id").is_none() && call.args.get("api_key").is_none(), "a managed or secret field passed: {}", call.args);
                let checked = checkpoint.check(&server::tools::ToolCall { name: call.tool.clone(), args: call.args.clone() }, &ctx);
                prop_assert!(checked.is_ok(), "accepted but the checkpoint refuses {}: {:?}", call.args, checked.err());
            }
        } else {
            refused.set(refused.get() + 1);
        }
    });
    assert!(runnable.get() > 10 && refused.get() > 10, "both kinds were generated: {} runnable, {} refused", runnable.get(), refused.get());
}

/// A tool that reaches private account data is never offered or run in a group, where every
/// member reads the answer: not for a customer, and not for an owner either. In a direct chat
/// an owner's call runs, and a customer's waits for an owner.
#[test]
fn private_data_is_never_answered_in_a_group() {
    use server::lane::adapter::{self, OfferTo};
    let extra = r#"
[[tool]]
name = "account_balance"
title = "Account balance"
description = "The balance of an account."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
tags = ["private_data"]
input_schema = { type = "object", properties = { account = { type = "string" } } }
"#;
    let catalog = super::catalog(&format!("{TOOLS}{extra}"));
    let s = settings(LlmProvider::Anthropic, "http://127.0.0.1:9");
    let tool = catalog.get("account_balance").expect("tool");
    let candidates = vec!["account_balance".to_string()];
    let call = [ProposedCall { id: "t1".into(), name: "account_balance".into(), args: json!({ "account": "A-1" }), reason: String::new() }];
    for (actor, chat, offered, verdict) in [
        (Role::Owner, ChatKind::Group, false, Err("TOOL_CHAT_TYPE_NOT_ALLOWED")),
        (Role::Customer, ChatKind::Group, false, Err("TOOL_CHAT_TYPE_NOT_ALLOWED")),
        (Role::Owner, ChatKind::Direct, true, Ok(false)),
        (Role::Customer, ChatKind::Direct, true, Ok(true)),
    ] {
        assert_eq!(adapter::offerable(&tool, actor, chat, &s.lane), offered, "{actor:?} in a {chat:?} chat");
        assert_eq!(adapter::tool_specs(std::slice::from_ref(&tool), OfferTo { actor, chat, strict_supported: true }, &s.lane).len(), usize::from(offered));
        let ctx = CallContext { actor, chat_type: chat, ..customer() };
        let scope = PlanScope { candidates: &candidates, ctx: &ctx, private_data: &PrivateData::Clear, max_steps: 2 };
        let v = Validator { catalog: &catalog, settings: &s.lane }.validate(&call, Advisory::default(), &scope);
        match verdict {
            Err(code) => assert_eq!(codes(&v), [("account_balance", code)], "{actor:?} in a {chat:?} chat"),
            Ok(waits) => assert_eq!(v.accepted.first().map(|a| a.needs_approval.is_some()), Some(waits), "{actor:?} in a {chat:?} chat: {v:?}"),
        }
    }
}
