//! The Tools & MCP page's server functions: catalog with filters, a "try it" call through the
//! checkpoint as the owner (audited), and a reload that refuses a broken file.

use axum::http::StatusCode;
use sqlx::Row;

use crate::{
    both_backends,
    support::{TestApp, TestDb},
};

const PASSWORD: &str = "correct horse battery";
const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tools.toml");

/// An app over a config directory holding the shipped tools.toml, with an owner signed in.
async fn shipped_tools(db: TestDb) -> (tempfile::TempDir, TestApp, crate::support::Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gatehouse.toml"), "").expect("config");
    std::fs::copy(SHIPPED, dir.path().join("tools.toml")).expect("tools");
    let app = TestApp::in_config_dir(db, dir.path()).await;
    let owner = app.with_owner("ada", PASSWORD).await;
    (dir, app, owner)
}

async fn tools_page_try_it_and_reload(db: TestDb) {
    let (dir, app, mut owner) = shipped_tools(db).await;

    let page = owner.post_form("/api/list_tools", &[("provider", ""), ("audience", ""), ("risk", "")]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let page = page.json();
    let names: Vec<&str> = page["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["read_result", "web_fetch", "web_search"]);
    assert_eq!(page["tools"][1]["breaker"], "closed");
    assert_eq!(page["approval_mode"], "auto");
    let filtered = owner.post_form("/api/list_tools", &[("provider", "connector"), ("audience", ""), ("risk", "")]).await.json();
    assert_eq!((filtered["tools"].as_array().map(Vec::len), filtered["total"].as_u64()), (Some(0), Some(3)));

    let detail = owner.post_form("/api/get_tool", &[("name", "web_fetch")]).await.json();
    assert_eq!(detail["owner_policy"], "allowed");
    assert!(detail["answer_template"].is_null(), "the summarizer writes its replies: {detail}");
    assert!(detail["example_args"].as_str().is_some_and(|a| a.contains("\"url\"")), "{detail}");
    let missing = owner.post_form("/api/get_tool", &[("name", "nope")]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // "Try it" runs through the checkpoint as the owner, and lands in the audit.
    let tried = owner.post_form("/api/try_tool", &[("name", "web_fetch"), ("args", r#"{"url":"http://127.0.0.1:9/"}"#), ("chat_type", "direct")]).await;
    assert_eq!(tried.status, StatusCode::OK, "{}", tried.body);
    let tried = tried.json();
    assert_eq!((tried["ok"].as_bool(), tried["code"].as_str()), (Some(false), Some("FETCH_ADDRESS_FORBIDDEN")));
    let correlation = tried["correlation_id"].as_str().expect("correlation").to_string();
    let bad_json = owner.post_form("/api/try_tool", &[("name", "web_fetch"), ("args", "{url"), ("chat_type", "direct")]).await;
    assert_eq!(bad_json.status, StatusCode::BAD_REQUEST);
    let page = owner.post_form("/api/list_tools", &[("provider", ""), ("audience", ""), ("risk", "")]).await.json();
    let call = &page["recent_calls"][0];
    assert_eq!((call["actor"].as_str(), call["decision"].as_str(), call["correlation_id"].as_str()), (Some("owner"), Some("deny"), Some(correlation.as_str())));
    let events: Vec<String> = sqlx::query("SELECT event FROM owner_audit ORDER BY id").fetch_all(&app.state.db.pool).await.expect("audit").iter().map(|r| r.get(0)).collect();
    assert!(events.contains(&"tool_try".to_string()), "{events:?}");

    // Reload picks up an edit, and names what changed.
    let worker = app.another_process(dir.path()).await;
    let before = app.state.tools.catalog().get("web_fetch").expect("tool").version.clone();
    let text = std::fs::read_to_string(SHIPPED).expect("read").replace("Fetches one public web page", "Reads one public web page");
    std::fs::write(dir.path().join("tools.toml"), &text).expect("edit");
    let reloaded = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.body);
    assert_eq!(reloaded.json(), serde_json::json!({"tools": 3, "changed": ["web_fetch"]}));
    let after = app.state.tools.catalog().get("web_fetch").expect("tool").version.clone();
    assert_ne!(before, after);
    // Another process of the deployment (a `gatehouse worker`, whose jobs call tools) follows
    // at its next poll, the first one included: its files were read before the edit.
    assert_eq!(worker.tools.catalog().get("web_fetch").expect("tool").version, before);
    worker.reloads.poll().await;
    assert_eq!(worker.tools.catalog().get("web_fetch").expect("tool").version, after, "the other process reloaded");
    // ... and every later one: a tool turned off here is off there.
    std::fs::write(dir.path().join("tools.toml"), text.replacen("name = \"web_fetch\"\n", "name = \"web_fetch\"\nenabled = false\n", 1)).expect("turn one off");
    let off = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(off.status, StatusCode::OK, "{}", off.body);
    assert_eq!(off.json()["changed"], serde_json::json!(["web_fetch"]));
    let enabled = |catalog: std::sync::Arc<server::tools::Catalog>| catalog.all().filter(|t| t.spec.enabled).map(|t| t.spec.name.clone()).collect::<Vec<_>>();
    assert_ne!(enabled(worker.tools.catalog()), enabled(app.state.tools.catalog()), "not yet followed");
    worker.reloads.poll().await;
    assert_eq!(enabled(worker.tools.catalog()), enabled(app.state.tools.catalog()));
    assert!(!enabled(worker.tools.catalog()).contains(&"web_fetch".to_string()));
    std::fs::write(dir.path().join("tools.toml"), &text).expect("back on");
    let on = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(on.status, StatusCode::OK, "{}", on.body);
    worker.reloads.poll().await;
    assert_eq!(worker.tools.catalog().get("web_fetch").expect("tool").version, after);
    let generation = || async { sqlx::query_scalar::<_, i64>("SELECT generation FROM catalog_reloads").fetch_one(&app.state.db.pool).await.expect("count") };
    let told = generation().await;

    // A broken file is refused with every problem, and the current catalog stays.
    std::fs::write(dir.path().join("tools.toml"), format!("surprise = 1\n{text}\n[[tool]]\nname = \"x y\"\n")).expect("break");
    let refused = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    let err = refused.json();
    assert_eq!(err["code"], "CONFIG_INVALID");
    assert!(err["message"].as_str().is_some_and(|m| m.contains("surprise") && m.contains("tool[3]")), "{err}");
    assert_eq!(app.state.tools.catalog().get("web_fetch").expect("tool").version, after, "the current catalog stays");
    // A tool whose calls cannot fit their job is refused as check-config refuses it, so a
    // reload never installs a file the next start would not take.
    std::fs::write(dir.path().join("tools.toml"), text.replacen("timeout = \"15s\"", "timeout = \"200s\"", 1)).expect("slow");
    let slow = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(slow.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", slow.body);
    assert!(slow.json()["message"].as_str().is_some_and(|m| m.contains("jobs.timeouts.tool_call")), "{}", slow.body);
    assert_eq!(app.state.tools.catalog().get("web_fetch").expect("tool").version, after, "the current catalog stays");
    let reloads: i64 = sqlx::query("SELECT COUNT(*) FROM owner_audit WHERE event = 'tools_reload'").fetch_one(&app.state.db.pool).await.expect("count").get(0);
    assert_eq!(reloads, 5, "every reload is audited");
    assert_eq!(generation().await, told, "a refused reload is told to no other process");
}
both_backends!(tools_console, tools_page_try_it_and_reload);

/// A process whose follow of another's reload fails for a passing cause (here the MCP tool
/// table cannot be read) tries again at its next poll, instead of keeping its old catalog until
/// the next reload.
async fn a_follow_that_fails_is_tried_again(db: TestDb) {
    let (dir, app, mut owner) = shipped_tools(db).await;
    let worker = app.another_process(dir.path()).await;
    worker.reloads.poll().await;
    let text = std::fs::read_to_string(SHIPPED).expect("read").replace("Fetches one public web page", "Reads one public web page");
    std::fs::write(dir.path().join("tools.toml"), &text).expect("edit");
    let reloaded = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.body);
    let after = app.state.tools.catalog().get("web_fetch").expect("tool").version.clone();
    sqlx::query("ALTER TABLE mcp_tools RENAME TO mcp_tools_away").execute(&app.state.db.pool).await.expect("hide the table");
    worker.reloads.poll().await;
    assert_ne!(worker.tools.catalog().get("web_fetch").expect("tool").version, after, "the follow failed");
    sqlx::query("ALTER TABLE mcp_tools_away RENAME TO mcp_tools").execute(&app.state.db.pool).await.expect("bring it back");
    worker.reloads.poll().await;
    assert_eq!(worker.tools.catalog().get("web_fetch").expect("tool").version, after, "followed at the next poll");
}
both_backends!(tools_follow_retried, a_follow_that_fails_is_tried_again);

/// A reload that cannot be published (here the MCP tool table cannot be read) keeps the current
/// catalog, and keeps it: the next publish, from any MCP event, does not install the catalog
/// that was reported as refused.
async fn a_refused_reload_is_not_published_later(db: TestDb) {
    let (dir, app, mut owner) = shipped_tools(db).await;
    let before = app.state.tools.catalog().get("web_fetch").expect("tool").version.clone();
    let text = std::fs::read_to_string(SHIPPED).expect("read").replace("Fetches one public web page", "Reads one public web page");
    std::fs::write(dir.path().join("tools.toml"), &text).expect("edit");
    sqlx::query("ALTER TABLE mcp_tools RENAME TO mcp_tools_away").execute(&app.state.db.pool).await.expect("hide the table");
    let refused = owner.post_form("/api/reload_tools", &[]).await;
    assert_ne!(refused.status, StatusCode::OK, "{}", refused.body);
    sqlx::query("ALTER TABLE mcp_tools_away RENAME TO mcp_tools").execute(&app.state.db.pool).await.expect("bring it back");
    app.state.mcp.load_cached().await.expect("a later publish");
    assert_eq!(app.state.tools.catalog().get("web_fetch").expect("tool").version, before, "the refused reload stays unpublished");
    let reloaded = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.body);
    assert_ne!(app.state.tools.catalog().get("web_fetch").expect("tool").version, before, "a reload that works is published");
}
both_backends!(tools_refused_reload_stays_out, a_refused_reload_is_not_published_later);

/// A process's first poll follows the reloads counted so far when they changed the files it had
/// read, whatever the clocks say: here the reload's time, written by a host whose clock is far
/// behind, is older than this process's start.
async fn the_first_poll_follows_by_the_files_not_the_clocks(db: TestDb) {
    let (dir, app, mut owner) = shipped_tools(db).await;
    let worker = app.another_process(dir.path()).await;
    let before = worker.tools.catalog().get("web_fetch").expect("tool").version.clone();
    let text = std::fs::read_to_string(SHIPPED).expect("read").replace("Fetches one public web page", "Reads one public web page");
    std::fs::write(dir.path().join("tools.toml"), &text).expect("edit");
    let reloaded = owner.post_form("/api/reload_tools", &[]).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.body);
    sqlx::query("UPDATE catalog_reloads SET reloaded_at = 1").execute(&app.state.db.pool).await.expect("a clock far behind");
    let after = app.state.tools.catalog().get("web_fetch").expect("tool").version.clone();
    assert_ne!(before, after);
    worker.reloads.poll().await;
    assert_eq!(worker.tools.catalog().get("web_fetch").expect("tool").version, after, "followed: its files changed after it read them");
}
both_backends!(tools_follow_by_files, the_first_poll_follows_by_the_files_not_the_clocks);

/// A connector of the test's own, reading its key from `SHOP_API_KEY`.
const SHOP_TOOL: &str = r#"
[[tool]]
name = "lookup_order"
title = "Look up an order"
description = "Finds an order by number."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string" } } }

[[tool]]
name = "find_customer"
title = "Find a customer"
description = "Finds a customer."
provider = "connector"
operation = "read"
audience = "owner_only"
risk = "low"
enabled = false
input_schema = { type = "object" }
"#;
const SHOP_CONNECTOR: &str = r#"
[[connector]]
id = "shop"
title = "Shop"
base_url = "https://shop.example/api"
allowed_urls = ["https://shop.example/api/orders/*"]
headers = { Authorization = "Bearer ${SHOP_API_KEY}" }

[[connector.action]]
tool = "lookup_order"
method = "GET"
path = "orders/{order_id}"

[[connector]]
id = "crm"
title = "CRM"
base_url = "https://crm.example/api"
allowed_urls = ["https://crm.example/api/*"]
enabled = false

[[connector.action]]
tool = "find_customer"
method = "GET"
path = "customers"
headers = { "X-Api-Key" = "${CRM_TOKEN}" }
"#;

/// The Settings page lists the secrets the tool files name, with what reads each and whether
/// it is set, never its value: before, only Gatehouse's own variables were listed, and an owner
/// could not tell whether a connector's or an MCP server's key was there.
async fn settings_list_the_secrets_the_tool_files_name(db: TestDb) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gatehouse.toml"), "").expect("config");
    std::fs::write(dir.path().join("tools.toml"), std::fs::read_to_string(SHIPPED).expect("shipped") + SHOP_TOOL).expect("tools");
    std::fs::write(dir.path().join("connectors.toml"), SHOP_CONNECTOR).expect("connectors");
    let value = "shop-key-never-shown";
    let secrets = server::config::Secrets::from_lookup(move |name| (name == "SHOP_API_KEY").then(|| value.to_string()));
    let app = TestApp::in_dir_with(db, dir.path(), secrets, |_| {}).await;
    let page = app.with_owner("ada", PASSWORD).await.get("/settings").await.body;
    let row = |var: &str| page.split("<tr>").find(|r| r.contains(var)).map(str::to_string).unwrap_or_default();
    assert!(page.contains("data-testid=\"tool-secrets\""), "{page}");
    let shop = row("SHOP_API_KEY");
    assert!(shop.contains(">set<") && shop.contains("connector shop"), "{shop}");
    assert!(!page.contains(value), "a secret's value is never shown");
    // A disabled connector's: what to set before enabling it.
    let crm = row("CRM_TOKEN");
    assert!(crm.contains(">unset<") && crm.contains("connector crm (disabled)"), "{page}");

    // An MCP server's: unset, and said to be of a disabled server (an owner may enable it).
    let mcp_dir = tempfile::tempdir().expect("tempdir");
    let path = mcp_dir.path().join("mcp.toml");
    let server = "[[server]]\nid = \"github\"\nenabled = false\n[server.transport]\ntype = \"stdio\"\ncommand = \"github-mcp\"\nenv = { GITHUB_TOKEN = { secret = \"GITHUB_PAT\" } }\n";
    // A token pasted where its variable's name belongs (it has a variable name's letters).
    let pasted = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
    let other = format!("[[server]]\nid = \"gitlab\"\nenabled = false\n[server.transport]\ntype = \"stdio\"\ncommand = \"gitlab-mcp\"\nenv = {{ GITLAB_TOKEN = {{ secret = \"{pasted}\" }} }}\n");
    std::fs::write(&path, format!("{server}{other}")).expect("write");
    let mcp = server::tools::mcp::config::load(&path, &|_| true).expect("valid mcp.toml");
    let app = TestApp::with_mcp(TestDb::sqlite(), mcp, server::config::Secrets::default()).await;
    let page = app.with_owner("ada", PASSWORD).await.get("/settings").await.body;
    let github = page.split("<tr>").find(|r| r.contains("GITHUB_PAT")).unwrap_or_default();
    assert!(github.contains(">unset<") && github.contains("MCP server github (disabled)"), "{page}");
    assert!(!page.contains(pasted) && page.contains("not shown: not in capitals"), "a name that may be a pasted token is not shown: {page}");
}
both_backends!(settings_tool_secrets, settings_list_the_secrets_the_tool_files_name);
