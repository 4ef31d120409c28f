//! JSON Schema as the checkpoint applies it to tool input.

use serde_json::Value;

/// Keywords beside which an object schema's properties may come from elsewhere, so closing it
/// could refuse what the schema means to allow.
const OPEN_BY_COMPOSITION: [&str; 9] = ["allOf", "anyOf", "oneOf", "not", "$ref", "$dynamicRef", "if", "dependentSchemas", "unevaluatedProperties"];

/// `schema` with every object schema that does not say whether it takes other properties
/// (`additionalProperties` absent) closed with `"additionalProperties": false`, at the top and
/// inside `properties`, `items`, `prefixItems`, `$defs` and `definitions`.
///
/// JSON Schema's default lets any extra argument through, and MCP servers rarely say otherwise;
/// an argument the tool did not declare is a sign the model is confused, and may be one the
/// server acts on without the catalog knowing. Object schemas combined with other schemas
/// (`allOf`, `$ref`, `if`, ...) are left open, because their properties may be declared there.
pub fn closed_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    close(&mut schema, 0);
    schema
}

fn close(schema: &mut Value, depth: usize) {
    let Value::Object(map) = schema else { return };
    if depth > 32 {
        return;
    }
    let is_object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    };
    if is_object && !map.contains_key("additionalProperties") && !OPEN_BY_COMPOSITION.iter().any(|k| map.contains_key(*k)) {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(|child| close(child, depth + 1));
        }
    }
    match map.get_mut("items") {
        Some(Value::Array(items)) => items.iter_mut().for_each(|item| close(item, depth + 1)),
        Some(item) => close(item, depth + 1),
        None => {}
    }
    if let Some(Value::Array(items)) = map.get_mut("prefixItems") {
        items.iter_mut().for_each(|item| close(item, depth + 1));
    }
    if let Some(extra @ Value::Object(_)) = map.get_mut("additionalProperties") {
        close(extra, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_are_closed_where_the_schema_does_not_say_otherwise() {
        let nested = json!({
            "type": "object",
            "properties": {
                "filter": { "type": "object", "properties": { "q": { "type": "string" } } },
                "rows": { "type": "array", "items": { "type": "object", "properties": { "id": { "type": "integer" } } } },
                "mixed": { "allOf": [{ "type": "object", "properties": { "a": { "type": "string" } } }] },
                "free": { "type": "object", "additionalProperties": { "type": "object", "properties": { "v": { "type": "string" } } } }
            }
        });
        let closed = closed_schema(&nested);
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["filter"]["additionalProperties"], false);
        assert_eq!(closed["properties"]["rows"]["items"]["additionalProperties"], false);
        assert!(closed["properties"]["mixed"].get("additionalProperties").is_none(), "composed schemas stay open");
        assert_eq!(closed["properties"]["mixed"]["allOf"][0].get("additionalProperties"), None, "allOf members are not closed");
        assert_eq!(closed["properties"]["free"]["additionalProperties"]["additionalProperties"], false, "a schema for extra values is itself closed");
    }
}
