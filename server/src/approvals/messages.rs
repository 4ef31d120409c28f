//! What owners and requesters are told: the approval prompt with its buttons, the replies to a
//! decision or an error, and the buttons' ids.

use super::{ApprovalError, Approvals, Decided};
use crate::{
    db::approvals::{ApprovalRow, State},
    domain::Role,
};

/// The prefix of an approval button's id: `gh-approval:{id}:{approve|reject}:{nonce}`.
const BUTTON_PREFIX: &str = "gh-approval:";

/// A pressed approval button, as parsed from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub id: i64,
    pub approve: bool,
    pub nonce: String,
}

impl Button {
    pub fn id_for(approval_id: i64, approve: bool, nonce: &str) -> String {
        format!("{BUTTON_PREFIX}{approval_id}:{}:{nonce}", if approve { "approve" } else { "reject" })
    }

    /// `Some` for an id that has the shape of an approval button (which says nothing about
    /// whether it is genuine).
    pub fn parse(reply_id: &str) -> Option<Self> {
        let rest = reply_id.strip_prefix(BUTTON_PREFIX)?;
        let mut parts = rest.splitn(3, ':');
        let id = parts.next()?.parse().ok()?;
        let approve = match parts.next()? {
            "approve" => true,
            "reject" => false,
            _ => return None,
        };
        Some(Self { id, approve, nonce: parts.next()?.to_string() })
    }
}

impl Approvals {
    /// The owner's WhatsApp message for approval `row`, with its buttons.
    pub fn prompt(&self, row: &ApprovalRow) -> (String, Vec<(String, String)>) {
        let a = &self.settings.approvals;
        let requester = if row.actor == Role::Owner.as_str() { &a.requester_owner } else { &a.requester_customer };
        let requester = requester.trim().replace("{number}", row.sender.trim_start_matches('+'));
        let expires = chrono_like(row.expires_at);
        // `{args}` last: a customer's argument that reads "{reason}" stays as it is.
        let framed = a
            .owner_prompt
            .trim()
            .replace("{id}", &row.id.to_string())
            .replace("{tool}", &row.tool)
            .replace("{risk}", &row.risk)
            .replace("{requester}", &requester)
            .replace("{reason}", &row.reason)
            .replace("{expires}", &expires);
        let fill = |args: &str| framed.replace("{args}", args);
        // Stored so since the display was; requests stored before, too.
        let display = crate::untrusted::escape_unseen(&row.display);
        let mut text = fill(&display);
        let max = crate::config::approvals::BUTTON_BODY_MAX;
        if text.chars().count() > max {
            // WhatsApp cuts the body at its limit: the arguments are cut here instead, saying
            // so, so that the owner never reads a call that looks whole and is not.
            let total = display.chars().count();
            let cut = |more: usize| a.args_cut.replace("{more}", &more.to_string()).replace("{id}", &row.id.to_string());
            let room = max.saturating_sub(fill("").chars().count() + cut(total).chars().count());
            let shown = crate::untrusted::json_prefix(&display, room);
            text = fill(&format!("{shown}{}", cut(total - shown.chars().count())));
        }
        let buttons = vec![
            (Button::id_for(row.id, true, &row.nonce), a.approve_button.trim().to_string()),
            (Button::id_for(row.id, false, &row.nonce), a.reject_button.trim().to_string()),
        ];
        (text, buttons)
    }

    /// The words for an approval error, for the owner who tried.
    pub fn error_reply(&self, e: &ApprovalError) -> String {
        let a = &self.settings.approvals;
        match e {
            ApprovalError::NotFound(id) => a.not_found_reply.replace("{id}", &id.to_string()),
            ApprovalError::AlreadyDecided { id, state, by } => a.already_decided_reply.replace("{id}", &id.to_string()).replace("{state}", state.as_str()).replace("{by}", by),
            ApprovalError::Expired(id) => a.expired_reply.replace("{id}", &id.to_string()),
            ApprovalError::InvalidButton(_) => a.invalid_button_reply.clone(),
            other => format!("{other}"),
        }
    }

    /// The words for a decision this owner made.
    pub fn decided_reply(&self, d: &Decided) -> String {
        let a = &self.settings.approvals;
        let text = if d.approval.state == State::Approved { &a.approved_reply } else { &a.rejected_reply };
        text.replace("{id}", &d.approval.id.to_string()).replace("{tool}", &d.approval.tool)
    }
}

/// A unix-ms time as "2026-11-30T14:05:00Z".
fn chrono_like(at_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(at_ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}
