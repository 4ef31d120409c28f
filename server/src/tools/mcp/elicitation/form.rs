//! The form of an elicitation: the requested schema read as fields (a flat object of string,
//! number, integer, boolean and single-choice enum properties, as the MCP spec allows), and an
//! owner's values checked against it. Omitted fields take their defaults (SEP-1034): the form
//! the owner saw had them filled in.

use serde_json::{Map, Value};

/// The most fields a form may have; a larger schema is declined.
pub const MAX_FIELDS: usize = 50;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Field {
    pub name: String,
    /// From the server: untrusted text.
    pub title: Option<String>,
    /// From the server: untrusted text.
    pub description: Option<String>,
    pub kind: Kind,
    pub required: bool,
    pub default: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    Text {
        format: Option<String>,
        min_length: Option<u64>,
        max_length: Option<u64>,
    },
    Number {
        integer: bool,
        minimum: Option<f64>,
        maximum: Option<f64>,
    },
    Boolean,
    /// One of `options` (value, label).
    Choice {
        options: Vec<(String, String)>,
    },
}

impl Kind {
    /// The name the console shows and keys its input on.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Text { .. } => "string",
            Self::Number { integer: true, .. } => "integer",
            Self::Number { .. } => "number",
            Self::Boolean => "boolean",
            Self::Choice { .. } => "enum",
        }
    }
}

/// Values that do not fit the form: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MCP_ELICITATION_INVALID: {field}: {message}")]
pub struct FormError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> FormError {
    FormError { field: field.to_string(), message: message.into() }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(|s| super::super::normalize::bound_text(s, 500))
}

/// Reads the requested schema; `Err` says why Gatehouse cannot show it as a form.
pub fn fields(schema: &Value) -> Result<Vec<Field>, String> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err("the requested schema is not an object".into());
    }
    let props = schema.get("properties").and_then(Value::as_object).ok_or("the requested schema has no properties")?;
    if props.len() > MAX_FIELDS {
        return Err(format!("the form has more than {MAX_FIELDS} fields"));
    }
    let required: Vec<&str> = schema.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let mut out = Vec::new();
    for (name, p) in props {
        // The console posts a field as `values[name]`: brackets in a name would split it.
        if name.is_empty() || name.contains(['[', ']']) {
            return Err(format!("the field name {name:?} cannot be a form input"));
        }
        let ty = p.get("type").and_then(Value::as_str).unwrap_or_default();
        let choice = |values: Vec<(String, String)>| Kind::Choice { options: values };
        let kind = if let Some(one_of) = p.get("oneOf").and_then(Value::as_array) {
            choice(one_of.iter().filter_map(|o| o.get("const").and_then(Value::as_str).map(|c| (c.to_string(), text(o, "title").unwrap_or_else(|| c.to_string())))).collect())
        } else if let Some(values) = p.get("enum").and_then(Value::as_array) {
            let names: Vec<String> = p.get("enumNames").and_then(Value::as_array).map(|n| n.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
            choice(values.iter().enumerate().filter_map(|(i, v)| v.as_str().map(|s| (s.to_string(), names.get(i).cloned().unwrap_or_else(|| s.to_string())))).collect())
        } else {
            match ty {
                "string" => Kind::Text { format: text(p, "format"), min_length: p.get("minLength").and_then(Value::as_u64), max_length: p.get("maxLength").and_then(Value::as_u64) },
                "number" | "integer" => Kind::Number { integer: ty == "integer", minimum: p.get("minimum").and_then(Value::as_f64), maximum: p.get("maximum").and_then(Value::as_f64) },
                "boolean" => Kind::Boolean,
                other => return Err(format!("the field {name:?} has type {other:?}, which a form cannot ask for")),
            }
        };
        if let Kind::Choice { options } = &kind
            && options.is_empty()
        {
            return Err(format!("the field {name:?} offers no choices"));
        }
        let field = Field { name: name.clone(), title: text(p, "title"), description: text(p, "description"), kind, required: required.contains(&name.as_str()), default: None };
        // A default that does not fit its own field is left out rather than offered.
        let default = p.get("default").filter(|d| check_value(&field, (*d).clone()).is_ok()).cloned();
        out.push(Field { default, ..field });
    }
    Ok(out)
}

