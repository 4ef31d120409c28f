//! Connector tools against a local HTTP server: URL templates, allowed patterns, header secrets,
//! body mapping, kept fields, retries and the checks made when the files load.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, Uri},
    response::{IntoResponse, Redirect},
    routing::{any, get, post},
};
use serde_json::{Value, json};
use server::domain::Role;
use server::tools::{
    CallContext, Catalog, Checkpoint, ToolCall,
    catalog::{ChatKind, Provider},
    checkpoint::{AuditWriter, SecretSource, ToolCode},
    connectors::{self, ConnectorExecutor},
};
use sqlx::Row;

use crate::{
    both_backends,
    support::{Captured, TestDb},
};

const KEY: &str = "shop-key-never-shown-9f2";

/// What the shop saw: every request's method, path and query, and the bodies it was sent.
#[derive(Default)]
struct Seen {
    requests: Vec<String>,
    auth: Vec<String>,
    bodies: Vec<Value>,
    flaky_calls: usize,
}

type Shared = Arc<Mutex<Seen>>;

fn record(seen: &Shared, method: &str, uri: &Uri, headers: &HeaderMap) {
    let mut s = seen.lock().expect("lock");
    s.requests.push(format!("{method} {uri}"));
    s.auth.push(headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string());
}

async fn shop() -> (SocketAddr, Shared) {
    let seen: Shared = Arc::default();
    let app = Router::new()
        .route(
            "/api/orders/{id}",
            get(|State(seen): State<Shared>, Path(id): Path<String>, uri: Uri, headers: HeaderMap| async move {
                record(&seen, "GET", &uri, &headers);
                // A shop that echoes the request's credentials back in a field that is kept.
                let status = if id == "ECHO1" { format!("shipped; you sent {}", headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default()) } else { "shipped".into() };
                let order = json!({ "id": id, "status": status, "internal_margin": 0.31, "items": [{"name": "Lamp", "cost": 9}, {"name": "Bulb", "cost": 1}] });
                // A shop that starts its JSON with a byte-order mark, or answers with text.
                let body = match id.as_str() {
                    "BOM1" => format!("\u{feff}{order}"),
                    "TEXT1" => format!("order {id}: internal_margin=0.31, api_token=t0k3n"),
                    _ => order.to_string(),
                };
                ([(axum::http::header::CONTENT_TYPE, "application/json")], body)
            }),
        )
        .route(
            "/api/refunds",
            post(|State(seen): State<Shared>, uri: Uri, headers: HeaderMap, Json(body): Json<Value>| async move {
                record(&seen, "POST", &uri, &headers);
                seen.lock().expect("lock").bodies.push(body);
                (StatusCode::CREATED, Json(json!({ "refund_id": "R-1", "state": "queued" })))
            }),
        )
        .route(
            "/api/flaky",
            get(|State(seen): State<Shared>, uri: Uri, headers: HeaderMap| async move {
                record(&seen, "GET", &uri, &headers);
                let n = {
                    let mut s = seen.lock().expect("lock");
                    s.flaky_calls += 1;
                    s.flaky_calls
                };
                if n == 1 { StatusCode::SERVICE_UNAVAILABLE.into_response() } else { Json(json!({"ok": true})).into_response() }
            }),
        )
        .route(
            "/api/moved",
            get(|State(seen): State<Shared>, uri: Uri, headers: HeaderMap| async move {
                record(&seen, "GET", &uri, &headers);
                Redirect::temporary("/api/admin/secrets")
            }),
        )
        .fallback(any(|State(seen): State<Shared>, method: axum::http::Method, uri: Uri, headers: HeaderMap| async move {
            record(&seen, method.as_str(), &uri, &headers);
            StatusCode::NOT_FOUND
        }))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (addr, seen)
}

const TOOLS: &str = r#"
[audit]
pii_fields = ["customer_email"]

[[tool]]
name = "lookup_order"
title = "Look up an order"
description = "Finds an order by number."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", additionalProperties = false, required = ["order_id"], properties = { order_id = { type = "string", maxLength = 40 }, expand = { type = "string" } } }

