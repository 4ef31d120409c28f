//! Elicitation forwarded to the owners (`elicitation = "owner"` in config/mcp.toml). A server's
//! `elicitation/create` during a call is stored as a pending request (`mcp_elicitations`) and
//! the owners are told; the call waits, polling its row, so the owner may answer in another
//! process (the console beside a `gatehouse worker`, or `gatehouse mcp answer`). One answer
//! wins (a compare-and-set on the pending state) and reaches the server once; without one
//! within the server's `elicitation_ttl` the server gets "cancel". A customer is never asked:
//! nothing here reaches a chat.

pub mod form;

use std::{sync::Arc, time::Duration};

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::{Map, Value, json};

use super::{
    AuditActor, McpError, McpManager, OwnerNotices, ServerConfig, normalize,
    notices::{Notice, Notices},
};
use crate::db::{self, Db, audit, mcp_elicitations::State};

/// How often a waiting call looks at its row (an answer in this process wakes it at once).
const POLL: Duration = Duration::from_millis(250);
/// The server's message is bounded to this many characters.
const MAX_MESSAGE_CHARS: usize = 2_000;
/// Forms of one server waiting for the owners at once; a server asking for more (a flood, each
/// a notice to every owner) has the rest declined.
const MAX_OPEN_PER_SERVER: i64 = 3;

/// The forms of this process's servers: where they are stored and how owners are told.
pub struct Forms {
    db: Db,
    notices: Arc<Notices>,
    /// Rung by an answer given in this process, so its waiting call need not wait for a poll.
    answered: tokio::sync::Notify,
}

impl std::fmt::Debug for Forms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forms").finish_non_exhaustive()
    }
}

fn answer(action: ElicitationAction) -> ElicitResult {
    ElicitResult::new(action)
}

impl Forms {
    pub(crate) fn new(db: Db, notices: Arc<Notices>) -> Self {
        Self { db, notices, answered: tokio::sync::Notify::new() }
    }

    /// Asks the owners on `server`'s behalf and waits for their answer, at most the server's
    /// owner wait; `withdrawn` ends when the server withdraws its request.
    pub async fn ask(&self, server: &ServerConfig, message: &str, schema: &Value, withdrawn: impl Future<Output = ()>) -> ElicitResult {
        let id = &server.id;
        if let Err(why) = form::fields(schema) {
            tracing::warn!(mcp.server = %id, reason = %why, "an MCP server asked for a form Gatehouse cannot show; declined");
            return answer(ElicitationAction::Decline);
        }
        let wait = server.owner_wait();
        let message = normalize::bound_text(message, MAX_MESSAGE_CHARS);
        let stored = async {
            let mut tx = self.db.begin_write().await?;
            let expires_at = db::now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2);
            let Some(row) = db::mcp_elicitations::insert(&mut tx, id, &message, &schema.to_string(), expires_at, MAX_OPEN_PER_SERVER).await? else { return Ok(None) };
            let minutes = wait.as_secs().div_ceil(60).max(1);
            let notice = Notice {
                hook: "mcp.elicitation",
                server: id,
                reason_code: "MCP_ELICITATION_WAITING",
                correlation_id: format!("elicitation-{row}"),
                template: |s| &s.elicitation_notice,
                values: &[("{minutes}", minutes.to_string())],
                anchor: format!("#elicitation-{row}"),
            };
            self.notices.raise(tx, &notice).await?;
            Ok::<_, db::DbError>(Some(row))
        }
        .await;
        let row = match stored {
            Ok(Some(row)) => row,
            Ok(None) => {
                tracing::warn!(mcp.server = %id, open = MAX_OPEN_PER_SERVER, "an MCP server asked for another form while its others wait for the owners; declined");
                return answer(ElicitationAction::Decline);
            }
            Err(e) => {
                tracing::error!(mcp.server = %id, error = %e, "storing an MCP server's form failed; cancelled");
                return answer(ElicitationAction::Cancel);
            }
        };
        tracing::info!(mcp.server = %id, elicitation = row, wait_s = wait.as_secs(), "an MCP server's form waits for an owner");
        let deadline = tokio::time::Instant::now() + wait;
        let mut withdrawn = std::pin::pin!(withdrawn);
        let mut was_withdrawn = false;
        loop {
            let woken = self.answered.notified();
            let mut gave_up = false;
            tokio::select! {
                () = tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + POLL)) => {}
                () = woken => {}
                () = &mut withdrawn, if !was_withdrawn => { was_withdrawn = true; gave_up = true }
            }
            gave_up |= was_withdrawn || tokio::time::Instant::now() >= deadline;
            match self.settle(row, gave_up).await {
                Ok(Some(result)) => return result,
                Ok(None) => {}
                // Past its time the row cannot take an answer any more: the server is told
                // "cancel" even when the database cannot be reached to mark it.
                Err(e) if gave_up => {
                    tracing::warn!(mcp.server = %id, elicitation = row, error = %e, "closing an MCP server's form failed; cancelled");
                    return answer(ElicitationAction::Cancel);
                }
                Err(e) => tracing::warn!(mcp.server = %id, elicitation = row, error = %e, "reading an MCP server's form failed; trying again"),
            }
        }
    }

    /// The answer, once, if there is one; with `give_up`, a request still pending expires and
    /// the server gets "cancel".
    async fn settle(&self, id: i64, give_up: bool) -> Result<Option<ElicitResult>, db::DbError> {
        if !give_up {
            // A plain read while it waits; the write lock only once there is something to take.
            let mut conn = self.db.pool.acquire().await?;
            if db::mcp_elicitations::get(&mut conn, id).await?.is_some_and(|r| r.state == State::Pending) {
                return Ok(None);
            }
        }
        let mut tx = self.db.begin_write().await?;
        if give_up {
            db::mcp_elicitations::expire(&mut tx, id).await?;
        }
        let Some(row) = db::mcp_elicitations::get(&mut tx, id).await? else {
            tx.commit().await?;
            return Ok(Some(answer(ElicitationAction::Cancel)));
        };
        if row.state == State::Pending {
            tx.commit().await?;
            return Ok(None);
        }
        let first = db::mcp_elicitations::take(&mut tx, id).await?;
        tx.commit().await?;
        if !first {
            return Ok(Some(answer(ElicitationAction::Cancel)));
        }
        tracing::info!(elicitation = id, state = %row.state, "an MCP server's form was answered");
        Ok(Some(match row.state {
            State::Accepted => answer(ElicitationAction::Accept).with_content(row.content.as_deref().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_else(|| json!({}))),
            State::Declined => answer(ElicitationAction::Decline),
            _ => answer(ElicitationAction::Cancel),
        }))
    }
}

