//! `[telemetry]`: OpenTelemetry export. With `otlp_endpoint` set, every handled message becomes
//! one trace (its steps, model calls and jobs as spans) and a few metrics are pushed, both over
//! OTLP/HTTP with protobuf. Message text, replies, tool arguments and secrets are never exported.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// Base URL of an OTLP/HTTP receiver (a collector's port 4318); traces go to
    /// `<endpoint>/v1/traces` and metrics to `<endpoint>/v1/metrics`. Empty: nothing is exported.
    pub otlp_endpoint: String,
    /// The `service.name` resource attribute of everything exported.
    pub service_name: String,
    /// How often metrics are pushed. Spans are sent as soon as their message or job ends.
    #[serde(with = "duration_str")]
    pub export_interval: Duration,
    /// How long one export request may take before it is given up.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    /// The name of an environment variable holding request headers for the receiver, as
    /// `key=value,key2=value2` (a hosted backend's API key). Empty: no extra headers.
    pub headers_secret: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self { otlp_endpoint: String::new(), service_name: "gatehouse".into(), export_interval: Duration::from_secs(10), timeout: Duration::from_secs(10), headers_secret: String::new() }
    }
}

impl TelemetrySettings {
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.trim().is_empty()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_values_are_named_by_their_keys() {
        let text = "[telemetry]\notlp_endpoint = \"collector:4318\"\nservice_name = \" \"\nexport_interval = \"0s\"\ntimeout = \"0s\"\nheaders_secret = \"otlp-headers\"\n";
        crate::config::tests::problems_at(text, &["telemetry.otlp_endpoint", "telemetry.service_name", "telemetry.export_interval", "telemetry.timeout", "telemetry.headers_secret"]);
    }

    /// The export's paths are appended to the endpoint: a query or a fragment would swallow
    /// them, and a key in the URL would be shown wherever the URL is.
    #[test]
    fn an_endpoint_is_a_base_url_without_a_query_or_credentials() {
        for endpoint in ["https://collector.example:4318/?tenant=shop", "https://collector.example:4318/#x", "https://user:key@collector.example:4318"] {
            crate::config::tests::problems_at(&format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n"), &["telemetry.otlp_endpoint"]);
        }
        crate::config::tests::load_text("[telemetry]\notlp_endpoint = \"https://collector.example:4318/otlp\"\n").expect("a base URL with a path");
    }
}