[[tool]]
name = "refund"
title = "Refund"
description = "Asks the shop to refund an order."
provider = "connector"
operation = "write"
audience = "owner_only"
risk = "low"
managed_fields = ["chat_id"]
input_schema = { type = "object", additionalProperties = false, required = ["order_id", "amount"], properties = { order_id = { type = "string" }, amount = { type = "number" }, note = { type = "string" }, customer_email = { type = "string" }, chat_id = { type = "string" } } }

[[tool]]
name = "order_subpage"
title = "Order subpage"
description = "Reaches past the allowed pattern (for the test)."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", properties = { order_id = { type = "string" }, page = { type = "string" } } }

[[tool]]
name = "flaky"
title = "Flaky"
description = "Fails once."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
retry = { max_attempts = 2, backoff = "10ms" }
input_schema = { type = "object" }

[[tool]]
name = "moved"
title = "Moved"
description = "Answers with a redirect."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object" }

[[tool]]
name = "missing"
title = "Missing"
description = "Answers 404."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
retry = { max_attempts = 3, backoff = "10ms" }
input_schema = { type = "object" }
"#;

fn connectors_toml(addr: SocketAddr) -> String {
    format!(
        r#"
[[connector]]
id = "shop"
title = "Test shop"
base_url = "http://{addr}/api"
allowed_urls = ["http://{addr}/api/orders/*", "http://{addr}/api/refunds", "http://{addr}/api/flaky", "http://{addr}/api/moved", "http://{addr}/api/missing"]
headers = {{ Authorization = "Bearer ${{TEST_CONNECTOR_KEY}}", Accept = "application/json" }}

[[connector.action]]
tool = "lookup_order"
method = "GET"
path = "orders/{{order_id}}"
query = {{ expand = "{{expand}}" }}
keep = ["id", "status", "items.name"]

[[connector.action]]
tool = "refund"
method = "POST"
path = "refunds"
body = {{ order = "{{order_id}}", amount = "{{amount}}", reason = "chat {{chat_id}}: {{note}}", source = "gatehouse" }}

[[connector.action]]
tool = "order_subpage"
method = "GET"
path = "orders/{{order_id}}/{{page}}"

[[connector.action]]
tool = "flaky"
method = "GET"
path = "flaky"

[[connector.action]]
tool = "moved"
method = "GET"
path = "moved"

[[connector.action]]
tool = "missing"
method = "GET"
path = "missing"
"#
    )
}

fn load(tools: &str, connectors: &str, set: &'static [&'static str]) -> Result<Catalog, Vec<server::config::Problem>> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tools.toml"), tools).expect("write");
    std::fs::write(dir.path().join("connectors.toml"), connectors).expect("write");
    Catalog::load(&dir.path().join("tools.toml"), &|v| set.contains(&v))
}

fn secrets() -> SecretSource {
    SecretSource::from_fn(|v: &str| (v == "TEST_CONNECTOR_KEY").then(|| KEY.to_string()))
}

fn ctx(actor: Role) -> CallContext {
    CallContext { actor, chat_type: ChatKind::Direct, chat_id: Some("chat-3".into()), sender_id: None, correlation_id: "corr-c".into(), approved: None, trace_id: None }
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall { name: name.into(), args }
}

