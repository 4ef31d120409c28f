use super::*;
use crate::config::{Problem, tests::problems_mention};

fn load(text: &str, secrets: &[&str]) -> Result<Catalog, Vec<Problem>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, text).expect("write");
    let set: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
    Catalog::load(&path, &move |v| set.iter().any(|s| s == v))
}

const GOOD: &str = r#"
approval_mode = "auto"

[[tool]]
name = "lookup_order"
title = "Look up an order"
description = "Finds an order by its number."
provider = "builtin"
handler = "shop.lookup"
operation = "read"
audience = "public"
risk = "low"
managed_fields = ["chat_id"]
secret_fields = { api_key = "SHOP_API_KEY" }
timeout = "5s"
retry = { max_attempts = 3, backoff = "200ms" }
[tool.input_schema]
type = "object"
additionalProperties = false
required = ["order_id"]
[tool.input_schema.properties.order_id]
type = "string"
[tool.input_schema.properties.chat_id]
type = "string"
[tool.input_schema.properties.api_key]
type = "string"
"#;

#[test]
fn loads_a_valid_catalog_with_a_version_hash() {
    let catalog = load(GOOD, &["SHOP_API_KEY"]).expect("valid");
    let tool = catalog.get("lookup_order").expect("tool");
    assert!(tool.version.starts_with("sha256:") && tool.version.len() == 71, "{}", tool.version);
    assert_eq!(tool.spec.retry.max_attempts, 3);
    assert_eq!(tool.spec.chat_types, vec![ChatKind::Direct, ChatKind::Group]);
    assert!(tool.input_validator.is_valid(&serde_json::json!({"order_id": "42"})));
    assert!(!tool.input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})));
    let edited = load(&GOOD.replace("Finds an order", "Finds any order"), &["SHOP_API_KEY"]).expect("valid");
    assert_ne!(edited.get("lookup_order").expect("tool").version, tool.version, "any edit changes the version");
}

#[test]
fn reports_every_problem_with_file_and_key() {
    let text = format!(
        "{GOOD}\n{}\n{}\n{}",
        // Duplicate name, bad schema, undeclared managed field.
        GOOD.replace("approval_mode = \"auto\"", "").replace("managed_fields = [\"chat_id\"]", "managed_fields = [\"sender\"]").replace("type = \"object\"", "type = \"objekt\""),
        "[[tool]]\nname = \"has space\"\ntitle = \"t\"\ndescription = \"d\"\nprovider = \"builtin\"\noperation = \"read\"\naudience = \"public\"\nrisk = \"low\"\ninput_schema = { type = \"object\" }\n",
        "[[tool]]\nname = \"typo\"\ntitle = \"t\"\ndescription = \"d\"\nprovider = \"connector\"\noperation = \"read\"\naudience = \"everyone\"\nrisk = \"low\"\ninput_schema = { type = \"object\" }\nretries = 3\n",
    );
    let problems = load(&text, &[]).expect_err("invalid");
    let shown = problems_mention(
        &problems,
        &[
            "tool[0] (lookup_order).secret_fields: \"api_key\" needs the environment variable SHOP_API_KEY",
            "tool[1] (lookup_order).name: \"lookup_order\" is defined more than once",
            "tool[1] (lookup_order).managed_fields: \"sender\" is not a property",
            "tool[2] (has space).name: must be 1 to 64",
            "tool[2] (has space).handler: a builtin tool must name its implementation",
        ],
    );
    let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
    assert!(has("tool[3] (typo)") && (has("everyone") || has("retries")), "{shown:#?}");
    assert!(problems.iter().all(|p| p.source.ends_with("tools.toml")));
}

