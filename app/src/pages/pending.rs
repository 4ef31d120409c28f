//! Sections whose capability has not landed yet. They say what will fill them and show no rows.

use leptos::prelude::*;
use leptos_meta::Title;

fn pending(title: &'static str, capability: &'static str, what: &'static str) -> impl IntoView {
    view! {
        <Title text=format!("{title} · Gatehouse") />
        <h1>{title}</h1>
        <div class="empty" data-testid="pending-capability">
            <p><strong>"Nothing to show yet."</strong> " This page is filled by the " <em>{capability}</em> " capability, which is not part of this build."</p>
            <p>{what}</p>
        </div>
    }
}

#[component]
pub fn Repairs() -> impl IntoView {
    pending(
        "Repairs",
        "self-improvement",
        "Failed traces will become regression cases and proposed repairs (diffs) for you to approve or reject. Nothing changes itself.",
    )
}
