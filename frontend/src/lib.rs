//! The wasm entry point: it only hydrates the server-rendered console.

#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // Synchronous hydration: a release build removes the async path (lazy routes,
    // `hydrate_lazy`) from the wasm, see scripts/wasm-drop-async-hydration.mjs.
    leptos::mount::hydrate_body(app::App);
}
