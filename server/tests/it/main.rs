//! Integration tests for the `server` crate: one binary, one module per area.

mod support;

mod auth;
mod cli;
mod connectors;
mod conversation;
mod jobs;
mod jobs_process;
mod lane;
mod llm;
mod mcp;
mod migrations;
mod ops;
mod server_fns;
mod setup;
mod tools;
mod tools_console;
mod web_fetch;
mod web_search;
mod whatsapp;
