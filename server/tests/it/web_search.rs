//! web_search against local fakes that answer like SearXNG's JSON format and the Brave Search
//! API.

use std::{collections::HashMap, time::Duration};

use axum::{Json, Router, extract::Query, http::HeaderMap, response::IntoResponse, routing::get};
use serde_json::json;
use server::{config::SearchProvider, tools::builtins::web_search::{SearchCode, WebSearch}};

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    format!("http://{addr}")
}

#[tokio::test]
async fn searxng_and_brave_results_with_sources() {
    let searxng = serve(Router::new().route(
        "/search",
        get(|Query(q): Query<HashMap<String, String>>| async move {
            assert_eq!(q.get("format").map(String::as_str), Some("json"));
            let query = q.get("q").cloned().unwrap_or_default();
            Json(json!({ "query": query, "results": [
                { "title": "Tea shop hours", "url": "https://tea.example/hours", "content": "Open 9 to 5" },
                { "title": "Second", "url": "https://two.example/", "content": "two" },
                { "url": "https://three.example/" }
            ]}))
        }),
    ))
    .await;
    let search = WebSearch::new(SearchProvider::Searxng, &searxng, 2, Duration::from_secs(5), None).expect("client");
    // 134 characters (402 bytes): within the schema's 400 characters.
    assert!(search.search(&"東京".repeat(67)).await.is_ok(), "characters are counted, not bytes");
    let too_long = search.search(&"東".repeat(401)).await.expect_err("401 characters");
    assert!(too_long.code == SearchCode::QueryInvalid.as_str() && too_long.refused, "the caller's input, not the provider's failure: {too_long:?}");
    let out = search.search("tea shop opening hours").await.expect("results");
    assert_eq!(out["source"], "searxng");
    assert_eq!(out["results"].as_array().map(Vec::len), Some(2), "max_results honoured");
    assert_eq!(out["results"][0], json!({ "title": "Tea shop hours", "url": "https://tea.example/hours", "snippet": "Open 9 to 5" }));

    let brave = serve(Router::new().route(
        "/res/v1/web/search",
        get(|headers: HeaderMap| async move {
            if headers.get("x-subscription-token").and_then(|v| v.to_str().ok()) != Some("brave-key") {
                return (axum::http::StatusCode::UNAUTHORIZED, "no").into_response();
            }
            Json(json!({ "web": { "results": [{ "title": "News", "url": "https://news.example/", "description": "Today" }] } })).into_response()
        }),
    ))
    .await;
    let endpoint = format!("{brave}/res/v1/web/search");
    let with_key = WebSearch::new(SearchProvider::Brave, &endpoint, 5, Duration::from_secs(5), Some("brave-key".into())).expect("client");
    let out = with_key.search("news").await.expect("results");
    assert_eq!(out["source"], "brave");
    assert_eq!(out["results"][0]["snippet"], "Today");
    let without = WebSearch::new(SearchProvider::Brave, &endpoint, 5, Duration::from_secs(5), None).expect("client");
    assert_eq!(without.search("news").await.expect_err("no key").code, SearchCode::NotConfigured.as_str());

    // A provider that redirects elsewhere is not followed: the key never reaches another host.
    let seen_key = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen = seen_key.clone();
    let elsewhere = serve(Router::new().route(
        "/take",
        get(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                *seen.lock().expect("lock") = headers.get("x-subscription-token").and_then(|v| v.to_str().ok()).map(String::from);
                Json(json!({ "web": { "results": [] } }))
            }
        }),
    ))
    .await;
    let target = format!("{elsewhere}/take");
    let redirecting = serve(Router::new().route("/res/v1/web/search", get(move || { let target = target.clone(); async move { axum::response::Redirect::temporary(&target) } }))).await;
    let keyed = WebSearch::new(SearchProvider::Brave, &format!("{redirecting}/res/v1/web/search"), 5, Duration::from_secs(5), Some("brave-key".into())).expect("client");
    let err = keyed.search("news").await.expect_err("a redirect is the provider's failure");
    assert_eq!(err.code, SearchCode::Provider.as_str(), "{err}");
    assert_eq!(*seen_key.lock().expect("lock"), None, "the key did not follow the redirect");
}

#[tokio::test]
async fn unconfigured_invalid_and_failing_providers() {
    let none = WebSearch::new(SearchProvider::Searxng, "", 5, Duration::from_secs(5), None).expect("client");
    assert_eq!(none.search("x").await.expect_err("unconfigured").code, SearchCode::NotConfigured.as_str());
    assert_eq!(none.search("   ").await.expect_err("empty").code, SearchCode::QueryInvalid.as_str());
    let failing = serve(Router::new().route("/search", get(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy") }))).await;
    let err = WebSearch::new(SearchProvider::Searxng, &failing, 5, Duration::from_secs(5), None).expect("client").search("x").await.expect_err("503");
    assert!(err.code == SearchCode::Provider.as_str() && err.retryable, "{err}");
}
