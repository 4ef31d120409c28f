//! `[approvals]`: how long a tool call waits for an owner, and every word the approval path
//! says (to the owners on WhatsApp, to the person who asked). The defaults are
//! `approvals_defaults.toml` beside this file, repeated in the shipped config/gatehouse.toml so
//! owners see and can change every word; `check-config` insists on each.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::duration_str;

/// WhatsApp's limit on a reply button's title.
pub const BUTTON_TITLE_MAX: usize = 20;
/// WhatsApp's limit on an interactive message's body.
pub const BUTTON_BODY_MAX: usize = 1024;
/// The longest `ttl` whose outcome still reaches the person inside WhatsApp's 24-hour window
/// (see [`ApprovalSettings::window_warning`]).
pub const TTL_WITHIN_WINDOW: Duration = Duration::from_secs(23 * 3600);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalSettings {
    /// How long a request waits for a decision; then it expires, nothing runs, and the person
    /// who asked is told.
    #[serde(with = "duration_str")]
    pub ttl: Duration,
    /// The message every owner number gets with Approve and Reject buttons. `{id}`, `{tool}`,
    /// `{risk}`, `{args}` (secrets and personal data replaced), `{requester}`, `{reason}` and
    /// `{expires}` are filled in. Cut to WhatsApp's 1,024 characters.
    pub owner_prompt: String,
    /// Ends `{args}` when the prompt would be longer than WhatsApp's 1,024 characters: the
    /// arguments are cut, never the rest, and the owner is told. `{more}` (characters left out)
    /// and `{id}`.
    pub args_cut: String,
    /// The two button titles (at most 20 characters each).
    pub approve_button: String,
    pub reject_button: String,
    /// Told to the owner who approved; `{id}`, `{tool}`.
    pub approved_reply: String,
    /// Told to the owner who rejected; `{id}`, `{tool}`.
    pub rejected_reply: String,
    /// Told when another decision came first: `{id}`, `{state}`, `{by}` (who decided).
    pub already_decided_reply: String,
    /// Told when the request ran out of time before the decision: `{id}`.
    pub expired_reply: String,
    /// Told for an id that does not exist: `{id}`.
    pub not_found_reply: String,
    /// Told to a number that is not an owner's when it presses an approval button.
    pub not_an_owner_reply: String,
    /// Told for a button whose secret does not match (forged, or from an older message).
    pub invalid_button_reply: String,
    /// The /approve and /reject usage, for a command without a valid id.
    pub usage_reply: String,
    /// Told to the owner who decided, once the approved call ran: `{id}`, `{tool}`, `{outcome}`.
    pub outcome_notice: String,
    /// `{outcome}` of a run whose effect is unknown, of a run an owner cancelled, and of one
    /// that failed otherwise: `{code}` is the run's code. (A run that succeeded is its answer.)
    pub outcome_unknown: String,
    pub outcome_cancelled: String,
    pub outcome_failed: String,
    /// `{requester}` in `owner_prompt`, for an owner and for a customer: `{number}` is theirs.
    pub requester_owner: String,
    pub requester_customer: String,
    /// Told to the person who asked when an owner rejected the call. Promises nothing.
    pub requester_rejected: String,
    /// Told to the person who asked when no owner decided in time. Promises nothing.
    pub requester_expired: String,
    /// Why a call waits, in an owner's words, by reason code (`APPROVAL_RISK`, ...): shown as
    /// `{reason}` in `owner_prompt` and on the console's Approvals page. A code left out keeps
    /// its shipped words; a hook's reason is its own words.
    pub reasons: BTreeMap<String, String>,
}

/// The defaults, as text: every word the approval path says unless gatehouse.toml changes it.
pub const SHIPPED_DEFAULTS: &str = include_str!("approvals_defaults.toml");

/// The fields as written, for reading the embedded defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    #[serde(with = "duration_str")]
    ttl: Duration,
    owner_prompt: String,
    args_cut: String,
    approve_button: String,
    reject_button: String,
    approved_reply: String,
    rejected_reply: String,
    already_decided_reply: String,
    expired_reply: String,
    not_found_reply: String,
    not_an_owner_reply: String,
    invalid_button_reply: String,
    usage_reply: String,
    outcome_notice: String,
    outcome_unknown: String,
    outcome_cancelled: String,
    outcome_failed: String,
    requester_owner: String,
    requester_customer: String,
    requester_rejected: String,
    requester_expired: String,
    reasons: BTreeMap<String, String>,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        // Checked by a test; a broken file fails every build's tests, never a deployment.
        let w: Written = toml::from_str(SHIPPED_DEFAULTS).expect("approvals_defaults.toml is valid");
        Self {
            ttl: w.ttl,
            owner_prompt: w.owner_prompt,
            args_cut: w.args_cut,
            approve_button: w.approve_button,
            reject_button: w.reject_button,
            approved_reply: w.approved_reply,
            rejected_reply: w.rejected_reply,
            already_decided_reply: w.already_decided_reply,
            expired_reply: w.expired_reply,
            not_found_reply: w.not_found_reply,
            not_an_owner_reply: w.not_an_owner_reply,
            invalid_button_reply: w.invalid_button_reply,
            usage_reply: w.usage_reply,
            outcome_notice: w.outcome_notice,
            outcome_unknown: w.outcome_unknown,
            outcome_cancelled: w.outcome_cancelled,
            outcome_failed: w.outcome_failed,
            requester_owner: w.requester_owner,
            requester_customer: w.requester_customer,
            requester_rejected: w.requester_rejected,
            requester_expired: w.requester_expired,
            reasons: w.reasons,
        }
    }
}