/// Keys that would load and then do nothing are refused: a handler on a connector tool, an
/// MCP tool declared here (it could never run, and would hide the server's tool of that name),
/// and `chainable` on a tool that writes (only reads are chained).
#[test]
fn keys_that_would_do_nothing_are_refused() {
    let handler = GOOD.replace("provider = \"builtin\"", "provider = \"connector\"");
    problems_mention(&load(&handler, &["SHOP_API_KEY"]).expect_err("handler on a connector"), &["tool[0] (lookup_order).handler: is only read for provider = \"builtin\""]);
    let mcp = GOOD.replace("provider = \"builtin\"\nhandler = \"shop.lookup\"", "provider = \"mcp\"");
    problems_mention(&load(&mcp, &["SHOP_API_KEY"]).expect_err("mcp here"), &["tool[0] (lookup_order).provider: \"mcp\" tools come from the servers in mcp.toml"]);
    let chain_write = GOOD.replace("operation = \"read\"", "operation = \"write\"\nchainable = true");
    problems_mention(&load(&chain_write, &["SHOP_API_KEY"]).expect_err("chained write"), &["tool[0] (lookup_order).chainable: only a tool with operation = \"read\""]);
    assert!(load(&GOOD.replace("operation = \"read\"", "operation = \"read\"\nchainable = true"), &["SHOP_API_KEY"]).is_ok(), "a chained read loads");
}

/// A `notify_owner` message names `{tool}` and `{code}` only: another placeholder would reach
/// owners as typed.
#[test]
fn a_notice_names_only_its_placeholders() {
    let hook = |message: &str| format!("{GOOD}\n[[hook]]\nname = \"tell\"\npoint = \"on_error\"\nkind = \"notify_owner\"\ntools = [\"*\"]\npattern = \".\"\nmessage = \"{message}\"\n");
    problems_mention(&load(&hook("{tool} fallo: {motivo}"), &["SHOP_API_KEY"]).expect_err("unknown placeholder"), &["(tell).message: may name {tool} and {code} only"]);
    let catalog = load(&hook("{tool} fallo ({code})"), &["SHOP_API_KEY"]).expect("known placeholders");
    assert_eq!(catalog.hooks[0].spec.notice("lookup_order", "TOOL_TIMEOUT"), "lookup_order fallo (TOOL_TIMEOUT)");
    let plain = load(&hook("Slow {#}"), &["SHOP_API_KEY"]).expect("a brace around no word is text");
    assert_eq!(plain.hooks[0].spec.notice("lookup_order", "OK"), "Slow {#}: lookup_order succeeded.");
}

/// Each problem carries its stable code: a file that is not TOML, a key no tool has, a value
/// that is wrong.
#[test]
fn each_problem_carries_its_code() {
    use crate::config::ProblemCode;
    let codes = |problems: Vec<Problem>| problems.into_iter().map(|p| p.code).collect::<Vec<_>>();
    assert_eq!(codes(load("[[tool]\n", &[]).expect_err("not TOML")), [ProblemCode::ConfigSyntax]);
    assert_eq!(codes(load(&format!("{GOOD}\n[surprise]\nkey = 1\n"), &["SHOP_API_KEY"]).expect_err("unknown")), [ProblemCode::ConfigKeyUnknown]);
    let extra = GOOD.replace("operation = \"read\"", "operation = \"read\"\nsurprise = 1");
    assert_eq!(codes(load(&extra, &["SHOP_API_KEY"]).expect_err("unknown field")), [ProblemCode::ConfigKeyUnknown], "a key a tool entry does not have");
    let wrong = GOOD.replace("operation = \"read\"", "operation = 7");
    assert_eq!(codes(load(&wrong, &["SHOP_API_KEY"]).expect_err("wrong type")), [ProblemCode::ConfigValueInvalid]);
    let chain_write = GOOD.replace("operation = \"read\"", "operation = \"write\"\nchainable = true");
    let problems = load(&chain_write, &["SHOP_API_KEY"]).expect_err("chained write");
    assert!(problems.iter().all(|p| p.code == ProblemCode::ConfigValueInvalid), "{problems:?}");
    assert!(problems[0].to_string().starts_with("CONFIG_VALUE_INVALID tool[0] (lookup_order).chainable: "), "{}", problems[0]);
}

/// A secret pasted where its variable's name belongs is refused without being repeated: the
/// problem reaches check-config's output, the logs and the console.
#[test]
fn a_pasted_secret_is_not_repeated() {
    let pasted = GOOD.replace("api_key = \"SHOP_API_KEY\"", "api_key = \"sk_live_51Hx-9f.q\"");
    let shown = problems_mention(&load(&pasted, &[]).expect_err("not a variable"), &["tool[0] (lookup_order).secret_fields: \"api_key\" is not an environment variable name"]);
    assert!(shown.iter().all(|p| !p.contains("sk_live_51Hx")), "{shown:#?}");
}

