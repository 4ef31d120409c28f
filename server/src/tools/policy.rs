//! The policy decision: allow, needs approval, or deny, each with a reason code.

use super::catalog::{Approval, ApprovalMode, Audience, Operation, Risk, ToolSpec};
use crate::domain::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    NeedsApproval { reason: &'static str },
    Deny { reason: &'static str },
}

/// Decides on a call that passed the audience and chat-type checks (seed 001's approval modes:
/// YOLO approves everything, AUTO asks for medium and high risk, ASK asks for everything).
///
/// | tool approval   | yolo  | auto                   | ask                    |
/// |-----------------|-------|------------------------|------------------------|
/// | never           | allow | ask if risk is medium+ | ask if risk is medium+ |
/// | ask (default)   | allow | ask if risk is medium+ | ask                    |
/// | always          | ask   | ask                    | ask                    |
///
/// `never` only exempts a tool from ASK mode's blanket question; it cannot lower the risk rule.
/// Independently of the mode, customers never run admin operations or owner-only tools, and
/// customers' high-risk writes always need an owner, YOLO included.
pub fn decide(spec: &ToolSpec, mode: ApprovalMode, actor: Role) -> Decision {
    if actor == Role::Customer && spec.operation == Operation::Admin {
        return Decision::Deny { reason: "POLICY_ADMIN_OWNER_ONLY" };
    }
    if actor == Role::Customer && spec.audience == Audience::OwnerOnly {
        return Decision::Deny { reason: "POLICY_OWNER_ONLY" };
    }
    if spec.approval == Approval::Always {
        return Decision::NeedsApproval { reason: "APPROVAL_ALWAYS" };
    }
    if actor == Role::Customer && spec.operation == Operation::Write && spec.risk == Risk::High {
        return Decision::NeedsApproval { reason: "APPROVAL_CUSTOMER_HIGH_RISK_WRITE" };
    }
    match (mode, spec.approval) {
        (ApprovalMode::Yolo, _) => Decision::Allow,
        (ApprovalMode::Ask, Approval::Ask) => Decision::NeedsApproval { reason: "APPROVAL_MODE_ASK" },
        (ApprovalMode::Auto | ApprovalMode::Ask, _) if spec.risk >= Risk::Medium => Decision::NeedsApproval { reason: "APPROVAL_RISK" },
        _ => Decision::Allow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(approval: Approval, risk: Risk, operation: Operation, audience: Audience) -> ToolSpec {
        let mut spec: ToolSpec = toml::from_str(
            r#"
name = "t"
title = "T"
description = "d"
provider = "builtin"
handler = "h"
operation = "read"
audience = "public"
risk = "low"
input_schema = { type = "object" }
"#,
        )
        .expect("spec");
        (spec.approval, spec.risk, spec.operation, spec.audience) = (approval, risk, operation, audience);
        spec
    }

    /// The whole table, mode × tool approval × risk × actor (× operation and audience for the
    /// customer rules), written out independently of `decide`'s structure.
    #[test]
    fn the_approval_table() {
        use Approval as A;
        use ApprovalMode as M;
        use Risk as R;
        let mut rows = 0;
        for mode in [M::Yolo, M::Auto, M::Ask] {
            for approval in [A::Never, A::Ask, A::Always] {
                for risk in [R::Low, R::Medium, R::High] {
                    for operation in [Operation::Read, Operation::Write, Operation::Admin] {
                        for audience in [Audience::Public, Audience::OwnerOnly] {
                            for actor in [Role::Owner, Role::Customer] {
                                rows += 1;
                                let got = decide(&spec(approval, risk, operation, audience), mode, actor);
                                let customer = actor == Role::Customer;
                                let expected = if customer && (operation == Operation::Admin || audience == Audience::OwnerOnly) {
                                    "deny"
                                } else if approval == A::Always || (customer && operation == Operation::Write && risk == R::High) {
                                    "ask"
                                } else {
                                    match mode {
                                        M::Yolo => "allow",
                                        M::Auto => if risk == R::Low { "allow" } else { "ask" },
                                        M::Ask => if approval == A::Never && risk == R::Low { "allow" } else { "ask" },
                                    }
                                };
                                let got_kind = match got {
                                    Decision::Allow => "allow",
                                    Decision::NeedsApproval { .. } => "ask",
                                    Decision::Deny { .. } => "deny",
                                };
                                assert_eq!(got_kind, expected, "{mode:?} {approval:?} {risk:?} {operation:?} {audience:?} {actor:?}");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(rows, 3 * 3 * 3 * 3 * 2 * 2);
        // The seed's AUTO row, named: medium and high risk ask even for a tool marked "never".
        assert!(matches!(decide(&spec(A::Never, R::Medium, Operation::Read, Audience::Public), M::Auto, Role::Owner), Decision::NeedsApproval { reason: "APPROVAL_RISK" }));
        assert_eq!(decide(&spec(A::Ask, R::Low, Operation::Read, Audience::Public), M::Auto, Role::Customer), Decision::Allow);
    }

    /// Owners read why a call waits in words: every reason the table can give has shipped ones.
    #[test]
    fn every_approval_reason_has_words() {
        let shipped = crate::config::approvals::ApprovalSettings::default();
        let mut reasons = std::collections::BTreeSet::new();
        for mode in [ApprovalMode::Yolo, ApprovalMode::Auto, ApprovalMode::Ask] {
            for approval in [Approval::Never, Approval::Ask, Approval::Always] {
                for risk in [Risk::Low, Risk::Medium, Risk::High] {
                    for operation in [Operation::Read, Operation::Write] {
                        for actor in [Role::Owner, Role::Customer] {
                            if let Decision::NeedsApproval { reason } = decide(&spec(approval, risk, operation, Audience::Public), mode, actor) {
                                reasons.insert(reason);
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        for reason in reasons {
            assert!(shipped.reason_words(reason).is_some_and(|w| !w.contains(reason)), "{reason} has no words in approvals_defaults.toml");
        }
    }
}