async fn connector_actions_stay_inside_their_patterns(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let (addr, seen) = shop().await;
    let catalog = load(TOOLS, &connectors_toml(addr), &["TEST_CONNECTOR_KEY"]).expect("valid");
    let mut cp = Checkpoint::new(pool.clone(), Arc::new(catalog), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets());
    cp.register_provider(Provider::Connector, Arc::new(ConnectorExecutor::new(secrets()).expect("client")));
    let customer = ctx(Role::Customer);
    let owner = ctx(Role::Owner);

    // GET with a path parameter and an optional query; only the kept fields come back.
    let order = cp.execute(call("lookup_order", json!({"order_id": "A 17", "expand": "items&admin=1"})), &customer).await.expect("lookup");
    assert_eq!(order.output, json!({"status": 200, "data": {"id": "A 17", "status": "shipped", "items": [{"name": "Lamp"}, {"name": "Bulb"}]}}));
    // The argument could not add a query parameter: it arrived encoded as one value.
    assert_eq!(seen.lock().expect("lock").requests.last().map(String::as_str), Some("GET /api/orders/A%2017?expand=items%26admin%3D1"));
    // A byte-order mark before the JSON: still JSON, still only the kept fields.
    let bom = cp.execute(call("lookup_order", json!({"order_id": "BOM1"})), &customer).await.expect("BOM");
    assert_eq!(bom.output["data"], json!({"id": "BOM1", "status": "shipped", "items": [{"name": "Lamp"}, {"name": "Bulb"}]}));
    // The connector's credentials, echoed in the answer, reach neither the model nor the person.
    let echo = cp.execute(call("lookup_order", json!({"order_id": "ECHO1"})), &customer).await.expect("echo");
    assert_eq!(echo.output["data"]["status"], "shipped; you sent Bearer [REDACTED]", "{}", echo.output);
    // A body that is not JSON cannot have its kept fields picked: nothing of it is passed on.
    let text = cp.execute(call("lookup_order", json!({"order_id": "TEXT1"})), &customer).await.expect_err("not JSON");
    assert!(text.message.contains(connectors::ConnectorCode::NotJson.as_str()) && !text.message.contains("t0k3n"), "{text}");
    let without = cp.execute(call("lookup_order", json!({"order_id": "B2"})), &customer).await.expect("no expand");
    assert_eq!(without.output["data"]["id"], "B2");
    assert_eq!(seen.lock().expect("lock").requests.last().map(String::as_str), Some("GET /api/orders/B2"), "an absent argument leaves its query parameter out");

    // Arguments cannot climb out of their segment or change the host.
    for hostile in ["../refunds", "..", "%2e%2e", "x/../../admin", "@evil.example", "a#frag", "a?b=c"] {
        let before = seen.lock().expect("lock").requests.len();
        match cp.execute(call("lookup_order", json!({"order_id": hostile})), &customer).await {
            Ok(res) => {
                let s = seen.lock().expect("lock");
                let last = s.requests.last().expect("request");
                assert!(last.starts_with("GET /api/orders/") && last["GET /api/orders/".len()..].split('?').next().is_some_and(|seg| !seg.contains('/')), "{hostile} -> {last}");
                assert_eq!(res.output["status"], 200);
            }
            Err(e) => {
                assert_eq!(e.code, connectors::ConnectorCode::UnsupportedUrl.as_str(), "{hostile}: {e}");
                assert_eq!(seen.lock().expect("lock").requests.len(), before, "{hostile}: refused before any request");
            }
        }
    }

    // A URL outside the allowed patterns is refused before any request is made.
    let before = seen.lock().expect("lock").requests.len();
    let outside = cp.execute(call("order_subpage", json!({"order_id": "A1", "page": "invoice"})), &customer).await.expect_err("outside");
    assert_eq!(outside.code, connectors::ConnectorCode::UnsupportedUrl.as_str());
    assert_eq!(seen.lock().expect("lock").requests.len(), before, "nothing reached the shop");
    // Refusals say nothing about the shop's health: they never open the tool's breaker.
    for _ in 0..4 {
        let again = cp.execute(call("order_subpage", json!({"order_id": "A1", "page": "invoice"})), &customer).await.expect_err("outside");
        assert_eq!(again.code, connectors::ConnectorCode::UnsupportedUrl.as_str());
    }
    assert_eq!(cp.breakers().state("order_subpage", std::time::Instant::now()), server::tools::breaker::BreakerState::Closed);

    // POST with a typed body mapping and the managed chat id; customers cannot call it.
    assert_eq!(cp.execute(call("refund", json!({"order_id": "A1", "amount": 12.5})), &customer).await.expect_err("owner only").code, ToolCode::NotAllowedForActor.as_str());
    let refund = cp.execute(call("refund", json!({"order_id": "A1", "amount": 12.5, "note": "broken", "customer_email": "c@example.org"})), &owner).await.expect("refund");
    assert_eq!(refund.output, json!({"status": 201, "data": {"refund_id": "R-1", "state": "queued"}}));
    assert_eq!(seen.lock().expect("lock").bodies.last(), Some(&json!({"order": "A1", "amount": 12.5, "reason": "chat chat-3: broken", "source": "gatehouse"})));

    // Retryable 503 then success; 404 is not retried; redirects are not followed.
    let (logs, guard) = Captured::start();
    let flaky = cp.execute(call("flaky", json!({})), &customer).await.expect("retried");
    assert_eq!(flaky.attempts, 2);
    let missing = cp.execute(call("missing", json!({})), &customer).await.expect_err("404");
    assert_eq!(missing.code, ToolCode::ProviderError.as_str());
    assert!(missing.message.contains(connectors::ConnectorCode::HttpStatus.as_str()) && missing.message.contains("404"), "{missing}");
    let moved = cp.execute(call("moved", json!({})), &customer).await.expect_err("redirect");
    assert!(moved.message.contains("307"), "{moved}");
    // Each connector call that ended in failure is logged once with the seed's event name,
    // its tool and code; the one that succeeded on retry is not, and the key never is.
    drop(guard);
    let logs = logs.text();
    let failed: Vec<&str> = logs.lines().filter(|l| l.contains("AgentToolConnectorFailed")).collect();
    assert_eq!(failed.len(), 2, "{logs}");
    assert!(failed[0].contains("tool=missing") && failed[0].contains("code=CONNECTOR_HTTP_STATUS") && failed[0].contains("correlation_id="), "{logs}");
    assert!(failed[1].contains("tool=moved"), "{logs}");
    assert!(!logs.contains(KEY), "{logs}");

    {
        let s = seen.lock().expect("lock");
        assert_eq!(s.requests.iter().filter(|r| r.contains("/missing")).count(), 1, "a 404 is not retried");
        assert!(!s.requests.iter().any(|r| r.contains("/admin") || r.contains("/refunds?")), "{:?}", s.requests);
        assert!(s.auth.iter().all(|a| a == &format!("Bearer {KEY}")), "the header secret reached the shop on every request");
    }
    // A 404 is the request's failure, not the shop's: made-up order numbers, asked for again
    // and again, do not close the tool for every chat.
    for _ in 0..4 {
        assert!(cp.execute(call("missing", json!({})), &customer).await.expect_err("404").message.contains("404"));
    }
    assert_eq!(cp.breakers().state("missing", std::time::Instant::now()), server::tools::breaker::BreakerState::Closed);

    cp.audit().flush().await;
    let rows = sqlx::query("SELECT tool, decision, reason_code, args FROM tool_audit ORDER BY id").fetch_all(&pool.pool).await.expect("audit");
    let outside_row = rows.iter().find(|r| r.get::<String, _>(0) == "order_subpage").expect("row");
    assert_eq!((outside_row.get::<String, _>(1), outside_row.get::<String, _>(2)), ("deny".to_string(), connectors::ConnectorCode::UnsupportedUrl.as_str().to_string()));
    for row in &rows {
        let args: String = row.get(3);
        assert!(!args.contains(KEY) && !args.contains("c@example.org"), "secret or personal data in the audit: {args}");
    }
}
both_backends!(connector_calls, connector_actions_stay_inside_their_patterns);

