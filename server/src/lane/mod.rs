//! The tool lane (seed 000 §5-§10): after the runtime's gates, a message the candidate detector
//! flags is planned by a model over the candidate tools only, every proposed call is validated
//! by deterministic code before anything runs or is promised, and results are summarized into a
//! WhatsApp reply.
//!
//! detector -> [`adapter`] (candidate tools as the planner sees them) -> [`planner`] (the
//! model's proposal, never trusted) -> [`validator`] (the seed's fifteen checks, through the
//! checkpoint's own gates) -> bridge and processor (jobs) -> [`summarizer`].
//!
//! Everything a model reads that did not come from Gatehouse (the person's message, chat
//! memory, tool results) is wrapped as untrusted data ([`data`]); every text a person reads
//! comes from `[lane]` in the configuration.
//!
//! Log events follow seed §17 (`AgentToolPlannerStart`, `AgentToolPlanRejected`, ...): one
//! `event` field, the correlation id, codes and counts, never message text or arguments.

pub mod adapter;
pub mod clarify;
pub mod context;
pub use crate::untrusted as data;
pub mod decide;
pub mod detector;
pub mod memory;
pub use crate::tools::job;
pub mod planner;
pub mod processor;
pub mod rerun;
mod run;
pub mod summarizer;
pub mod validator;

pub use run::Lane;

use serde::Serialize;

pub use crate::tools::canonical::canonical_json;
use detector::{ParamDoc, ToolDoc};

use crate::tools::{Catalog, catalog::Audience};

/// What the private-data guard found for the message being planned. The guard runs before the
/// lane; the planner is told the state and the validator enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PrivateData {
    /// The guard looked and no private-data category matched.
    #[default]
    Clear,
    /// Owners' messages are not guarded.
    Unguarded,
    /// The message asks for private account data of this category: only a tool tagged as
    /// reaching private data may serve it, and for a customer only with an owner's approval.
    Matched { category: String },
}

/// The catalog's tools as the detector indexes them. Withheld tools (quarantined, rejected, of
/// a disabled MCP server) are not in the catalog's list, and disabled ones are marked so, so
/// neither is ever a candidate. Managed and secret fields are not parameters the model fills,
/// so they are left out.
pub fn tool_docs(catalog: &Catalog) -> Vec<ToolDoc> {
    catalog
        .all()
        .map(|tool| {
            let s = &tool.spec;
            let params = ParamDoc::from_schema(&s.input_schema)
                .into_iter()
                .filter(|p| {
                    let root = p.name.split('.').next().unwrap_or_default();
                    !s.managed_fields.iter().any(|f| f == root) && !s.secret_fields.contains_key(root)
                })
                .collect();
            ToolDoc {
                name: s.name.clone(),
                title: s.title.clone(),
                description: s.description.clone(),
                when_to_use: s.when_to_use.clone(),
                when_not_to_use: s.when_not_to_use.clone(),
                aliases: s.aliases.clone(),
                triggers: s.triggers.clone(),
                tags: s.tags.clone(),
                params,
                owner_only: s.audience == Audience::OwnerOnly,
                chat_types: s.chat_types.clone(),
                enabled: s.enabled,
                plan_threshold: s.plan_threshold,
            }
        })
        .collect()
}
