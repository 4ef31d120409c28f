//! The tool lane: a message that needs a tool passes the candidate detector, the planner and the
//! plan validator, and every accepted call runs through the one checkpoint as a durable job.

pub mod detector;

use crate::tools::{Catalog, catalog::Audience};

use detector::{ParamDoc, ToolDoc};

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
            }
        })
        .collect()
}