#[test]
fn a_tools_own_plan_threshold_is_a_fraction_and_leaves_other_versions_alone() {
    let with = |t: &str| GOOD.replace("timeout = \"5s\"", &format!("timeout = \"5s\"\nplan_threshold = {t}"));
    let tool = load(&with("0.3"), &["SHOP_API_KEY"]).expect("valid");
    assert_eq!(tool.get("lookup_order").expect("tool").spec.plan_threshold, Some(0.3));
    for bad in ["0.0", "1.0", "1.5", "-0.2"] {
        let problems = load(&with(bad), &["SHOP_API_KEY"]).expect_err(bad);
        assert!(problems.iter().any(|p| p.to_string().contains("(lookup_order).plan_threshold: must be between 0 and 1")), "{bad}: {problems:?}");
    }
    // Unset, the key is not part of the definition: versions of tools without it stay as they were.
    let plain = load(GOOD, &["SHOP_API_KEY"]).expect("valid");
    assert!(!serde_json::to_string(&plain.get("lookup_order").expect("tool").spec).expect("json").contains("plan_threshold"));
}

/// A tool's own answer names values of its result: never a managed or secret field (nor one
/// whose name looks secret), whose value is never shown, and it must parse.
#[test]
fn an_answer_template_names_only_shown_values_and_parses() {
    let with = |t: &str| GOOD.replace("timeout = \"5s\"", &format!("timeout = \"5s\"\nanswer_template = {t:?}"));
    let tool = load(&with("Order {order_id}: {status}"), &["SHOP_API_KEY"]).expect("valid");
    assert_eq!(tool.get("lookup_order").expect("tool").spec.answer_template.as_deref(), Some("Order {order_id}: {status}"));
    for (bad, says) in [
        ("Order {api_key}", "names {api_key}: \"api_key\" is a managed or secret field"),
        ("For {CHAT_ID}", "names {CHAT_ID}: \"CHAT_ID\" is a managed or secret field"),
        ("Use {result.access_token}", "names {result.access_token}: \"access_token\" is a managed or secret field"),
        ("Order {order_id", "is not closed"),
        ("  ", "is empty"),
    ] {
        let problems = load(&with(bad), &["SHOP_API_KEY"]).expect_err(bad);
        assert!(problems.iter().any(|p| p.to_string().contains("(lookup_order).answer_template") && p.to_string().contains(says)), "{bad}: {problems:?}");
    }
    // A connector's result is its status and, under data, the JSON it answered.
    let connector = |t: &str| with(t).replace("provider = \"builtin\"\nhandler = \"shop.lookup\"", "provider = \"connector\"");
    // (Without its connectors.toml, a connector tool has another problem; only this one counts.)
    let answer_problems = |t: &str| load(&connector(t), &["SHOP_API_KEY"]).expect_err("no action").into_iter().filter(|p| p.to_string().contains("answer_template")).collect::<Vec<_>>();
    assert!(answer_problems("Order {data.order_id}: {data.status} ({status})").is_empty(), "valid for a connector");
    let problems = answer_problems("Order {order_id}");
    assert!(problems.iter().any(|p| p.to_string().contains("names {order_id}, which a connector's result never has: its answer is under data ({data.order_id})")), "{problems:?}");
    // Unset, the key is not part of the definition: versions of tools without it stay as they were.
    let plain = load(GOOD, &["SHOP_API_KEY"]).expect("valid");
    assert!(!serde_json::to_string(&plain.get("lookup_order").expect("tool").spec).expect("json").contains("answer_template"));
}

