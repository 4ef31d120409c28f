//! The OpenTelemetry pipeline: spans and metrics pushed over OTLP/HTTP (protobuf, through
//! reqwest). Everything exported is made from a record Gatehouse wrote (see [`super::spans`]);
//! callers hand over a fact and never wait for the network: facts go through a bounded queue to
//! one export task, and a full queue drops them (logged), so a slow receiver never slows a reply.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, MeterProvider as _},
};
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    Resource,
    metrics::{ManualReader, SdkMeterProvider, Temporality},
    trace::{SpanData, SpanExporter as _},
};
use tokio::sync::{mpsc, oneshot};

use super::{
    metrics::{MetricsPush, SharedReader, export_metrics},
    spans::{self, Parent},
};
use crate::config::{SecretSource, TelemetrySettings};
use crate::db::{self, Db, jobs::JobRow, llm_calls::LlmCallRow, traces::Appended};

/// Facts waiting for the export task; more are dropped (and logged) rather than held.
const QUEUE: usize = 4096;
/// Spans sent in one request at most.
const MAX_BATCH: usize = 512;
tokio::task_local! {
    /// The span of the job this task runs: model calls made by it are its children.
    static CURRENT: Parent;
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("TELEMETRY_HEADERS_MISSING: telemetry.headers_secret names {0}, which is not set")]
    HeadersMissing(String),
    #[error("TELEMETRY_HEADERS_INVALID: {0} must hold key=value pairs separated by commas")]
    HeadersInvalid(String),
    #[error("TELEMETRY_EXPORTER: the OTLP exporter cannot be set up: {0}")]
    Exporter(String),
}

impl TelemetryError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::HeadersMissing(_) => "TELEMETRY_HEADERS_MISSING",
            Self::HeadersInvalid(_) => "TELEMETRY_HEADERS_INVALID",
            Self::Exporter(_) => "TELEMETRY_EXPORTER",
        }
    }
}

/// This process's OpenTelemetry export; the default exports nothing and costs nothing.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").field("enabled", &self.inner.is_some()).finish()
    }
}

