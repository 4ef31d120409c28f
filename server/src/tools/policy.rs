//! The policy decision: allow, needs approval, or deny, each with a reason code.

use super::catalog::{Approval, ApprovalMode, Audience, Operation, Risk, ToolSpec};
use crate::domain::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    NeedsApproval { reason: &'static str },
    Deny { reason: &'static str },
}

/// Decides on a call that passed the audience and chat-type checks.
///
/// | tool approval | yolo  | auto                      | ask   |
/// |---------------|-------|---------------------------|-------|
/// | never         | allow | allow                     | ask   |
/// | ask           | allow | ask if risk is medium+    | ask   |
/// | always        | ask   | ask                       | ask   |
///
/// Independently of the mode, customers never run admin operations, and high-risk writes by
/// customers always need an owner.
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
    match (spec.approval, mode) {
        (_, ApprovalMode::Ask) => Decision::NeedsApproval { reason: "APPROVAL_MODE_ASK" },
        (Approval::Ask, ApprovalMode::Auto) if spec.risk >= Risk::Medium => Decision::NeedsApproval { reason: "APPROVAL_RISK" },
        _ => Decision::Allow,
    }
}
