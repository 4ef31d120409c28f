use axum::http::{Method, StatusCode};

use crate::{
    both_backends,
    support::{TestApp, TestDb},
};

/// Every registered server function, found at run time, so a new one cannot be forgotten.
fn registered() -> Vec<(String, Method)> {
    leptos::server_fn::axum::server_fn_paths().map(|(path, method)| (path.to_string(), method)).collect()
}

#[test]
fn registry_is_enumerable() {
    let paths: Vec<String> = registered().into_iter().map(|(p, _)| p).collect();
    for known in ["/api/login", "/api/setup_owner", "/api/logout", "/api/current_owner", "/api/dashboard_facts", "/api/console_settings", "/api/update_phones"] {
        assert!(paths.iter().any(|p| p == known), "{known} missing from {paths:?}");
    }
}

async fn every_server_fn_refuses_without_session(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", "correct horse battery").await;
    let mut anonymous = app.client();
    let public = app::api::PUBLIC_SERVER_FNS;
    let mut checked = 0;
    for (path, method) in registered() {
        if public.contains(&path.as_str()) {
            continue;
        }
        let res = anonymous.request(method.clone(), &path, Some(String::new())).await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{method} {path}: {}", res.body);
        let body = res.json();
        assert_eq!(body["code"], "UNAUTHORIZED", "{path}");
        assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{path} returns no data: {}", res.body);
        checked += 1;
    }
    assert!(checked >= 5, "checked {checked} protected server functions");
}
both_backends!(server_fns_need_session, every_server_fn_refuses_without_session);

/// Defence in depth: each protected function refuses on its own, even if the guard in front of
/// it were gone. The functions are called directly, with an empty session.
async fn every_server_fn_checks_the_session_itself(db: TestDb) {
    use std::sync::Arc;

    use app::backend::SharedBackend;
    use leptos::prelude::provide_context;

    let app = TestApp::new(db).await;
    app.with_owner("ada", "correct horse battery").await;
    let backend: SharedBackend = Arc::new(server::web::console::ConsoleBackend::new(app.state.clone()));
    let store = Arc::new(server::web::session_store::DbSessionStore::new(app.state.db.clone()));
    for (path, method) in registered() {
        if app::api::PUBLIC_SERVER_FNS.contains(&path.as_str()) {
            continue;
        }
        // Functions with arguments need a body that decodes, or they fail before their body
        // runs. A new function with arguments must be added here, or this test fails.
        let body = match path.as_str() {
            "/api/update_phones" => "phones=%2B15550009999",
            "/api/list_jobs" => "state=&tool=&chat=&since_minutes=0&before=0",
            "/api/get_job" | "/api/retry_job" | "/api/cancel_job" | "/api/run_job_again" => "id=1",
            "/api/list_tools" => "provider=&audience=&risk=",
            "/api/get_tool" => "name=web_fetch",
            "/api/try_tool" => "name=web_fetch&args=%7B%7D&chat_type=direct",
            "/api/mcp_set_enabled" => "server=x&enabled=true",
            "/api/mcp_refresh" => "server=x",
            "/api/list_traces" => "chat=&route=&outcome=&error_code=&since_minutes=0&before=0",
            "/api/get_trace" => "id=1",
            "/api/get_chat" => "channel=simulator&chat_id=x",
            "/api/simulate_message" => "from=%2B15550100000&text=hi&chat_id=",
            "/api/mcp_decide" => "tool=x__y&decision=approve&hash=sha256%3A0",
            "/api/decide_approval" => "id=1&decision=approve",
            "/api/mark_trace" => "trace_id=1&expect=normal_chat",
            "/api/decide_repair" => "id=1&action=approve",
            "/api/mcp_answer_form" => "id=1&decision=accept",
            "/api/take_answer" => "path=%2Fapi%2Ftry_tool",
            _ => "",
        };
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(&path)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(axum::body::Body::from(body))
            .expect("request");
        req.extensions_mut().insert(tower_sessions::Session::new(None, store.clone(), None));
        let backend = backend.clone();
        let res = leptos_axum::handle_server_fns_with_context(move || provide_context(backend.clone()), req).await;
        let res = axum::response::IntoResponse::into_response(res);
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path} without the guard");
    }
}
both_backends!(server_fns_check_session_themselves, every_server_fn_checks_the_session_itself);

/// A filter takes any number a URL can carry: a huge `since_minutes` is answered (every row
/// is that recent), not an arithmetic overflow.
async fn huge_filter_numbers_are_answered(db: TestDb) {
    let app = TestApp::new(db).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let huge = "200000000000000";
    for path in [format!("/traces?since_minutes={huge}"), format!("/jobs?since_minutes={huge}")] {
        assert_eq!(owner.get(&path).await.status, StatusCode::OK, "{path}");
    }
    let listed = owner.post_form("/api/list_traces", &[("chat", ""), ("route", ""), ("outcome", ""), ("error_code", ""), ("since_minutes", huge), ("before", "0")]).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
}
both_backends!(server_fns_huge_filters, huge_filter_numbers_are_answered);

async fn every_console_page_needs_session(db: TestDb) {
    let app = TestApp::new(db).await;
    app.with_owner("ada", "correct horse battery").await;
    let mut anonymous = app.client();
    for (path, _) in app::NAV {
        let res = anonymous.get(path).await;
        let encoded: String = url::form_urlencoded::byte_serialize(path.as_bytes()).collect();
        assert_eq!(res.location(), Some(format!("/login?next={encoded}").as_str()), "{path}");
        assert!(!res.body.contains("Dashboard"), "{path} leaks no page content");
    }
    let mut owner = app.client();
    owner.post_form("/api/login", &[("login", "ada"), ("password", "correct horse battery"), ("next", "/")]).await;
    for (path, label) in app::NAV {
        let res = owner.get(path).await;
        assert_eq!(res.status, StatusCode::OK, "{path}");
        assert!(res.body.contains(label.replace('&', "&amp;").as_str()), "{path} renders {label}");
    }
}
both_backends!(console_pages_need_session, every_console_page_needs_session);

/// A page renders while routers are being built. Route generation switches resource loading off
/// process-wide (leptos_server's `SuppressResourceLoad`), so a page whose data started loading at
/// that moment used to wait forever: tests that built their apps beside a rendering test hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_render_while_routers_are_built() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let app = TestApp::new(TestDb::sqlite()).await;
    let mut owner = app.with_owner("ada", "correct horse battery").await;
    let stop = Arc::new(AtomicBool::new(false));
    let builder = {
        let (stop, state, runtime) = (stop.clone(), app.state.clone(), tokio::runtime::Handle::current());
        std::thread::spawn(move || {
            let _runtime = runtime.enter();
            let mut built = 0u32;
            while !stop.load(Ordering::Relaxed) {
                drop(server::web::router(state.clone()));
                built += 1;
            }
            built
        })
    };
    for render in 0..30 {
        let page = tokio::time::timeout(std::time::Duration::from_secs(10), owner.get("/")).await;
        let page = page.unwrap_or_else(|_| panic!("render {render} never finished while routers were being built"));
        assert_eq!(page.status, StatusCode::OK);
        assert!(page.body.contains("dashboard-facts"), "the dashboard's data loaded");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(builder.join().expect("builder thread") > 0, "routers were built meanwhile");
}
