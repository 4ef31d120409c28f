//! Gatehouse: a WhatsApp assistant that business owners can trust. This crate holds the axum
//! server, the bot engine and the `gatehouse` command line.

pub mod approvals;
pub mod bootstrap;
pub mod budget;
pub mod channel;
pub mod config;
pub mod conversation;
pub mod db;
pub mod domain;
pub mod evals;
pub mod events;
pub mod jobs;
pub mod lane;
pub mod llm;
pub mod owners;
pub mod redact;
pub mod repairs;
pub mod retention;
pub mod telemetry;
pub mod tools;
pub mod traces;
pub mod untrusted;
pub mod web;
