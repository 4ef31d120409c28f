use leptos::prelude::*;

use crate::api::{UpdatePhones, console_settings};

#[component]
pub fn SettingsPage() -> impl IntoView {
    let (update, saved) = super::form_action::<UpdatePhones>();
    // What was typed, when the numbers were refused: the form is filled with it again.
    let typed = super::form_input::<UpdatePhones>();
    let info = Resource::new_blocking(|| (), |_| console_settings());
    view! {
        {super::page_head("Settings", None)}
        <h1>"Settings"</h1>
        {super::loaded(info, move |s| {
            let phones = typed.get().map_or_else(|| s.my_phones.join("\n"), |t| t.phones);
            view! {
                    <section>
                        <h2>"Your WhatsApp numbers"</h2>
                        <p>"The bot treats messages from these numbers as coming from you, an owner."</p>
                        <ActionForm action=update attr:class="stack">
                            <label>"Numbers in E.164 form, one per line"
                                <textarea name="phones" rows="3" data-testid="phones">{phones}</textarea>
                            </label>
                            <button type="submit">"Save numbers"</button>
                        </ActionForm>
                        {super::answer_view(saved, |_| view! { <p class="ok" role="status">"Saved."</p> })}
                    </section>
                    <section>
                        <h2>"Secrets"</h2>
                        <p>"Read from the environment only; values are never shown."</p>
                        <table class="kv" data-testid="secrets">
                            <tbody>
                                {s.secrets.into_iter().map(|e| view! {
                                    <tr><th><code>{e.variable}</code></th><td>{if e.set { "set" } else { "unset" }}</td></tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                        <h3>"Named in the tool files"</h3>
                        {if s.tool_secrets.is_empty() {
                            view! {
                                <p data-testid="tool-secrets-empty">
                                    "No connector or MCP server names a secret. A connector's header reads one as "
                                    <code>"${VAR}"</code> " (config/connectors.toml), an MCP server's environment or header as "
                                    <code>"{ secret = \"VAR\" }"</code> " (config/mcp.toml)."
                                </p>
                            }.into_any()
                        } else {
                            view! {
                                <table class="kv" data-testid="tool-secrets">
                                    <tbody>
                                        {s.tool_secrets.into_iter().map(|e| view! {
                                            <tr>
                                                <th>{match e.variable {
                                                    Some(v) => view! { <code>{v}</code> }.into_any(),
                                                    None => view! { <span>"(not shown: not in capitals, so it may be a secret pasted where a variable's name belongs)"</span> }.into_any(),
                                                }}</th>
                                                <td>{if e.set { "set" } else { "unset" }}</td>
                                                <td>{e.used_by.join(", ")}</td>
                                            </tr>
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            }.into_any()
                        }}
                    </section>
                    <section>
                        <h2>"Effective configuration"</h2>
                        <p>"From " <code>{s.config_path.clone()}</code> " and GATEHOUSE__SECTION__KEY variables. Every key is explained in that file."</p>
                        <table class="kv" data-testid="effective-config">
                            <tbody>
                                {s.entries.into_iter().map(|e| view! {
                                    <tr><th><code>{e.key}</code></th><td><code>{e.value}</code></td></tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                    </section>
            }
        })}
    }
}
