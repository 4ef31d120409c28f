//! Integration tests for the `server` crate: one binary, one module per area.

mod support;

mod auth;
mod cli;
mod jobs;
mod jobs_process;
mod migrations;
mod ops;
mod server_fns;
mod setup;
mod tools;
mod web_fetch;
mod web_search;
mod whatsapp;
