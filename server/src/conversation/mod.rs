//! The conversation runtime. Every inbound message, from WhatsApp or the simulator, passes the
//! same steps in this order, each recorded in the message's trace with its decision, reason
//! code and timing:
//!
//! dedupe -> message type -> actor role -> group rules -> owner commands and the customer slash
//! boundary -> private-data guard -> tool lane -> (degraded mode) -> normal chat with memory.
//!
//! The channel delivers the reply the runtime returns and appends the delivery to the trace;
//! only the transport differs between channels. Tool prompts and results never enter chat
//! memory: only the person's messages and what they were sent do (the chat's replies, the tool
//! lane's replies, and the later messages a chat gets, such as a slow call's answer).

mod chat;
pub mod clock;
mod commands;
mod decide;
pub use commands::MarkTraceJob;
pub mod memory;
pub mod speakers;
pub mod steps;

use std::sync::Arc;

use serde_json::json;

pub use crate::channel::Inbound;
use decide::Decision;
use crate::{
    approvals::Approvals,
    budget::Budget,
    channel::{self, Acknowledgement, Handled, HandlerError, InboundHandler, Presence},
    config::{Secrets, Settings},
    db::{self, Db, DbError, conversation as store},
    domain::{ChatKind, Role},
    jobs::JobQueue,
    llm::ChatModel,
    owners::notices,
    telemetry::Telemetry,
    traces::{self, Ending, Recorder, Subject},
};

/// Where a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Route {
    Duplicate,
    /// A type the bot cannot read (an image, a voice note, ...).
    UnknownType,
    Ignored,
    OwnerCommand,
    CustomerCommand,
    PrivateData,
    /// A customer chat (in a group, a member) over `conversation.rate_limit` within its window,
    /// or a group over `group_rate_limit`.
    RateLimited,
    /// A customer while a spend budget is exhausted with `at_limit = "degraded"`.
    OverBudget,
    ToolLane,
    Degraded,
    Chat,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The runtime's answer for one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub route: Route,
    pub actor: Role,
    /// What to send back, if anything.
    pub reply: Option<String>,
    /// The trace of this message (for a duplicate, the first delivery's).
    pub trace_id: Option<i64>,
    pub error_code: Option<String>,
}

