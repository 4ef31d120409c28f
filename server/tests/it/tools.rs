//! The one checkpoint, end to end, with its audit on both backends.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use server::{
    domain::{ChatKind, Role},
    tools::{
        ApprovedCall, CallContext, Catalog, Checkpoint, ToolCall, ToolDef, ToolError, ToolExecutor,
        checkpoint::{AuditWriter, ToolCode},
    },
};
use sqlx::Row;

use crate::{both_backends, support::TestDb};

const SECRET: &str = "s3cr3t-value-never-shown";

const TOOLS: &str = r#"
approval_mode = "auto"

[[tool]]
name = "echo"
title = "Echo"
description = "Returns its text."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["text"], properties = { text = { type = "string" } } }
output_schema = { type = "object", required = ["echo"], properties = { echo = { type = "string" } } }

[[tool]]
name = "owner_report"
title = "Owner report"
description = "Owners only."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "owner_only"
risk = "low"
input_schema = { type = "object", properties = { text = { type = "string" } } }

[[tool]]
name = "purge"
title = "Purge"
description = "An admin operation with a required argument."
provider = "builtin"
handler = "test.echo"
operation = "admin"
audience = "public"
risk = "low"
input_schema = { type = "object", required = ["scope"], properties = { scope = { type = "string" }, days = { type = "integer" } } }

[[tool]]
name = "direct_only"
title = "Direct only"
description = "Not in groups."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
chat_types = ["direct"]
input_schema = { type = "object", properties = { text = { type = "string" } } }

[[tool]]
name = "refund"
title = "Refund"
description = "Always asks an owner."
provider = "builtin"
handler = "test.echo"
operation = "write"
audience = "public"
risk = "medium"
approval = "always"
input_schema = { type = "object", properties = { text = { type = "string" } } }

[[tool]]
name = "flaky"
title = "Flaky"
description = "Fails twice, then works."
provider = "builtin"
handler = "test.flaky"
operation = "read"
audience = "public"
risk = "low"
retry = { max_attempts = 3, backoff = "10ms" }
input_schema = { type = "object" }

[[tool]]
name = "broken"
title = "Broken"
description = "Always fails."
provider = "builtin"
handler = "test.broken"
operation = "read"
audience = "public"
risk = "low"
retry = { max_attempts = 2, backoff = "10ms" }
input_schema = { type = "object" }

[[tool]]
name = "slow"
title = "Slow"
description = "Never answers in time."
provider = "builtin"
handler = "test.slow"
operation = "read"
audience = "public"
risk = "low"
timeout = "100ms"
input_schema = { type = "object" }

[[tool]]
name = "liar"
title = "Liar"
description = "Returns what its schema forbids."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", properties = { text = { type = "string" } } }
output_schema = { type = "object", required = ["count"], properties = { count = { type = "integer" } } }

[[tool]]
name = "shop"
title = "Shop"
description = "Needs a secret and the chat."
provider = "builtin"
handler = "test.shop"
operation = "read"
audience = "public"
risk = "low"
managed_fields = ["chat_id"]
secret_fields = { api_key = "TEST_SHOP_KEY" }
input_schema = { type = "object", additionalProperties = false, required = ["order", "chat_id", "api_key"], properties = { order = { type = "string" }, chat_id = { type = "string" }, api_key = { type = "string" } } }

[[tool]]
name = "off"
title = "Off"
description = "Disabled."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
enabled = false
input_schema = { type = "object" }
"#;

struct Echo;
#[async_trait::async_trait]
impl ToolExecutor for Echo {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        Ok(json!({ "echo": args.get("text").and_then(Value::as_str).unwrap_or_default() }))
    }
}

struct Flaky(AtomicUsize);
#[async_trait::async_trait]
impl ToolExecutor for Flaky {
    async fn call(&self, _tool: &ToolDef, _args: &Value) -> Result<Value, ToolError> {
        if self.0.fetch_add(1, Ordering::SeqCst) < 2 { Err(ToolError::new("UPSTREAM_503", "try later", true)) } else { Ok(json!({})) }
    }
}

struct Broken(AtomicUsize);
#[async_trait::async_trait]
impl ToolExecutor for Broken {
    async fn call(&self, _tool: &ToolDef, _args: &Value) -> Result<Value, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::new("UPSTREAM_500", "down", true))
    }
}

