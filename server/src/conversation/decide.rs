//! The steps from the message type to normal chat, each recorded in the trace, and the
//! decision they come to: a reply (or none), its route, and what else it brings.

use serde_json::json;

use super::{FAILED_ROUTE, Inbound, LaneOutcome, RATE_LIMIT_NOTICE, Route, Runtime, RuntimeError, UNKNOWN_TYPE_NOTICE, steps};
use crate::{
    approvals::{ApprovalCode, Button, Verdict},
    db,
    domain::{ChatKind, Role},
    llm,
    traces::Recorder,
};

/// The decision of the steps before the reply is recorded.
pub(super) struct Decision {
    pub(super) route: Route,
    pub(super) reply: Option<String>,
    pub(super) error_code: Option<String>,
    /// Raise this notice for the owners with the reply.
    pub(super) notice: Option<db::owner_notifications::Notification>,
    /// The reply is a note (its notice kind and period) sent at most once per chat per period.
    pub(super) note_once: Option<(String, std::time::Duration)>,
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
    /// The steps from the message type to normal chat.
    pub(super) async fn decide(&self, inbound: &Inbound, actor: Role, owner_id: Option<i64>, trace: &mut Recorder) -> Result<Decision, RuntimeError> {
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
            let once = Some((UNKNOWN_TYPE_NOTICE.to_string(), self.settings.whatsapp.unknown_type_reply_every));
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
        // 4b. Rate limits: every message costs a model call. Owners are not limited. A chat
        // has `rate_limit`; in a group, each member has it, and the group as a whole
        // `group_rate_limit`, so one member sending too much does not silence the others.
        let group = inbound.chat_kind == ChatKind::Group;
        let group_limit = if group { conv.group_rate_limit } else { 0 };
        if !owner && (conv.rate_limit > 0 || group_limit > 0) {
            let since = db::now_ms().saturating_sub(i64::try_from(conv.rate_window.as_millis()).unwrap_or(i64::MAX));
            let mut conn = self.db.pool.acquire().await?;
            // Messages the bot let pass without a model (group chatter it ignored, types it cannot
            // read, owners' commands, ones it already refused) do not use up the chat's limit,
            // nor do attempts that failed (their retry is the same message).
            let uncounted = [Route::Ignored.as_str(), Route::UnknownType.as_str(), Route::OwnerCommand.as_str(), Route::RateLimited.as_str(), Route::Duplicate.as_str(), FAILED_ROUTE];
            let count = async |conn: &mut sqlx::AnyConnection, sender: Option<&str>| db::traces::count_for_chat(conn, &inbound.channel, &inbound.chat_id, sender, since, &uncounted, Role::Owner.as_str()).await;
            let recent = if conv.rate_limit > 0 { count(&mut conn, group.then_some(inbound.sender.as_str())).await? } else { 0 };
            let everyone = if group_limit > 0 { Some(count(&mut conn, None).await?) } else { None };
            drop(conn);
            let mut detail = json!({ "messages": recent, "limit": conv.rate_limit, "window_secs": conv.rate_window.as_secs() });
            if let Some(everyone) = everyone {
                detail["group_messages"] = everyone.into();
                detail["group_limit"] = group_limit.into();
            }
            // A group over its limit is told once in the window, for everyone (so no member's
            // own note follows it); a member over their own limit once, each member apart.
            let limited = if everyone.is_some_and(|n| n > i64::from(group_limit)) {
                Some(("GROUP_RATE_LIMITED", RATE_LIMIT_NOTICE.to_string()))
            } else if conv.rate_limit > 0 && recent > i64::from(conv.rate_limit) {
                Some(("RATE_LIMITED", if group { format!("{RATE_LIMIT_NOTICE}:{}", inbound.sender) } else { RATE_LIMIT_NOTICE.to_string() }))
            } else {
                None
            };
            if let Some((code, note)) = limited {
                trace.step("rate_limit", "limited", code, detail);
                return Ok(Decision { note_once: Some((note, conv.rate_window)), ..Decision::reply(Route::RateLimited, conv.rate_limited_reply.clone()) });
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
            LaneOutcome::Handled { reply, private } => {
                self.remember_lane_exchange(inbound, &reply, private).await;
                trace.step("tool_lane", "handled", "TOOL_LANE", json!({}));
                return Ok(Decision::reply(Route::ToolLane, reply));
            }
            LaneOutcome::Quiet => {
                trace.step("tool_lane", "handled", "TOOL_LANE_QUIET", json!({}));
                return Ok(Decision::silent(Route::ToolLane));
            }
            LaneOutcome::NotHandled => trace.step("tool_lane", "pass", "NOT_HANDLED", json!({})),
            LaneOutcome::Failed { code, message } => return Err(RuntimeError::Lane { code, message }),
        }
        // Degraded mode: no key for the model.
        if let Some(d) = llm::degraded(&self.settings, &self.secrets) {
            // The instruction names the deployment's settings: for the owner's direct chat only,
            // never for a group's members to read.
            let reply = if actor == Role::Owner && inbound.chat_kind == ChatKind::Direct { d.owner_instruction } else { d.customer_reply };
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
}