/// What the tool lane did with a message.
#[derive(Debug, Clone, PartialEq)]
pub enum LaneOutcome {
    NotHandled,
    /// Handled, with this reply; `private` when it holds a private-data tool's answer
    /// (`lane.private_data_tags`), which chat memory does not keep.
    Handled { reply: String, private: bool },
    /// Handled, with nothing to say now: what the person hears goes out through jobs already
    /// under way (a message handled again after its approval request was settled).
    Quiet,
    /// Not handled now, and not to be handed to normal chat either (the lane could not read
    /// what this message stored before): the message's run fails and is tried again later.
    Failed { code: &'static str, message: String },
}

/// Where the tool lane plugs in: the runtime asks it before normal chat. It records its own
/// steps in the message's trace, whose id its tool calls carry.
#[async_trait::async_trait]
pub trait ToolLane: Send + Sync {
    async fn try_handle(&self, inbound: &Inbound, actor: Role, trace: &mut Recorder) -> LaneOutcome;
}

/// A lane that hands every message on to normal chat.
#[derive(Debug, Default)]
pub struct NoToolLane;

#[async_trait::async_trait]
impl ToolLane for NoToolLane {
    async fn try_handle(&self, _inbound: &Inbound, _actor: Role, _trace: &mut Recorder) -> LaneOutcome {
        LaneOutcome::NotHandled
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The tool lane could not handle the message now ([`LaneOutcome::Failed`]).
    #[error("{code}: {message}")]
    Lane { code: &'static str, message: String },
}

impl RuntimeError {
    /// The stable code: the database's (`STORAGE_FULL`, `DATABASE_ERROR`) or the lane's.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Db(e) => e.code(),
            Self::Lane { code, .. } => code,
        }
    }
}

crate::db::from_sqlx_as_db!(RuntimeError);

/// The notice kinds recorded per chat: the unknown-type note, the rate-limit reply and the
/// owners' private-data notice go to (or for) one chat at most once per period.
const UNKNOWN_TYPE_NOTICE: &str = "unknown_type";
const RATE_LIMIT_NOTICE: &str = "rate_limited";
const PRIVATE_DATA_NOTICE: &str = "private_data";
/// The route of a trace whose handling failed ([`Runtime::end_failed`]).
const FAILED_ROUTE: &str = "error";

/// What the runtime needs, built once by the composition root.
pub struct RuntimeParts {
    pub db: Db,
    pub queue: JobQueue,
    pub settings: Arc<Settings>,
    pub secrets: Secrets,
    pub model: Arc<dyn ChatModel>,
    pub lane: Arc<dyn ToolLane>,
    /// Owners decide approvals with buttons and /approve, /reject.
    pub approvals: Arc<Approvals>,
    /// At 100% of a budget with `at_limit = "degraded"`, customers get its limit reply.
    pub budget: Arc<Budget>,
    /// Each committed trace is exported as the message's OpenTelemetry trace.
    pub telemetry: Telemetry,
}

pub struct Runtime {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
    secrets: Secrets,
    model: Arc<dyn ChatModel>,
    lane: Arc<dyn ToolLane>,
    approvals: Arc<Approvals>,
    budget: Arc<Budget>,
    telemetry: Telemetry,
    guard: steps::PrivateGuard,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("provider", &self.model.provider()).finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn new(parts: RuntimeParts) -> Self {
        let guard = steps::PrivateGuard::new(&parts.settings.private_data);
        Self { db: parts.db, queue: parts.queue, settings: parts.settings, secrets: parts.secrets, model: parts.model, lane: parts.lane, approvals: parts.approvals, budget: parts.budget, telemetry: parts.telemetry, guard }
    }

    fn text_detail(&self, text: &str) -> serde_json::Value {
        if self.settings.conversation.trace_text { json!({ "chars": text.chars().count(), "text": text }) } else { json!({ "chars": text.chars().count() }) }
    }

    /// Runs every step for `inbound` and records its trace.
    pub async fn handle(&self, inbound: &Inbound) -> Result<Outcome, RuntimeError> {
        let mut conn = self.db.pool.acquire().await?;
        // 1. Dedupe: a message handled to the end is not handled again. Its earlier reply is
        // given back, so a retried delivery sends the same answer (the ledger skips parts
        // already out) instead of asking the model twice.
        if let Some(earlier) = store::earlier_reply(&mut conn, &inbound.message_id).await? {
            return Ok(Outcome { route: Route::Duplicate, actor: Role::Customer, reply: earlier.reply, trace_id: Some(earlier.trace_id), error_code: None });
        }
        drop(conn);
        let subject = Subject {
            correlation_id: inbound.correlation_id.clone(),
            channel: inbound.channel.clone(),
            chat_id: inbound.chat_id.clone(),
            message_id: inbound.message_id.clone(),
            sender: (inbound.chat_kind == ChatKind::Group).then(|| inbound.sender.clone()),
        };
        let mut trace = {
            let mut tx = self.db.begin_write().await?;
            let trace = traces::begin(&mut tx, subject).await?;
            tx.commit().await?;
            trace
        };
        if inbound.kind.is_readable() {
            let mut first = self.text_detail(&inbound.text);
            if let Some(id) = &inbound.reply_id {
                first["reply_id"] = json!(id);
            }
            trace.step("dedupe", "new", "FIRST_DELIVERY", first);
        }

        let decided = async {
            let mut conn = self.db.pool.acquire().await?;
            let owner = db::owners::owner_by_phone(&mut conn, &inbound.sender).await?;
            drop(conn);
            let actor = if owner.is_some() { Role::Owner } else { Role::Customer };
            Ok::<_, RuntimeError>((actor, self.decide(inbound, actor, owner, &mut trace).await?))
        }
        .await;
        match decided {
            Ok((actor, decision)) => self.record(inbound, actor, decision, trace).await,
            Err(e) => {
                self.end_failed(trace, &e).await;
                Err(e)
            }
        }
    }

