//! `[mcp]`: what Gatehouse tells the owners about its MCP servers (the servers themselves are in
//! config/mcp.toml). Each notice is kept for the console and, unless turned off, sent to every
//! owner number on WhatsApp.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct McpSettings {
    /// Each notice also goes to every owner number on WhatsApp; false: kept for the console only.
    pub notices_on_whatsapp: bool,
    /// An OAuth server's token could not be refreshed (or it asks for more scope): sent once
    /// when it goes to "needs login". `{server}` its id, `{reason}` why, `{link}` the console's
    /// MCP servers page.
    pub needs_login_notice: String,
    /// A server asks the owners to fill in a form during a call (`elicitation = "owner"`).
    /// `{server}` its id, `{minutes}` the time left to answer, `{link}` the form in the console.
    /// The server's own message is shown only in the console, marked as the server's.
    pub elicitation_notice: String,
}

impl Default for McpSettings {
    fn default() -> Self {
        Self {
            notices_on_whatsapp: true,
            needs_login_notice: "The MCP server {server} needs an owner to log in again ({reason}). Its tools are withheld until then: connect it at {link} or run `gatehouse mcp login {server}`."
                .into(),
            elicitation_notice: "The MCP server {server} asks an owner to fill in a form during a tool call; the call waits up to {minutes} min: {link}".into(),
        }
    }
}
