use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::api::SetupOwner;

/// First run: creates the first owner. Closed for good once an owner exists.
#[component]
pub fn SetupPage() -> impl IntoView {
    let action = ServerAction::<SetupOwner>::new();
    let value = action.value();
    // The setup token, for setup from another machine (`/setup?token=...`).
    let query = use_query_map();
    let token = move || query.read().get("token").unwrap_or_default();
    view! {
        <Title text="Set up Gatehouse" />
        <main class="narrow">
            <h1>"Set up Gatehouse"</h1>
            <p>"Create the first owner account. Owners run the console and are recognised by the bot from their WhatsApp numbers."</p>
            <p data-testid="setup-access">
                "Setup is answered on the machine Gatehouse runs on (http://127.0.0.1, not through a proxy). From anywhere else, set "
                <code>"GATEHOUSE_SETUP_TOKEN"</code>
                " for the server and open "
                <code>"/setup?token=<that value>"</code>
                "."
            </p>
            <ActionForm action=action attr:class="stack">
                <input type="hidden" name="token" value=token />
                <label>"Display name" <input type="text" name="display_name" required maxlength="80" autocomplete="name" /></label>
                <label>"Login name" <input type="text" name="login" required minlength="2" maxlength="32" autocomplete="username" /></label>
                <label>"Password (at least 12 characters)" <input type="password" name="password" required minlength="12" autocomplete="new-password" /></label>
                <label>"Repeat password" <input type="password" name="password_confirm" required minlength="12" autocomplete="new-password" /></label>
                <label>"Your WhatsApp numbers in E.164 form, comma separated"
                    <input type="text" name="whatsapp" required placeholder="+15550001111" inputmode="tel" />
                </label>
                <button type="submit" disabled=move || action.pending().get()>"Create owner"</button>
            </ActionForm>
            {move || value.get().and_then(|r| r.err()).map(|e| super::error_view(&e))}
        </main>
    }
}
