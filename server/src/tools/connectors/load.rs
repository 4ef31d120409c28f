//! Loading `config/connectors.toml`: every problem reported with its key, each action bound
//! to its catalog tool.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use serde::Deserialize;

use super::{
    ConnectorAction, ConnectorCode, ConnectorSecrets, ConnectorSpec, DeclaredTool, Method, compile_allowed,
    template::{args_in, body_strings, secrets_in},
};
use crate::{
    config::{
        Problem,
        secrets::{is_env_name, secret_var_problem},
    },
    tools::toml_file,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectorsFile {
    #[serde(default)]
    connector: Vec<toml::Value>,
}

/// What `connectors.toml` holds: the actions by tool name, and each connector's secret variables.
pub type Loaded = (BTreeMap<String, Arc<ConnectorAction>>, Vec<ConnectorSecrets>);

/// Loads `path` and binds each action to its tool in `tools`.
pub fn load(path: &Path, tools: &BTreeMap<String, DeclaredTool>, secret_is_set: &dyn Fn(&str) -> bool) -> Result<Loaded, Vec<Problem>> {
    let problem = toml_file::problem_at(path);
    let text = toml_file::read(path, "the connectors file", &problem)?;
    let file: ConnectorsFile = toml_file::parse(&text, "not a connectors file", &problem)?;
    let mut problems = Vec::new();
    let mut actions = BTreeMap::new();
    let mut secrets = Vec::new();
    let mut ids = BTreeSet::new();
    for entry in toml_file::entries::<ConnectorSpec>(file.connector, "connector", "id", &problem) {
        let Ok((label, spec)) = entry.map_err(|p| problems.push(p)) else { continue };
        let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{field}"), message));
        if !ids.insert(spec.id.clone()) {
            bad("id", format!("{:?} is defined more than once", spec.id));
        }
        // A name that is no variable's (a pasted secret) is a problem below, and never listed.
        let vars: BTreeSet<String> = spec.headers.values().chain(spec.action.iter().flat_map(|a| a.headers.values())).filter_map(|h| secrets_in(h).ok()).flatten().filter(|v| is_env_name(v)).map(str::to_string).collect();
        secrets.push(ConnectorSecrets { connector: spec.id.clone(), enabled: spec.enabled, vars: vars.into_iter().collect() });
        match url::Url::parse(&spec.base_url) {
            Ok(u) if !matches!(u.scheme(), "http" | "https") => bad("base_url", "must be an http or https URL".into()),
            Ok(u) if u.host_str().is_none() => bad("base_url", "must name a host".into()),
            Ok(u) if !u.username().is_empty() || u.password().is_some() => bad("base_url", "must not hold credentials; use a header with ${VAR}".into()),
            Ok(u) if u.query().is_some() || u.fragment().is_some() => bad("base_url", "must not have a query or fragment".into()),
            Ok(_) => {}
            Err(e) => bad("base_url", format!("not a URL: {e}")),
        }
        if spec.allowed_urls.is_empty() {
            bad("allowed_urls", "must list at least one URL pattern requests may reach".into());
        }
        for pattern in &spec.allowed_urls {
            if !same_origin_prefix(pattern, &spec.base_url) {
                bad("allowed_urls", format!("{pattern:?} must start with the base URL's scheme and host ({})", origin_of(&spec.base_url)));
            }
        }
        if let Err(e) = compile_allowed(&spec.allowed_urls) {
            bad("allowed_urls", e);
        }
        for (name, template) in &spec.headers {
            match secrets_in(template) {
                Ok(vars) => {
                    for var in vars {
                        if let Some(why) = secret_var_problem(var, !spec.enabled || secret_is_set(var)) {
                            bad(&format!("headers.{name}"), why);
                        }
                    }
                }
                Err(e) => bad(&format!("headers.{name}"), e),
            }
        }
        if spec.action.is_empty() {
            bad("action", "declares no actions".into());
        }
        for (j, action) in spec.action.iter().enumerate() {
            let at = format!("action[{j}] ({})", action.tool);
            let mut bad = |field: &str, message: String| problems.push(problem(format!("{label}.{at}.{field}"), message));
            let Some(DeclaredTool { is_connector, properties: props, secret_fields }) = tools.get(&action.tool) else {
                bad("tool", format!("there is no tool named {:?} in tools.toml", action.tool));
                continue;
            };
            if !is_connector {
                bad("tool", format!("{:?} must have provider = \"connector\" to be run by a connector", action.tool));
            }
            if actions.contains_key(&action.tool) {
                bad("tool", format!("{:?} is already run by another action", action.tool));
            }
            if action.path.contains("://") || action.path.starts_with("//") {
                bad("path", "must be a path below base_url, not a URL".into());
            }
            if action.path.contains(['?', '#']) {
                bad("path", "must not contain '?' or '#'; use query".into());
            }
            if action.body.is_some() && action.method == Method::Get {
                bad("body", "a GET request has no body".into());
            }
            let mut templates: Vec<(String, String)> = vec![("path".into(), action.path.clone())];
            templates.extend(action.query.iter().map(|(k, v)| (format!("query.{k}"), v.clone())));
            templates.extend(action.headers.iter().map(|(k, v)| (format!("headers.{k}"), v.clone())));
            let mut strings = Vec::new();
            if let Some(body) = &action.body {
                body_strings(body, &mut strings);
            }
            templates.extend(strings.into_iter().map(|s| ("body".to_string(), s)));
            for (field, template) in &templates {
                match args_in(template) {
                    Ok(args) => {
                        for arg in &args {
                            if !props.contains(*arg) {
                                bad(field, format!("{{{arg}}} is not a property of {}'s input_schema", action.tool));
                            }
                            let in_url = field == "path" || field.starts_with("query.");
                            if in_url && secret_fields.contains(*arg) {
                                bad(
                                    field,
                                    format!("{{{arg}}} is a secret field of {} and cannot be placed in the URL ({}); send it in a header", action.tool, ConnectorCode::SecretInUrl.as_str()),
                                );
                            }
                        }
                    }
                    Err(e) => bad(field, e),
                }
                if let Ok(vars) = secrets_in(template) {
                    for var in vars {
                        if field.starts_with("headers.") {
                            if let Some(why) = secret_var_problem(var, !spec.enabled || secret_is_set(var)) {
                                bad(field, why);
                            }
                        } else {
                            bad(field, format!("${{{var}}} secrets may only appear in headers"));
                        }
                    }
                }
            }
            if spec.enabled {
                let mut headers = spec.headers.clone();
                headers.extend(action.headers.clone());
                // A pattern that does not compile was reported above with the connector's key.
                if let Ok(built) = ConnectorAction::new(spec.id.clone(), spec.base_url.clone(), spec.allowed_urls.clone(), headers, action.clone()) {
                    actions.insert(action.tool.clone(), Arc::new(built));
                }
            }
        }
    }
    if problems.is_empty() { Ok((actions, secrets)) } else { Err(problems) }
}

fn origin_of(url: &str) -> String {
    url::Url::parse(url).map(|u| u.origin().ascii_serialization()).unwrap_or_default()
}

fn same_origin_prefix(pattern: &str, base: &str) -> bool {
    let origin = origin_of(base);
    !origin.is_empty() && (pattern == origin || pattern.starts_with(&format!("{origin}/")))
}
