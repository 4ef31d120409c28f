//! The conversation runtime. Every inbound message, from WhatsApp or the simulator, passes the
//! same steps in this order, each recorded in the message's trace with its decision, reason
//! code and timing:
//!
//! dedupe -> actor role -> group rules -> owner commands and the customer slash boundary ->
//! private-data guard -> tool lane -> (degraded mode) -> normal chat with memory.
//!
//! The channel delivers the reply the runtime returns; only the transport differs between
//! channels. Tool prompts and results never enter chat memory: only the person's messages and
//! the chat replies do.

mod inbound;
pub mod memory;
pub mod steps;

/// `Inbound::channel` of messages that came through the WhatsApp webhook.
pub const WHATSAPP_CHANNEL: &str = "whatsapp";

use std::{sync::Arc, time::Instant};

use serde_json::json;

use crate::{
    config::{Secrets, Settings},
    db::{self, Db, DbError, conversation as store, traces},
    llm::{self, ChatModel, ChatRequest, Purpose},
    tools::policy::Actor,
};

/// Direct (one person) or group chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatKind {
    #[default]
    Direct,
    Group,
}

/// A message as the runtime sees it, whatever channel it came from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inbound {
    /// `whatsapp` or `simulator`.
    pub channel: String,
    /// Unique per message (the WhatsApp wamid, or the simulator's id).
    pub message_id: String,
    pub chat_id: String,
    pub chat_kind: ChatKind,
    /// The sender's number, digits with or without '+'.
    pub sender: String,
    /// The text; for a button or list reply, the title the person chose.
    pub text: String,
    /// For a button or list reply, the id of the choice (the business's own payload).
    pub reply_id: Option<String>,
    /// The id of the message this one replies to (WhatsApp's context.id).
    pub quoted_id: Option<String>,
    /// The quoted message's text when the channel has it (a bot message it sent); otherwise the
    /// runtime looks the id up in chat memory.
    pub quoted_text: Option<String>,
    /// WhatsApp's own mention of the business number.
    pub mentions_bot: bool,
    /// It replies to one of the bot's messages.
    pub replies_to_bot: bool,
    pub correlation_id: String,
}

#[cfg(test)]
impl Inbound {
    pub(crate) fn test_default() -> Self {
        Self { channel: "simulator".into(), message_id: "m1".into(), chat_id: "c1".into(), sender: "15550001111".into(), correlation_id: "corr".into(), ..Self::default() }
    }
}

/// Where a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    Duplicate,
    Ignored,
    OwnerCommand,
    CustomerCommand,
    PrivateData,
    ToolLane,
    Degraded,
    Chat,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Ignored => "ignored",
            Self::OwnerCommand => "owner_command",
            Self::CustomerCommand => "customer_command",
            Self::PrivateData => "private_data",
            Self::ToolLane => "tool_lane",
            Self::Degraded => "degraded",
            Self::Chat => "chat",
        }
    }
}

/// The runtime's answer for one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub route: Route,
    pub actor: Actor,
    /// What to send back, if anything.
    pub reply: Option<String>,
    /// The trace of this message (`None` for a duplicate, which keeps the first one's).
    pub trace_id: Option<i64>,
    pub error_code: Option<String>,
}

/// What the tool lane did with a message.
#[derive(Debug, Clone, PartialEq)]
pub enum LaneOutcome {
    NotHandled,
    Handled { reply: String },
}

/// Where the tool lane plugs in: the runtime asks it before normal chat.
#[async_trait::async_trait]
pub trait ToolLane: Send + Sync {
    async fn try_handle(&self, inbound: &Inbound, actor: Actor) -> LaneOutcome;
}

/// The lane of this build: no message is a tool request yet.
#[derive(Debug, Default)]
pub struct NoToolLane;

#[async_trait::async_trait]
impl ToolLane for NoToolLane {
    async fn try_handle(&self, _inbound: &Inbound, _actor: Actor) -> LaneOutcome {
        LaneOutcome::NotHandled
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for RuntimeError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(DbError::from(e))
    }
}

