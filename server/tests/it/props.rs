//! Property tests, with bounded case counts so they run in seconds: the WhatsApp webhook parser
//! (never panics, round-trips what Meta sends), the checkpoint's argument validation (a call
//! that breaks the schema never reaches an executor) and the connector URL builder (no argument
//! changes the scheme, host or path prefix, and every argument arrives as itself).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use proptest::{prelude::*, test_runner::Config};
use serde_json::{Map, Value, json};
use server::{
    channel::whatsapp::payload,
    tools::{
        CallContext, Catalog, Checkpoint, ToolCall, ToolDef, ToolError, ToolExecutor,
        checkpoint::{AuditWriter, ToolCode},
        connectors::{self, ActionSpec, ConnectorAction, Method},
    },
};
use server::domain::{ChatKind, Role};

use crate::support::TestDb;

fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[a-z_]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,10}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON shaped like a webhook, with arbitrary values where Meta's fields go.
fn webhook_like() -> impl Strategy<Value = Value> {
    let message = prop::collection::btree_map(
        prop_oneof![Just("from".to_string()), Just("id".into()), Just("timestamp".into()), Just("type".into()), Just("text".into()), Just("interactive".into()), Just("button".into()), Just("context".into()), Just("group_id".into())],
        any_json(),
        0..8,
    );
    (prop::collection::vec(message, 0..4), prop::collection::vec(any_json(), 0..3), any_json()).prop_map(|(messages, statuses, metadata)| {
        let messages: Vec<Value> = messages.into_iter().map(|m| Value::Object(m.into_iter().collect())).collect();
        json!({ "object": "whatsapp_business_account", "entry": [{ "changes": [{ "field": "messages", "value": { "metadata": metadata, "messages": messages, "statuses": statuses } }] }] })
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_webhook_parser_never_panics_on_bytes(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = payload::parse(&body, 4096, 0);
    }

    #[test]
    fn the_webhook_parser_never_panics_on_json(value in prop_oneof![any_json(), webhook_like()], raw_max in 0usize..512) {
        if let Ok(batch) = payload::parse(value.to_string().as_bytes(), raw_max, 7) {
            for m in &batch.messages {
                prop_assert!(!m.wamid.is_empty() && !m.sender.is_empty());
                prop_assert_eq!(m.raw.is_some(), !m.raw_truncated);
            }
        }
    }
}

/// A message as Meta sends it, with what the parser must make of it.
#[derive(Debug, Clone)]
struct Sent {
    json: Value,
    wamid: String,
    from: String,
    msg_type: &'static str,
    text: Option<String>,
    reply_id: Option<String>,
    group: Option<String>,
    context: Option<String>,
    sent_at: i64,
}

fn sent_message() -> impl Strategy<Value = Sent> {
    let kind = prop_oneof![Just("text"), Just("button_reply"), Just("list_reply"), Just("button"), Just("sticker")];
    ("[0-9]{6,15}", "wamid\\.[A-Za-z0-9=_-]{4,40}", 0i64..4_000_000_000, kind, any::<String>(), "[a-z0-9-]{1,20}", proptest::option::of("[0-9]{5,20}-?[0-9]{0,5}"), proptest::option::of("wamid\\.[A-Za-z0-9]{4,20}"))
        .prop_map(|(from, wamid, ts, kind, text, choice, group, context)| {
            let mut json = json!({ "from": from, "id": wamid, "timestamp": ts.to_string() });
            let (msg_type, body, reply_id) = match kind {
                "text" => {
                    json["type"] = json!("text");
                    json["text"] = json!({ "body": text });
                    ("text", Some(text), None)
                }
                "button_reply" | "list_reply" => {
                    json["type"] = json!("interactive");
                    let mut interactive = Map::new();
                    interactive.insert("type".into(), json!(kind));
                    interactive.insert(kind.into(), json!({ "id": choice, "title": text }));
                    json["interactive"] = Value::Object(interactive);
                    (if kind == "button_reply" { "interactive.button_reply" } else { "interactive.list_reply" }, Some(text), Some(choice))
                }
                "button" => {
                    json["type"] = json!("button");
                    json["button"] = json!({ "text": text, "payload": choice });
                    ("button", Some(text), Some(choice))
                }
                _ => {
                    json["type"] = json!("sticker");
                    json["sticker"] = json!({ "id": choice });
                    ("sticker", None, None)
                }
            };
            if let Some(g) = &group {
                json["group_id"] = json!(g);
            }
            if let Some(c) = &context {
                json["context"] = json!({ "from": "1", "id": c });
            }
            Sent { json, wamid, from, msg_type, text: body, reply_id, group, context, sent_at: ts * 1000 }
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn valid_payloads_round_trip(messages in prop::collection::vec(sent_message(), 1..6), phone in "[0-9]{6,16}") {
        let body = json!({ "object": "whatsapp_business_account", "entry": [{ "id": "1", "changes": [{ "field": "messages", "value": {
            "messaging_product": "whatsapp", "metadata": { "phone_number_id": phone, "display_phone_number": "15550001111" },
            "messages": messages.iter().map(|m| m.json.clone()).collect::<Vec<_>>() } }] }] });
        let batch = payload::parse(body.to_string().as_bytes(), 1 << 20, 0).expect("a valid payload parses");
        prop_assert_eq!(batch.skipped, 0);
        prop_assert_eq!(batch.messages.len(), messages.len());
        for (got, sent) in batch.messages.iter().zip(&messages) {
            prop_assert_eq!(&got.wamid, &sent.wamid);
            prop_assert_eq!(&got.sender, &sent.from);
            prop_assert_eq!(&got.phone_number_id, &phone);
            prop_assert_eq!(got.msg_type.as_str(), sent.msg_type);
            prop_assert_eq!(&got.text, &sent.text);
            prop_assert_eq!(&got.reply_id, &sent.reply_id);
            prop_assert_eq!(&got.context_id, &sent.context);
            prop_assert_eq!(got.is_group, sent.group.is_some());
            prop_assert_eq!(&got.chat_id, sent.group.as_ref().unwrap_or(&sent.from));
            prop_assert_eq!(got.sent_at, sent.sent_at);
            let raw: Value = serde_json::from_str(got.raw.as_deref().expect("kept")).expect("raw is JSON");
            prop_assert_eq!(&raw, &sent.json);
        }
    }
}

/// Records every call that reaches it.
#[derive(Default)]
struct Recorder(Mutex<Vec<Value>>);

#[async_trait::async_trait]
impl ToolExecutor for Recorder {
    async fn call(&self, _tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        self.0.lock().expect("calls").push(args.clone());
        Ok(json!({ "ok": true }))
    }
}

const SCHEMA_TOOL: &str = r#"
[[tool]]
name = "book_table"
title = "Book a table"
description = "Books a table."
provider = "builtin"
handler = "recorder"
operation = "read"
audience = "public"
risk = "low"
[tool.input_schema]
type = "object"
additionalProperties = false
required = ["name", "guests"]
[tool.input_schema.properties]
name = { type = "string", minLength = 1, maxLength = 12 }
guests = { type = "integer", minimum = 1, maximum = 8 }
time = { type = "string", enum = ["lunch", "dinner"] }
notes = { type = "array", items = { type = "string" }, maxItems = 2 }
contact = { type = "object", required = ["phone"], properties = { phone = { type = "string", pattern = "^[0-9]{6,12}$" } } }
"#;

/// Valid arguments for `book_table`, then 0 to 2 edits (a field removed, or set to a value of
/// any type, including fields the schema does not have): about half the cases stay valid.
fn near_schema_args() -> impl Strategy<Value = Value> {
    let valid = ("[a-z]{1,12}", 1i64..=8, proptest::option::of(prop_oneof![Just("lunch"), Just("dinner")]), proptest::option::of(prop::collection::vec("[a-z]{0,3}", 0..=2)), proptest::option::of("[0-9]{6,12}"))
        .prop_map(|(name, guests, time, notes, phone)| {
            let mut m = Map::new();
            m.insert("name".into(), json!(name));
            m.insert("guests".into(), json!(guests));
            if let Some(t) = time {
                m.insert("time".into(), json!(t));
            }
            if let Some(n) = notes {
                m.insert("notes".into(), json!(n));
            }
            if let Some(p) = phone {
                m.insert("contact".into(), json!({ "phone": p }));
            }
            m
        });
    let key = prop_oneof![Just("name"), Just("guests"), Just("time"), Just("notes"), Just("contact"), Just("extra"), Just("")];
    let value = prop_oneof![
        any_json(),
        "[a-z]{0,14}".prop_map(Value::String),
        (-2i64..12).prop_map(Value::from),
        prop_oneof![Just(json!("lunch")), Just(json!("dinner")), Just(json!("brunch"))],
        prop::collection::vec("[a-z]{0,3}".prop_map(Value::String), 0..4).prop_map(Value::Array),
        "[0-9]{4,14}".prop_map(|p| json!({ "phone": p })),
    ];
    let edit = (key, proptest::option::of(value));
    let edited = (valid, prop::collection::vec(edit, 0..3)).prop_map(|(mut m, edits)| {
        for (k, v) in edits {
            match v {
                Some(v) => m.insert(k.to_string(), v),
                None => m.remove(k),
            };
        }
        Value::Object(m)
    });
    prop_oneof![1 => any_json(), 4 => edited]
}

#[test]
fn schema_violating_calls_never_reach_the_executor() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tools.toml"), SCHEMA_TOOL).expect("write");
    let catalog = Catalog::load(&dir.path().join("tools.toml"), &|_| false).expect("valid catalog");
    let schema = catalog.get("book_table").expect("tool").spec.input_schema.clone();
    let independent = jsonschema::validator_for(&schema).expect("schema compiles");
    let recorder = Arc::new(Recorder::default());
    let checkpoint = rt.block_on(async {
        let pool = db.connect().await;
        pool.migrate().await.expect("migrate");
        let mut cp = Checkpoint::new(pool.clone(), Arc::new(catalog), AuditWriter::spawn(pool.clone(), server::jobs::JobQueue::new(pool)), server::config::SecretSource::empty());
        cp.register_builtin("recorder", recorder.clone());
        cp
    });
    let ctx = CallContext { actor: Role::Owner, chat_type: ChatKind::Direct, chat_id: None, sender_id: None, correlation_id: "props".into(), approved: None, trace_id: None };
    let (valid, invalid) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    proptest!(config(512), |(args in near_schema_args())| {
        let before = recorder.0.lock().expect("calls").len();
        let result = rt.block_on(checkpoint.execute(ToolCall { name: "book_table".into(), args: args.clone() }, &ctx));
        let reached = recorder.0.lock().expect("calls").len() > before;
        if independent.is_valid(&args) {
            valid.set(valid.get() + 1);
            prop_assert!(reached && result.is_ok(), "valid {args} must run: {result:?}");
        } else {
            invalid.set(invalid.get() + 1);
            prop_assert!(!reached, "{args} breaks the schema and reached the executor");
            prop_assert_eq!(result.expect_err("refused").code, ToolCode::SchemaInvalid.as_str());
        }
    });
    let (valid, invalid) = (valid.get(), invalid.get());
    assert!(valid > 10 && invalid > 10, "both kinds were generated: {valid} valid, {invalid} invalid");
}

fn shop_action() -> ConnectorAction {
    ConnectorAction::new(
        "shop".into(),
        "https://shop.example.com/api/v2/".into(),
        vec!["https://shop.example.com/api/v2/**".into()],
        BTreeMap::new(),
        ActionSpec {
            tool: "t".into(),
            method: Method::Get,
            path: "orders/{id}/items/{item}".into(),
            query: BTreeMap::from([("q".into(), "{q}".into()), ("page".into(), "p{page}".into())]),
            headers: BTreeMap::new(),
            body: None,
            keep: vec![],
        },
    )
    .expect("valid patterns")
}

/// Text built to break URLs: separators, dot segments, encodings, authority and scheme pieces.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[./?#%@:\\\\ +&=;a-z0-9]{0,12}",
        prop::collection::vec(prop_oneof![Just("..".to_string()), Just(".".into()), Just("%2e".into()), Just("%2F".into()), Just("//evil.example".into()), Just("@evil.example".into()), Just("http://x".into()), Just("\\".into()), Just("?".into()), Just("#".into()), Just(" ".into())], 0..5).prop_map(|parts| parts.concat()),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn no_argument_changes_the_connector_url_outside_its_values(id in hostile_text(), item in hostile_text(), q in hostile_text(), page in hostile_text()) {
        let args: Map<String, Value> = [("id", &id), ("item", &item), ("q", &q), ("page", &page)].into_iter().map(|(k, v)| (k.to_string(), Value::String(v.clone()))).collect();
        let no_secrets = server::config::SecretSource::empty();
        match connectors::build_url(&shop_action(), &args, &no_secrets) {
            Ok(url) => {
                prop_assert_eq!(url.scheme(), "https");
                prop_assert_eq!(url.host_str(), Some("shop.example.com"));
                prop_assert_eq!(url.port(), None);
                prop_assert!(url.username().is_empty() && url.password().is_none() && url.fragment().is_none());
                let segments: Vec<&str> = url.path_segments().expect("segments").collect();
                prop_assert_eq!(segments.len(), 6, "{}", url);
                prop_assert_eq!(&segments[..3], &["api", "v2", "orders"][..]);
                prop_assert_eq!(segments[4], "items");
                // Each value arrives as itself, byte for byte.
                prop_assert_eq!(connectors::percent_decode(segments[3]), id.clone());
                prop_assert_eq!(connectors::percent_decode(segments[5]), item.clone());
                prop_assert!(!connectors::walks_up(&id) && !connectors::walks_up(&item), "a dot step went out: {}", url);
                let query: BTreeMap<String, String> = url.query_pairs().into_owned().collect();
                prop_assert_eq!(query, BTreeMap::from([("q".to_string(), q), ("page".to_string(), format!("p{page}"))]));
            }
            Err(e) => {
                // Only an empty value, or one that is a dot step for a server that decodes it.
                let dot = |s: &str| s.is_empty() || connectors::walks_up(s);
                prop_assert!(dot(&id) || dot(&item), "refused {:?} / {:?}: {}", id, item, e);
                prop_assert_eq!(e.code, connectors::ConnectorCode::UnsupportedUrl.as_str());
            }
        }
    }
}
