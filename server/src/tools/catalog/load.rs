//! Loading `config/tools.toml`: every tool, hook and setting checked, every problem reported
//! with its key.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use serde::Deserialize;

use super::{ApprovalMode, Audience, AuditSettings, Catalog, Operation, Provider, ToolDef, ToolSpec, compile, hash_json, valid_tool_name, version_hash};
use crate::{
    config::{Problem, ProblemCode, secrets::secret_var_problem},
    domain::ChatKind,
    tools::{connectors, hooks, schema::closed_schema, toml_file},
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(default)]
    approval_mode: ApprovalMode,
    #[serde(default)]
    tool: Vec<toml::Value>,
    #[serde(default)]
    hook: Vec<toml::Value>,
    #[serde(default)]
    audit: AuditSettings,
}

impl Catalog {
    /// Loads and checks `path`. `secret_is_set` says whether an environment variable holds a
    /// value. On failure, every problem is returned.
    pub fn load(path: &Path, secret_is_set: &dyn Fn(&str) -> bool) -> Result<Self, Vec<Problem>> {
        let problem = toml_file::problem_at(path);
        let text = toml_file::read(path, "the tools file", &problem)?;
        let mut table: toml::Table = toml_file::parse(&text, "not valid TOML", &problem)?;
        let mut problems = Vec::new();
        // Unknown top-level keys are reported with everything else, not instead of it.
        const KNOWN: [&str; 4] = ["approval_mode", "tool", "hook", "audit"];
        for key in table.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
            problems.push(problem(key.clone(), format!("unknown key; expected one of {}", KNOWN.join(", "))).coded(ProblemCode::ConfigKeyUnknown));
        }
        table.retain(|k, _| KNOWN.contains(&k));
        let file: ToolsFile = match table.try_into() {
            Ok(file) => file,
            Err(e) => {
                problems.push(problem(String::new(), e.to_string().trim().to_string()).coded(ProblemCode::of_toml(&e)));
                return Err(problems);
            }
        };