/// Whether a reason is a code (`APPROVAL_RISK`: capital letters and `_`) rather than words (a
/// hook's own reason).
pub fn is_reason_code(reason: &str) -> bool {
    !reason.is_empty() && reason.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

impl ApprovalSettings {
    /// The words for reason `code`: this config's, else the shipped ones, else none (the code
    /// is then shown as it is).
    pub fn reason_words(&self, code: &str) -> Option<String> {
        static SHIPPED: std::sync::LazyLock<BTreeMap<String, String>> = std::sync::LazyLock::new(|| ApprovalSettings::default().reasons);
        self.reasons.get(code).filter(|w| !w.trim().is_empty()).or_else(|| SHIPPED.get(code)).cloned()
    }

    /// Why the person who asked may never hear how a request ended: WhatsApp's free-form
    /// messages reach a person only within 24 hours of their last message, which came just
    /// before the request. A `ttl` past 23 hours (an hour's room for the run and the send) ends
    /// requests whose outcome Meta refuses (131047), unless `whatsapp.window_template` opens
    /// the window again. For `serve`'s log and `check-config`.
    pub fn window_warning(&self, window_template: &str) -> Option<String> {
        (self.ttl > TTL_WITHIN_WINDOW && window_template.trim().is_empty()).then(|| {
            format!(
                "approvals.ttl is {}, but WhatsApp delivers a free-form message only within 24 hours of the person's last one: a request that expires or is decided later cannot be told to them. Keep approvals.ttl at 23h or less, or set whatsapp.window_template",
                humantime::format_duration(self.ttl)
            )
        })
    }

    /// Every text, by its key, for `check-config`.
    pub fn texts(&self) -> [(&'static str, &str); 20] {
        super::texts_by_key!(
            self, "approvals":
            owner_prompt, args_cut, approve_button, reject_button, approved_reply, rejected_reply,
            already_decided_reply, expired_reply, not_found_reply, not_an_owner_reply,
            invalid_button_reply, usage_reply, outcome_notice, outcome_unknown, outcome_cancelled,
            outcome_failed, requester_owner, requester_customer, requester_rejected,
            requester_expired
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{load_text, problems_at};

    /// The shipped ttl ends a request while the person can still be told; a longer one is
    /// warned about unless a template can reopen the window.
    #[test]
    fn a_ttl_past_the_whatsapp_window_is_warned_about() {
        let shipped = super::ApprovalSettings::default();
        assert_eq!(shipped.window_warning(""), None, "the shipped ttl fits the window");
        let day = load_text("[approvals]\nttl = \"24h\"\n").expect("loads").settings;
        let warning = day.approvals.window_warning(&day.whatsapp.window_template).expect("warned");
        assert!(warning.contains("approvals.ttl is 1day") && warning.contains("whatsapp.window_template"), "{warning}");
        assert_eq!(day.approvals.window_warning("reopen_chat"), None, "a template reopens the window");
    }

    /// An owner may reword one reason; the others keep their shipped words, and a key that is
    /// not a code, or empty words, is a problem `check-config` names.
    #[test]
    fn reasons_are_reworded_one_at_a_time_and_checked() {
        let loaded = load_text("[approvals.reasons]\nAPPROVAL_RISK = \"risky, so I look first\"\n").expect("loads");
        let a = &loaded.settings.approvals;
        assert_eq!(a.reason_words("APPROVAL_RISK").as_deref(), Some("risky, so I look first"));
        assert!(a.reason_words("APPROVAL_ALWAYS").is_some_and(|w| w.contains("always")), "a code left out keeps its shipped words");
        assert_eq!(a.reason_words("APPROVAL_UNKNOWN"), None);
        problems_at("[approvals.reasons]\nrisk = \"words\"\nAPPROVAL_RISK = \" \"\n", &["approvals.reasons.risk", "approvals.reasons.APPROVAL_RISK"]);
    }

    /// The owner commands' answers must be set, `/jobs` must show the jobs, and the requester's
    /// words may name only `{number}` (the prompt's own placeholders are filled in after them).
    #[test]
    fn command_answers_and_requester_words_are_checked() {
        problems_at(
            "[conversation]\njobs_reply = \"Latest\"\nstatus_reply = \" \"\n[approvals]\nrequester_customer = \"{args} +{number}\"\n",
            &["conversation.jobs_reply", "conversation.status_reply", "approvals.requester_customer"],
        );
        assert!(load_text("[approvals]\nrequester_customer = \"Kunde +{number}\"\n").is_ok());
    }

    /// The owner's prompt leaves the call's arguments room in WhatsApp's body, and shows them
    /// once (they are cut to fit once); a degraded budget warns the owners when it starts.
    #[test]
    fn the_prompt_leaves_the_arguments_room_and_a_degraded_budget_says_so() {
        let twice = "[approvals]\nowner_prompt = \"#{id} {tool}: {args} and again {args}\"\n";
        problems_at(twice, &["approvals.owner_prompt"]);
        let long = format!("[approvals]\nowner_prompt = \"#{{id}} {{tool}}: {{args}} {}\"\n", "words ".repeat(100));
        let err = problems_at(&long, &["approvals.owner_prompt"]);
        assert!(err.to_string().contains("leave the call's arguments room"), "{err}");
        problems_at("[budget]\ndaily_usd = 5.0\nat_limit = \"degraded\"\nwarn_at = [50, 80]\n", &["budget.warn_at"]);
        assert!(load_text("[budget]\ndaily_usd = 5.0\nat_limit = \"degraded\"\nwarn_at = [80, 100]\n").is_ok());
    }
}