struct Slow;
#[async_trait::async_trait]
impl ToolExecutor for Slow {
    async fn call(&self, _tool: &ToolDef, _args: &Value) -> Result<Value, ToolError> {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(json!({}))
    }
}

/// The connector side: proves the secret and the managed field arrive, and returns neither.
struct Shop;
#[async_trait::async_trait]
impl ToolExecutor for Shop {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        assert_eq!(args["api_key"], SECRET, "the runtime injected the secret");
        // A system that echoes the key it was sent, in a field with an innocent name.
        let note = args["order"].as_str().filter(|o| *o == "echo").map(|_| format!("called with {}", args["api_key"].as_str().unwrap_or_default()));
        Ok(match note {
            Some(note) => json!({ "order": args["order"], "chat": args["chat_id"], "note": note }),
            None => json!({ "order": args["order"], "chat": args["chat_id"] }),
        })
    }
}

fn catalog(text: &str) -> Arc<Catalog> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, text).expect("write");
    Arc::new(Catalog::load(&path, &|var| var == "TEST_SHOP_KEY").expect("valid catalog"))
}

struct Rig {
    checkpoint: Checkpoint,
    db: server::db::Db,
    broken: Arc<Broken>,
    _test_db: TestDb,
}

async fn rig(db: TestDb) -> Rig {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let secrets = server::config::SecretSource::from_fn(|var: &str| (var == "TEST_SHOP_KEY").then(|| SECRET.to_string()));
    let mut checkpoint = Checkpoint::new(pool.clone(), catalog(TOOLS), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets);
    let broken = Arc::new(Broken(AtomicUsize::new(0)));
    checkpoint.register_builtin("test.echo", Arc::new(Echo));
    checkpoint.register_builtin("test.flaky", Arc::new(Flaky(AtomicUsize::new(0))));
    checkpoint.register_builtin("test.broken", broken.clone());
    checkpoint.register_builtin("test.slow", Arc::new(Slow));
    checkpoint.register_builtin("test.shop", Arc::new(Shop));
    Rig { checkpoint, db: pool, broken, _test_db: db }
}

fn ctx(actor: Role, chat_type: ChatKind) -> CallContext {
    CallContext { actor, chat_type, chat_id: Some("chat-7".into()), sender_id: Some("+15550001111".into()), correlation_id: "corr-9".into(), approved: None, trace_id: None }
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall { name: name.into(), args }
}

