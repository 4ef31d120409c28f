//! OpenTelemetry export end to end: one WhatsApp message through the tool lane (the fake
//! planner and summarizer of `lane_e2e`, a real connector to the fake shop) reaches a local
//! OTLP/HTTP receiver, which decodes what arrives with the OTLP protobuf types: one trace for
//! the message, its lane stages, model calls (GenAI attributes) and the tool.call job as spans
//! of that trace, metrics beside it, and the message's text, the reply and the tool's arguments
//! nowhere in the bytes. A slow job, and a job run later by `gatehouse worker` in another
//! process, join the same trace. With `otlp_endpoint` unset (or unusable) nothing is sent.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::header, response::IntoResponse, routing::post};
use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{AnyValue, KeyValue, any_value},
    trace::v1::Span,
};
use prost::Message;

use crate::{
    both_backends,
    lane::{PLANNER_MODEL, SUMMARIZER_MODEL},
    lane_e2e::{CUSTOMER, rig},
    support::TestDb,
};

/// What the person writes: none of it may leave in telemetry.
const TEXT: &str = "Where is my order 4821? Zebulon here";

/// A local OTLP/HTTP receiver that keeps every request body it gets.
#[derive(Clone, Default)]
struct Receiver {
    traces: Arc<Mutex<Vec<Bytes>>>,
    metrics: Arc<Mutex<Vec<Bytes>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let ok = || ([(header::CONTENT_TYPE, "application/x-protobuf")], Bytes::new());
        let router = Router::new()
            .route(
                "/v1/traces",
                post(move |State(r): State<Receiver>, body: Bytes| async move {
                    r.traces.lock().expect("lock").push(body);
                    ok().into_response()
                }),
            )
            .route(
                "/v1/metrics",
                post(move |State(r): State<Receiver>, body: Bytes| async move {
                    r.metrics.lock().expect("lock").push(body);
                    ok().into_response()
                }),
            )
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        (receiver, format!("http://{addr}"))
    }

    fn spans(&self) -> Vec<(HashMap<String, String>, Span)> {
        let mut out = Vec::new();
        for body in self.traces.lock().expect("lock").iter() {
            let request = ExportTraceServiceRequest::decode(body.as_ref()).expect("an OTLP trace export");
            for rs in request.resource_spans {
                let resource = rs.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
                for ss in rs.scope_spans {
                    out.extend(ss.spans.into_iter().map(|s| (resource.clone(), s)));
                }
            }
        }
        out
    }

    fn metric_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for body in self.metrics.lock().expect("lock").iter() {
            let request = ExportMetricsServiceRequest::decode(body.as_ref()).expect("an OTLP metrics export");
            for rm in request.resource_metrics {
                for sm in rm.scope_metrics {
                    out.extend(sm.metrics.into_iter().map(|m| m.name));
                }
            }
        }
        out
    }

    fn all_bytes(&self) -> Vec<u8> {
        let traces = self.traces.lock().expect("lock");
        let metrics = self.metrics.lock().expect("lock");
        traces.iter().chain(metrics.iter()).flat_map(|b| b.to_vec()).collect()
    }
}

fn text_of(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().map(|v| text_of(&Some(v.clone()))).collect::<Vec<_>>().join(","),
        _ => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text_of(&kv.value))).collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).map(|kv| text_of(&kv.value))
}

