//! Gatehouse: a WhatsApp assistant that business owners can trust. This crate holds the axum
//! server, the bot engine and the `gatehouse` command line.

pub mod bench;
pub mod channel;
pub mod cli;
pub mod config;
pub mod conversation;
pub mod db;
pub mod jobs;
pub mod lane;
pub mod llm;
pub mod owners;
pub mod telemetry;
pub mod tools;
pub mod web;