    /// Ends the trace of a message whose handling failed, with the steps it got to and the
    /// error's code, so that no trace is left running (a retry of the message begins its own).
    /// Best effort: when the database that failed still refuses, the trace stays running and a
    /// retry continues it.
    async fn end_failed(&self, mut trace: Recorder, e: &RuntimeError) {
        let code = e.code();
        trace.step("error", "failed", code, json!({}));
        let ending = Ending { actor: String::new(), route: FAILED_ROUTE.into(), outcome: "failed".into(), error_code: Some(code.into()) };
        let ended = async {
            let mut tx = self.db.begin_write().await?;
            let id = trace.finish(&mut tx, ending).await?;
            tx.commit().await?;
            Ok::<_, DbError>(id)
        }
        .await;
        match ended {
            Ok(id) => self.telemetry.message(id),
            Err(again) => tracing::warn!(error = %again, "the trace of a failed message could not be ended; a retry continues it"),
        }
    }

    /// Records the trace, the reply and any owner notice in one transaction: a retried message
    /// finds its reply recorded, so it neither asks the model again nor notifies twice.
    async fn record(&self, inbound: &Inbound, actor: Role, mut d: Decision, mut trace: Recorder) -> Result<Outcome, RuntimeError> {
        let mut tx = self.db.begin_write().await?;
        if let Some((kind, every)) = d.note_once {
            if !claim_once(&mut tx, &inbound.chat_id, &kind, every).await? {
                // The kind without the member it may name (a number stays out of the trace).
                trace.step("reply", "none", "NOTE_ALREADY_SENT", json!({ "note": kind.split(':').next().unwrap_or_default() }));
                d.reply = None;
            } else {
                trace.step("reply", "send", if kind == UNKNOWN_TYPE_NOTICE { "UNKNOWN_TYPE_NOTE" } else { "RATE_LIMITED_NOTE" }, json!({}));
            }
        } else if let Some(r) = &d.reply {
            trace.step("reply", "send", d.route.as_str(), self.text_detail(r));
        }
        let outcome = match (&d.reply, &d.error_code) {
            (_, Some(_)) => "failed",
            (Some(_), None) => "replied",
            // The tool lane handled it with nothing to say now: what the person hears goes out
            // through jobs already under way (a message handled again, say).
            (None, None) if d.route == Route::ToolLane => "deferred",
            (None, None) => "ignored",
        };
        let ending = Ending { actor: actor.as_str().into(), route: d.route.as_str().into(), outcome: outcome.into(), error_code: d.error_code.clone() };
        let trace_id = trace.finish(&mut tx, ending).await?;
        // Another run of this message recorded its reply first (its job was rescued from a run
        // that stalled past its lease, and both ran): that reply is the one sent, part by part
        // under the job's ledger keys, so this run's own text never mixes into it.
        let earlier = if store::record_reply(&mut tx, &inbound.message_id, d.route.as_str(), d.reply.as_deref(), trace_id, db::now_ms()).await? {
            None
        } else {
            store::earlier_reply(&mut tx, &inbound.message_id).await?
        };
        if let Some(notice) = &d.notice {
            // One notice per person per chat per period: someone asking again and again does
            // not page the owners again and again, and in a group each member who asks is
            // named (the reply promised them the owner's answer). Simulated chats notify the
            // console only, never a phone.
            let kind = if inbound.chat_kind == ChatKind::Group { format!("{PRIVATE_DATA_NOTICE}:{}", inbound.sender) } else { PRIVATE_DATA_NOTICE.to_string() };
            if claim_once(&mut tx, &inbound.chat_id, &kind, self.settings.private_data.notice_every).await? {
                notices::raise(&mut tx, &self.queue, notice, inbound.channel == channel::WHATSAPP).await?;
            } else {
                // Committed with the trace's ending, so the message's export below holds it.
                let _in_the_message = traces::append(&mut tx, trace_id, &traces::Step::new("owner_notice", "none", "NOTICE_ALREADY_RAISED", json!({}))).await?;
            }
        }
        self.queue.commit(tx).await?;
        self.telemetry.message(trace_id);
        if let Some(earlier) = earlier {
            tracing::warn!(correlation_id = %inbound.correlation_id, trace_id, "another run of this message recorded its reply first; that one is sent");
            return Ok(Outcome { route: Route::Duplicate, actor, reply: earlier.reply, trace_id: Some(earlier.trace_id), error_code: None });
        }
        Ok(Outcome { route: d.route, actor, reply: d.reply, trace_id: Some(trace_id), error_code: d.error_code })
    }
}

/// Claims `kind` for `chat_id` if it was not claimed within `every`.
async fn claim_once(conn: &mut sqlx::AnyConnection, chat_id: &str, kind: &str, every: std::time::Duration) -> Result<bool, RuntimeError> {
    let now = db::now_ms();
    let every = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
    Ok(db::whatsapp::claim_notice(conn, chat_id, kind, now.saturating_sub(every), now).await?)
}

/// The runtime as the channels' handler.
#[async_trait::async_trait]
impl InboundHandler for Runtime {
    async fn handle(&self, inbound: &Inbound, presence: &dyn Presence) -> Result<Handled, HandlerError> {
        if inbound.kind.is_readable() {
            presence.typing().await;
        }
        // The database's own code: a full disk (`STORAGE_FULL`) must not use up the message's
        // attempts, or a disk that stays full longer than the backoff discards the message.
        let outcome = Runtime::handle(self, inbound).await.map_err(|e| HandlerError { code: e.code().into(), message: e.to_string(), retryable: true })?;
        let reply = outcome.reply.filter(|r| !r.trim().is_empty());
        let acknowledgement = reply.as_deref().and_then(|r| only_acknowledges(r, &self.settings.lane));
        Ok(Handled {
            trace_id: outcome.trace_id,
            role: outcome.actor,
            route: outcome.route.as_str().into(),
            reply,
            quote: inbound.chat_kind == ChatKind::Group,
            error_code: outcome.error_code,
            acknowledgement,
        })
    }
}

/// Whether `reply` is only the lane's word that the work is under way (`pending_reply`,
/// `already_checking_reply`) or that an owner was asked (`approval_reply`), with no answer
/// joined to it: after the answer, or the owner's decision, it would be untrue.
fn only_acknowledges(reply: &str, lane: &crate::config::LaneSettings) -> Option<Acknowledgement> {
    let is = |ack: &str| !ack.trim().is_empty() && reply.trim() == ack.trim();
    if is(&lane.pending_reply) || is(&lane.already_checking_reply) {
        Some(Acknowledgement::Underway)
    } else if is(&lane.approval_reply) {
        Some(Acknowledgement::OwnerAsked)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::channel::Acknowledgement;

    #[test]
    fn only_a_bare_acknowledgement_is_one() {
        let lane = crate::config::LaneSettings {
            pending_reply: "I'm looking that up now.".into(),
            already_checking_reply: "I'm already checking that.".into(),
            approval_reply: "An owner must approve that; I have asked them.".into(),
            ..Default::default()
        };
        assert_eq!(super::only_acknowledges(&lane.pending_reply, &lane), Some(Acknowledgement::Underway));
        assert_eq!(super::only_acknowledges(&lane.approval_reply, &lane), Some(Acknowledgement::OwnerAsked), "after the decision it is untrue");
        assert_eq!(super::only_acknowledges(&format!("{}\n", lane.already_checking_reply), &lane), Some(Acknowledgement::Underway));
        let joined = format!("The returns page says: free within 30 days.\n\n{}", lane.pending_reply);
        assert_eq!(super::only_acknowledges(&joined, &lane), None, "an answer joined to it is not lost");
        assert_eq!(super::only_acknowledges("Your order has shipped.", &lane), None);
        assert_eq!(super::only_acknowledges(" ", &crate::config::LaneSettings::default()), None, "no texts, no acknowledgement");
    }
}