async fn one_message_is_one_trace_without_its_text(db: TestDb) {
    let (otlp, endpoint) = Receiver::start().await;
    let rig = rig(db, move |s| {
        s.telemetry.otlp_endpoint = endpoint;
        s.telemetry.service_name = "gatehouse-test".into();
        s.telemetry.export_interval = Duration::from_millis(200);
        // The trace keeps the text on record: the export still never carries it.
        s.conversation.trace_text = true;
    })
    .await;
    assert!(rig.app.gatehouse.telemetry.is_enabled());
    rig.exchange(&[("wamid.otel-1", TEXT)], 1).await;
    let reply = rig.graph.texts().join("\n");
    assert!(reply.contains("Parcel Co"), "the customer got the summary: {reply}");
    rig.app.gatehouse.telemetry.shutdown().await;

    let spans = otlp.spans();
    assert!(!spans.is_empty(), "spans arrived");
    assert!(spans.iter().all(|(resource, _)| resource.get("service.name").map(String::as_str) == Some("gatehouse-test")), "the service name is the resource's");
    // One message span, the root of the message's trace.
    let roots: Vec<&Span> = spans.iter().map(|(_, s)| s).filter(|s| attr(s, "gatehouse.route").is_some()).collect();
    assert_eq!(roots.len(), 1, "one message span: {:?}", roots.iter().map(|s| &s.name).collect::<Vec<_>>());
    let root = roots[0];
    assert!(root.parent_span_id.is_empty(), "the message span is the root");
    assert_eq!(attr(root, "gatehouse.outcome").as_deref(), Some("replied"));
    let in_trace: Vec<&Span> = spans.iter().map(|(_, s)| s).filter(|s| s.trace_id == root.trace_id).collect();

    // The lane's stages: children of the message, with their reason codes.
    let stages: Vec<&Span> = in_trace.iter().copied().filter(|s| attr(s, "gatehouse.step").is_some()).collect();
    assert!(stages.iter().all(|s| s.parent_span_id == root.span_id), "steps are the message's children");
    for stage in ["AgentToolPlannerResult", "AgentToolJobEnqueued", "AgentToolExecutionSucceeded"] {
        let span = stages.iter().find(|s| s.name == stage).unwrap_or_else(|| panic!("a {stage} span among {:?}", stages.iter().map(|s| &s.name).collect::<Vec<_>>()));
        assert!(attr(span, "gatehouse.reason_code").is_some_and(|c| !c.is_empty()));
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano >= root.start_time_unix_nano);
    }

    // The tool call: the tool.call job's run, in the message's trace, under the message.
    let tool = in_trace.iter().find(|s| attr(s, "gatehouse.job.kind").as_deref() == Some("tool.call")).expect("the tool.call job's span joins the message's trace");
    assert_eq!(tool.name, "execute_tool order_status");
    assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("order_status"));
    assert_eq!(attr(tool, "gatehouse.job.outcome").as_deref(), Some("completed"));
    assert_eq!(tool.parent_span_id, root.span_id);
    // The job that handled the WhatsApp message is in the same trace too.
    assert!(in_trace.iter().any(|s| attr(s, "gatehouse.job.kind").as_deref() == Some("whatsapp.inbound")));

    // Model calls, with the GenAI semantic conventions.
    let model = |m: &str| in_trace.iter().copied().find(|s| attr(s, "gen_ai.request.model").as_deref() == Some(m)).unwrap_or_else(|| panic!("a span for {m}"));
    let planner = model(PLANNER_MODEL);
    assert_eq!(planner.name, format!("chat {PLANNER_MODEL}"));
    assert_eq!(attr(planner, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(attr(planner, "gen_ai.provider.name").as_deref(), Some("anthropic"));
    assert_eq!(attr(planner, "gen_ai.system").as_deref(), Some("anthropic"));
    assert_eq!(attr(planner, "gen_ai.usage.input_tokens").as_deref(), Some("20"));
    assert_eq!(attr(planner, "gen_ai.usage.output_tokens").as_deref(), Some("5"));
    assert_eq!(attr(planner, "gen_ai.response.finish_reasons").as_deref(), Some("tool_use"));
    let summarizer = model(SUMMARIZER_MODEL);
    assert_eq!(summarizer.parent_span_id, tool.span_id, "the summary was made by the tool call's run");

    // Every span is the message's, or a job's made for no message (a root of its own).
    for (_, s) in &spans {
        assert!(s.trace_id == root.trace_id || (s.parent_span_id.is_empty() && s.name.starts_with("job ")), "{} is outside the message's trace", s.name);
    }

    // Metrics over OTLP/HTTP too.
    let names = otlp.metric_names();
    for metric in ["gatehouse.messages", "gatehouse.tool_calls", "gatehouse.model.tokens", "gatehouse.jobs.queue_depth"] {
        assert!(names.iter().any(|n| n == metric), "{metric} among {names:?}");
    }

    // Nothing the person wrote, nothing they were told, no tool arguments, no phone number.
    let bytes = otlp.all_bytes();
    let sent = String::from_utf8_lossy(&bytes);
    for secret in ["Where is my order", "Zebulon", "4821", "Parcel Co", "track.example", "order_id", CUSTOMER, "test-llm-key"] {
        assert!(!sent.contains(secret), "{secret:?} was exported");
    }
}
both_backends!(otel_export_of_one_message, one_message_is_one_trace_without_its_text);

/// A tool slower than the lane waits: the message's trace is written (with "it is underway")
/// before the job ends, and the job's span still lands in it, with the later summary under it.
async fn a_slow_jobs_span_joins_its_messages_trace(db: TestDb) {
    let (otlp, endpoint) = Receiver::start().await;
    let rig = rig(db, move |s| {
        s.telemetry.otlp_endpoint = endpoint;
        s.lane.immediate_deadline = Duration::from_millis(500);
    })
    .await;
    *rig.shop.slow.lock().expect("lock") = Duration::from_secs(2);
    rig.exchange(&[("wamid.otel-slow", "Where is my order slow-7?")], 2).await;
    rig.app.gatehouse.telemetry.shutdown().await;

    let spans: Vec<Span> = otlp.spans().into_iter().map(|(_, s)| s).collect();
    let root = spans.iter().find(|s| attr(s, "gatehouse.route").is_some()).expect("the message span");
    let timeout = spans.iter().find(|s| s.trace_id == root.trace_id && s.name == "AgentToolImmediateTimeout").expect("the lane stopped waiting");
    let tool = spans.iter().find(|s| attr(s, "gatehouse.job.kind").as_deref() == Some("tool.call")).expect("the slow job's span");
    assert_eq!(tool.trace_id, root.trace_id, "the slow job joins its message's trace");
    assert_eq!(tool.parent_span_id, root.span_id);
    assert!(tool.end_time_unix_nano > root.end_time_unix_nano, "it ended after the message's trace was written");
    assert!(tool.end_time_unix_nano > timeout.end_time_unix_nano);
    let summary = spans.iter().find(|s| attr(s, "gen_ai.request.model").as_deref() == Some(SUMMARIZER_MODEL)).expect("the later summary");
    assert_eq!((summary.trace_id.as_slice(), summary.parent_span_id.as_slice()), (root.trace_id.as_slice(), tool.span_id.as_slice()));
    // Steps the trace gained after its export (the later answer, the sends of both replies)
    // are in it too, under the message, each once.
    let steps: Vec<&Span> = spans.iter().filter(|s| s.trace_id == root.trace_id && attr(s, "gatehouse.step").is_some()).collect();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    let later = steps.iter().find(|s| attr(s, "gatehouse.decision").as_deref() == Some("later")).unwrap_or_else(|| panic!("the later answer's step among {names:?}"));
    assert_eq!(later.parent_span_id, root.span_id);
    assert!(later.end_time_unix_nano >= tool.start_time_unix_nano, "timed when it was written");
    assert!(names.contains(&"delivery") && names.contains(&"later_delivery"), "the acknowledgement's send and the answer's: {names:?}");
    let mut ids: Vec<&[u8]> = steps.iter().map(|s| s.span_id.as_slice()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), steps.len(), "no step exported twice: {names:?}");
}
both_backends!(otel_slow_job_joins_trace, a_slow_jobs_span_joins_its_messages_trace);

