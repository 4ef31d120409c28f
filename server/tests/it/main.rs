//! Integration tests for the `server` crate: one binary, one module per area.

mod support;

mod approvals;
mod auth;
mod cli;
mod chains;
mod connectors;
mod followups;
mod hardening;
mod conversation;
mod evals;
mod events;
mod jobs;
mod jobs_process;
mod jobs_race;
mod lane;
mod lane_e2e;
mod llm;
mod mcp;
mod mcp_elicitation;
mod mcp_hardening;
mod mcp_oauth;
mod mcp_oauth_console;
mod mcp_oauth_fake;
mod migrations;
mod ops;
mod otel;
mod procs;
mod props;
mod server_fns;
mod setup;
mod tools;
mod tools_console;
mod web_fetch;
mod web_search;
mod whatsapp;
