//! Catalog tools as the planner sees them (seed §6): only the candidates the detector chose,
//! only those the actor may use in this chat, described from their configuration, with the
//! fields Gatehouse fills removed from the schema.
//!
//! Offering is a courtesy to the model, not a permission: whatever the planner proposes is
//! validated again by [`super::validator`] through the checkpoint's gates.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{
    config::LaneSettings,
    domain::{ChatKind, Role},
    llm,
    tools::{
        Catalog, ToolDef,
        catalog::{Audience, Operation, Provider},
    },
};

/// Who the tools are offered to, and how.
#[derive(Debug, Clone, Copy)]
pub struct OfferTo {
    pub actor: Role,
    pub chat: ChatKind,
    /// The model honours `strict` tool definitions ([`llm::ChatModel::supports_strict_tools`]).
    pub strict_supported: bool,
}

/// The catalog's definitions of `names` (the detector's candidates), in order, once each.
/// Unknown and withheld tools (an MCP tool waiting for an owner, say) are not in the catalog's
/// offer and are left out.
pub fn resolve<S: AsRef<str>>(catalog: &Catalog, names: &[S]) -> Vec<Arc<ToolDef>> {
    let mut seen = std::collections::BTreeSet::new();
    names.iter().filter(|n| seen.insert(n.as_ref().to_string())).filter_map(|n| catalog.get(n.as_ref())).collect()
}

/// Whether `tool` may be offered to `actor` in `chat` at all: enabled, not owner-only (nor an
/// admin operation) for a customer, allowed in this kind of chat (an owner-only tool, and one
/// tagged with a `lane.private_data_tags` tag, in direct chats only: every member of a group
/// reads the answer), within the actor's risk ceiling, and not named like the planner's own
/// `respond_tool`.
pub fn offerable(tool: &ToolDef, actor: Role, chat: ChatKind, settings: &LaneSettings) -> bool {
    let spec = &tool.spec;
    let customer = actor == Role::Customer;
    spec.enabled
        && !(customer && (spec.audience == Audience::OwnerOnly || spec.operation == Operation::Admin))
        && spec.chat_types.contains(&chat)
        && !(chat == ChatKind::Group && (spec.audience == Audience::OwnerOnly || is_private(spec, settings)))
        && super::validator::risk_allowed(spec.risk, actor, settings)
        && spec.name != settings.respond_tool
        && spec.name != settings.search_tool
}

/// Whether `spec` reaches private account data (a `lane.private_data_tags` tag).
pub fn is_private(spec: &crate::tools::catalog::ToolSpec, settings: &LaneSettings) -> bool {
    spec.tags.iter().any(|t| settings.private_data_tags.contains(t))
}

/// Whether the catalog's tool `name` reaches private account data; an unknown tool does not.
pub fn is_private_tool(catalog: &Catalog, name: &str, settings: &LaneSettings) -> bool {
    catalog.get(name).is_some_and(|t| is_private(&t.spec, settings))
}

/// The planner's view of `tools` for `to`: each offerable tool once, described by
/// `settings.tool_description`, with the schema a call must satisfy minus managed and secret
/// fields.
pub fn tool_specs(tools: &[Arc<ToolDef>], to: OfferTo, settings: &LaneSettings) -> Vec<llm::ToolSpec> {
    let skipped: Vec<&str> = tools.iter().filter(|t| !offerable(t, to.actor, to.chat, settings)).map(|t| t.spec.name.as_str()).collect();
    if !skipped.is_empty() {
        tracing::debug!(event = "AgentToolAdapterSkipped", skipped = ?skipped, actor = to.actor.as_str(), "candidates not offered to this actor");
    }
    if tools.iter().any(|t| t.spec.name == settings.respond_tool) {
        tracing::warn!(event = "AgentToolAdapterNameClash", tool = %settings.respond_tool, "a catalog tool has the name of lane.respond_tool and is never offered; rename one of them");
    }
    tools
        .iter()
        .filter(|t| offerable(t, to.actor, to.chat, settings))
        .map(|t| {
            let input_schema = model_schema(t);
            // Anthropic only (see `ChatModel::supports_strict_tools`), and only for schemas our
            // own configuration wrote inside the strict subset: MCP schemas are the servers'.
            let strict = to.strict_supported && t.spec.provider != Provider::Mcp && strict_compatible(&input_schema);
            llm::ToolSpec { name: t.spec.name.clone(), description: description(t, &settings.tool_description), input_schema, strict }
        })
        .collect()
}

