//! Pushing the metrics: every `[telemetry] export_interval` the job queue's depth is sampled and
//! the instruments are collected and sent over OTLP/HTTP, from a Tokio task of their own.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use opentelemetry::{KeyValue, metrics::Gauge};
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{InstrumentKind, ManualReader, Pipeline, Temporality, data::ResourceMetrics, exporter::PushMetricExporter, reader::MetricReader},
};

use crate::db::{self, Db};

/// Job states counted as the queue's depth.
const OPEN_STATES: [db::jobs::JobState; 5] = [db::jobs::JobState::Available, db::jobs::JobState::Scheduled, db::jobs::JobState::Retryable, db::jobs::JobState::Running, db::jobs::JobState::Pending];

/// What pushing the metrics takes.
pub(super) struct MetricsPush {
    pub(super) exporter: MetricExporter,
    pub(super) reader: SharedReader,
    pub(super) db: Db,
    pub(super) depth: Gauge<i64>,
}

/// Every `every`: samples the job queue's depth, collects the instruments and pushes them.
/// [`Telemetry::shutdown`] stops it and pushes once more.
pub(super) async fn export_metrics(metrics: Arc<MetricsPush>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        metrics.push().await;
    }
}

impl MetricsPush {
    pub(super) async fn push(&self) {
        let Self { exporter, reader, db: database, depth } = self;
        let counts = async {
            let mut conn = database.pool.acquire().await?;
            db::jobs::counts_by_state(&mut conn).await
        }
        .await;
        match counts {
            Ok(counts) => {
                for state in OPEN_STATES {
                    let n = counts.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
                    depth.record(n, &[KeyValue::new("gatehouse.job.state", state.to_string())]);
                }
            }
            Err(e) => tracing::warn!(code = "TELEMETRY_QUEUE_UNREAD", error = %e, "the job queue's depth could not be read"),
        }
        let mut metrics = ResourceMetrics::default();
        if let Err(e) = reader.collect(&mut metrics) {
            tracing::warn!(code = "TELEMETRY_METRICS_UNREAD", error = %e, "collecting metrics failed");
            return;
        }
        if let Err(e) = exporter.export(&metrics).await {
            tracing::warn!(code = "TELEMETRY_EXPORT_FAILED", error = %e, "exporting metrics failed; they are sent again next time");
        }
    }
}

/// The SDK's manual reader, shared between the meter provider (which registers with it) and the
/// export task (which collects from it on its own Tokio timer: nothing blocks a runtime thread).
#[derive(Debug, Clone)]
pub(super) struct SharedReader(pub(super) Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}
