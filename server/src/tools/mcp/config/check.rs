//! Loading `mcp.toml`: every server checked on its own, every problem reported with its key.

use std::{collections::BTreeSet, path::Path};

use serde::Deserialize;

use super::{AuthMode, ElicitationPolicy, MAX_TOOLS_LIMIT, McpConfig, OAuthClient, ServerConfig, Transport, Trust, ValueOrSecret};
use crate::{
    config::{
        Problem,
        secrets::{is_env_name, secret_var_problem},
    },
    tools::toml_file,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpFile {
    #[serde(default)]
    server: Vec<toml::Value>,
}

/// Server ids become tool-name prefixes, so they are short and plain.
pub fn valid_server_id(id: &str) -> bool {
    (1..=24).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// Loads and checks `path`. `secret_is_set` says whether an environment variable holds a value.
pub fn load(path: &Path, secret_is_set: &dyn Fn(&str) -> bool) -> Result<McpConfig, Vec<Problem>> {
    let problem = toml_file::problem_at(path);
    let text = toml_file::read(path, "the MCP servers file", &problem)?;
    let file: McpFile = toml_file::parse(&text, "not an MCP servers file", &problem)?;

    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in toml_file::entries::<ServerConfig>(file.server, "server", "id", &problem) {
        let Ok((label, server)) = entry.map_err(|p| problems.push(p)) else { continue };
        let before = problems.len();
        let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
        if !valid_server_id(&server.id) {
            bad("id", "must be 1 to 24 lower-case letters, digits or '-', starting with a letter or digit".into());
        }
        if !seen.insert(server.id.clone()) {
            bad("id", format!("{:?} is used by more than one server", server.id));
        }
        if !(1..=MAX_TOOLS_LIMIT).contains(&server.max_tools) {
            bad("max_tools", format!("must be 1 to {MAX_TOOLS_LIMIT}"));
        }
        if server.call_timeout.is_zero() {
            bad("call_timeout", "must be longer than zero".into());
        }
        if server.ping_interval.is_zero() {
            bad("ping_interval", "must be longer than zero".into());
        }
        match (server.elicitation, server.elicitation_ttl) {
            (_, Some(ttl)) if ttl.is_zero() => bad("elicitation_ttl", "must be longer than zero".into()),
            (ElicitationPolicy::Decline, Some(_)) => bad("elicitation_ttl", "is only read with elicitation = \"owner\"".into()),
            _ => {}
        }
        let d = &server.discovery;
        if d.timeout.is_zero() {
            bad("discovery.timeout", "must be longer than zero".into());
        }
        if d.max_pages == 0 {
            bad("discovery.max_pages", "must be at least 1".into());
        }
        if d.max_schema_bytes < 64 {
            bad("discovery.max_schema_bytes", "must be at least 64".into());
        }
        if d.max_description_chars == 0 {
            bad("discovery.max_description_chars", "must be at least 1".into());
        }
        if server.trust == Trust::Untrusted && !server.destructive_needs_approval {
            bad("destructive_needs_approval", "only a trusted server may run destructive tools without an owner's approval".into());
        }
        for (field, list) in [("allow_tools", &server.allow_tools), ("deny_tools", &server.deny_tools)] {
            if list.iter().any(|p| p.trim().is_empty()) {
                bad(field, "holds an empty name".into());
            }
        }
        match &server.transport {
            Transport::Stdio { command, env, cwd, .. } => {
                if command.trim().is_empty() {
                    bad("transport.command", "must name the program to start".into());
                }
                for name in env.keys().filter(|n| !is_env_name(n)) {
                    bad("transport.env", format!("{name:?} is not a valid environment variable name"));
                }
                if let Some(dir) = cwd.as_ref().filter(|d| server.enabled && !d.is_dir()) {
                    bad("transport.cwd", format!("{} is not a folder", dir.display()));
                }
            }
            Transport::Http { url, headers } => {
                let ok = url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
                if !ok {
                    bad("transport.url", format!("{:?} is not an http(s) URL", crate::config::load::display_url(url)));
                }
                for name in headers.keys().filter(|n| http::HeaderName::from_bytes(n.as_bytes()).is_err()) {
                    bad("transport.headers", format!("{name:?} is not a valid HTTP header name"));
                }
                for (name, value) in headers {
                    if let ValueOrSecret::Plain(v) = value
                        && http::HeaderValue::from_str(v).is_err()
                    {
                        bad("transport.headers", format!("the value of {name:?} is not a valid HTTP header value"));
                    }
                }
            }
        }
        if server.auth == AuthMode::Oauth {
            if server.transport.kind() != "http" {
                bad("auth", "\"oauth\" needs an http transport (a stdio server gets its credentials through env)".into());
            }
            if let Some(ValueOrSecret::Plain(_)) = &server.oauth.client_secret {
                bad("oauth.client_secret", "must be { secret = \"VAR\" }: a secret is never written in the file".into());
            }
            if server.oauth.client_secret.is_some() && server.oauth.client_id.is_none() {
                bad("oauth.client_secret", "needs oauth.client_id".into());
            }
            if server.oauth.client_id.as_deref().is_some_and(|c| c.trim().is_empty()) {
                bad("oauth.client_id", "is empty".into());
            }
            if server.oauth.scopes.iter().any(|s| s.is_empty() || s.contains(char::is_whitespace)) {
                bad("oauth.scopes", "holds an empty scope or one with spaces".into());
            }
        } else if server.oauth != OAuthClient::default() {
            bad("oauth", "is only read with auth = \"oauth\"".into());
        }
        // Every server's names are names (a secret pasted in place of one is refused, and never
        // shown); an enabled server's are set.
        for var in server.secret_vars() {
            if let Some(why) = secret_var_problem(var, !server.enabled || secret_is_set(var)) {
                bad("transport", why);
            }
        }
        if problems.len() == before {
            servers.push(server);
        }
    }
    if problems.is_empty() { Ok(McpConfig { servers }) } else { Err(problems) }
}

/// A call of a server may take its `call_timeout`, plus `elicitation_ttl` when its forms wait
/// for an owner, plus the second the checkpoint adds to the server's own deadline; the
/// tool.call job that runs it must have that time and `reserve` (the summary and the answer's
/// sends) within `jobs.timeouts.tool_call`. A call that outlives its job is given up in the
/// middle, and the job's retry calls the tool again (a write, perhaps, twice).
pub fn fits_tool_call_budget(config: &McpConfig, path: &Path, tool_call: std::time::Duration, reserve: std::time::Duration) -> Vec<Problem> {
    let problem = toml_file::problem_at(path);
    let worst = |s: &ServerConfig| s.call_deadline().saturating_add(std::time::Duration::from_secs(1));
    config
        .servers
        .iter()
        .filter(|s| s.enabled && worst(s).saturating_add(reserve) > tool_call)
        .map(|s| {
            let (key, what) = if s.elicitation == ElicitationPolicy::Owner { ("elicitation_ttl", "call_timeout + elicitation_ttl") } else { ("call_timeout", "call_timeout") };
            problem(
                format!("server ({}).{key}", s.id),
                format!(
                    "{what} and a second ({}), with the summary and the answer's sends ({}), must fit jobs.timeouts.tool_call in gatehouse.toml ({})",
                    humantime::format_duration(worst(s)),
                    humantime::format_duration(reserve),
                    humantime::format_duration(tool_call)
                ),
            )
        })
        .collect()
}