async fn every_gate_with_its_code_and_an_audit_row_each(db: TestDb) {
    let r = rig(db).await;
    let customer = ctx(Role::Customer, ChatKind::Direct);
    let owner = ctx(Role::Owner, ChatKind::Direct);
    let code_of = |res: Result<server::tools::checkpoint::ToolSuccess, server::tools::checkpoint::ToolFailure>| res.err().map(|f| f.code);
    let cp = &r.checkpoint;

    let ok = cp.execute(call("echo", json!({"text": "hi"})), &customer).await.expect("allowed");
    assert_eq!(ok.output, json!({"echo": "hi"}));
    assert!(ok.version.starts_with("sha256:"));
    assert_eq!(code_of(cp.execute(call("nope", json!({})), &customer).await).as_deref(), Some(ToolCode::Unknown.as_str()));
    assert_eq!(code_of(cp.execute(call("off", json!({})), &owner).await).as_deref(), Some(ToolCode::Disabled.as_str()));
    assert_eq!(code_of(cp.execute(call("owner_report", json!({})), &customer).await).as_deref(), Some(ToolCode::NotAllowedForActor.as_str()));
    assert!(cp.execute(call("owner_report", json!({})), &owner).await.is_ok());
    // An owner-only answer is not posted to a group, even an owner's call there.
    assert_eq!(code_of(cp.execute(call("owner_report", json!({})), &ctx(Role::Owner, ChatKind::Group)).await).as_deref(), Some(ToolCode::ChatTypeNotAllowed.as_str()));
    assert_eq!(code_of(cp.execute(call("direct_only", json!({})), &ctx(Role::Owner, ChatKind::Group)).await).as_deref(), Some(ToolCode::ChatTypeNotAllowed.as_str()));
    // The policy refuses a customer's admin call before its arguments are looked at: never a
    // schema error (which the lane would turn into a question for a missing argument).
    assert_eq!(code_of(cp.execute(call("purge", json!({})), &customer).await).as_deref(), Some(ToolCode::PolicyDenied.as_str()));
    assert_eq!(code_of(cp.execute(call("purge", json!({})), &owner).await).as_deref(), Some(ToolCode::SchemaInvalid.as_str()));
    assert_eq!(code_of(cp.execute(call("echo", json!({"text": 5})), &customer).await).as_deref(), Some(ToolCode::SchemaInvalid.as_str()));
    assert_eq!(code_of(cp.execute(call("echo", json!({"text": "a", "extra": 1})), &customer).await).as_deref(), Some(ToolCode::SchemaInvalid.as_str()));
    assert_eq!(code_of(cp.execute(call("echo", json!("not an object")), &customer).await).as_deref(), Some(ToolCode::SchemaInvalid.as_str()));
    assert_eq!(code_of(cp.execute(call("shop", json!({"order": "1", "chat_id": "other-chat"})), &customer).await).as_deref(), Some(ToolCode::ManagedFieldSupplied.as_str()));
    assert_eq!(code_of(cp.execute(call("shop", json!({"order": "1", "api_key": "guess"})), &customer).await).as_deref(), Some(ToolCode::ManagedFieldSupplied.as_str()));
    let shop = cp.execute(call("shop", json!({"order": "42"})), &customer).await.expect("shop");
    assert_eq!(shop.output, json!({"order": "42", "chat": "chat-7"}), "the runtime filled chat_id");
    let echoed = cp.execute(call("shop", json!({"order": "echo"})), &customer).await.expect("shop");
    assert_eq!(echoed.output["note"], "called with [REDACTED]", "a secret the call was sent, echoed, stays out of the result");
    assert_eq!(code_of(cp.execute(call("refund", json!({})), &owner).await).as_deref(), Some(ToolCode::NeedsApproval.as_str()));
    let refund_version = cp.catalog().get("refund").expect("refund").version.clone();
    assert!(cp.execute(call("refund", json!({})), &CallContext { approved: Some(ApprovedCall::bind(1, &refund_version, &json!({}))), ..owner.clone() }).await.is_ok(), "an approved call runs");
    let flaky = cp.execute(call("flaky", json!({})), &customer).await.expect("retried until it worked");
    assert_eq!(flaky.attempts, 3);
    assert_eq!(code_of(cp.execute(call("broken", json!({})), &customer).await).as_deref(), Some(ToolCode::ProviderError.as_str()), "retries exhausted");
    assert_eq!(r.broken.0.load(Ordering::SeqCst), 2, "max_attempts honoured");
    assert_eq!(code_of(cp.execute(call("slow", json!({})), &customer).await).as_deref(), Some(ToolCode::Timeout.as_str()));
    // A run stopped while its call is under way (a job's budget, a lost lease, a shutdown)
    // still leaves the call's audit row.
    assert!(tokio::time::timeout(Duration::from_millis(20), cp.execute(call("slow", json!({})), &customer)).await.is_err(), "stopped under way");
    assert_eq!(code_of(cp.execute(call("liar", json!({"text": "x"})), &customer).await).as_deref(), Some(ToolCode::ResultInvalid.as_str()));

    cp.audit().flush().await;
    let rows = sqlx::query("SELECT tool, decision, reason_code, args, version, actor, correlation_id FROM tool_audit ORDER BY id").fetch_all(&r.db.pool).await.expect("audit");
    assert_eq!(rows.len(), 23, "one row per call (23 above), allowed, denied or stopped");
    let reasons: Vec<String> = rows.iter().map(|row| row.get::<String, _>(2)).collect();
    for expected in [ToolCode::Unknown.as_str(), ToolCode::Disabled.as_str(), ToolCode::NotAllowedForActor.as_str(), ToolCode::PolicyDenied.as_str(), ToolCode::ChatTypeNotAllowed.as_str(), ToolCode::SchemaInvalid.as_str(), ToolCode::ManagedFieldSupplied.as_str(), ToolCode::NeedsApproval.as_str(), ToolCode::ProviderError.as_str(), ToolCode::Timeout.as_str(), ToolCode::ResultInvalid.as_str(), ToolCode::Cancelled.as_str(), "OK"] {
        assert!(reasons.iter().any(|r| r == expected), "{expected} in {reasons:?}");
    }
    for row in &rows {
        let args: String = row.get(3);
        assert!(!args.contains(SECRET) && !args.contains("guess"), "secret in the audit: {args}");
        assert_eq!(row.get::<String, _>(6), "corr-9");
    }
    let decisions: Vec<String> = rows.iter().map(|row| row.get::<String, _>(1)).collect();
    assert!(decisions.contains(&"needs_approval".to_string()) && decisions.contains(&"deny".to_string()) && decisions.contains(&"allow".to_string()));
}
both_backends!(checkpoint_gates, every_gate_with_its_code_and_an_audit_row_each);

