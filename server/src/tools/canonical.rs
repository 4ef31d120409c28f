//! Canonical JSON: one text for one value, whatever order its keys were built or received in.
//! A validated call's arguments are kept in this form, so an owner's approval (which hashes it)
//! binds to exactly the call that was checked.

use std::fmt::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `sha256:` and the hex digest of `value`'s canonical text: what an approval binds to.
pub fn args_hash(value: &Value) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(canonical_json(value).as_bytes())))
}

/// `value` as compact JSON with the keys of every object sorted (by their UTF-8 bytes) at every
/// depth. Strings and numbers are written as `serde_json` writes them. The sorting is done
/// here, so the result does not depend on whether some dependency turns on serde_json's
/// `preserve_order` feature.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        scalar => {
            let _ = write!(out, "{scalar}");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_sorted_at_every_depth_and_compact() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"z": [3, {"y": "é\"", "x": null}], "c": true}, "A": 1.5}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"A": 1.5, "a": {"c": true, "z": [3, {"x": null, "y": "é\""}]}, "b": 1}"#).expect("json");
        let text = canonical_json(&a);
        assert_eq!(text, r#"{"A":1.5,"a":{"c":true,"z":[3,{"x":null,"y":"é\""}]},"b":1}"#);
        assert_eq!(text, canonical_json(&b), "the same value gives the same text");
        assert_eq!(serde_json::from_str::<Value>(&text).expect("valid JSON"), a, "and it reads back as the value");
        assert_ne!(canonical_json(&json!({"a": [1, 2]})), canonical_json(&json!({"a": [2, 1]})), "array order is meaning, kept");
        assert_eq!(canonical_json(&json!("x")), "\"x\"");
    }
}
