//! Tools: the catalog every tool call is checked against. Built-in, connector and MCP tools
//! share one definition type, so one checkpoint can govern them all.

pub mod catalog;

pub use catalog::{Catalog, ToolDef};