/// The message is handled here, its tool call is left to a worker, and `gatehouse worker` (the
/// real binary, another process on the same database) runs it later: the job's span and the
/// summary's model call land in the message's trace, and they are sent before that process
/// exits on SIGTERM.
async fn a_job_run_by_another_process_joins_its_messages_trace(db: TestDb) {
    let (otlp, endpoint) = Receiver::start().await;
    let tools = crate::lane_e2e::TOOLS.replacen("timeout = \"20s\"\n", "timeout = \"20s\"\nasync_policy = \"required\"\n", 1);
    assert_ne!(tools, crate::lane_e2e::TOOLS, "order_status always runs as a job");
    let here = endpoint.clone();
    let rig = crate::lane_e2e::rig_with(db, &tools, "", move |s| {
        s.telemetry.otlp_endpoint = here;
        s.telemetry.service_name = "gatehouse-test".into();
    })
    .await;
    let message = server::channel::simulator::SimMessage { from: "+15550109999".into(), text: TEXT.into(), ..Default::default() };
    let outcome = rig.app.gatehouse.simulator.send(message).await.expect("simulate");
    assert_eq!(outcome.handled.reply.as_deref(), Some(rig.app.state.config.settings.lane.pending_reply.as_str()), "the person is told it is underway");
    rig.app.gatehouse.telemetry.shutdown().await;

    let settings = &rig.app.state.config.settings;
    let config = rig.dir.path().join("gatehouse.toml");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gatehouse.toml"), &config).expect("config");
    let worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .arg("--config")
        .arg(&config)
        .arg("worker")
        .env("GATEHOUSE__DATABASE__URL", &rig.app.db.url)
        .env("GATEHOUSE__LLM__ANTHROPIC__BASE_URL", &settings.llm.anthropic.base_url)
        .env("GATEHOUSE__LLM__MAX_RETRIES", "0")
        .env("GATEHOUSE__MODELS__CHAT", &settings.models.chat)
        .env("GATEHOUSE__MODELS__PLANNER", PLANNER_MODEL)
        .env("GATEHOUSE__MODELS__SUMMARIZER", SUMMARIZER_MODEL)
        .env("GATEHOUSE__JOBS__POLL_INTERVAL", "100ms")
        .env("GATEHOUSE__TELEMETRY__OTLP_ENDPOINT", &endpoint)
        .env("GATEHOUSE__TELEMETRY__SERVICE_NAME", "gatehouse-test")
        .env("ANTHROPIC_API_KEY", "test-llm-key")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gatehouse worker");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE kind = 'tool.call' AND state = 'completed'").fetch_one(&rig.app.state.db.pool).await.expect("jobs");
        if done == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the worker process did not run the tool call");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = worker.id().expect("running").to_string();
    let signalled = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill");
    assert!(signalled.success());
    let out = tokio::time::timeout(Duration::from_secs(30), worker.wait_with_output()).await.expect("the worker stops on SIGTERM").expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the worker exited cleanly: {stderr}");

    let spans: Vec<Span> = otlp.spans().into_iter().map(|(_, s)| s).collect();
    let root = spans.iter().find(|s| attr(s, "gatehouse.route").is_some()).expect("the message span, from this process");
    assert!(spans.iter().any(|s| s.trace_id == root.trace_id && s.name == "AgentToolImmediateStart"), "the lane left the call to a worker");
    let tool = spans.iter().find(|s| s.name == "execute_tool order_status").unwrap_or_else(|| panic!("the worker process sent the job's span; its log: {stderr}"));
    assert_eq!(tool.trace_id, root.trace_id, "the job run by another process joins its message's trace");
    assert_eq!(tool.parent_span_id, root.span_id);
    let summary = spans.iter().find(|s| attr(s, "gen_ai.request.model").as_deref() == Some(SUMMARIZER_MODEL)).expect("the summary's model call");
    assert_eq!((summary.trace_id.as_slice(), summary.parent_span_id.as_slice()), (root.trace_id.as_slice(), tool.span_id.as_slice()));
    let sent = String::from_utf8_lossy(&otlp.all_bytes()).into_owned();
    for secret in ["Where is my order", "Zebulon", "4821", "Parcel Co"] {
        assert!(!sent.contains(secret), "{secret:?} was exported");
    }
}
both_backends!(otel_job_in_another_process, a_job_run_by_another_process_joins_its_messages_trace);

