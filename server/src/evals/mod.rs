//! Self-improvement's first half (seed 000 §18): traces become findings, findings and owners'
//! marks become eval cases, and cases replay deterministically over a configuration. Repairs
//! (the repairs module) propose configuration diffs from failing cases; nothing here changes the
//! bot.

pub mod case;
pub mod findings;
pub mod judge;

pub use case::{Case, Expect, Origin};
pub use findings::{CasesError, MarkError, Pattern};
pub use judge::{CaseResult, Judge, Verdict};
