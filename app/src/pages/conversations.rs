//! The Conversations page: every chat, WhatsApp and simulated, with its messages, delivery
//! states and links to traces; and the simulator, which talks to the bot through the same
//! runtime as WhatsApp (only the transport differs), as any number: an owner's number makes
//! the sender an owner. The list and each chat follow the live events of messages and replies.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::{
    api::{SimulateMessage, get_chat, list_chats},
    dto::ChatView,
    live::{MESSAGES_LIVE, fmt_time},
};

fn chat_href(c: &ChatView) -> String {
    format!("/conversations/{}/{}", c.channel, super::url_encode(&c.chat_id))
}

#[component]
pub fn ConversationsPage() -> impl IntoView {
    let (send, sent) = super::form_action::<SimulateMessage>();
    // What was typed, when the last message was refused: the form is filled with it again.
    let typed = super::form_input::<SimulateMessage>();
    let page = Resource::new(|| (), |_| list_chats());
    view! {
        {super::page_head("Conversations", Some(MESSAGES_LIVE))}
        <h1>"Conversations"</h1>
        {super::loaded(page, move |p| {
            // Carry on as the last message's sender, as a chat would.
            let typed = typed.get().filter(|t| t.chat_id.is_empty());
            let from = match &typed {
                Some(t) => t.from.clone(),
                None => sent.get().and_then(Result::ok).map_or_else(|| p.simulator_customer.clone(), |o| o.from),
            };
            let text = typed.as_ref().map(|t| t.text.clone()).unwrap_or_default();
            let group = typed.as_ref().is_some_and(|t| t.group.as_deref() == Some("true"));
            let owner_hint = if p.owner_numbers.is_empty() {
                view! { "Add your WhatsApp number in "<a href="/settings" data-testid="sim-settings">"Settings"</a>" to talk as the owner." }.into_any()
            } else {
                format!("Send from {} to talk as the owner; any other number is a customer.", p.owner_numbers.join(" or ")).into_any()
            };
            view! {
                <section class="card" data-testid="simulator">
                    <h2>"Simulator"</h2>
                    <p>{owner_hint}</p>
                    <ActionForm action=send attr:class="try-it">
                        <label>"From" <input type="tel" name="from" value=from required=true data-testid="sim-from" /></label>
                        <label>"Message" <textarea name="text" rows="3" required=true data-testid="sim-text">{text}</textarea></label>
                        <input type="hidden" name="chat_id" value="" />
                        <label class="inline"><input type="checkbox" name="group" value="true" checked=group data-testid="sim-group" />" In a group, mentioning the bot"</label>
                        <button type="submit" data-testid="sim-send">"Send"</button>
                    </ActionForm>
                </section>
                <div data-live-region="chats">{chat_list(p.chats)}</div>
            }
        })}
        {super::answer_view(sent, |o| view! {
                <div class="try-result ok" data-testid="sim-result" data-route=o.route.clone()>
                    <p><strong>{format!("Route: {} (as {})", o.route, o.actor)}</strong>
                        {o.trace_id.map(|id| view! { " · "<a href=format!("/traces/{id}") data-testid="sim-trace">"trace"</a> })}
                        " · "<a href=format!("/conversations/simulator/{}", super::url_encode(&o.chat_id))>"open the chat"</a></p>
                    <p data-testid="sim-reply">{o.reply.clone().unwrap_or_else(|| "(no reply)".into())}</p>
                </div>
        })}
    }
}

fn chat_list(chats: Vec<ChatView>) -> AnyView {
    if chats.is_empty() {
        return view! {
            <div class="empty" data-testid="chats-empty">
                <p><strong>"No conversations yet."</strong></p>
                <p>"WhatsApp chats appear here once Meta delivers messages to /webhooks/whatsapp. Use the simulator above to talk to the bot now."</p>
            </div>
        }
        .into_any();
    }
    let rows = chats.into_iter().map(|c| view! {
        <tr data-chat=c.chat_id.clone()>
            <td data-label="Chat">
                <a href=chat_href(&c)>{c.name.clone().unwrap_or_else(|| c.chat_id.clone())}</a>
                {c.name.is_some().then(|| view! { <br/><small data-testid="chat-number">{c.chat_id.clone()}</small> })}
            </td>
            <td data-label="Channel">{c.channel.clone()}</td>
            <td data-label="Messages">{c.messages}</td>
            <td data-label="Last (UTC)">{fmt_time(c.last_at)}</td>
        </tr>
    }).collect_view();
    super::list_table("chats-table", &["Chat", "Channel", "Messages", "Last (UTC)"], rows)
}