/// An owner's approval request from the console has a trace of its own: it is exported too,
/// without the call's arguments.
async fn a_console_approval_request_is_a_trace_too(db: TestDb) {
    let (otlp, endpoint) = Receiver::start().await;
    let rig = rig(db, move |s| s.telemetry.otlp_endpoint = endpoint).await;
    let who = server::approvals::Requester {
        actor: server::domain::Role::Owner,
        channel: server::approvals::CONSOLE.into(),
        chat_kind: server::domain::ChatKind::Direct,
        chat_id: "console".into(),
        sender: "owner:1".into(),
        message_id: "console-otel".into(),
        request: "refund for Zebulon".into(),
        correlation_id: "corr-otel".into(),
    };
    let call = server::tools::ToolCall { name: "refund_order".into(), args: serde_json::json!({ "order_id": "4821", "email": "zebulon@example.com" }) };
    let requested = rig.app.gatehouse.approvals.request(&call, &who, None, None).await.expect("request");
    rig.app.gatehouse.telemetry.shutdown().await;
    let spans: Vec<Span> = otlp.spans().into_iter().map(|(_, s)| s).collect();
    let root = spans.iter().find(|s| attr(s, "gatehouse.route").as_deref() == Some("approval")).expect("the request's trace");
    assert_eq!(attr(root, "gatehouse.trace.id"), requested.trace_id.map(|id| id.to_string()));
    assert!(spans.iter().any(|s| s.trace_id == root.trace_id && s.name == "ApprovalRequested" && s.parent_span_id == root.span_id));
    let sent = String::from_utf8_lossy(&otlp.all_bytes()).into_owned();
    for secret in ["4821", "zebulon", "Zebulon", "refund for"] {
        assert!(!sent.contains(secret), "{secret:?} was exported");
    }
}
both_backends!(otel_console_approval, a_console_approval_request_is_a_trace_too);