        let mut tools = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for entry in toml_file::entries::<ToolSpec>(file.tool, "tool", "name", &problem) {
            let Ok((label, spec)) = entry.map_err(|p| problems.push(p)) else { continue };
            let before = problems.len();
            let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
            if !valid_tool_name(&spec.name) {
                bad("name", "must be 1 to 64 letters, digits, '_' or '-' (Anthropic and OpenAI tool-name rules)".into());
            }
            if !seen.insert(spec.name.clone()) {
                bad("name", format!("{:?} is defined more than once", spec.name));
            }
            if spec.description.trim().is_empty() {
                bad("description", "must say what the tool does; the planner chooses tools by it".into());
            }
            if spec.provider == Provider::Builtin && spec.handler.as_deref().is_none_or(str::is_empty) {
                bad("handler", "a builtin tool must name its implementation".into());
            }
            if spec.provider != Provider::Builtin && spec.handler.is_some() {
                bad("handler", "is only read for provider = \"builtin\"; a connector tool runs its action in connectors.toml".into());
            }
            if spec.provider == Provider::Mcp {
                bad("provider", "\"mcp\" tools come from the servers in mcp.toml and are not declared here; use \"builtin\" or \"connector\"".into());
            }
            if spec.chainable && spec.operation != Operation::Read {
                bad("chainable", "only a tool with operation = \"read\" can be chained; remove it or make the tool read-only".into());
            }
            if spec.chat_types.is_empty() {
                bad("chat_types", "must allow at least one of \"direct\", \"group\"".into());
            } else if spec.audience == Audience::OwnerOnly && !spec.chat_types.contains(&ChatKind::Direct) {
                bad("chat_types", "an owner_only tool is used in owners' direct chats only (in a group everyone would read its answer); add \"direct\"".into());
            }
            if spec.timeout.is_zero() {
                bad("timeout", "must be longer than zero".into());
            }
            if spec.retry.max_attempts == 0 {
                bad("retry.max_attempts", "must be at least 1".into());
            }
            if let Some(t) = spec.plan_threshold
                && !(t > 0.0 && t < 1.0)
            {
                bad("plan_threshold", format!("must be between 0 and 1 (exclusive), not {t}"));
            }
            if spec.max_result_bytes == 0 {
                bad("max_result_bytes", "must be at least 1".into());
            }
            if let Some(template) = &spec.answer_template {
                match crate::tools::answer::parse(template) {
                    Err(e) => bad("answer_template", e),
                    Ok(_) if template.trim().is_empty() => bad("answer_template", "is empty: remove it, and the summarizer writes the reply".into()),
                    Ok(_) => {
                        // Any step of a path: a connector's values are under `data`.
                        let hidden = spec.hidden_fields();
                        for path in crate::tools::answer::paths(template) {
                            if let Some(step) = path.iter().find(|s| hidden.iter().any(|h| h.eq_ignore_ascii_case(s)) || crate::redact::is_secret_name(s)) {
                                bad("answer_template", format!("names {{{}}}: {step:?} is a managed or secret field, whose value is never shown", path.join(".")));
                            }
                            // A connector's result is its HTTP status and the JSON it answered.
                            if spec.provider == Provider::Connector && !matches!(path[0].as_str(), "data" | "status") {
                                bad("answer_template", format!("names {{{}}}, which a connector's result never has: its answer is under data ({{data.{}}})", path.join("."), path.join(".")));
                            }
                        }
                    }
                }
            }
            let closed_input_schema = closed_schema(&spec.input_schema);
            let input = if spec.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
                bad("input_schema", "must be a JSON Schema with \"type\": \"object\"".into());
                None
            } else {
                match compile(&closed_input_schema, true) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        bad("input_schema", format!("does not compile: {e}"));
                        None
                    }
                }
            };
            let output = match spec.output_schema.as_ref().map(|s| compile(s, false)) {
                Some(Err(e)) => {
                    bad("output_schema", format!("does not compile: {e}"));
                    None
                }
                Some(Ok(v)) => Some(v),
                None => None,
            };
            let properties = spec.input_schema.get("properties").and_then(|p| p.as_object());
            let declared = |field: &str| properties.is_some_and(|p| p.contains_key(field));
            for field in &spec.managed_fields {
                if !declared(field) {
                    bad("managed_fields", format!("{field:?} is not a property of input_schema"));
                }
            }
            for (field, var) in &spec.secret_fields {
                if !declared(field) {
                    bad("secret_fields", format!("{field:?} is not a property of input_schema"));
                }
                if spec.managed_fields.contains(field) {
                    bad("secret_fields", format!("{field:?} cannot be both managed and secret"));
                }
                if let Some(why) = secret_var_problem(var, !spec.enabled || secret_is_set(var)) {
                    bad("secret_fields", format!("{field:?} {why}"));
                }
            }
            if problems.len() == before
                && let Some(input_validator) = input
            {
                let version = version_hash(&spec);
                tools.insert(spec.name.clone(), ToolDef { spec, version, closed_input_schema, input_validator, output_validator: output, connector: None });
            }
        }
        // Connector actions, from connectors.toml beside this file.
        let connectors_path = path.with_file_name("connectors.toml");
        let declared: BTreeMap<String, connectors::DeclaredTool> = tools
            .values()
            .map(|t| {
                let properties = t.spec.input_schema.get("properties").and_then(|p| p.as_object()).map(|p| p.keys().cloned().collect()).unwrap_or_default();
                let secret_fields = t.spec.secret_fields.keys().cloned().collect();
                (t.spec.name.clone(), connectors::DeclaredTool { is_connector: t.spec.provider == Provider::Connector, properties, secret_fields })
            })
            .collect();
        let mut actions = BTreeMap::new();
        let mut connector_secrets = Vec::new();
        if connectors_path.is_file() {
            match connectors::load(&connectors_path, &declared, secret_is_set) {
                Ok((found, secrets)) => (actions, connector_secrets) = (found, secrets),
                Err(found) => problems.extend(found),
            }
        }
        for tool in tools.values_mut() {
            if tool.spec.provider != Provider::Connector {
                continue;
            }
            match actions.remove(&tool.spec.name) {
                Some(action) => {
                    // The version covers the HTTP action too: editing it is a new version.
                    tool.version = hash_json(&serde_json::json!({ "tool": tool.spec, "connector": *action }));
                    tool.connector = Some(action);
                }
                None if tool.spec.enabled => problems.push(problem(
                    format!("tool ({}).provider", tool.spec.name),
                    format!("no enabled action in {} runs this connector tool", connectors_path.display()),
                )),
                None => {}
            }
        }
        let tools: BTreeMap<String, Arc<ToolDef>> = tools.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        let mut hooks = Vec::new();
        for entry in toml_file::entries::<hooks::HookSpec>(file.hook, "hook", "name", &problem) {
            let Ok((label, spec)) = entry.map_err(|p| problems.push(p)) else { continue };
            for t in spec.tools.iter().filter(|t| *t != "*" && !tools.contains_key(*t) && !seen.contains(*t)) {
                problems.push(problem(format!("{label}.tools"), format!("there is no tool named {t:?}")));
            }
            if let Some(why) = spec.problem() {
                problems.push(problem(format!("{label}.kind"), why.into()));
            }
            if let Some(why) = spec.message_problem() {
                problems.push(problem(format!("{label}.message"), why.into()));
            }
            match regex::Regex::new(&spec.pattern) {
                Ok(regex) => hooks.push(hooks::Hook { spec, regex }),
                Err(e) => problems.push(problem(format!("{label}.pattern"), format!("not a regular expression: {e}"))),
            }
        }
        hooks.sort_by_key(|h| h.spec.priority);
        if problems.is_empty() { Ok(Self { approval_mode: file.approval_mode, tools, hooks, audit: file.audit, withheld: BTreeMap::new(), connector_secrets }) } else { Err(problems) }
    }
}

