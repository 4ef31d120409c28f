//! The Gatehouse console: Leptos pages rendered on the server, and the server functions behind
//! them. Built in islands mode: a page's own code never reaches the browser; the wasm holds
//! only the islands in [`live`] (keeping a page current, marking it ready). Owner actions are
//! plain HTML forms: the server function runs and the browser comes back to the page, which
//! shows its answer ([`pages::answer_view`]).

pub mod api;
pub mod domain;
pub mod dto;
pub mod error;
mod layout;
pub mod live;
pub mod pages;

#[cfg(feature = "ssr")]
pub mod auth;
#[cfg(feature = "ssr")]
pub mod backend;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::{
    ParamSegment, SsrMode, StaticSegment,
    components::{ParentRoute, Route, Router, Routes},
};

pub use layout::NAV;

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <link rel="icon" href="data:," />
                <link rel="stylesheet" href="/assets/gatehouse.css" />
                <HydrationScripts options islands=true />
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Title text="Gatehouse" />
        <Router>
            <Routes fallback=pages::NotFound>
                <Route path=StaticSegment("setup") view=pages::setup::SetupPage />
                <Route path=StaticSegment("login") view=pages::login::LoginPage />
                // Rendered whole before it is sent (no streamed fragments), so a page is
                // complete without JavaScript and a live update can take its region as it is.
                <ParentRoute path=StaticSegment("") view=layout::ConsoleLayout ssr=SsrMode::Async>
                    <Route path=StaticSegment("") view=pages::dashboard::DashboardPage />
                    <Route path=StaticSegment("settings") view=pages::settings::SettingsPage />
                    <Route path=StaticSegment("conversations") view=pages::conversations::ConversationsPage />
                    <Route path=(StaticSegment("conversations"), ParamSegment("channel"), ParamSegment("chat")) view=pages::conversations::ChatPage />
                    <Route path=StaticSegment("traces") view=pages::traces::TracesPage />
                    <Route path=(StaticSegment("traces"), ParamSegment("id")) view=pages::traces::TraceDetailPage />
                    <Route path=StaticSegment("approvals") view=pages::approvals::ApprovalsPage />
                    <Route path=StaticSegment("jobs") view=pages::jobs::JobsPage />
                    <Route path=(StaticSegment("jobs"), ParamSegment("id")) view=pages::jobs::JobDetailPage />
                    <Route path=StaticSegment("tools") view=pages::tools::ToolsPage />
                    <Route path=StaticSegment("mcp") view=pages::mcp::McpPage />
                    <Route path=(StaticSegment("tools"), ParamSegment("name")) view=pages::tools::ToolDetailPage />
                    <Route path=StaticSegment("repairs") view=pages::repairs::RepairsPage />
                </ParentRoute>
            </Routes>
        </Router>
        <live::Ready />
    }
}
