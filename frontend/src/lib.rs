//! The wasm entry point: it hydrates the console's islands (app::live); everything else on a
//! page is server-rendered HTML.

// Links the app crate, whose islands are exported to the page's JavaScript.
extern crate app;

#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_islands();
}
