//! The conversation runtime. Every inbound message, from WhatsApp or the simulator, passes the
//! same steps in this order, each recorded in the message's trace with its decision, reason
//! code and timing:
//!
//! dedupe -> message type -> actor role -> group rules -> owner commands and the customer slash
//! boundary -> private-data guard -> tool lane -> (degraded mode) -> normal chat with memory.
//!
//! The channel delivers the reply the runtime returns and appends the delivery to the trace;
//! only the transport differs between channels. Tool prompts and results never enter chat
//! memory: only the person's messages and the chat replies do.

mod chat;
mod commands;
pub use commands::MarkTraceJob;
pub mod memory;
pub mod speakers;
pub mod steps;

use std::sync::Arc;

use serde_json::json;

pub use crate::channel::Inbound;
use crate::{
    approvals::{ApprovalCode, Approvals, Button, Verdict},
    budget::Budget,
    channel::{self, Handled, HandlerError, InboundHandler, Presence},
    config::{Secrets, Settings},
    db::{self, Db, DbError, conversation as store},
    domain::{ChatKind, Role},
    jobs::JobQueue,
    llm::{self, ChatModel},
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
    /// A customer chat over `conversation.rate_limit` within its window.
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
    Handled { reply: String },
    /// Handled, with nothing to say now: what the person hears goes out through jobs already
    /// under way (a message handled again after its approval request was settled).
    Quiet,
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

/// The decision of the steps before the reply is recorded.
struct Decision {
    route: Route,
    reply: Option<String>,
    error_code: Option<String>,
    /// Raise this notice for the owners with the reply.
    notice: Option<db::owner_notifications::Notification>,
    /// The reply is a note (its notice kind and period) sent at most once per chat per period.
    note_once: Option<(&'static str, std::time::Duration)>,
}

impl Decision {
    fn reply(route: Route, reply: String) -> Self {
        Self { route, reply: Some(reply), error_code: None, notice: None, note_once: None }
    }

    fn silent(route: Route) -> Self {
        Self { route, reply: None, error_code: None, notice: None, note_once: None }
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
        let RuntimeError::Db(db_error) = e;
        let code = db_error.code();
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

    /// The steps from the message type to normal chat.
    async fn decide(&self, inbound: &Inbound, actor: Role, owner_id: Option<i64>, trace: &mut Recorder) -> Result<Decision, RuntimeError> {
        let owner = owner_id.is_some();
        // 2. Message type: what the bot cannot read gets the configured note (the trace's first
        // step: there is no text to dedupe or guard).
        if !inbound.kind.is_readable() {
            if self.settings.whatsapp.silent_types.iter().any(|t| t == inbound.kind.as_str()) {
                trace.step("message_type", "ignored", "SILENT_TYPE", json!({ "type": inbound.kind.as_str() }));
                return Ok(Decision::silent(Route::UnknownType));
            }
            trace.step("message_type", "not_read", "UNSUPPORTED_TYPE", json!({ "type": inbound.kind.as_str() }));
            // In a group the note is an answer like any other: it follows the group rules.
            let conv = &self.settings.conversation;
            if let Err(reason) = steps::group_allows(inbound, conv.group_reply, &conv.mention_names) {
                trace.step("group", "ignore", reason, json!({}));
                return Ok(Decision::silent(Route::Ignored));
            }
            let note = self.settings.whatsapp.unknown_type_reply.trim();
            if note.is_empty() {
                trace.step("reply", "none", "NO_NOTE_CONFIGURED", json!({}));
                return Ok(Decision::silent(Route::UnknownType));
            }
            let once = Some((UNKNOWN_TYPE_NOTICE, self.settings.whatsapp.unknown_type_reply_every));
            return Ok(Decision { note_once: once, ..Decision::reply(Route::UnknownType, note.to_string()) });
        }
        // A text with nothing in it (spaces, or only a NUL the intake removed) has nothing to
        // answer; stored in memory, its empty turn would make every later model call invalid.
        // A button press is read by its id, whatever its title.
        if inbound.text.trim().is_empty() && inbound.reply_id.is_none() {
            trace.step("message_type", "empty", "EMPTY_TEXT", json!({ "type": inbound.kind.as_str() }));
            return Ok(Decision::silent(Route::UnknownType));
        }
        // 3. Actor role: a number registered on an owner account is an owner.
        trace.step("actor", actor.as_str(), if owner { "OWNER_NUMBER" } else { "NOT_AN_OWNER_NUMBER" }, json!({}));
        let conv = &self.settings.conversation;
        // 4. Group rules.
        match steps::group_allows(inbound, conv.group_reply, &conv.mention_names) {
            Ok(reason) => trace.step("group", "answer", reason, json!({})),
            Err(reason) => {
                trace.step("group", "ignore", reason, json!({}));
                return Ok(Decision::silent(Route::Ignored));
            }
        }
        // 4b. Per-chat rate limit: every message costs a model call. Owners are not limited.
        if !owner && conv.rate_limit > 0 {
            let since = db::now_ms().saturating_sub(i64::try_from(conv.rate_window.as_millis()).unwrap_or(i64::MAX));
            let mut conn = self.db.pool.acquire().await?;
            // Messages the bot let pass without a model (group chatter it ignored, types it cannot
            // read, owners' commands, ones it already refused) do not use up the chat's limit,
            // nor do attempts that failed (their retry is the same message).
            let uncounted = [Route::Ignored.as_str(), Route::UnknownType.as_str(), Route::OwnerCommand.as_str(), Route::RateLimited.as_str(), Route::Duplicate.as_str(), FAILED_ROUTE];
            let recent = db::traces::count_for_chat(&mut conn, &inbound.channel, &inbound.chat_id, since, &uncounted, Role::Owner.as_str()).await?;
            drop(conn);
            let detail = json!({ "messages": recent, "limit": conv.rate_limit, "window_secs": conv.rate_window.as_secs() });
            if recent > i64::from(conv.rate_limit) {
                trace.step("rate_limit", "limited", "RATE_LIMITED", detail);
                let once = Some((RATE_LIMIT_NOTICE, conv.rate_window));
                return Ok(Decision { note_once: once, ..Decision::reply(Route::RateLimited, conv.rate_limited_reply.clone()) });
            }
            trace.step("rate_limit", "pass", "WITHIN_LIMIT", detail);
        }
        // 5. Approval buttons, owner commands and the customer slash boundary.
        if let Some(button) = inbound.reply_id.as_deref().and_then(Button::parse) {
            let Some(owner_id) = owner_id else {
                trace.step("approval", "refuse", ApprovalCode::NotAnOwner.as_str(), json!({ "approval_id": button.id }));
                return Ok(Decision::reply(Route::CustomerCommand, self.approvals.settings().not_an_owner_reply.clone()));
            };
            let verdict = if button.approve { Verdict::Approve } else { Verdict::Reject { reason: None } };
            let (code, reply) = self.decide_approval(button.id, verdict, owner_id, inbound, Some(&button.nonce)).await?;
            trace.step("approval", if button.approve { "approve" } else { "reject" }, code, json!({ "approval_id": button.id, "via": "button" }));
            return Ok(Decision::reply(Route::OwnerCommand, reply));
        }
        match steps::slash(actor, inbound.chat_kind, &inbound.text) {
            steps::Slash::NotACommand => trace.step("slash", "pass", "NOT_A_COMMAND", json!({})),
            steps::Slash::CustomerRefused => {
                trace.step("slash", "refuse", "CUSTOMER_COMMAND", json!({}));
                return Ok(Decision::reply(Route::CustomerCommand, conv.customer_command_reply.clone()));
            }
            steps::Slash::OwnerInGroup => {
                trace.step("slash", "refuse", "OWNER_COMMAND_IN_GROUP", json!({}));
                let reply = conv.group_owner_command_reply.trim();
                return Ok(if reply.is_empty() { Decision::silent(Route::OwnerCommand) } else { Decision::reply(Route::OwnerCommand, reply.to_string()) });
            }
            steps::Slash::Owner(command) => {
                // Typed into the simulator, a command is the console owner's.
                let acting = inbound.operator.or(owner_id).unwrap_or_default();
                let (reason, reply) = self.owner_command(&command, acting, inbound, trace.id()).await?;
                trace.step("slash", "owner_command", reason, json!({ "command": command.name() }));
                return Ok(Decision::reply(Route::OwnerCommand, reply));
            }
        }
        // 6. Private-data guard.
        if let Some(category) = self.guard.check(actor, inbound.chat_kind, &inbound.text) {
            let handoff = self.settings.private_data.handoff;
            trace.step("private_data", "guard", "PRIVATE_DATA_REQUEST", json!({ "category": category, "handoff": handoff }));
            let notice = handoff.then(|| self.private_data_notice(inbound, category));
            return Ok(Decision { notice, ..Decision::reply(Route::PrivateData, self.settings.private_data.safe_reply.clone()) });
        }
        let unguarded = actor == Role::Owner && inbound.chat_kind == ChatKind::Direct;
        trace.step("private_data", "pass", if unguarded { "OWNER_NOT_GUARDED" } else { "NO_CATEGORY_MATCHED" }, json!({}));
        // 6b. Spend budget: past 100% with at_limit = "degraded", customers get no model call.
        if let Some(period) = self.budget.limit_for(actor).await? {
            let detail = json!({ "period": period.key, "spent_usd": crate::budget::usd(period.spent_micro_usd), "budget_usd": crate::budget::usd(period.budget_micro_usd) });
            trace.step("budget", "limit", "BUDGET_EXHAUSTED", detail);
            return Ok(Decision::reply(Route::OverBudget, self.budget.limit_reply().to_string()));
        }
        // 7. The tool lane.
        match self.lane.try_handle(inbound, actor, trace).await {
            LaneOutcome::Handled { reply } => {
                trace.step("tool_lane", "handled", "TOOL_LANE", json!({}));
                return Ok(Decision::reply(Route::ToolLane, reply));
            }
            LaneOutcome::Quiet => {
                trace.step("tool_lane", "handled", "TOOL_LANE_QUIET", json!({}));
                return Ok(Decision::silent(Route::ToolLane));
            }
            LaneOutcome::NotHandled => trace.step("tool_lane", "pass", "NOT_HANDLED", json!({})),
        }
        // Degraded mode: no key for the model.
        if let Some(d) = llm::degraded(&self.settings, &self.secrets) {
            let reply = if actor == Role::Owner { d.owner_instruction } else { d.customer_reply };
            let code = llm::ErrorCode::NotConfigured.as_str();
            trace.step("chat", "degraded", code, json!({ "provider": d.provider }));
            return Ok(Decision { error_code: Some(code.to_string()), ..Decision::reply(Route::Degraded, reply) });
        }
        // 8. Normal chat with memory.
        Ok(match self.chat(inbound, trace).await? {
            Ok(reply) => Decision::reply(Route::Chat, reply),
            Err(code) => Decision { error_code: Some(code), ..Decision::reply(Route::Chat, self.settings.llm.fallback_reply.clone()) },
        })
    }

    /// Records the trace, the reply and any owner notice in one transaction: a retried message
    /// finds its reply recorded, so it neither asks the model again nor notifies twice.
    async fn record(&self, inbound: &Inbound, actor: Role, mut d: Decision, mut trace: Recorder) -> Result<Outcome, RuntimeError> {
        let mut tx = self.db.begin_write().await?;
        if let Some((kind, every)) = d.note_once {
            if !claim_once(&mut tx, &inbound.chat_id, kind, every).await? {
                trace.step("reply", "none", "NOTE_ALREADY_SENT", json!({ "note": kind }));
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
            // One notice per chat per period: a chat asking again and again does not page the
            // owners again and again. Simulated chats notify the console only, never a phone.
            if claim_once(&mut tx, &inbound.chat_id, PRIVATE_DATA_NOTICE, self.settings.private_data.notice_every).await? {
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
        let outcome = Runtime::handle(self, inbound).await.map_err(|RuntimeError::Db(e)| HandlerError { code: e.code().into(), message: e.to_string(), retryable: true })?;
        Ok(Handled {
            trace_id: outcome.trace_id,
            role: outcome.actor,
            route: outcome.route.as_str().into(),
            reply: outcome.reply.filter(|r| !r.trim().is_empty()),
            quote: inbound.chat_kind == ChatKind::Group,
            error_code: outcome.error_code,
        })
    }
}
