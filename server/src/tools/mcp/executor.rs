//! Calling an approved MCP tool for the checkpoint: the server's circuit breaker, the call
//! itself, and the result marked untrusted.

use std::{sync::Arc, time::Instant};

use serde_json::{Value, json};

use super::{Inner, McpCode, session};
use crate::{
    db,
    tools::{ToolDef, ToolError, ToolExecutor, checkpoint::ToolCode},
};

/// A server's listing: each tool's definition hash by its name on the server.
type ListedHashes = std::collections::HashMap<String, String>;

/// Calls MCP tools for the checkpoint, which has already run every gate.
pub(super) struct McpExecutor {
    pub(super) inner: Arc<Inner>,
}

fn text_of(content: &[rmcp::model::ContentBlock]) -> String {
    let texts: Vec<String> = content.iter().filter_map(|c| serde_json::to_value(c).ok()).filter_map(|v| v.get("text").and_then(Value::as_str).map(str::to_string)).collect();
    if texts.is_empty() { "the tool reported an error without a message".into() } else { texts.join("\n") }
}

impl McpExecutor {
    /// The tool's row and its server's as the database holds them now. A database that cannot
    /// say fails the call (retryable): it does not reach the server.
    async fn decision(&self, name: &str, server_id: &str) -> Result<(Option<db::mcp::ToolRow>, Option<db::mcp::ServerRow>), ToolError> {
        let read = async {
            let mut conn = self.inner.db.pool.acquire().await?;
            let tool = db::mcp::tool_by_catalog_name(&mut conn, name).await?;
            let server = db::mcp::server(&mut conn, server_id).await?;
            Ok::<_, db::DbError>((tool, server))
        };
        read.await.map_err(|e| ToolError::unsent(McpCode::ServerUnavailable.as_str(), format!("cannot read {name}'s approval: {e}"), true))
    }

    /// What the database says now of the tool and its server: an owner may have rejected the
    /// tool, or disabled the server, from another process since this one built its catalog.
    /// A database that cannot say fails the call (retryable): it does not reach the server.
    async fn still_allowed(&self, name: &str, server_id: &str) -> Result<(), ToolError> {
        let (mut tool, server) = self.decision(name, server_id).await?;
        // Disabled or enabled again elsewhere: this process's server follows either way (its
        // supervisor stops, or reconnects).
        let live = self.inner.servers.get(server_id);
        if let Some(live) = live
            && !live.follow_switch(server.and_then(|s| s.enabled_override))
        {
            return Err(ToolError::refused(McpCode::ServerDisabled.as_str(), format!("the MCP server {server_id} is disabled")));
        }
        // What the server lists now, even when that listing could not be stored, must be what
        // an owner approved. A listing older than the approval (another process stored the
        // new definition and an owner approved it) is listed again first, and the call waits
        // for it: the server decides, never the database alone.
        let older = |t: &db::mcp::ToolRow, listed: Option<&ListedHashes>| listed.is_some_and(|l| l.get(&t.name) != t.approved_hash.as_ref());
        if let (Some(t), Some(live)) = (&tool, live) {
            let connected_and_older = {
                let now = live.live.borrow();
                t.usable() && now.peer.is_some() && older(t, now.listed.as_deref())
            };
            if connected_and_older {
                // Within half the call's own time, which the call then has less of: the
                // checkpoint's timeout covers both.
                let bound = live.config.discovery.timeout.min(live.config.call_timeout / 2);
                if tokio::time::timeout(bound, live.list_again_for_call(|now| !older(t, now.listed.as_deref()))).await.is_err() {
                    return Err(ToolError::unsent(McpCode::ServerUnavailable.as_str(), format!("{server_id} did not list its tools again within {bound:?}"), true));
                }
                tool = self.decision(name, server_id).await?.0;
            }
        }
        let listed = live.and_then(|live| live.live.borrow().listed.clone());
        match tool {
            Some(t) if t.usable() && older(&t, listed.as_deref()) => {
                let why = if listed.is_some_and(|l| l.contains_key(&t.name)) { "lists it with a definition no owner approved" } else { "no longer lists it" };
                Err(ToolError::refused(ToolCode::Quarantined.as_str(), format!("{name} is not approved for use now: its server {why}")))
            }
            Some(t) if t.usable() => Ok(()),
            Some(t) if t.state == db::mcp::ToolState::Rejected => Err(ToolError::refused(ToolCode::Rejected.as_str(), format!("{name} was rejected by an owner"))),
            _ => Err(ToolError::refused(ToolCode::Quarantined.as_str(), format!("{name} is not approved for use now"))),
        }
    }
}