async fn check_runs_the_same_gates_and_writes_nothing(db: TestDb) {
    let r = rig(db).await;
    let cp = &r.checkpoint;
    let customer = ctx(Role::Customer, ChatKind::Direct);
    let owner = ctx(Role::Owner, ChatKind::Direct);

    // `2.0` is an integer to JSON Schema: the executor is given 2, which reads as one.
    let purge = cp.check(&call("purge", json!({"scope": "old", "days": 2.0})), &owner).expect("passes");
    assert_eq!(purge.input.get("days").and_then(Value::as_u64), Some(2), "{:?}", purge.input);
    let shop = cp.check(&call("shop", json!({"order": "42"})), &customer).expect("passes");
    assert_eq!(Value::Object(shop.input.clone()), json!({"order": "42", "chat_id": "chat-7"}), "managed fields in, secrets never");
    assert_eq!((shop.version.as_str(), shop.needs_approval.as_deref()), (shop.tool.version.as_str(), None));
    let refund = cp.check(&call("refund", json!({})), &owner).expect("passes, waiting for an owner");
    assert_eq!(refund.needs_approval.as_deref(), Some("APPROVAL_ALWAYS"));
    let refund_version = cp.catalog().get("refund").expect("refund").version.clone();
    let approved = CallContext { approved: Some(ApprovedCall::bind(1, &refund_version, &json!({}))), ..owner.clone() };
    assert_eq!(cp.check(&call("refund", json!({})), &approved).expect("approved").needs_approval, None);
    // The approval binds the exact call: other arguments or another definition do not pass.
    let other_args = CallContext { approved: Some(ApprovedCall::bind(1, &refund_version, &json!({"x": 1}))), ..owner.clone() };
    assert_eq!(cp.check(&call("refund", json!({})), &other_args).expect_err("stale").code, ToolCode::ApprovalStale.as_str());
    let other_version = CallContext { approved: Some(ApprovedCall::bind(1, "sha256:other", &json!({}))), ..owner.clone() };
    assert_eq!(cp.check(&call("refund", json!({})), &other_version).expect_err("stale").code, ToolCode::ApprovalStale.as_str());
    for (name, args, actor) in [("nope", json!({}), &customer), ("off", json!({}), &owner), ("owner_report", json!({}), &customer), ("echo", json!({"text": 5}), &customer), ("shop", json!({"order": "1", "api_key": "guess"}), &customer)] {
        let checked = cp.check(&call(name, args.clone()), actor).expect_err("refused");
        let executed = cp.execute(call(name, args), actor).await.expect_err("refused");
        assert_eq!((checked.code.as_str(), checked.message.as_str()), (executed.code.as_str(), executed.message.as_str()), "one set of gates and codes for {name}");
    }
    let missing = cp.check(&call("echo", json!({"extra": 1})), &customer).expect_err("invalid");
    assert_eq!(
        missing.detail,
        Some(server::tools::checkpoint::FailureDetail::Schema(server::tools::checkpoint::SchemaIssues { missing: vec!["text".into()], unexpected: vec!["extra".into()], other: false }))
    );
    cp.audit().flush().await;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tool_audit").fetch_one(&r.db.pool).await.expect("count");
    assert_eq!(rows, 5, "one row per executed call, none for a check");
}
both_backends!(checkpoint_check, check_runs_the_same_gates_and_writes_nothing);

const HOOKS: &str = r##"
[[tool]]
name = "code_lookup"
title = "Code lookup"
description = "Looks up a four-character code."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", properties = { text = { type = "string", maxLength = 8 } } }

[[hook]]
name = "no-intranet"
point = "before_tool_call"
kind = "deny_pattern"
priority = 1
tools = ["echo"]
pattern = "(?i)intranet"

[[hook]]
name = "big-numbers-need-an-owner"
point = "before_tool_call"
kind = "require_approval_if"
priority = 2
tools = ["*"]
pattern = '\d{6,}'

