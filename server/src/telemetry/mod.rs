//! Logging: human-readable by default, JSON with `--log-format json`. Request bodies, query
//! strings and secrets are never logged. And OpenTelemetry export over OTLP/HTTP when
//! `[telemetry] otlp_endpoint` is set ([`Telemetry`]).

mod metrics;
mod otel;
pub mod spans;

pub use otel::{Telemetry, TelemetryError};

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt};

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG` wins over the configured filter. Text is
/// coloured only on a terminal without `NO_COLOR`: a log file or a collector gets plain lines.
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(filter)).unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).with_ansi(colour);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