#[component]
pub fn ChatPage() -> impl IntoView {
    let params = use_params_map();
    let key = Memo::new(move |_| params.with(|p| (p.get("channel").unwrap_or_default(), p.get("chat").unwrap_or_default())));
    // Taken here, so that the Conversations page does not show it later as its own result.
    let (send, sent) = super::form_action::<SimulateMessage>();
    let typed = super::form_input::<SimulateMessage>();
    let chat = Resource::new(move || key.get(), |(channel, chat)| get_chat(channel, chat));
    view! {
        {super::page_head("Chat", Some(MESSAGES_LIVE))}
        <p><a href="/conversations">"\u{2190} All conversations"</a></p>
        {super::loaded(chat, move |c| {
            // Carry on as the chat's last sender (an owner's number talks as the owner).
            let last_sender = c.messages.iter().rev().find(|m| m.direction == "in").map(|m| format!("+{}", m.sender)).unwrap_or_default();
            // What was typed in this chat, when its last message was refused.
            let typed = typed.get().filter(|t| t.chat_id == c.chat_id);
            let from = typed.as_ref().map_or(last_sender, |t| t.from.clone());
            let text = typed.as_ref().map(|t| t.text.clone()).unwrap_or_default();
            let group = typed.as_ref().map_or(c.group, |t| t.group.as_deref() == Some("true"));
            view! {
                <h1>
                    {c.name.clone().map(|name| view! { <span data-testid="chat-name">{name}</span>" " })}
                    {c.name.as_ref().map_or_else(|| c.chat_id.clone(), |_| format!("({})", c.chat_id))}" "<span class="badge">{c.channel.clone()}</span>
                    {c.group.then(|| view! { " "<span class="badge" data-testid="chat-group">"group"</span> })}
                </h1>
                <ol class="chat" data-testid="chat-messages" data-live-region="messages">
                    {c.messages.into_iter().map(|m| view! {
                        <li class=format!("msg {}", m.direction) data-direction=m.direction.clone() data-state=m.state.clone()>
                            <div class="meta">
                                <small>{format!("{} · {}", m.sender, fmt_time(m.at))}</small>" "
                                <span class=format!("badge delivery-{}", m.state)>{m.state.clone()}</span>
                                {m.error_code.clone().map(|code| view! { " "<code>{code}</code> })}
                                {m.trace_id.map(|id| view! { " "<a href=format!("/traces/{id}")>"trace"</a> })}
                            </div>
                            <p>{m.text.clone()}</p>
                        </li>
                    }).collect_view()}
                </ol>
                {(c.channel == "simulator").then(|| {
                    view! {
                        <section class="card" data-testid="chat-compose">
                            <h2>"Continue this chat"</h2>
                            <ActionForm action=send attr:class="try-it">
                                <label>"From" <input type="tel" name="from" value=from required=true data-testid="compose-from" /></label>
                                <label>"Message" <textarea name="text" rows="2" required=true data-testid="compose-text">{text}</textarea></label>
                                <input type="hidden" name="chat_id" value=c.chat_id.clone() />
                                <label class="inline"><input type="checkbox" name="group" value="true" checked=group data-testid="compose-group" />" In a group, mentioning the bot"</label>
                                <button type="submit" data-testid="compose-send">"Send"</button>
                            </ActionForm>
                        </section>
                    }
                })}
            }
        })}
        // A message sent shows in the chat itself; only an error is said here.
        {super::answer_with(sent, |r| r.err().map(|e| super::error_view(&e)))}
    }
}