[[hook]]
name = "mask-digits"
point = "before_tool_call"
kind = "redact"
priority = 3
tools = ["code_lookup", "echo"]
pattern = '\d'
replacement = "#"

[[hook]]
name = "mask-in-results"
point = "after_tool_call"
kind = "redact"
tools = ["echo"]
pattern = "secret"
replacement = "[hidden]"

[[hook]]
name = "digits-grow"
point = "before_tool_call"
kind = "redact"
priority = 4
tools = ["code_lookup"]
pattern = "#"
replacement = "[removed]"
"##;

async fn hooks_abort_ask_and_modify_with_revalidation(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let secrets = server::config::SecretSource::empty();
    let mut cp = Checkpoint::new(pool.clone(), catalog(&format!("{TOOLS}\n{HOOKS}")), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets);
    cp.register_builtin("test.echo", Arc::new(Echo));
    let customer = ctx(Role::Customer, ChatKind::Direct);

    let denied = cp.execute(call("echo", json!({"text": "open the INTRANET page"})), &customer).await.expect_err("aborted");
    assert_eq!(denied.code, ToolCode::HookDenied.as_str());
    assert!(denied.message.contains("no-intranet"), "{denied}");
    let ask = cp.execute(call("echo", json!({"text": "order 1234567"})), &customer).await.expect_err("needs an owner");
    assert_eq!(ask.code, ToolCode::NeedsApproval.as_str());
    // Once approved it runs with the hooks after the one that asked applied: digits masked.
    let args = json!({"text": "order 1234567"});
    let version = cp.catalog().get("echo").expect("echo").version.clone();
    let approved = CallContext { approved: Some(ApprovedCall::bind(1, &version, &args)), ..customer.clone() };
    let ran = cp.execute(call("echo", args), &approved).await.expect("approved");
    assert_eq!(ran.output, json!({"echo": "order #######"}), "the redaction after the approval hook still applies");
    let masked = cp.execute(call("echo", json!({"text": "pin 42 is secret"})), &customer).await.expect("modified, still valid");
    assert_eq!(masked.output, json!({"echo": "pin ## is [hidden]"}), "args redacted before the call, result after");
    // The second redaction makes the argument too long for the schema: validated again, refused.
    let grown = cp.execute(call("code_lookup", json!({"text": "A1"})), &customer).await.expect_err("revalidated");
    assert_eq!(grown.code, ToolCode::SchemaInvalid.as_str());
    assert!(grown.message.contains("hook"), "{grown}");

    cp.audit().flush().await;
    let reasons: Vec<String> = sqlx::query("SELECT reason_code FROM tool_audit ORDER BY id").fetch_all(&pool.pool).await.expect("audit").iter().map(|r| r.get(0)).collect();
    assert_eq!(reasons, vec![ToolCode::HookDenied.as_str(), ToolCode::NeedsApproval.as_str(), "OK", "OK", ToolCode::SchemaInvalid.as_str()], "the hook's outcome reaches the audit");
    // The audit keeps no more of a call than its tool was given: the redact hooks apply to it.
    let audited: Vec<String> = sqlx::query("SELECT args FROM tool_audit WHERE reason_code = 'OK' ORDER BY id").fetch_all(&pool.pool).await.expect("audit").iter().map(|r| r.get(0)).collect();
    assert_eq!(audited, vec![json!({"text": "order #######"}).to_string(), json!({"text": "pin ## is secret"}).to_string()]);
}
both_backends!(checkpoint_hooks, hooks_abort_ask_and_modify_with_revalidation);

async fn the_breaker_opens_after_three_failures(db: TestDb) {
    let r = rig(db).await;
    let customer = ctx(Role::Customer, ChatKind::Direct);
    // Two calls of two attempts each: four failures, so the third call finds the breaker open.
    for _ in 0..2 {
        let _ = r.checkpoint.execute(call("broken", json!({})), &customer).await;
    }
    let third = r.checkpoint.execute(call("broken", json!({})), &customer).await.expect_err("open");
    assert_eq!(third.code, ToolCode::CircuitOpen.as_str());
    let tried = r.broken.0.load(Ordering::SeqCst);
    assert!(tried <= 4, "the open breaker kept calls away from the provider: {tried}");
    assert_eq!(r.checkpoint.breakers().state("broken", std::time::Instant::now()), server::tools::breaker::BreakerState::Open);
}
both_backends!(checkpoint_breaker, the_breaker_opens_after_three_failures);