/// Collects a message's steps and times each one.
struct Trace {
    started: Instant,
    started_at: i64,
    last: Instant,
    steps: Vec<traces::Step>,
}

impl Trace {
    fn new() -> Self {
        let now = Instant::now();
        Self { started: now, started_at: db::now_ms(), last: now, steps: Vec::new() }
    }

    fn step(&mut self, step: &str, decision: &str, reason: &str, detail: serde_json::Value) {
        let now = Instant::now();
        let duration_us = i64::try_from(now.duration_since(self.last).as_micros()).unwrap_or(i64::MAX);
        self.last = now;
        self.steps.push(traces::Step { step: step.into(), decision: decision.into(), reason_code: reason.into(), duration_us, detail: detail.to_string() });
    }
}

pub struct Runtime {
    db: Db,
    settings: Arc<Settings>,
    secrets: Secrets,
    model: Arc<dyn ChatModel>,
    lane: Arc<dyn ToolLane>,
    guard: steps::PrivateGuard,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("provider", &self.model.provider()).finish_non_exhaustive()
    }
}

impl Runtime {
    /// The runtime over the configured model, every call recorded in `llm_calls`, with this
    /// build's tool lane.
    pub fn from_config(cfg: &crate::config::LoadedConfig, db: &Db) -> Result<Self, llm::LlmError> {
        let settings = Arc::new(cfg.settings.clone());
        let model = llm::recorded(llm::from_settings(&settings, &cfg.secrets)?, db.clone(), &settings);
        Ok(Self::new(db.clone(), settings, cfg.secrets.clone(), model, Arc::new(NoToolLane)))
    }

    pub fn new(db: Db, settings: Arc<Settings>, secrets: Secrets, model: Arc<dyn ChatModel>, lane: Arc<dyn ToolLane>) -> Self {
        let guard = steps::PrivateGuard::new(&settings.private_data);
        Self { db, settings, secrets, model, lane, guard }
    }

    fn text_detail(&self, text: &str) -> serde_json::Value {
        if self.settings.conversation.trace_text { json!({ "chars": text.chars().count(), "text": text }) } else { json!({ "chars": text.chars().count() }) }
    }