/// The longest a call of `spec` may take at the checkpoint: every attempt to its timeout, and
/// the doubling backoff between them.
pub fn worst_call(spec: &ToolSpec) -> std::time::Duration {
    let attempts = spec.retry.max_attempts.max(1);
    let waits = (1..attempts).fold(std::time::Duration::ZERO, |sum, n| sum.saturating_add(spec.retry.backoff.saturating_mul(1u32 << (n - 1).min(20))));
    spec.timeout.saturating_mul(attempts).saturating_add(waits)
}

/// A tool's calls run inside a `tool.call` job, which also summarises the result (`reserve`:
/// one model call and the answer's sends) within `jobs.timeouts.tool_call` (`budget`). A tool
/// whose worst call leaves less than that is cut in the middle, and its job runs the tool again.
pub fn fits_tool_call_budget(catalog: &Catalog, path: &Path, budget: std::time::Duration, reserve: std::time::Duration) -> Vec<Problem> {
    let problem = toml_file::problem_at(path);
    catalog
        .all()
        .filter(|t| t.spec.enabled && t.spec.provider != Provider::Mcp)
        .map(|t| (t, worst_call(&t.spec)))
        .filter(|(_, worst)| worst.saturating_add(reserve) > budget)
        .map(|(t, worst)| {
            problem(
                format!("tool ({}).timeout", t.spec.name),
                format!(
                    "timeout x retry.max_attempts plus the backoffs ({}), with the summary and the answer's sends ({}), must fit jobs.timeouts.tool_call in gatehouse.toml ({})",
                    humantime::format_duration(worst),
                    humantime::format_duration(reserve),
                    humantime::format_duration(budget)
                ),
            )
        })
        .collect()
}