async fn reload_keeps_calls_in_flight_on_their_version(db: TestDb) {
    let r = rig(db).await;
    let before = r.checkpoint.catalog().get("echo").expect("echo").version.clone();
    let in_flight = r.checkpoint.catalog();
    r.checkpoint.reload(catalog(&TOOLS.replace("Returns its text.", "Returns its text, reloaded.")));
    assert_eq!(in_flight.get("echo").expect("echo").version, before, "a call that started keeps its definition");
    let after = r.checkpoint.execute(call("echo", json!({"text": "x"})), &ctx(Role::Owner, ChatKind::Direct)).await.expect("ok");
    assert_ne!(after.version, before, "new calls use the reloaded definition");
}
both_backends!(checkpoint_reload, reload_keeps_calls_in_flight_on_their_version);

struct Big(usize);
#[async_trait::async_trait]
impl ToolExecutor for Big {
    async fn call(&self, _tool: &ToolDef, _args: &Value) -> Result<Value, ToolError> {
        Ok(json!({ "text": "é".repeat(self.0), "card": "4111 1111 1111 1111", "access_token": "tok-secret-1" }))
    }
}

async fn large_results_are_stored_and_fetched(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let tools = r#"
[[tool]]
name = "big"
title = "Big"
description = "Returns a lot."
provider = "builtin"
handler = "test.big"
operation = "read"
audience = "public"
risk = "low"
max_result_bytes = 1000
input_schema = { type = "object" }

[[tool]]
name = "huge"
title = "Huge"
description = "Returns more than the hard limit."
provider = "builtin"
handler = "test.huge"
operation = "read"
audience = "public"
risk = "low"
max_result_bytes = 1000
input_schema = { type = "object" }

[[hook]]
name = "mask-cards"
point = "after_tool_call"
kind = "redact"
priority = 1
tools = ["big", "huge"]
pattern = '\b\d{4}(?: \d{4}){3}\b'
replacement = "[CARD]"
"#;
    let secrets = server::config::SecretSource::empty();
    let mut cp = Checkpoint::new(pool.clone(), catalog(tools), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets);
    cp.register_builtin("test.big", Arc::new(Big(50_000)));
    cp.register_builtin("test.huge", Arc::new(Big(server::tools::checkpoint::HARD_RESULT_LIMIT)));
    let owner = ctx(Role::Owner, ChatKind::Direct);

    let big = cp.execute(call("big", json!({})), &owner).await.expect("big");
    let out = &big.output;
    assert_eq!(out["truncated"], false);
    assert!(out["summary"].as_str().expect("summary").chars().count() <= 1000, "bounded summary");
    let reference = out["result_ref"].as_str().expect("reference");
    let whole = cp.fetch_result(reference).await.expect("fetch").expect("stored");
    assert_eq!(serde_json::from_str::<Value>(&whole).expect("json")["text"].as_str().map(|t| t.chars().count()), Some(50_000), "fetched whole");
    // What is stored and summarised has been through the tool's after-call hooks and lost its
    // secrets, like any result: a large one is no way around them.
    assert!(whole.contains("[CARD]"), "redacted by the hook");
    for text in [whole.as_str(), out["summary"].as_str().expect("summary")] {
        assert!(!text.contains("4111 1111"), "the card number was redacted");
        assert!(!text.contains("tok-secret-1"), "a secret-named field's value is withheld");
    }

    let huge = cp.execute(call("huge", json!({})), &owner).await.expect("huge");
    assert_eq!(huge.output["truncated"], true);
    assert!(huge.output["note"].as_str().unwrap_or_default().contains("only the first"), "says it was cut");
    let kept = cp.fetch_result(huge.output["result_ref"].as_str().expect("ref")).await.expect("fetch").expect("stored");
    assert!(kept.len() <= server::tools::checkpoint::HARD_RESULT_LIMIT);
    assert!(cp.fetch_result("res_missing").await.expect("fetch").is_none());
}
both_backends!(checkpoint_large_results, large_results_are_stored_and_fetched);