/// The formats the spec allows a string field, checked as JSON Schema checks them.
fn fits_format(format: &str, s: &str) -> bool {
    jsonschema::options().should_validate_formats(true).build(&serde_json::json!({ "type": "string", "format": format })).is_ok_and(|v| v.is_valid(&Value::String(s.to_string())))
}

/// One value checked (and, for numbers, made the right JSON type).
fn check_value(f: &Field, v: Value) -> Result<Value, FormError> {
    let name = f.name.as_str();
    match &f.kind {
        Kind::Text { format, min_length, max_length } => {
            let Value::String(s) = v else { return Err(bad(name, "must be text")) };
            let len = s.chars().count() as u64;
            if min_length.is_some_and(|m| len < m) {
                return Err(bad(name, format!("must be at least {} characters", min_length.unwrap_or_default())));
            }
            if max_length.is_some_and(|m| len > m) {
                return Err(bad(name, format!("must be at most {} characters", max_length.unwrap_or_default())));
            }
            let fits = match format.as_deref() {
                Some(f @ ("email" | "uri" | "date" | "date-time")) => fits_format(f, &s),
                _ => true,
            };
            if !fits {
                return Err(bad(name, format!("is not a valid {}", format.as_deref().unwrap_or("value"))));
            }
            Ok(Value::String(s))
        }
        Kind::Number { integer, minimum, maximum } => {
            let Some(n) = v.as_f64() else { return Err(bad(name, "must be a number")) };
            if *integer && (n.fract() != 0.0 || !n.is_finite()) {
                return Err(bad(name, "must be a whole number"));
            }
            if minimum.is_some_and(|m| n < m) || maximum.is_some_and(|m| n > m) {
                let range = format!("{}..{}", minimum.map(|m| m.to_string()).unwrap_or_default(), maximum.map(|m| m.to_string()).unwrap_or_default());
                return Err(bad(name, format!("must be within {range}")));
            }
            // A whole number within i64 (checked above) is sent as an integer.
            Ok(if *integer { v.as_i64().map_or(v, Value::from) } else { v })
        }
        Kind::Boolean => v.as_bool().map(Value::Bool).ok_or_else(|| bad(name, "must be true or false")),
        Kind::Choice { options } => match v {
            Value::String(s) if options.iter().any(|(o, _)| *o == s) => Ok(Value::String(s)),
            _ => Err(bad(name, format!("must be one of {}", options.iter().map(|(o, _)| o.as_str()).collect::<Vec<_>>().join(", ")))),
        },
    }
}

/// Typed values (JSON, from the CLI) checked against the form; omitted fields take their
/// defaults; a required field without one is an error, as is a field the form does not have.
pub fn check(fields: &[Field], mut values: Map<String, Value>) -> Result<Map<String, Value>, FormError> {
    if let Some(extra) = values.keys().find(|k| !fields.iter().any(|f| &f.name == *k)) {
        return Err(bad(extra, "is not a field of this form"));
    }
    let mut out = Map::new();
    for f in fields {
        match values.remove(&f.name).filter(|v| !v.is_null()).or_else(|| f.default.clone()) {
            Some(v) => {
                out.insert(f.name.clone(), check_value(f, v)?);
            }
            None if f.required => return Err(bad(&f.name, "is required")),
            None => {}
        }
    }
    Ok(out)
}

