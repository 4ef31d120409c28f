//! Forms MCP servers ask the owners to fill in during a call (`elicitation = "owner"`), on the
//! MCP servers page: they sit beside the server that asks, whose tools and trust the owner
//! sees there. Each form is generated from the schema the server sent (text, number, whole
//! number, yes/no and choice fields, defaults filled in); the server's message, titles and
//! descriptions are untrusted text, shown as text and labelled as the server's. Accept sends
//! the values (checked against the schema on the server), Decline and Cancel send none.

use leptos::prelude::*;

use crate::{
    api::McpAnswerForm,
    dto::{McpFormField, McpFormView},
    live::fmt_time,
};

/// A form's card; `filled` holds the values given in a refused answer, shown instead of the
/// defaults.
pub fn form_card(f: McpFormView, answer: ServerAction<McpAnswerForm>, filled: std::collections::BTreeMap<String, String>) -> impl IntoView {
    let id = f.id.to_string();
    let button = move |decision: &'static str, text: &'static str, class: &'static str| {
        let id = id.clone();
        view! {
            <ActionForm action=answer>
                <input type="hidden" name="id" value=id />
                <input type="hidden" name="decision" value=decision />
                <button type="submit" class=class data-testid=format!("form-{decision}")>{text}</button>
            </ActionForm>
        }
    };
    let accept_id = f.id.to_string();
    view! {
        <section class="card mcp-form" id=format!("elicitation-{}", f.id) data-testid="mcp-form" data-id=f.id.to_string() data-server=f.server.clone()>
            <h2>{format!("Form #{} asked by the MCP server {}", f.id, f.server)}</h2>
            <p><small>{format!("A call waits for this answer until {}; then the server is told \"cancel\". Only owners are asked, never a customer.", fmt_time(f.expires_at))}</small></p>
            <div class="untrusted">
                <p><strong>{format!("Message from the server {} (untrusted, not written by Gatehouse):", f.server)}</strong></p>
                <blockquote data-testid="form-message">{f.message.clone()}</blockquote>
            </div>
            <ActionForm action=answer>
                <input type="hidden" name="id" value=accept_id />
                <input type="hidden" name="decision" value="accept" />
                {f.fields.into_iter().map(|fl| {
                    let given = filled.get(&fl.name).cloned();
                    field_input(fl, given)
                }).collect_view()}
                <button type="submit" data-testid="form-accept">"Accept and send"</button>
            </ActionForm>
            <div class="actions">
                {button("decline", "Decline", "")}
                {button("cancel", "Cancel the call's request", "danger")}
            </div>
        </section>
    }
}

fn field_input(fl: McpFormField, given: Option<String>) -> impl IntoView {
    let name = format!("values[{}]", fl.name);
    let default = given.or_else(|| fl.default.clone()).unwrap_or_default();
    // A field that may stay empty gets an empty choice; empty means "not given" (its default).
    let blank = !fl.required || fl.default.is_none();
    let input = match fl.kind.as_str() {
        "boolean" => view! {
            <select name=name data-field=fl.name.clone()>
                {blank.then(|| view! { <option value="">"(not given)"</option> })}
                <option value="true" selected={default == "true"}>"yes"</option>
                <option value="false" selected={default == "false"}>"no"</option>
            </select>
        }
        .into_any(),
        "enum" => view! {
            <select name=name data-field=fl.name.clone()>
                {blank.then(|| view! { <option value="">"(not given)"</option> })}
                {fl.options.iter().map(|(value, label)| view! { <option value=value.clone() selected={*value == default}>{label.clone()}</option> }).collect_view()}
            </select>
        }
        .into_any(),
        kind => {
            let (ty, step) = match (kind, fl.format.as_deref()) {
                ("integer", _) => ("number", Some("1")),
                ("number", _) => ("number", Some("any")),
                (_, Some("email")) => ("email", None),
                (_, Some("uri")) => ("url", None),
                (_, Some("date")) => ("date", None),
                _ => ("text", None),
            };
            view! { <input type=ty step=step name=name value=default required=fl.required data-field=fl.name.clone() /> }.into_any()
        }
    };
    view! {
        <label class="form-field">
            <span>{fl.label.clone()}{fl.required.then_some(" *")}" "<small>{format!("({})", fl.kind)}</small></span>
            {input}
            {fl.description.clone().map(|d| view! { <small class="untrusted">{d}</small> })}
        </label>
    }
}