#[test]
fn connector_files_report_every_problem() {
    let addr: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let bad = format!(
        "{}\n{}",
        connectors_toml(addr),
        r#"
[[connector]]
id = "crm"
base_url = "https://crm.example.com/v1"
allowed_urls = ["https://other.example.com/v1/*"]
headers = { "X-Key" = "${CRM_KEY}" }

[[connector.action]]
tool = "no_such_tool"
method = "GET"
path = "people"

[[connector.action]]
tool = "lookup_order"
method = "GET"
path = "people/{person}"
body = { a = "b" }
"#
    );
    // `flaky` loses its action, so the catalog must say nothing runs it.
    let bad = bad.replace("tool = \"flaky\"", "tool = \"flaky_renamed\"");
    let problems = load(TOOLS, &bad, &[]).expect_err("invalid");
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let has = |needle: &str| shown.iter().any(|s| s.contains(needle));
    assert!(has("connector[0] (shop).headers.Authorization: needs the environment variable TEST_CONNECTOR_KEY"), "{shown:#?}");
    assert!(has("connector[1] (crm).allowed_urls: \"https://other.example.com/v1/*\" must start with"), "{shown:#?}");
    assert!(has("connector[1] (crm).headers.X-Key: needs the environment variable CRM_KEY"), "{shown:#?}");
    assert!(has("action[0] (no_such_tool).tool: there is no tool named"), "{shown:#?}");
    assert!(has("action[1] (lookup_order).tool: \"lookup_order\" is already run by another action"), "{shown:#?}");
    assert!(has("action[1] (lookup_order).path: {person} is not a property"), "{shown:#?}");
    assert!(has("action[1] (lookup_order).body: a GET request has no body"), "{shown:#?}");
    assert!(has("action[3] (flaky_renamed).tool: there is no tool named"), "{shown:#?}");
    assert!(has("tool (flaky).provider: no enabled action"), "{shown:#?}");
    assert!(problems.iter().any(|p| p.source.ends_with("connectors.toml")) && problems.iter().any(|p| p.source.ends_with("tools.toml")));

    // Any edit to an action is a new tool version.
    let good = load(TOOLS, &connectors_toml(addr), &["TEST_CONNECTOR_KEY"]).expect("valid");
    let edited = load(TOOLS, &connectors_toml(addr).replace("keep = [\"id\", ", "keep = ["), &["TEST_CONNECTOR_KEY"]).expect("valid");
    assert_ne!(good.get("lookup_order").expect("tool").version, edited.get("lookup_order").expect("tool").version);
    assert_eq!(good.get("refund").expect("tool").version, edited.get("refund").expect("tool").version);
}

