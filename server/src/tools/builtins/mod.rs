//! Built-in tool implementations, registered with the checkpoint by handler id. Which tools use
//! them (names, descriptions, policies) is configuration, in config/tools.toml.

pub mod host_rules;
pub mod html;
pub mod net_guard;
pub mod read_result;
pub mod web_fetch;
pub mod web_search;

/// The handler ids this build implements, what a builtin tool's `handler` may name.
pub const HANDLERS: [&str; 3] = [web_fetch::HANDLER, web_search::HANDLER, read_result::HANDLER];