struct Inner {
    service: String,
    queue: mpsc::Sender<Fact>,
    meters: Meters,
    provider: SdkMeterProvider,
    metrics: Arc<MetricsPush>,
    metrics_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Meters {
    messages: Counter<u64>,
    tool_calls: Counter<u64>,
    tokens: Counter<u64>,
}

enum Fact {
    /// A message's trace was committed: export it as the database has it.
    Trace(i64),
    /// A step was appended to a finished trace (and committed) at `at` (unix ms).
    Appended { step: Appended, at: i64 },
    Spans(Vec<SpanData>),
    Flush(oneshot::Sender<()>),
}

impl Telemetry {
    /// Starts the export when `telemetry.otlp_endpoint` is set (inside a Tokio runtime).
    pub fn start(settings: &TelemetrySettings, secrets: &SecretSource, db: Db) -> Result<Self, TelemetryError> {
        if !settings.enabled() {
            return Ok(Self::default());
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(TelemetryError::Exporter("it must start inside a Tokio runtime".into()));
        }
        let headers = match settings.headers_secret.as_str() {
            "" => HashMap::new(),
            name => parse_headers(name, &secrets.get(name).ok_or_else(|| TelemetryError::HeadersMissing(name.into()))?)?,
        };
        let base = settings.otlp_endpoint.trim().trim_end_matches('/');
        // No redirects: the collector's key travels in a header of the operator's choosing,
        // which reqwest keeps on a redirect to another host.
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let resource = Resource::builder_empty().with_service_name(settings.service_name.clone()).build();
        let mut span_exporter = SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(settings.timeout)
            .with_headers(headers.clone())
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        span_exporter.set_resource(&resource);
        let metric_exporter = MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(settings.timeout)
            .with_headers(headers)
            .with_temporality(Temporality::Cumulative)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let reader = SharedReader(Arc::new(ManualReader::builder().with_temporality(Temporality::Cumulative).build()));
        let provider = SdkMeterProvider::builder().with_resource(resource).with_reader(reader.clone()).build();
        let meter = provider.meter("gatehouse");
        let meters = Meters {
            messages: meter.u64_counter("gatehouse.messages").with_description("Messages handled, by channel, route and outcome").build(),
            tool_calls: meter.u64_counter("gatehouse.tool_calls").with_description("Tool call runs, by tool and outcome").build(),
            tokens: meter.u64_counter("gatehouse.model.tokens").with_unit("{token}").with_description("Model tokens, by purpose, model and token type").build(),
        };
        let depth = meter.i64_gauge("gatehouse.jobs.queue_depth").with_unit("{job}").with_description("Jobs not yet finished, by state").build();
        let (queue, facts) = mpsc::channel(QUEUE);
        let service = settings.service_name.clone();
        tokio::spawn(export_spans(span_exporter, facts, db.clone(), service.clone(), meters.messages.clone()));
        let metrics = Arc::new(MetricsPush { exporter: metric_exporter, reader, db, depth });
        let metrics_task = tokio::spawn(export_metrics(metrics.clone(), settings.export_interval));
        tracing::info!(endpoint = %crate::config::load::display_url(base), service = %service, "OpenTelemetry export on");
        Ok(Self { inner: Some(Arc::new(Inner { service, queue, meters, provider, metrics, metrics_task: Mutex::new(Some(metrics_task)) })) })
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    fn send(inner: &Inner, fact: Fact) {
        if inner.queue.try_send(fact).is_err() {
            tracing::warn!(code = "TELEMETRY_QUEUE_FULL", "the OpenTelemetry export is behind; spans were dropped");
        }
    }

    /// A message's trace was committed (its steps and ending): it is exported as stored.
    pub fn message(&self, trace_id: i64) {
        if let Some(inner) = &self.inner {
            Self::send(inner, Fact::Trace(trace_id));
        }
    }

    /// Steps appended to finished traces were committed (a delivery, a later answer, an
    /// approval's decision): each one's span joins its message's trace, under the message, as a
    /// step the message's own export did not hold. Takes what a transaction appended: none, one
    /// (`Option`) or several.
    pub fn appended(&self, steps: impl IntoIterator<Item = Appended>) {
        if let Some(inner) = &self.inner {
            let at = db::now_ms();
            for step in steps {
                Self::send(inner, Fact::Appended { step, at });
            }
        }
    }

    /// A model call was recorded: its span joins the job running it, or else its message.
    pub fn model_call(&self, row: &LlmCallRow) {
        let Some(inner) = &self.inner else { return };
        let parent = CURRENT.try_with(|p| *p).unwrap_or_else(|_| spans::message(&inner.service, &row.correlation_id));
        Self::send(inner, Fact::Spans(vec![spans::model_span(parent, row)]));
        for (kind, n) in [("input", row.input_tokens), ("output", row.output_tokens)] {
            let attributes = [KeyValue::new("gen_ai.token.type", kind), KeyValue::new("gatehouse.llm.purpose", row.purpose.clone()), KeyValue::new("gen_ai.request.model", row.model.clone())];
            inner.meters.tokens.add(u64::try_from(n).unwrap_or(0), &attributes);
        }
    }

    /// `work` inside the job span of the task that calls this, if it runs in one: for work
    /// moved to a task of its own, whose model calls stay the job's children.
    pub fn carry<F: Future>(work: F) -> impl Future<Output = F::Output> {
        let parent = CURRENT.try_with(|p| *p).ok();
        async move {
            match parent {
                Some(parent) => CURRENT.scope(parent, work).await,
                None => work.await,
            }
        }
    }

    /// Runs `work` (one attempt of `job`) inside the job's span, so model calls it makes are
    /// the job span's children.
    pub async fn in_job<F: Future>(&self, job: &JobRow, work: F) -> F::Output {
        match &self.inner {
            Some(inner) => CURRENT.scope(spans::job(&inner.service, job), work).await,
            None => work.await,
        }
    }

    /// One attempt of `job` ended (`failure` is its error code).
    pub fn job_ran(&self, job: &JobRow, started_ms: i64, failure: Option<&str>) {
        let Some(inner) = &self.inner else { return };
        Self::send(inner, Fact::Spans(vec![spans::job_span(&inner.service, job, started_ms, db::now_ms(), failure)]));
        if let Some(tool) = &job.tool_name {
            inner.meters.tool_calls.add(1, &[KeyValue::new("gen_ai.tool.name", tool.clone()), KeyValue::new("gatehouse.outcome", failure.unwrap_or("ok").to_string())]);
        }
    }

    /// Returns once everything handed over so far was sent (or given up).
    pub async fn flush(&self) {
        let Some(inner) = &self.inner else { return };
        let (done, sent) = oneshot::channel();
        if inner.queue.send(Fact::Flush(done)).await.is_ok() {
            let _ = sent.await;
        }
    }

    /// Sends what is queued and the metrics one last time; the process is about to end.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.inner else { return };
        self.flush().await;
        let task = inner.metrics_task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        // One last push of the metrics, then the provider stops.
        inner.metrics.push().await;
        let _ = inner.provider.shutdown();
    }
}

fn parse_headers(name: &str, value: &str) -> Result<HashMap<String, String>, TelemetryError> {
    value
        .split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(TelemetryError::HeadersInvalid(name.into())),
        })
        .collect()
}