/// A tool's secret field is filled from the environment by the checkpoint; templated into a URL
/// it would reach access logs and error messages, so the files do not load.
#[test]
fn secret_fields_cannot_be_templated_into_urls() {
    let tools = r#"
[[tool]]
name = "fetch_doc"
title = "Fetch a document"
description = "Reads a document."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
secret_fields = { api_key = "DOCS_KEY" }
input_schema = { type = "object", properties = { doc = { type = "string" }, api_key = { type = "string" } } }
"#;
    let connector = |action: &str| format!("[[connector]]\nid = \"docs\"\nbase_url = \"https://docs.example.com/v1\"\nallowed_urls = [\"https://docs.example.com/v1/**\"]\n\n[[connector.action]]\ntool = \"fetch_doc\"\nmethod = \"GET\"\n{action}\n");
    for (action, field) in [("path = \"docs/{doc}/{api_key}\"", "path"), ("path = \"docs/{doc}\"\nquery = { key = \"{api_key}\" }", "query.key")] {
        let problems = load(tools, &connector(action), &["DOCS_KEY"]).expect_err("refused");
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(
            shown.iter().any(|p| p.contains(&format!("action[0] (fetch_doc).{field}: {{api_key}} is a secret field")) && p.contains(connectors::ConnectorCode::SecretInUrl.as_str())),
            "{shown:#?}"
        );
    }
    // In a header it is fine: headers are sent marked sensitive and never logged.
    load(tools, &connector("path = \"docs/{doc}\"\nheaders = { \"X-Key\" = \"{api_key}\" }"), &["DOCS_KEY"]).expect("a header may carry it");
}