    /// Runs every step for `inbound` and records its trace.
    pub async fn handle(&self, inbound: &Inbound) -> Result<Outcome, RuntimeError> {
        let mut trace = Trace::new();
        let mut conn = self.db.pool.acquire().await?;

        // 1. Dedupe: a message handled to the end is not handled again. Its earlier reply is
        // given back, so a retried delivery sends the same answer (the ledger skips parts
        // already out) instead of asking the model twice.
        if let Some(earlier) = store::earlier_reply(&mut conn, &inbound.message_id).await? {
            return Ok(Outcome { route: Route::Duplicate, actor: Actor::Customer, reply: earlier.reply, trace_id: Some(earlier.trace_id), error_code: None });
        }
        let mut first = self.text_detail(&inbound.text);
        if let Some(id) = &inbound.reply_id {
            first["reply_id"] = json!(id);
        }
        trace.step("dedupe", "new", "FIRST_DELIVERY", first);

        // 2. Actor role: a number registered on an owner account is an owner.
        let owner = db::owners::owner_by_phone(&mut conn, &inbound.sender).await?;
        let actor = if owner.is_some() { Actor::Owner } else { Actor::Customer };
        trace.step("actor", actor.as_str(), if owner.is_some() { "OWNER_NUMBER" } else { "NOT_AN_OWNER_NUMBER" }, json!({}));
        drop(conn);

        let conv = &self.settings.conversation;
        let mut owner_notice = None;
        let (route, reply, error_code) = 'decide: {
            // 3. Group rules.
            match steps::group_allows(inbound, conv.group_reply, &conv.mention_names) {
                Ok(reason) => trace.step("group", "answer", reason, json!({})),
                Err(reason) => {
                    trace.step("group", "ignore", reason, json!({}));
                    break 'decide (Route::Ignored, None, None);
                }
            }
            // 4. Owner commands and the customer slash boundary.
            match steps::slash(actor, &inbound.text) {
                steps::Slash::NotACommand => trace.step("slash", "pass", "NOT_A_COMMAND", json!({})),
                steps::Slash::CustomerRefused => {
                    trace.step("slash", "refuse", "CUSTOMER_COMMAND", json!({}));
                    break 'decide (Route::CustomerCommand, Some(conv.customer_command_reply.clone()), None);
                }
                steps::Slash::Owner(command) => {
                    let (reason, reply) = self.owner_command(&command).await?;
                    trace.step("slash", "owner_command", reason, json!({ "command": format!("{command:?}") }));
                    break 'decide (Route::OwnerCommand, Some(reply), None);
                }
            }
            // 5. Private-data guard.
            if let Some(category) = self.guard.check(actor, &inbound.text) {
                let handoff = self.settings.private_data.handoff;
                trace.step("private_data", "guard", "PRIVATE_DATA_REQUEST", json!({ "category": category, "handoff": handoff }));
                if handoff {
                    owner_notice = Some(self.private_data_notice(inbound, category));
                }
                break 'decide (Route::PrivateData, Some(self.settings.private_data.safe_reply.clone()), None);
            }
            trace.step("private_data", "pass", if actor == Actor::Owner { "OWNER_NOT_GUARDED" } else { "NO_CATEGORY_MATCHED" }, json!({}));
            // 6. The tool lane.
            match self.lane.try_handle(inbound, actor).await {
                LaneOutcome::Handled { reply } => {
                    trace.step("tool_lane", "handled", "TOOL_LANE", json!({}));
                    break 'decide (Route::ToolLane, Some(reply), None);
                }
                LaneOutcome::NotHandled => trace.step("tool_lane", "pass", "NOT_HANDLED", json!({})),
            }
            // Degraded mode: no key for the model.
            if let Some(d) = llm::degraded(&self.settings, &self.secrets) {
                let reply = if actor == Actor::Owner { d.owner_instruction } else { d.customer_reply };
                trace.step("chat", "degraded", llm::ErrorCode::NotConfigured.as_str(), json!({ "provider": d.provider }));
                break 'decide (Route::Degraded, Some(reply), Some(llm::ErrorCode::NotConfigured.as_str().to_string()));
            }
            // 7. Normal chat with memory.
            match self.chat(inbound, &mut trace).await? {
                Ok(reply) => (Route::Chat, Some(reply), None),
                Err(code) => (Route::Chat, Some(self.settings.llm.fallback_reply.clone()), Some(code)),
            }
        };
        if let Some(r) = &reply {
            trace.step("reply", "send", route.as_str(), self.text_detail(r));
        }
        let outcome = match (&reply, &error_code) {
            (_, Some(_)) => "failed",
            (Some(_), None) => "replied",
            (None, None) => "ignored",
        };
        let row = traces::TraceRow {
            id: 0,
            correlation_id: inbound.correlation_id.clone(),
            channel: inbound.channel.clone(),
            chat_id: inbound.chat_id.clone(),
            message_id: inbound.message_id.clone(),
            actor: actor.as_str().into(),
            route: route.as_str().into(),
            outcome: outcome.into(),
            error_code: error_code.clone(),
            started_at: trace.started_at,
            duration_us: i64::try_from(trace.started.elapsed().as_micros()).unwrap_or(i64::MAX),
        };
        let mut tx = self.db.begin_write().await?;
        let trace_id = traces::insert(&mut tx, &row, &trace.steps).await?;
        store::record_reply(&mut tx, &inbound.message_id, route.as_str(), reply.as_deref(), trace_id, db::now_ms()).await?;
        if let Some(notice) = &owner_notice {
            // With the trace and the reply: a retried job finds the reply recorded and does not
            // notify twice. Simulated chats notify the console only, never a real phone.
            db::owner_notifications::insert(&mut tx, notice).await?;
            if inbound.channel == WHATSAPP_CHANNEL {
                let jobs = &self.settings.jobs;
                db::owner_notifications::enqueue_deliveries(&mut tx, notice, &jobs.queue, i64::from(jobs.default_max_attempts)).await?;
            }
        }
        tx.commit().await?;
        Ok(Outcome { route, actor, reply, trace_id: Some(trace_id), error_code })
    }

    /// The owners' notice for a customer's private-data question (`private_data.owner_notice`).
    fn private_data_notice(&self, inbound: &Inbound, category: &str) -> db::owner_notifications::Notification {
        let settings = &self.settings.private_data;
        let description = settings.categories.iter().find(|c| c.name == category).map_or("", |c| c.description.as_str());
        let text: String = inbound.text.chars().take(300).collect();
        let message = settings
            .owner_notice
            .replace("{chat}", &inbound.chat_id)
            .replace("{category}", category)
            .replace("{description}", description)
            .replace("{text}", &text);
        db::owner_notifications::Notification {
            at: db::now_ms(),
            hook: "private_data".into(),
            tool: category.into(),
            reason_code: "PRIVATE_DATA_REQUEST".into(),
            message,
            correlation_id: inbound.correlation_id.clone(),
        }
    }

    async fn owner_command(&self, command: &steps::Command) -> Result<(&'static str, String), RuntimeError> {
        use steps::Command;
        let conv = &self.settings.conversation;
        Ok(match command {
            Command::Help => ("COMMAND_HELP", conv.owner_help.trim().to_string()),
            Command::Approve(_) | Command::Reject(_) => ("APPROVALS_NOT_AVAILABLE", conv.approvals_unavailable_reply.clone()),
            Command::Status => {
                let mut conn = self.db.pool.acquire().await?;
                let counts = db::jobs::counts_by_state(&mut conn).await?;
                let shown: Vec<String> = counts.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{} {n}", s.as_str())).collect();
                let degraded = llm::degraded(&self.settings, &self.secrets).map(|d| format!(" {}", d.owner_instruction)).unwrap_or_default();
                let jobs = if shown.is_empty() { "no jobs".to_string() } else { shown.join(", ") };
                ("COMMAND_STATUS", format!("Gatehouse {} is running. Jobs: {jobs}.{degraded}", env!("CARGO_PKG_VERSION")))
            }
            Command::Jobs => {
                let mut conn = self.db.pool.acquire().await?;
                let page = db::jobs::list(&mut conn, &db::jobs::JobFilter::default(), 5).await?;
                let lines: Vec<String> = page.iter().map(|j| format!("#{} {} {}", j.id, j.kind, j.state.as_str())).collect();
                ("COMMAND_JOBS", if lines.is_empty() { "No jobs yet.".to_string() } else { format!("Latest jobs:\n{}", lines.join("\n")) })
            }
            Command::Unknown(name) => ("COMMAND_UNKNOWN", format!("There is no /{name} command.\n{}", conv.owner_help.trim())),
        })
    }

    /// Normal chat: the person's turn is stored, history is assembled within the budget
    /// (compacting older turns when needed), the chat model answers, the answer is stored.
    /// The inner error is the LLM error code (the caller sends the fallback reply).
    async fn chat(&self, inbound: &Inbound, trace: &mut Trace) -> Result<Result<String, String>, RuntimeError> {
        let conv = &self.settings.conversation;
        let now = db::now_ms();
        let mut conn = self.db.pool.acquire().await?;
        let quoted = match (&inbound.quoted_text, &inbound.quoted_id) {
            (Some(text), _) => Some(text.clone()),
            (None, Some(id)) => store::text_of(&mut conn, id).await?,
            (None, None) => None,
        };
        let summary = store::summary(&mut conn, &inbound.chat_id).await?;
        let history: Vec<store::Turn> = store::turns_after(&mut conn, &inbound.chat_id, summary.as_ref().map_or(0, |s| s.covers_through))
            .await?
            .into_iter()
            .filter(|t| t.message_id != inbound.message_id)
            .collect();
        drop(conn);
        let current_tokens = memory::estimate_tokens(&inbound.text) + quoted.as_deref().map_or(0, memory::estimate_tokens);
        let budget = i64::from(conv.history_token_budget);
        let keep = usize::try_from(conv.keep_recent_turns).unwrap_or(usize::MAX);
        let (summary, turns) = match memory::plan(summary.as_ref(), &history, current_tokens, budget, keep) {
            memory::Plan::Fits => {
                trace.step("memory", "fits", "WITHIN_BUDGET", json!({ "turns": history.len(), "summary": summary.is_some() }));
                (summary, history)
            }
            memory::Plan::Compact { older, keep } => {
                let compacted = memory::summarize(self.model.as_ref(), &self.settings.models, &conv.compaction_prompt, summary.as_ref(), &older, &inbound.correlation_id).await;
                let text = compacted.as_ref().map(|res| res.text().trim().to_string()).unwrap_or_default();
                match compacted {
                    Ok(res) if !text.is_empty() => {
                        let new = store::Summary { text, covers_through: older.last().map_or(0, |t| t.id) };
                        let mut tx = self.db.begin_write().await?;
                        store::save_summary(&mut tx, &inbound.chat_id, &new, now).await?;
                        tx.commit().await?;
                        trace.step(
                            "memory",
                            "compacted",
                            "OVER_BUDGET",
                            json!({
                                "summarized_turns": older.len(), "kept_turns": keep.len(), "purpose": "compaction", "model": res.model,
                                "input_tokens": res.usage.input_tokens, "output_tokens": res.usage.output_tokens,
                                "latency_ms": u64::try_from(res.latency.as_millis()).unwrap_or(u64::MAX),
                            }),
                        );
                        (Some(new), keep)
                    }
                    other => {
                        let code = other.err().map_or_else(|| "LLM_EMPTY_SUMMARY".to_string(), |e| e.code.as_str().to_string());
                        tracing::warn!(chat = %inbound.chat_id, code = %code, "compacting chat memory failed; leaving out the oldest turns instead");
                        let mut all = older;
                        all.extend(keep);
                        let kept = memory::truncate(summary.as_ref(), all, current_tokens, budget);
                        trace.step("memory", "truncated", &code, json!({ "kept_turns": kept.len() }));
                        (summary, kept)
                    }
                }
            }
        };
        let messages = memory::messages(summary.as_ref(), &turns, &inbound.text, quoted.as_deref());
        let mut req = ChatRequest::new(&self.settings.models, Purpose::Chat, inbound.correlation_id.clone(), messages);
        if !conv.system_prompt.trim().is_empty() {
            req = req.with_system(conv.system_prompt.trim());
        }
        // The person's turn is stored before the call, so it stays in memory even if the call fails.
        let mut tx = self.db.begin_write().await?;
        let user_turn = store::NewTurn {
            chat_id: &inbound.chat_id,
            channel: &inbound.channel,
            role: store::role::USER,
            text: &inbound.text,
            message_id: &inbound.message_id,
            at: now,
            tokens: memory::estimate_tokens(&inbound.text),
        };
        store::insert_turn(&mut tx, &user_turn).await?;
        tx.commit().await?;
        let started = Instant::now();
        match self.model.chat(&req).await {
            Ok(res) => {
                let reply = res.text().trim().to_string();
                trace.step(
                    "llm",
                    "answered",
                    res.stop_reason.as_str(),
                    json!({
                        "purpose": "chat", "model": res.model, "input_tokens": res.usage.input_tokens, "output_tokens": res.usage.output_tokens,
                        "latency_ms": started.elapsed().as_millis() as u64, "attempts": res.attempts,
                    }),
                );
                if reply.is_empty() {
                    return Ok(Err("LLM_EMPTY_REPLY".into()));
                }
                let mut tx = self.db.begin_write().await?;
                let turn = store::NewTurn { role: store::role::ASSISTANT, text: &reply, tokens: memory::estimate_tokens(&reply), at: db::now_ms(), ..user_turn };
                store::insert_turn(&mut tx, &turn).await?;
                tx.commit().await?;
                Ok(Ok(reply))
            }
            Err(e) => {
                trace.step("llm", "failed", e.code.as_str(), json!({ "purpose": "chat", "model": req.model, "attempts": e.attempts }));
                Ok(Err(e.code.as_str().to_string()))
            }
        }
    }
}
