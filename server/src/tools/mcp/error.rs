//! The stable codes of MCP calls and the errors of MCP management.

use super::{elicitation, oauth};
use crate::db::DbError;

/// Stable error codes of MCP calls (inside `TOOL_PROVIDER_ERROR` messages, or on their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
pub enum McpCode {
    /// Not connected, exited during the call, or its circuit breaker is open.
    #[strum(serialize = "MCP_SERVER_UNAVAILABLE")]
    ServerUnavailable,
    #[strum(serialize = "MCP_SERVER_DISABLED")]
    ServerDisabled,
    #[strum(serialize = "MCP_UNKNOWN_SERVER")]
    UnknownServer,
    /// The server answered with a protocol error (unknown tool, invalid params, ...).
    #[strum(serialize = "MCP_PROTOCOL_ERROR")]
    ProtocolError,
    /// The tool ran and reported an error (`isError: true`).
    #[strum(serialize = "MCP_TOOL_ERROR")]
    ToolError,
    #[strum(serialize = "MCP_UNKNOWN_TOOL")]
    UnknownTool,
    /// An OAuth server without a usable token: an owner must log in.
    #[strum(serialize = "MCP_NEEDS_LOGIN")]
    NeedsLogin,
}

impl McpCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An MCP management failure with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP_UNKNOWN_SERVER: there is no MCP server {0:?}")]
    UnknownServer(String),
    #[error("MCP_UNKNOWN_TOOL: there is no MCP tool {0:?}")]
    UnknownTool(String),
    #[error("MCP_SERVER_UNAVAILABLE: {0}")]
    Unavailable(String),
    /// The definition changed after the owner reviewed it; nothing was decided.
    #[error("MCP_DEFINITION_CHANGED: the definition of {0} changed since it was reviewed; look at it again")]
    DefinitionChanged(String),
    #[error(transparent)]
    OAuth(#[from] oauth::OAuthError),
    #[error("MCP_ELICITATION_UNKNOWN: there is no form {0}")]
    FormUnknown(i64),
    /// Answered already, or its time ran out: the call it belonged to has moved on.
    #[error("MCP_ELICITATION_CLOSED: form {0} no longer waits for an answer")]
    FormClosed(i64),
    #[error(transparent)]
    FormInvalid(#[from] elicitation::form::FormError),
    #[error(transparent)]
    Db(#[from] DbError),
}

crate::db::from_sqlx_as_db!(McpError);

impl McpError {
    /// The stable code, alone (the display is the code and a sentence).
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownServer(_) => "MCP_UNKNOWN_SERVER",
            Self::UnknownTool(_) => "MCP_UNKNOWN_TOOL",
            Self::Unavailable(_) => "MCP_SERVER_UNAVAILABLE",
            Self::DefinitionChanged(_) => "MCP_DEFINITION_CHANGED",
            Self::OAuth(e) => e.code(),
            Self::FormUnknown(_) => "MCP_ELICITATION_UNKNOWN",
            Self::FormClosed(_) => "MCP_ELICITATION_CLOSED",
            Self::FormInvalid(_) => "MCP_ELICITATION_INVALID",
            Self::Db(e) => e.code(),
        }
    }
}

#[cfg(test)]
mod code_tests {
    use super::McpError;

    /// The code an owner sees (the console's `oauth_error`) is the one the message starts with.
    #[test]
    fn each_error_s_code_is_the_one_it_says() {
        let errors = [
            McpError::UnknownServer("s".into()),
            McpError::UnknownTool("t".into()),
            McpError::Unavailable("down".into()),
            McpError::DefinitionChanged("t".into()),
            McpError::FormUnknown(1),
            McpError::FormClosed(1),
            McpError::FormInvalid(crate::tools::mcp::elicitation::form::FormError { field: "f".into(), message: "m".into() }),
        ];
        for e in errors {
            assert!(e.to_string().starts_with(&format!("{}: ", e.code())), "{e}");
        }
        let db = McpError::Db(crate::db::DbError::Sql(sqlx::Error::PoolClosed));
        assert_eq!(db.code(), "DATABASE_ERROR", "not the first words of a sentence: {db}");
    }
}
