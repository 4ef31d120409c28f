//! What a provider implements to run calls (built-in implementations, connectors, MCP
//! servers), how it reports a failure, and the idempotency key each attempt of a call carries.

use serde_json::Value;

use super::CallContext;
use crate::tools::{Catalog, ToolDef};

/// An execution failure reported by a provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    pub code: String,
    pub message: String,
    pub retryable: bool,
    /// The provider refused the call before reaching anything (a forbidden address, a URL
    /// outside a connector's patterns). The checkpoint reports the provider's own code as a
    /// denial, and a refusal does not count against the tool's circuit breaker.
    pub refused: bool,
    /// The failure is the target's, not the tool's: the page web_fetch was asked for is missing,
    /// not text, or its site does not answer. It says the tool works, so it does not count
    /// against the tool's circuit breaker (one chat's dead links would close it for all).
    pub of_target: bool,
    /// The request never left (no connection, a server not connected): the call did not take
    /// effect, so it may be made again even where a repeat is not safe.
    pub unsent: bool,
    /// The request reached the provider, or may have, and nothing says what came of it: the
    /// connection closed during the call, or the server failed inside it. A write it carried
    /// may have taken effect, so it is not made again on its own.
    pub outcome_unknown: bool,
}

impl ToolError {
    pub fn new(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self { code: code.into(), message: message.into(), retryable, refused: false, of_target: false, unsent: false, outcome_unknown: false }
    }

    pub fn refused(code: &str, message: impl Into<String>) -> Self {
        Self { refused: true, ..Self::new(code, message, false) }
    }

    /// A failure before the request left (see [`Self::unsent`]).
    pub fn unsent(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self { unsent: true, ..Self::new(code, message, retryable) }
    }

    /// A failure of the target the tool was pointed at (see [`Self::of_target`]).
    pub fn of_target(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self { of_target: true, ..Self::new(code, message, retryable) }
    }

    /// A failure after the request may have reached the provider (see [`Self::outcome_unknown`]).
    pub fn outcome_unknown(code: &str, message: impl Into<String>) -> Self {
        Self { outcome_unknown: true, ..Self::new(code, message, false) }
    }
}

/// Runs a tool's calls for one provider (built-in implementations, connectors, MCP servers).
#[async_trait::async_trait]
pub trait ToolExecutor: Send + Sync {
    async fn call(&self, tool: &ToolDef, args: &Value) -> Result<Value, ToolError>;

    /// The checkpoint publishes `catalog` (a reload, an MCP discovery): an executor whose
    /// rules derive from the catalog updates them here.
    fn catalog_changed(&self, catalog: &Catalog) {
        let _ = catalog;
    }

    /// Runs a call whose every attempt (a retry after a timeout, a re-run after a crash or a
    /// restart) carries the same `key` ([`idempotency_key`]). Executors whose systems
    /// deduplicate writes by key send it; the others run [`Self::call`].
    async fn call_keyed(&self, tool: &ToolDef, args: &Value, key: &str) -> Result<Value, ToolError> {
        let _ = key;
        self.call(tool, args).await
    }

    /// Whether [`Self::call_keyed`] sends its key for a call of `tool`.
    fn sends_key(&self, tool: &ToolDef) -> bool {
        let _ = tool;
        false
    }
}

/// The idempotency key of a call: the same for every attempt of the same call for the same
/// request (its correlation id, or the approval that bound it), different for any other.
pub fn idempotency_key(tool: &str, args: &Value, ctx: &CallContext) -> String {
    use sha2::{Digest, Sha256};
    let origin = ctx.approved.as_ref().map_or_else(|| format!("request:{}", ctx.correlation_id), |a| format!("approval:{}", a.approval_id));
    let mut h = Sha256::new();
    for part in [origin.as_str(), tool, crate::tools::canonical::args_hash(args).as_str()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("gatehouse-{}", &hex::encode(h.finalize())[..32])
}
