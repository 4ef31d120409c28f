use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::api::Login;

#[component]
pub fn LoginPage() -> impl IntoView {
    let action = ServerAction::<Login>::new();
    let value = action.value();
    let query = use_query_map();
    let next = move || query.with(|q| q.get("next")).unwrap_or_else(|| "/".to_string());
    view! {
        <Title text="Log in · Gatehouse" />
        <main class="narrow">
            <h1>"Gatehouse"</h1>
            <ActionForm action=action attr:class="stack">
                <input type="hidden" name="next" value=next />
                <label>"Login name" <input type="text" name="login" required autocomplete="username" /></label>
                <label>"Password" <input type="password" name="password" required autocomplete="current-password" /></label>
                <button type="submit" disabled=move || action.pending().get()>"Log in"</button>
            </ActionForm>
            {move || value.get().and_then(|r| r.err()).map(|e| {
                view! { <p class="error" role="alert" data-code=e.code.clone()>{e.message.clone()}</p> }
            })}
        </main>
    }
}