/// File references a connector returned reach it again exactly as returned when given back as
/// arguments, in a path segment, a query value or the body: no trimming, normalisation or
/// re-encoding on the way. A value HTTP itself would change (surrounding spaces in a header) is
/// refused, never altered, and so is a path value that is a dot step once decoded ("%2e%2e").
async fn file_references_pass_through_byte_for_byte(db: TestDb) {
    const REFS: [&str; 10] = [
        "files/2024/report final.pdf",
        "  padded reference  ",
        "%41%2F%42",
        "a%2Fb%20c",
        "x+y=z&w?q#frag",
        "ünïcødé ✓.txt",
        "back\\slash;semi,comma",
        "tab\there",
        ".hidden",
        "trailing.",
    ];
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let received: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let seen = received.clone();
    let app = Router::new()
        .route("/api/files", get(|| async { Json(json!({ "files": REFS })) }))
        .route(
            "/api/files/{reference}",
            post(move |Path(reference): Path<String>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>, Json(body): Json<Value>| {
                let seen = seen.clone();
                async move {
                    let from_body = body["ref"].as_str().unwrap_or_default().to_string();
                    seen.lock().expect("lock").push((reference, q.get("ref").cloned().unwrap_or_default(), from_body));
                    Json(json!({ "ok": true }))
                }
            }),
        )
        .route("/api/by-header", get(|headers: HeaderMap| async move { Json(json!({ "ref": headers.get("x-file").and_then(|v| v.to_str().ok()) })) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });

    let tools = r#"
[[tool]]
name = "list_files"
title = "List files"
description = "Lists file references."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object" }

[[tool]]
name = "open_file"
title = "Open a file"
description = "Opens a file by reference."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", required = ["file"], properties = { file = { type = "string" } } }

[[tool]]
name = "file_by_header"
title = "File by header"
description = "Sends the reference in a header."
provider = "connector"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object", required = ["file"], properties = { file = { type = "string" } } }
"#;
    let connectors = format!(
        r#"
[[connector]]
id = "files"
base_url = "http://{addr}/api"
allowed_urls = ["http://{addr}/api/files", "http://{addr}/api/files/*", "http://{addr}/api/by-header"]

[[connector.action]]
tool = "list_files"
method = "GET"
path = "files"

[[connector.action]]
tool = "open_file"
method = "POST"
path = "files/{{file}}"
query = {{ ref = "{{file}}" }}
body = {{ ref = "{{file}}" }}

[[connector.action]]
tool = "file_by_header"
method = "GET"
path = "by-header"
headers = {{ "X-File" = "{{file}}" }}
"#
    );
    let catalog = load(tools, &connectors, &[]).expect("valid");
    let mut cp = Checkpoint::new(pool.clone(), Arc::new(catalog), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool.clone())), secrets());
    cp.register_provider(Provider::Connector, Arc::new(ConnectorExecutor::new(secrets()).expect("client")));
    let customer = ctx(Role::Customer);

    let listed = cp.execute(call("list_files", json!({})), &customer).await.expect("list");
    let returned: Vec<String> = listed.output["data"]["files"].as_array().expect("files").iter().map(|v| v.as_str().expect("text").to_string()).collect();
    assert_eq!(returned, REFS, "returned as the connector sent them");
    for reference in &returned {
        cp.execute(call("open_file", json!({ "file": reference })), &customer).await.unwrap_or_else(|e| panic!("{reference:?}: {e}"));
        let (path, query, body) = received.lock().expect("lock").pop().expect("the connector was reached");
        assert_eq!((path.as_str(), query.as_str(), body.as_str()), (reference.as_str(), reference.as_str(), reference.as_str()), "{reference:?}");
    }
    let plain = cp.execute(call("file_by_header", json!({ "file": REFS[0] })), &customer).await.expect("header");
    assert_eq!(plain.output["data"]["ref"], REFS[0]);
    let padded = cp.execute(call("file_by_header", json!({ "file": REFS[1] })), &customer).await.expect_err("HTTP would trim it");
    assert_eq!(padded.code, connectors::ConnectorCode::ParamInvalid.as_str(), "{padded}");
}
both_backends!(connector_file_references, file_references_pass_through_byte_for_byte);