async fn nothing_is_exported_without_an_endpoint(db: TestDb) {
    let (otlp, endpoint) = Receiver::start().await;
    // No endpoint: the export is off.
    let rig = rig(db, |s| s.telemetry.export_interval = Duration::from_millis(50)).await;
    assert!(!rig.app.gatehouse.telemetry.is_enabled());
    rig.exchange(&[("wamid.otel-off", TEXT)], 1).await;
    rig.app.gatehouse.telemetry.shutdown().await;
    // An endpoint whose headers secret is not set: the export stays off rather than sending
    // without the credentials it was configured with.
    let second = crate::support::TestDb::sqlite();
    let unusable = crate::lane_e2e::rig(second, move |s| {
        s.telemetry.otlp_endpoint = endpoint;
        s.telemetry.headers_secret = "GATEHOUSE_TEST_OTLP_HEADERS_UNSET".into();
        s.telemetry.export_interval = Duration::from_millis(50);
    })
    .await;
    assert!(!unusable.app.gatehouse.telemetry.is_enabled());
    unusable.exchange(&[("wamid.otel-unusable", TEXT)], 1).await;
    unusable.app.gatehouse.telemetry.shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(otlp.traces.lock().expect("lock").is_empty() && otlp.metrics.lock().expect("lock").is_empty(), "nothing was sent");
}
both_backends!(otel_off_without_endpoint, nothing_is_exported_without_an_endpoint);
