use serde_json::Map;

use super::{
    template::{Piece, fill_body, pieces},
    *,
};
use crate::tools::checkpoint::SecretSource;

fn action(path: &str, allowed: &[&str]) -> ConnectorAction {
    ConnectorAction::new(
        "shop".into(),
        "https://shop.example.com/api/".into(),
        allowed.iter().map(|s| s.to_string()).collect(),
        BTreeMap::new(),
        ActionSpec { tool: "t".into(), method: Method::Get, path: path.into(), query: BTreeMap::from([("q".into(), "{q}".into())]), headers: BTreeMap::new(), body: None, keep: vec![] },
    )
    .expect("valid patterns")
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

fn no_secrets() -> SecretSource {
    SecretSource::empty()
}

#[test]
fn arguments_stay_inside_one_segment_and_the_allowed_patterns() {
    let a = action("orders/{id}", &["https://shop.example.com/api/orders/*"]);
    let ok = build_url(&a, &args(serde_json::json!({"id": "A 1", "q": "x&y=z"})), &no_secrets()).expect("allowed");
    assert_eq!(ok.as_str(), "https://shop.example.com/api/orders/A%201?q=x%26y%3Dz");
    for hostile in ["../admin", "..", "%2e%2e", "a/../../b", "x?y", "@evil.example", "//evil.example/x"] {
        match build_url(&a, &args(serde_json::json!({"id": hostile})), &no_secrets()) {
            Ok(url) => {
                assert_eq!(url.host_str(), Some("shop.example.com"), "{hostile}");
                assert!(url.path().starts_with("/api/orders/") && url.path().matches('/').count() == 3, "{hostile} -> {url}");
            }
            Err(e) => assert_eq!(e.code, ConnectorCode::UnsupportedUrl.as_str(), "{hostile}: {e}"),
        }
    }
    // Refused, not encoded: a server in front that decodes %2F (or reads `..;` as `..`) would
    // walk up the path with the connector's credentials.
    for walking in ["../../admin/users", "..;", "...", "a\\..\\b", "x%2F..%2Fy", "%2e%2e", "%252e%252e", "orders/./x"] {
        let err = build_url(&a, &args(serde_json::json!({"id": walking})), &no_secrets()).expect_err(walking);
        assert_eq!(err.code, ConnectorCode::UnsupportedUrl.as_str(), "{walking}");
        assert!(!err.message.contains(walking), "the value is not echoed: {err}");
    }
    // Anything else goes through as itself, a slash included (one encoded segment).
    for plain in ["files/2024/report final.pdf", "a;b", ".hidden", "trailing.", "%41%2F%42"] {
        let url = build_url(&a, &args(serde_json::json!({"id": plain})), &no_secrets()).expect(plain);
        assert_eq!(url.path().matches('/').count(), 3, "{plain} -> {url}");
    }
    let narrow = action("orders/{id}/{sub}", &["https://shop.example.com/api/orders/*"]);
    let err = build_url(&narrow, &args(serde_json::json!({"id": "1", "sub": "refund"})), &no_secrets()).expect_err("not allowed");
    assert_eq!(err.code, ConnectorCode::UnsupportedUrl.as_str());
    let missing = build_url(&a, &args(serde_json::json!({})), &no_secrets()).expect_err("missing");
    assert_eq!(missing.code, ConnectorCode::ParamInvalid.as_str());
}

/// The checkpoint adds a tool's secret fields to the arguments before the connector runs.
/// A refused URL's error must not carry such a value (or any argument) back to the caller.
#[test]
fn refused_urls_do_not_echo_their_arguments() {
    let secret = "sk_live_never_in_errors_77";
    let a = action("orders/{id}/{key}", &["https://shop.example.com/api/orders/*"]);
    let err = build_url(&a, &args(serde_json::json!({"id": "A1", "key": secret})), &no_secrets()).expect_err("outside the patterns");
    assert_eq!(err.code, ConnectorCode::UnsupportedUrl.as_str());
    assert!(!err.message.contains(secret) && !err.message.contains("A1"), "{err}");
    let dots = build_url(&a, &args(serde_json::json!({"id": "..", "key": secret})), &no_secrets()).expect_err("dot segment");
    assert!(!dots.message.contains(secret), "{dots}");
}

#[test]
fn templates_parse_arguments_secrets_and_braces() {
    assert_eq!(pieces("Bearer ${KEY}").expect("ok"), vec![Piece::Text("Bearer "), Piece::Secret("KEY")]);
    assert_eq!(pieces("a{b}c").expect("ok"), vec![Piece::Text("a"), Piece::Arg("b"), Piece::Text("c")]);
    assert_eq!(pieces("{{x}}").expect("ok"), vec![Piece::Text("{"), Piece::Text("x"), Piece::Text("}")]);
    assert!(pieces("{a b}").is_err());
    assert!(pieces("{open").is_err());
}

#[test]
fn keeps_only_the_named_fields() {
    let v = serde_json::json!({"status": "shipped", "secret": "x", "items": [{"name": "a", "cost": 1}, {"name": "b", "cost": 2}], "eta": {"day": "Mon", "internal": 1}});
    let kept = keep_fields(&v, &["status".into(), "items.name".into(), "eta.day".into()]);
    assert_eq!(kept, serde_json::json!({"status": "shipped", "items": [{"name": "a"}, {"name": "b"}], "eta": {"day": "Mon"}}));
}

#[test]
fn body_takes_typed_values_and_drops_absent_ones() {
    let template = serde_json::json!({"qty": "{qty}", "note": "order {id}", "gift": "{gift}", "fixed": true});
    let body = fill_body(&template, &args(serde_json::json!({"qty": 3, "id": "A1"})), &no_secrets()).expect("ok");
    assert_eq!(body, Some(serde_json::json!({"qty": 3, "note": "order A1", "fixed": true})));
}

fn glob(pattern: &str, text: &str) -> bool {
    compile_allowed(&[pattern.to_string()]).expect("pattern").is_match(text)
}

#[test]
fn glob_patterns() {
    assert!(glob("https://h/api/orders/*", "https://h/api/orders/1"));
    assert!(!glob("https://h/api/orders/*", "https://h/api/orders/1/x"));
    assert!(glob("https://h/api/**", "https://h/api/orders/1/x"));
    assert!(!glob("https://h/api/**", "https://h/other"));
}