const NOTICES: &str = r#"
[[tool]]
name = "contact"
title = "Contact"
description = "Takes a message and an email address."
provider = "builtin"
handler = "test.echo"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", properties = { text = { type = "string" }, email = { type = "string" }, people = { type = "array" } } }

[[hook]]
name = "vip"
point = "before_tool_call"
kind = "notify_owner"
tools = ["contact"]
pattern = "(?i)vip"
message = "A VIP wrote"

[[hook]]
name = "slow-alert"
point = "on_error"
kind = "notify_owner"
tools = ["*"]
pattern = "^TOOL_TIMEOUT"

[[hook]]
name = "lenta"
point = "on_error"
kind = "notify_owner"
tools = ["slow"]
pattern = "^TOOL_TIMEOUT"
message = "La herramienta {tool} no respondió a tiempo ({code})."

[audit]
pii_fields = ["email"]
"#;

async fn owners_are_notified_and_personal_data_stays_out_of_the_audit(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let secrets = server::config::SecretSource::empty();
    let mut cp = Checkpoint::new(pool.clone(), catalog(&format!("{TOOLS}\n{NOTICES}")), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets);
    cp.register_builtin("test.echo", Arc::new(Echo));
    cp.register_builtin("test.slow", Arc::new(Slow));
    let customer = ctx(Role::Customer, ChatKind::Direct);
    {
        let mut tx = pool.begin_write().await.expect("tx");
        sqlx::query("INSERT INTO owners (display_name, login, password_hash, session_epoch, created_at, updated_at) VALUES ('O', 'o', 'x', 1, 0, 0)").execute(&mut *tx).await.expect("owner");
        sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ('+15550001111', (SELECT MAX(id) FROM owners), 0)").execute(&mut *tx).await.expect("phone");
        tx.commit().await.expect("commit");
    }

    let args = json!({"text": "VIP order", "email": "ann@example.org", "people": [{"EMAIL": "bob@example.org"}]});
    cp.execute(call("contact", args), &customer).await.expect("a notice does not stop the call");
    cp.execute(call("contact", json!({"text": "plain"})), &customer).await.expect("no notice");
    assert_eq!(cp.execute(call("slow", json!({})), &customer).await.expect_err("timeout").code, ToolCode::Timeout.as_str());
    assert_eq!(cp.execute(call("nope", json!({})), &customer).await.expect_err("unknown").code, ToolCode::Unknown.as_str(), "other errors do not match");
    cp.audit().flush().await;

    let notices = server::db::owner_notifications::recent(&mut pool.pool.acquire().await.expect("conn"), 10).await.expect("notices");
    let shown: Vec<(String, String, String)> = notices.iter().rev().map(|n| (n.hook.clone(), n.reason_code.clone(), n.message.clone())).collect();
    assert_eq!(
        shown,
        vec![
            ("vip".into(), "OK".into(), "A VIP wrote: contact succeeded.".into()),
            ("slow-alert".into(), ToolCode::Timeout.as_str().into(), format!("Hook slow-alert: slow ended with {}.", ToolCode::Timeout.as_str())),
            ("lenta".into(), ToolCode::Timeout.as_str().into(), format!("La herramienta slow no respondió a tiempo ({}).", ToolCode::Timeout.as_str())),
        ]
    );
    assert!(notices.iter().all(|n| n.correlation_id == "corr-9"));
    // Each notice is also on its way to every owner number on WhatsApp, as a durable job.
    let deliveries: Vec<String> = sqlx::query("SELECT args FROM jobs WHERE kind = 'owner.notify' ORDER BY id").fetch_all(&pool.pool).await.expect("jobs").iter().map(|r| r.get(0)).collect();
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    let first: Value = serde_json::from_str(&deliveries[0]).expect("json");
    assert_eq!(first, json!({"to": "15550001111", "message": "A VIP wrote: contact succeeded."}));

    let audited: Vec<String> = sqlx::query("SELECT args FROM tool_audit WHERE tool = 'contact' ORDER BY id").fetch_all(&pool.pool).await.expect("audit").iter().map(|r| r.get(0)).collect();
    assert!(audited[0].contains("[PII]") && !audited[0].contains("ann@example.org") && !audited[0].contains("bob@example.org"), "{}", audited[0]);
    assert!(audited[0].contains("VIP order"), "other fields stay: {}", audited[0]);
}
both_backends!(checkpoint_notices_and_pii, owners_are_notified_and_personal_data_stays_out_of_the_audit);
