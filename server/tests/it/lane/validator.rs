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
        Validator { checkpoint: &self.checkpoint, settings: &self.settings.lane }.validate(calls, advisory, &scope)
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
