//! The one error type every server function returns: a stable code plus a message that is safe
//! to show an owner. Internals never travel in it.

use leptos::server_fn::{
    codec::JsonEncoding,
    error::{FromServerFnError, ServerFnErrorErr},
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AppError {
    pub code: String,
    pub message: String,
}

/// Stable error codes shown to owners and matched by tests.
pub mod code {
    pub const UNAUTHORIZED: &str = "UNAUTHORIZED";
    pub const LOGIN_FAILED: &str = "LOGIN_FAILED";
    pub const LOGIN_THROTTLED: &str = "LOGIN_THROTTLED";
    pub const INVALID_INPUT: &str = "INVALID_INPUT";
    pub const SETUP_CLOSED: &str = "SETUP_CLOSED";
    pub const CONFLICT: &str = "CONFLICT";
    pub const NOT_FOUND: &str = "NOT_FOUND";
    pub const CONFIG_INVALID: &str = "CONFIG_INVALID";
    pub const INTERNAL: &str = "INTERNAL";
    /// The database cannot be reached (down, restarting, its connections all taken): try again.
    pub const DATABASE_UNAVAILABLE: &str = "DATABASE_UNAVAILABLE";
    pub const REQUEST_FAILED: &str = "REQUEST_FAILED";
}

impl AppError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_string(), message: message.into() }
    }

    pub fn unauthorized() -> Self {
        Self::new(code::UNAUTHORIZED, "Please log in.")
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_INPUT, message)
    }

    /// Hides the cause from the owner; the caller logs it.
    pub fn internal() -> Self {
        Self::new(code::INTERNAL, "Something went wrong on the server. The log has the details.")
    }

    /// The database could not be reached; the same request may work in a moment (what was
    /// done before the database went away, if anything, shows then).
    pub fn database_unavailable() -> Self {
        Self::new(code::DATABASE_UNAVAILABLE, "The database is not reachable right now. Try again in a moment; the page then shows what was done.")
    }

    pub fn is_unauthorized(&self) -> bool {
        self.code == code::UNAUTHORIZED
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> u16 {
        match self.code.as_str() {
            code::UNAUTHORIZED | code::LOGIN_FAILED => 401,
            code::LOGIN_THROTTLED => 429,
            code::INVALID_INPUT | code::REQUEST_FAILED => 400,
            code::SETUP_CLOSED => 410,
            // First-run setup from another machine without the setup token.
            "SETUP_NOT_LOCAL" => 403,
            code::CONFLICT => 409,
            code::DATABASE_UNAVAILABLE => 503,
            code::NOT_FOUND => 404,
            code::CONFIG_INVALID | "REPAIR_CONFIG_INVALID" => 422,
            // Self-improvement: a decision the repair's state refuses, and input that is not one.
            "REPAIR_NEEDS_CONFIRMATION" | "REPAIR_REPLAY_CHANGED" | "REPAIR_CHANGED" | "REPAIR_ALREADY_DECIDED" | "REPAIR_STALE" | "REPAIR_HALF_APPLIED" => 409,
            "REPAIR_REASON_REQUIRED" | "EVAL_EXPECT_INVALID" | "EVAL_PATTERN_UNKNOWN" | "EVAL_TRACE_UNREADABLE" => 400,
            "REPAIR_NOT_FOUND" => 404,
            // A form of an MCP server: values that do not fit it, one already answered or gone.
            "MCP_ELICITATION_INVALID" => 400,
            "MCP_ELICITATION_CLOSED" => 409,
            "MCP_ELICITATION_UNKNOWN" => 404,
            // An approval decision the request's state refuses: decided already (by another
            // owner, say), expired, not waiting, or refused by policy; and one that is not there.
            "APPROVAL_ALREADY_DECIDED" | "APPROVAL_EXPIRED" | "APPROVAL_NOT_NEEDED" | "APPROVAL_REFUSED" => 409,
            "APPROVAL_INVALID_BUTTON" => 400,
            // An owner's run again of a job's call that the job's state refuses.
            "RUN_AGAIN_NOT_A_CALL" | "RUN_AGAIN_UNFINISHED" | "RUN_AGAIN_STOPPING" | "RUN_AGAIN_NO_CHAT" | "RUN_AGAIN_ANSWERED" | "RUN_AGAIN_DONE"
            | "RUN_AGAIN_APPROVED" | "RUN_AGAIN_UNREADABLE" | "RUN_AGAIN_TOOL_GONE" | "RUN_AGAIN_NOT_AS_JOB" => 409,
            "APPROVAL_NOT_FOUND" => 404,
            // An MCP server's OAuth login: asked of a server without one, a login that is gone or
            // another owner's, and an authorization server that failed or refused.
            "MCP_NOT_OAUTH" => 400,
            "MCP_OAUTH_LOGIN_UNKNOWN" => 404,
            "MCP_OAUTH_LOGIN_NOT_YOURS" => 403,
            "MCP_OAUTH_DISCOVERY_FAILED" | "MCP_OAUTH_REGISTRATION_FAILED" | "MCP_OAUTH_DENIED" => 502,
            _ => 500,
        }
    }
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    /// The request's own faults (arguments that do not decode, a method the function does not
    /// take, the browser's request failing) are `REQUEST_FAILED`; the server's (its result not
    /// encodable, a middleware or registration failure) are `INTERNAL`, answered 500.
    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        let code = match value {
            ServerFnErrorErr::Args(_)
            | ServerFnErrorErr::MissingArg(_)
            | ServerFnErrorErr::Deserialization(_)
            | ServerFnErrorErr::Request(_)
            | ServerFnErrorErr::UnsupportedRequestMethod(_) => code::REQUEST_FAILED,
            _ => code::INTERNAL,
        };
        Self::new(code, value.to_string())
    }
}