#[test]
fn extra_arguments_are_refused_unless_the_schema_allows_them() {
    let open = GOOD.replace("additionalProperties = false\n", "");
    let catalog = load(&open, &["SHOP_API_KEY"]).expect("valid");
    let tool = catalog.get("lookup_order").expect("tool");
    assert!(tool.spec.input_schema.get("additionalProperties").is_none(), "the schema as written is kept");
    assert!(tool.input_validator.is_valid(&serde_json::json!({"order_id": "42"})));
    assert!(!tool.input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})), "a missing additionalProperties means none");

    let allowed = load(&GOOD.replace("additionalProperties = false", "additionalProperties = true"), &["SHOP_API_KEY"]).expect("valid");
    assert!(allowed.get("lookup_order").expect("tool").input_validator.is_valid(&serde_json::json!({"order_id": "42", "extra": 1})), "an explicit true is kept");

    let mcp = ToolDef::from_spec(ToolSpec { input_schema: serde_json::json!({"type": "object", "properties": {"a": {"type": "number"}}}), ..tool.spec.clone() }).expect("spec");
    assert!(!mcp.input_validator.is_valid(&serde_json::json!({"a": 1, "b": 2})), "definitions made at run time (MCP) are closed too");
    assert!(mcp.spec.input_schema.get("additionalProperties").is_none());
}

#[test]
fn argument_formats_are_checked_and_unknown_formats_ignored() {
    let spec = load(GOOD, &["SHOP_API_KEY"]).expect("valid").get("lookup_order").expect("tool").spec.clone();
    let with_formats = serde_json::json!({"type": "object", "properties": {
        "email": {"type": "string", "format": "email"},
        "day": {"type": "string", "format": "date"},
        "code": {"type": "string", "format": "x-shop-code"}
    }});
    let tool = ToolDef::from_spec(ToolSpec { input_schema: with_formats.clone(), output_schema: Some(with_formats), ..spec }).expect("an unknown format compiles");
    assert!(tool.input_validator.is_valid(&serde_json::json!({"email": "ada@example.com", "day": "2026-12-06", "code": "anything"})));
    assert!(!tool.input_validator.is_valid(&serde_json::json!({"email": "x'; DROP TABLE orders; --"})), "not an email address");
    assert!(!tool.input_validator.is_valid(&serde_json::json!({"day": "next tuesday"})), "not a date");
    let output = tool.output_validator.as_ref().expect("output schema");
    assert!(output.is_valid(&serde_json::json!({"day": "next tuesday"})), "a result is checked for its shape only");
}

#[test]
fn names_follow_provider_rules() {
    assert!(valid_tool_name("web_fetch"));
    assert!(valid_tool_name("server-everything__get-sum"));
    assert!(!valid_tool_name(""));
    assert!(!valid_tool_name("a.b"));
    assert!(!valid_tool_name(&"x".repeat(65)));
}

/// A tool whose retries outlast its job's budget is reported: cut in the middle, its job would
/// run the tool again.
#[test]
fn a_tool_whose_retries_outlast_the_tool_call_budget_is_reported() {
    use std::time::Duration;
    let slow = GOOD.replace("timeout = \"5s\"", "timeout = \"100s\"");
    let catalog = load(&slow, &["SHOP_API_KEY"]).expect("valid");
    let spec = &catalog.get("lookup_order").expect("tool").spec;
    assert_eq!(load::worst_call(spec), Duration::from_millis(300_600), "three attempts of 100 s, waits of 200 and 400 ms");
    let path = std::path::Path::new("tools.toml");
    let problems = fits_tool_call_budget(&catalog, path, Duration::from_secs(240), Duration::from_secs(65));
    problems_mention(&problems, &["tool (lookup_order).timeout", "must fit jobs.timeouts.tool_call"]);
    let quick = load(GOOD, &["SHOP_API_KEY"]).expect("valid");
    assert!(fits_tool_call_budget(&quick, path, Duration::from_secs(240), Duration::from_secs(65)).is_empty());
}

/// An owner-only tool answers in owners' direct chats only: one allowed in groups alone could
/// never be used, and is refused.
#[test]
fn an_owner_only_tool_for_groups_alone_is_refused() {
    let owners = GOOD.replace("audience = \"public\"", "audience = \"owner_only\"");
    assert!(load(&owners, &["SHOP_API_KEY"]).is_ok(), "direct and group by default: used in direct chats");
    let problems = load(&owners.replace("timeout = \"5s\"", "timeout = \"5s\"\nchat_types = [\"group\"]"), &["SHOP_API_KEY"]).expect_err("refused");
    problems_mention(&problems, &["tool[0] (lookup_order).chat_types: an owner_only tool is used in owners' direct chats only"]);
}