/// The description from the template: `{title}`, `{description}`, `{when_to_use}` and
/// `{when_not_to_use}` filled in; a line whose placeholders are all empty is dropped.
pub fn description(tool: &ToolDef, template: &str) -> String {
    let spec = &tool.spec;
    let fields = [("{title}", spec.title.trim()), ("{description}", spec.description.trim()), ("{when_to_use}", spec.when_to_use.trim()), ("{when_not_to_use}", spec.when_not_to_use.trim())];
    template
        .trim()
        .lines()
        .filter(|line| {
            let used: Vec<&str> = fields.iter().filter(|(k, _)| line.contains(k)).map(|(_, v)| *v).collect();
            used.is_empty() || used.iter().any(|v| !v.is_empty())
        })
        .map(|line| fields.iter().fold(line.to_string(), |acc, (k, v)| acc.replace(k, v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The schema the model fills: the checkpoint's (closed) input schema without the managed and
/// secret fields, which Gatehouse fills and the model must never see or supply.
pub fn model_schema(tool: &ToolDef) -> Value {
    let spec = &tool.spec;
    let hidden = |name: &str| spec.managed_fields.iter().any(|f| f == name) || spec.secret_fields.contains_key(name);
    let mut schema = tool.closed_input_schema.clone();
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.retain(|name, _| !hidden(name));
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| !name.as_str().is_some_and(hidden));
    }
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
    }
    schema
}

/// Keywords outside the subset strict tool use is documented to support (or that this code
/// cannot vouch for); a schema using any of them is sent without `strict`. Conservative on
/// purpose: leaving `strict` off costs nothing, since the checkpoint validates every call.
const NOT_STRICT: [&str; 19] = [
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "maxItems", "minProperties", "maxProperties",
    "pattern", "patternProperties", "allOf", "oneOf", "not", "if", "$ref", "$dynamicRef", "dependentSchemas",
];

/// Formats strict tool use accepts.
const STRICT_FORMATS: [&str; 10] = ["date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"];

/// Whether `schema` stays inside the strict subset: every object closed
/// (`additionalProperties: false`), no unsupported keyword, `minItems` at most 1, only common
/// formats.
pub fn strict_compatible(schema: &Value) -> bool {
    fn walk(value: &Value, depth: usize) -> bool {
        if depth > 16 {
            return false;
        }
        match value {
            Value::Object(map) => object_ok(map) && map.iter().all(|(k, v)| k == "enum" || k == "const" || k == "default" || k == "examples" || walk(v, depth + 1)),
            Value::Array(items) => items.iter().all(|v| walk(v, depth + 1)),
            _ => true,
        }
    }
    fn object_ok(map: &Map<String, Value>) -> bool {
        let is_object = map.get("type").is_some_and(|t| t == "object") || map.contains_key("properties");
        !NOT_STRICT.iter().any(|k| map.contains_key(*k))
            && map.get("minItems").is_none_or(|n| n.as_u64().is_some_and(|n| n <= 1))
            && map.get("format").is_none_or(|f| f.as_str().is_some_and(|f| STRICT_FORMATS.contains(&f)))
            && (!is_object || map.get("additionalProperties") == Some(&Value::Bool(false)))
    }
    walk(schema, 0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tools::catalog::testing::{self, ToolToml};

    fn catalog() -> Catalog {
        let order_schema = r#"{ type = "object", required = ["order_id", "chat_id", "api_key"], properties = { order_id = { type = "string" }, chat_id = { type = "string" }, api_key = { type = "string" } } }"#;
        testing::catalog(
            &[
                ToolToml::builtin("lookup_order", "Order lookup", "Finds an order by its number.")
                    .with("when_to_use", r#""The person gives an order number.""#)
                    .with("managed_fields", r#"["chat_id"]"#)
                    .with("secret_fields", r#"{ api_key = "SHOP_KEY" }"#)
                    .with("input_schema", order_schema),
                ToolToml::builtin("owner_stats", "Stats", "Owners only.")
                    .with("audience", r#""owner_only""#)
                    .with("input_schema", r#"{ type = "object", properties = { q = { type = "string", maxLength = 10 } } }"#),
                ToolToml::builtin("wipe", "Wipe", "An admin operation.").with("operation", r#""admin""#),
                ToolToml::builtin("off", "Off", "Disabled.").with("enabled", "false"),
                ToolToml::builtin("risky", "Risky", "High risk.").with("risk", r#""high""#).with("chat_types", r#"["direct"]"#),
            ],
            &["SHOP_KEY"],
        )
    }

    fn settings() -> LaneSettings {
        LaneSettings { tool_description: "{title}: {description}\nUse when: {when_to_use}\nDo not use when: {when_not_to_use}".into(), respond_tool: "respond".into(), ..LaneSettings::default() }
    }

    fn names(specs: &[llm::ToolSpec]) -> Vec<&str> {
        specs.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn customers_get_public_enabled_tools_within_their_ceiling_only() {
        let catalog = catalog();
        let all = resolve(&catalog, &["lookup_order", "owner_stats", "wipe", "off", "risky", "nope", "lookup_order"]);
        assert_eq!(all.len(), 5, "unknown left out, duplicates once");
        let customer = OfferTo { actor: Role::Customer, chat: ChatKind::Direct, strict_supported: true };
        assert_eq!(names(&tool_specs(&all, customer, &settings())), ["lookup_order"], "no owner-only, admin, disabled or above-ceiling tool");
        let owner = OfferTo { actor: Role::Owner, ..customer };
        assert_eq!(names(&tool_specs(&all, owner, &settings())), ["lookup_order", "owner_stats", "wipe", "risky"]);
        let group = OfferTo { chat: ChatKind::Group, ..owner };
        assert!(!names(&tool_specs(&all, group, &settings())).contains(&"risky"), "chat types apply");
        assert!(!names(&tool_specs(&all, group, &settings())).contains(&"owner_stats"), "an owner-only answer is not posted to a group");
        let clash = LaneSettings { respond_tool: "lookup_order".into(), ..settings() };
        assert!(tool_specs(&all, customer, &clash).is_empty(), "a tool named like the respond tool is never offered");
    }

    #[test]
    fn schema_without_managed_or_secret_fields_and_description_from_config() {
        let catalog = catalog();
        let tools = resolve(&catalog, &["lookup_order", "owner_stats"]);
        let owner = OfferTo { actor: Role::Owner, chat: ChatKind::Direct, strict_supported: true };
        let specs = tool_specs(&tools, owner, &settings());
        let order = &specs[0];
        assert_eq!(order.input_schema, json!({"type": "object", "additionalProperties": false, "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}));
        assert_eq!(order.description, "Order lookup: Finds an order by its number.\nUse when: The person gives an order number.", "the empty line is left out");
        assert!(order.strict, "a built-in schema in the strict subset, for a provider that supports it");
        assert!(!specs[1].strict, "maxLength is outside the strict subset");
        let openai = OfferTo { strict_supported: false, ..owner };
        assert!(tool_specs(&tools, openai, &settings()).iter().all(|s| !s.strict), "never strict where the provider does not support it");
        assert!(!strict_compatible(&json!({"type": "object", "properties": {"a": {"type": "object"}}, "additionalProperties": false})), "every object must be closed");
    }
}
