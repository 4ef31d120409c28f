//! JSON Schema as the checkpoint applies it to tool input.

use serde_json::Value;

/// Keywords beside which an object schema's properties may come from elsewhere, so closing it
/// could refuse what the schema means to allow.
const OPEN_BY_COMPOSITION: [&str; 9] = ["allOf", "anyOf", "oneOf", "not", "$ref", "$dynamicRef", "if", "dependentSchemas", "unevaluatedProperties"];

/// `schema` with every object schema that does not say whether it takes other properties
/// (`additionalProperties` absent) closed with `"additionalProperties": false`, at the top and
/// inside `properties`, `items` and `prefixItems` (and where `$defs` are referenced from them).
///
/// JSON Schema's default lets any extra argument through, and MCP servers rarely say otherwise;
/// an argument the tool did not declare is a sign the model is confused, and may be one the
/// server acts on without the catalog knowing. An object schema combined with other schemas
/// (`allOf`, `anyOf`, `$ref`, `if`, ...), whose properties may be declared there, is closed with
/// `"unevaluatedProperties": false` instead, which admits every property declared anywhere in
/// it (draft 2020-12, which the catalog compiles with). The alternatives (`anyOf`, `oneOf`) of a
/// schema that is not itself an object schema, such as a nullable object, are closed one by one.
pub fn closed_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    close(&mut schema, 0, true);
    schema
}

/// Closes `schema` where it stands for one value (`here`), and the schemas inside it. A
/// definition (`$defs`) may be one part of an `allOf`, where closing it would refuse the other
/// parts' properties: it is left as it is, and closed where it is used, by
/// `"unevaluatedProperties": false` beside the `$ref`, which sees what the definition declares.
fn close(schema: &mut Value, depth: usize, here: bool) {
    let Value::Object(map) = schema else { return };
    if depth > 32 {
        return;
    }
    let is_object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    };
    let composed = OPEN_BY_COMPOSITION.iter().any(|k| map.contains_key(*k));
    let says = map.contains_key("additionalProperties") || map.contains_key("unevaluatedProperties");
    if here && !says {
        if is_object && !composed {
            map.insert("additionalProperties".into(), Value::Bool(false));
        } else if is_object || map.contains_key("$ref") || map.contains_key("$dynamicRef") {
            // Only an object is checked by it: a reference to a string is untouched.
            map.insert("unevaluatedProperties".into(), Value::Bool(false));
        }
    }
    if !is_object {
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(members)) = map.get_mut(key) {
                members.iter_mut().for_each(|member| close(member, depth + 1, here));
            }
        }
    }
    if let Some(Value::Object(children)) = map.get_mut("properties") {
        children.values_mut().for_each(|child| close(child, depth + 1, true));
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(|child| close(child, depth + 1, false));
        }
    }
    match map.get_mut("items") {
        Some(Value::Array(items)) => items.iter_mut().for_each(|item| close(item, depth + 1, true)),
        Some(item) => close(item, depth + 1, true),
        None => {}
    }
    if let Some(Value::Array(items)) = map.get_mut("prefixItems") {
        items.iter_mut().for_each(|item| close(item, depth + 1, true));
    }
    if let Some(extra @ Value::Object(_)) = map.get_mut("additionalProperties") {
        close(extra, depth + 1, true);
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
        assert!(closed["properties"]["mixed"].get("additionalProperties").is_none(), "not itself an object schema");
        assert_eq!(closed["properties"]["mixed"]["allOf"][0].get("additionalProperties"), None, "allOf members are not closed");
        assert_eq!(closed["properties"]["free"]["additionalProperties"]["additionalProperties"], false, "a schema for extra values is itself closed");
    }

    #[test]
    fn composed_objects_take_what_they_declare_anywhere_and_nothing_else() {
        let valid = |schema: &Value, args: Value| {
            jsonschema::options().with_draft(jsonschema::Draft::Draft202012).build(&closed_schema(schema)).expect("compiles").is_valid(&args)
        };
        // "At least one of": the properties are the object's own, the alternatives only require.
        let one_of_two = json!({ "type": "object", "properties": { "order_id": { "type": "string" }, "email": { "type": "string" } },
            "anyOf": [{ "required": ["order_id"] }, { "required": ["email"] }] });
        assert!(valid(&one_of_two, json!({ "order_id": "1" })));
        assert!(!valid(&one_of_two, json!({ "order_id": "1", "force": true })), "an extra argument");
        // Properties declared in an allOf member and by $ref are declared.
        let merged = json!({ "type": "object", "$defs": { "page": { "properties": { "page": { "type": "integer" } } } },
            "allOf": [{ "properties": { "q": { "type": "string" } } }, { "$ref": "#/$defs/page" }] });
        assert!(valid(&merged, json!({ "q": "x", "page": 2 })));
        assert!(!valid(&merged, json!({ "q": "x", "admin": true })));
        // A definition used by reference is closed where it is used.
        let referenced = json!({ "type": "object", "$defs": { "addr": { "type": "object", "properties": { "city": { "type": "string" } } } },
            "properties": { "to": { "$ref": "#/$defs/addr" } } });
        assert!(valid(&referenced, json!({ "to": { "city": "Porto" } })));
        assert!(!valid(&referenced, json!({ "to": { "city": "Porto", "admin": true } })));
        // A nullable object: its object alternative is closed.
        let nullable = json!({ "type": "object", "properties": { "filter": { "anyOf": [{ "type": "object", "properties": { "q": { "type": "string" } } }, { "type": "null" }] } } });
        assert!(valid(&nullable, json!({ "filter": null })) && valid(&nullable, json!({ "filter": { "q": "x" } })));
        assert!(!valid(&nullable, json!({ "filter": { "q": "x", "admin": true } })));
        // A schema that says itself how it treats other properties is left as it says.
        let open = json!({ "type": "object", "properties": { "a": { "type": "string" } }, "anyOf": [{ "required": ["a"] }], "unevaluatedProperties": true });
        assert!(valid(&open, json!({ "a": "x", "b": 1 })));
    }
}