/// Values as an HTML form sends them (text; a checkbox only when ticked, so a boolean field
/// is sent as "true" or "false" by the console): turned into typed values, then [`check`]ed.
/// An empty input counts as omitted.
pub fn from_text(fields: &[Field], values: &[(String, String)]) -> Result<Map<String, Value>, FormError> {
    let mut typed = Map::new();
    for (name, raw) in values {
        let Some(f) = fields.iter().find(|f| &f.name == name) else { return Err(bad(name, "is not a field of this form")) };
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let v = match &f.kind {
            Kind::Text { .. } | Kind::Choice { .. } => Value::String(raw.to_string()),
            Kind::Number { integer: true, .. } => raw.parse::<i64>().map(Value::from).map_err(|_| bad(name, "must be a whole number"))?,
            Kind::Number { .. } => raw.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number).ok_or_else(|| bad(name, "must be a number"))?,
            Kind::Boolean => match raw {
                "true" | "on" | "yes" => Value::Bool(true),
                "false" | "off" | "no" => Value::Bool(false),
                _ => return Err(bad(name, "must be true or false")),
            },
        };
        typed.insert(name.clone(), v);
    }
    check(fields, typed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "User name", "default": "John Doe" },
                "age": { "type": "integer", "default": 30, "minimum": 0 },
                "score": { "type": "number", "default": 95.5 },
                "status": { "type": "string", "enum": ["active", "inactive"], "default": "active" },
                "verified": { "type": "boolean", "default": true },
                "email": { "type": "string", "format": "email" },
                "plan": { "type": "string", "oneOf": [{ "const": "a", "title": "Plan A" }] }
            },
            "required": ["email"]
        })
    }

    #[test]
    fn accepting_an_untouched_form_sends_the_defaults() {
        let f = fields(&schema()).expect("a form");
        assert_eq!(f.len(), 7);
        assert!(matches!(&f.iter().find(|f| f.name == "plan").expect("plan").kind, Kind::Choice { options } if options == &[("a".to_string(), "Plan A".to_string())]));
        let out = from_text(&f, &[("email".into(), "ada@example.org".into()), ("name".into(), String::new())]).expect("valid");
        assert_eq!(Value::Object(out), json!({ "name": "John Doe", "age": 30, "score": 95.5, "status": "active", "verified": true, "email": "ada@example.org" }));
    }

    #[test]
    fn values_that_do_not_fit_name_their_field() {
        let f = fields(&schema()).expect("a form");
        let err = |values: &[(&str, &str)]| from_text(&f, &values.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>()).expect_err("invalid");
        assert_eq!(err(&[]).field, "email", "a required field without a default");
        assert_eq!(err(&[("email", "not-an-address")]).field, "email");
        assert_eq!(err(&[("email", "a@b.c"), ("age", "3.5")]).field, "age");
        assert_eq!(err(&[("email", "a@b.c"), ("age", "-1")]).field, "age");
        assert_eq!(err(&[("email", "a@b.c"), ("status", "gone")]).field, "status");
        assert_eq!(err(&[("email", "a@b.c"), ("verified", "maybe")]).field, "verified");
        assert_eq!(err(&[("email", "a@b.c"), ("extra", "x")]).field, "extra");
        assert!(err(&[("email", "a@b.c"), ("extra", "x")]).to_string().starts_with("MCP_ELICITATION_INVALID"));
        let typed = check(&f, serde_json::from_value(json!({ "email": "a@b.c", "score": "high" })).expect("map")).expect_err("a string for a number");
        assert_eq!(typed.field, "score");
    }

    #[test]
    fn schemas_a_form_cannot_show_are_refused() {
        assert!(fields(&json!({ "type": "array" })).is_err());
        assert!(fields(&json!({ "type": "object", "properties": { "x": { "type": "object" } } })).is_err());
        assert!(fields(&json!({ "type": "object", "properties": { "x": { "type": "string", "enum": [] } } })).is_err());
        assert!(fields(&json!({ "type": "object", "properties": { "a]b": { "type": "string" } } })).is_err());
        let bad_default = fields(&json!({ "type": "object", "properties": { "n": { "type": "integer", "default": "ten" } } })).expect("a form");
        assert_eq!(bad_default[0].default, None, "a default that does not fit is not offered");
    }
}