#[async_trait::async_trait]
impl ToolExecutor for McpExecutor {
    async fn call(&self, tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        let started = Instant::now();
        let name = &tool.spec.name;
        // The catalog a call started with may be older than the latest decision: the routes are
        // the current usable set, so a tool quarantined since never reaches its server.
        let route = self.inner.routes.read().ok().and_then(|r| r.get(name).cloned());
        let Some(route) = route else { return Err(ToolError::refused(ToolCode::Quarantined.as_str(), format!("{name} is not approved for use now"))) };
        let Some(server) = self.inner.servers.get(&route.server) else {
            return Err(ToolError::unsent(McpCode::UnknownServer.as_str(), format!("no MCP server {}", route.server), false));
        };
        // The database decides, not this process's last word: a server enabled again elsewhere
        // is enabled here too.
        if let Err(e) = self.still_allowed(name, &route.server).await {
            // Decided in another process (the CLI, another `serve` or worker): this process's
            // catalog catches up. (A database that could not say decided nothing.)
            if e.refused {
                let manager = super::McpManager { inner: self.inner.clone() };
                tokio::spawn(async move {
                    if let Err(e) = manager.rebuild().await {
                        tracing::warn!(error = %e, "rebuilding the MCP catalog after a decision made elsewhere failed");
                    }
                });
            }
            return Err(e);
        }
        let (peer, last_error) = {
            let live = server.live.borrow();
            (live.peer.clone(), live.last_error.clone())
        };
        let Some(peer) = peer else {
            let last = last_error.unwrap_or_else(|| "not connected yet".into());
            return Err(ToolError::unsent(McpCode::ServerUnavailable.as_str(), format!("{} is not connected ({last})", route.server), false));
        };
        // Dropped unsettled (this future dropped, or a call that ends waiting for a login),
        // the trial gives its slot back.
        let trial = match self.inner.breakers.try_acquire(&route.server, Instant::now()) {
            Ok(trial) => trial,
            Err(wait) => {
                return Err(ToolError::unsent(
                    McpCode::ServerUnavailable.as_str(),
                    format!("{} failed repeatedly; next try in {} s", route.server, wait.as_secs().max(1)),
                    false,
                ));
            }
        };
        let params = rmcp::model::CallToolRequestParams::new(route.tool.clone()).with_arguments(args.as_object().cloned().unwrap_or_default());
        // A form waiting for an owner does not use up the server's own time.
        let timeout = server.config.call_deadline().saturating_sub(started.elapsed());
        let scrub = |text: &str| session::scrub(&server.config, &self.inner.secrets, text);
        let in_flight = server.call_started();
        let outcome = tokio::time::timeout(timeout, peer.call_tool(params)).await;
        drop(in_flight);
        if matches!(outcome, Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_)))) {
            server.answered();
        }
        let result = match outcome {
            Err(_) => {
                trial.failed(Instant::now());
                let _ = server.refresh.send(session::RefreshRequest::Probe);
                return Err(ToolError::new(ToolCode::Timeout.as_str(), format!("{} did not answer within {timeout:?}", route.server), false));
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => {
                // The server is alive and answered: a protocol error is not a health problem.
                trial.succeeded();
                let message = scrub(&format!("{} ({})", e.message, e.code.0));
                // The request itself was refused (it does not parse, no such method or tool,
                // invalid arguments): nothing ran, and the tool is not at fault. Any other error
                // (internal, or the server's own) came from inside the call, which may have done
                // part of its work.
                let refused = [rmcp::model::ErrorCode::PARSE_ERROR, rmcp::model::ErrorCode::INVALID_REQUEST, rmcp::model::ErrorCode::METHOD_NOT_FOUND, rmcp::model::ErrorCode::INVALID_PARAMS].contains(&e.code);
                return Err(if refused { ToolError::of_target(McpCode::ProtocolError.as_str(), message, false) } else { ToolError::outcome_unknown(McpCode::ProtocolError.as_str(), message) });
            }
            Ok(Err(e)) => {
                // A token that could not be refreshed, or a step-up: the server now waits for an
                // owner's login, which says more than the transport's error.
                let needs_login = server.live.borrow().needs_login.clone();
                if let Some(reason) = needs_login {
                    return Err(ToolError::new(McpCode::NeedsLogin.as_str(), format!("{} needs an owner to log in: {reason}", route.server), false));
                }
                trial.failed(Instant::now());
                let closed = matches!(e, rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)) || peer.is_transport_closed();
                let message = if closed {
                    format!("the connection to {} closed during the call (the server may have exited); it is being restarted", route.server)
                } else {
                    scrub(&e.to_string())
                };
                // The request was sent: the server may have done the work before it went away.
                return Err(ToolError::outcome_unknown(McpCode::ServerUnavailable.as_str(), message));
            }
            Ok(Ok(result)) => result,
        };
        trial.succeeded();
        if result.is_error == Some(true) {
            // The tool ran and said why it could not do this (no such order, a file not found):
            // an answer about the request, which says the tool works. Counted against the tool's
            // circuit breaker, one chat's bad requests would close the tool for everyone.
            return Err(ToolError::of_target(McpCode::ToolError.as_str(), scrub(&text_of(&result.content)), false));
        }
        let content = serde_json::to_value(&result.content).unwrap_or_else(|_| Value::Array(Vec::new()));
        let mut out = json!({ "untrusted": true, "source": format!("mcp:{}", route.server), "content": content });
        if let Some(structured) = result.structured_content {
            out["structured"] = structured;
        }
        session::scrub_result(&server.config, &self.inner.secrets, server.sent_tokens.values(), &mut out);
        Ok(out)
    }
}