/// The one task that sends spans: it batches what is queued, reads committed traces back from
/// the database, and answers flushes once what came before them is sent.
async fn export_spans(exporter: SpanExporter, mut facts: mpsc::Receiver<Fact>, db: Db, service: String, messages: Counter<u64>) {
    let mut exported = Exported::default();
    while let Some(first) = facts.recv().await {
        let mut batch = Vec::new();
        let mut traces = Vec::new();
        let mut appended = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(fact) = next {
            match fact {
                Fact::Trace(id) => traces.push(id),
                Fact::Appended { step, at } => appended.push((step, at)),
                Fact::Spans(spans) => batch.extend(spans),
                Fact::Flush(done) => flushes.push(done),
            }
            next = if batch.len() + traces.len() + appended.len() < MAX_BATCH { facts.try_recv().ok() } else { None };
        }
        for id in traces {
            match read_trace(&db, id).await {
                Ok(Some((trace, steps))) => {
                    let attributes =
                        [KeyValue::new("gatehouse.channel", trace.channel.clone()), KeyValue::new("gatehouse.route", trace.route.clone()), KeyValue::new("gatehouse.outcome", trace.outcome.clone())];
                    messages.add(1, &attributes);
                    batch.extend(spans::message_spans(&service, &trace, &steps));
                    exported.note(id, steps.len());
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(code = "TELEMETRY_TRACE_UNREAD", trace.id = id, error = %e, "a trace could not be read for export"),
            }
        }
        for (step, at) in appended {
            // Read after its message's export here: that export held it already.
            if exported.holds(step.trace_id, step.seq) {
                continue;
            }
            match read_trace(&db, step.trace_id).await {
                Ok(Some((trace, _))) if spans::held_by_trace_export(&trace, at) => {}
                Ok(Some((trace, steps))) => {
                    if let Some(row) = usize::try_from(step.seq).ok().and_then(|seq| steps.get(seq)) {
                        batch.push(spans::appended_span(&service, &trace, step, row, at));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(code = "TELEMETRY_TRACE_UNREAD", trace.id = step.trace_id, error = %e, "a trace could not be read for export"),
            }
        }
        if !batch.is_empty() {
            let n = batch.len();
            if let Err(e) = exporter.export(batch).await {
                tracing::warn!(code = "TELEMETRY_EXPORT_FAILED", spans = n, error = %e, "exporting spans failed; they are dropped");
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// How many steps the latest message exports here held, per trace: a step appended after
/// the message was written but before its export read it is not exported twice. Bounded: past
/// `EXPORTED_KEPT` traces it starts again (an appended step comes seconds after its message).
#[derive(Default)]
struct Exported {
    steps: HashMap<i64, usize>,
}

const EXPORTED_KEPT: usize = 10_000;

impl Exported {
    fn note(&mut self, trace_id: i64, steps: usize) {
        if self.steps.len() >= EXPORTED_KEPT {
            self.steps.clear();
        }
        self.steps.insert(trace_id, steps);
    }

    fn holds(&self, trace_id: i64, seq: i64) -> bool {
        self.steps.get(&trace_id).is_some_and(|n| usize::try_from(seq).is_ok_and(|seq| seq < *n))
    }
}

async fn read_trace(db: &Db, id: i64) -> Result<Option<(db::traces::TraceRow, Vec<db::traces::Step>)>, db::DbError> {
    let mut conn = db.pool.acquire().await?;
    db::traces::get(&mut conn, id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_key_value_pairs() {
        let parsed = parse_headers("H", "api-key = abc, x-team=ops,").expect("valid");
        assert_eq!(parsed.get("api-key").map(String::as_str), Some("abc"));
        assert_eq!(parsed.get("x-team").map(String::as_str), Some("ops"));
        let bad = parse_headers("OTLP_HEADERS", "just-a-token").expect_err("no key");
        assert_eq!(bad.code(), "TELEMETRY_HEADERS_INVALID");
        assert!(!bad.to_string().contains("just-a-token"), "the secret's value is never in the error");
    }

    #[tokio::test]
    async fn without_an_endpoint_nothing_starts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let db = Db::connect(&crate::config::DatabaseSettings { url, ..Default::default() }).await.expect("db");
        let t = Telemetry::start(&TelemetrySettings::default(), &SecretSource::empty(), db.clone()).expect("off");
        assert!(!t.is_enabled());
        let missing = TelemetrySettings { otlp_endpoint: "http://127.0.0.1:9".into(), headers_secret: "NOT_SET_ANYWHERE".into(), ..Default::default() };
        let e = Telemetry::start(&missing, &SecretSource::empty(), db).expect_err("headers missing");
        assert_eq!(e.code(), "TELEMETRY_HEADERS_MISSING");
    }
}