/// What an owner answers to a form.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Values as the console's form sends them (text); omitted fields take their defaults.
    AcceptText(Vec<(String, String)>),
    /// Typed values (the CLI's JSON); omitted fields take their defaults.
    Accept(Map<String, Value>),
    Decline,
    Cancel,
}

/// A form waiting for an owner, for the console and `gatehouse mcp forms`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PendingForm {
    pub id: i64,
    pub server: String,
    /// From the server: untrusted text, shown as text and labelled as the server's.
    pub message: String,
    pub fields: Vec<form::Field>,
    pub created_at: i64,
    pub expires_at: i64,
}

impl McpManager {
    /// Forms of MCP servers waiting for an owner, oldest first.
    pub async fn forms(&self) -> Result<Vec<PendingForm>, McpError> {
        let mut conn = self.inner.db.pool.acquire().await?;
        let rows = db::mcp_elicitations::open(&mut conn, 50).await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let schema: Value = serde_json::from_str(&r.schema).ok()?;
                let fields = form::fields(&schema).ok()?;
                Some(PendingForm { id: r.id, server: r.server_id, message: r.message, fields, created_at: r.created_at, expires_at: r.expires_at })
            })
            .collect())
    }

    /// An owner's answer to a form: checked against its schema (`MCP_ELICITATION_INVALID`
    /// names the field), taken only while the form waits (`MCP_ELICITATION_CLOSED`), audited.
    pub async fn answer_form(&self, id: i64, answer: Answer, by: &AuditActor) -> Result<&'static str, McpError> {
        let mut tx = self.inner.db.begin_write().await?;
        let row = db::mcp_elicitations::get(&mut tx, id).await?.ok_or(McpError::FormUnknown(id))?;
        if !row.open(db::now_ms()) {
            return Err(McpError::FormClosed(id));
        }
        let fields = serde_json::from_str::<Value>(&row.schema).map_err(|e| e.to_string()).and_then(|s| form::fields(&s)).map_err(|_| McpError::FormClosed(id))?;
        let (new_state, content) = match answer {
            Answer::AcceptText(values) => (State::Accepted, Some(form::from_text(&fields, &values)?)),
            Answer::Accept(values) => (State::Accepted, Some(form::check(&fields, values)?)),
            Answer::Decline => (State::Declined, None),
            Answer::Cancel => (State::Cancelled, None),
        };
        let text = content.as_ref().map(|c| Value::Object(c.clone()).to_string());
        if !db::mcp_elicitations::answer(&mut tx, id, new_state, text.as_deref(), by.owner_id).await? {
            return Err(McpError::FormClosed(id));
        }
        // The values may be personal: the audit names the fields, not what was in them.
        let filled: Vec<&String> = content.as_ref().map(|c| c.keys().collect()).unwrap_or_default();
        let detail = json!({ "elicitation": id, "server": row.server_id, "answer": new_state.as_str(), "fields": filled });
        let entry = audit::AuditEntry { owner_id: by.owner_id, login: by.login.as_deref(), ip: by.ip.as_deref(), event: audit::event::MCP_ELICITATION_ANSWERED, detail: Some(detail) };
        audit::record(&mut tx, entry).await?;
        tx.commit().await?;
        self.inner.forms.answered.notify_waiters();
        Ok(new_state.as_str())
    }

    /// Where owner notices go on WhatsApp, and their words (`[mcp]` in gatehouse.toml).
    pub fn set_owner_notices(&self, notices: OwnerNotices) {
        self.inner.notices.set(notices);
    }
}
