//! Tools: the catalog every tool call is checked against, and the one checkpoint every call
//! passes. Built-in, connector and MCP tools share one definition type.

pub mod breaker;
pub mod builtins;
pub mod catalog;
pub mod checkpoint;
pub mod policy;

pub use catalog::{Catalog, ToolDef};
pub use checkpoint::{CallContext, Checkpoint, ToolCall, ToolError, ToolExecutor};
