use super::*;

/// A message carries its sender's profile name from the change's contacts: trimmed, bounded,
/// and never another sender's.
#[test]
fn a_message_carries_its_senders_profile_name() {
    let long = "N".repeat(300);
    let body = serde_json::json!({ "object": "whatsapp_business_account", "entry": [{ "changes": [{ "field": "messages", "value": {
        "contacts": [{ "profile": { "name": "  Ana Souza " }, "wa_id": "1" }, { "profile": { "name": long }, "wa_id": "2" }, { "profile": { "name": "" }, "wa_id": "3" }],
        "messages": [
            { "from": "1", "id": "wamid.A", "timestamp": "1", "type": "text", "text": { "body": "hi" } },
            { "from": "2", "id": "wamid.B", "timestamp": "1", "type": "text", "text": { "body": "hi" } },
            { "from": "3", "id": "wamid.C", "timestamp": "1", "type": "text", "text": { "body": "hi" } },
            { "from": "4", "id": "wamid.D", "timestamp": "1", "type": "text", "text": { "body": "hi" } }
        ] } }] }] });
    let batch = parse(body.to_string().as_bytes(), 4096, 0).expect("parses");
    let names: Vec<Option<String>> = batch.messages.iter().map(|m| m.sender_name.clone()).collect();
    assert_eq!(names, vec![Some("Ana Souza".to_string()), Some("N".repeat(NAME_MAX_CHARS)), None, None]);
}

/// An entry or a change that is `null`, or holds `null` or a wrong type where Meta's documents
/// show a list, costs only itself: the messages of the others are still read, and a signed
/// post is never refused (Meta would send it again for days, and it would be lost anyway).
#[test]
fn a_malformed_entry_or_change_costs_only_itself() {
    let message = |id: &str| serde_json::json!({ "from": "1", "id": id, "timestamp": "1", "type": "text", "text": { "body": "hi" } });
    let good = |id: &str| serde_json::json!({ "field": "messages", "value": { "messages": [message(id)] } });
    let body = serde_json::json!({ "object": "whatsapp_business_account", "entry": [
        null,
        { "changes": null },
        { "changes": 7 },
        { "changes": [null, good("wamid.A"), { "field": 3, "value": {} }, "change"] },
        "entry",
        { "changes": [good("wamid.B")] }
    ] });
    let batch = parse(body.to_string().as_bytes(), 4096, 0).expect("parses");
    let wamids: Vec<&str> = batch.messages.iter().map(|m| m.wamid.as_str()).collect();
    assert_eq!(wamids, ["wamid.A", "wamid.B"]);
    assert_eq!(batch.skipped, 5, "two entries and two changes that are not objects, and a change whose field is not a name");
    assert_eq!(batch.unreadable, 4, "the entries and changes that are not objects; a field that is no name is no one's message");
    let nothing = parse(br#"{"object":"whatsapp_business_account","entry":null}"#, 100, 0).expect("an entry list of null is read as empty");
    assert_eq!((nothing.messages.len(), nothing.skipped), (0, 0));
}

/// A status without its state, or with `null` where Meta's documents show an object or a
/// list, is skipped alone: the messages of the same change are still read.
#[test]
fn a_malformed_status_or_contact_costs_only_itself() {
    let body = serde_json::json!({ "object": "whatsapp_business_account", "entry": [{ "changes": [{ "field": "messages", "value": {
        "metadata": null,
        "contacts": [{ "profile": null, "wa_id": "1" }, { "profile": { "name": "Bo" }, "wa_id": "2" }],
        "messages": [
            { "from": "1", "id": "wamid.A", "timestamp": "1", "type": "text", "text": { "body": "hi" } },
            { "from": "2", "id": "wamid.B", "timestamp": "1", "type": "text", "text": { "body": "hi" } }
        ],
        "statuses": [
            { "id": "wamid.OUT1", "timestamp": "1" },
            { "id": "wamid.OUT2", "status": "failed", "timestamp": "1", "errors": null },
            { "id": "wamid.OUT3", "status": "read", "timestamp": "1" }
        ] } }] }] });
    let batch = parse(body.to_string().as_bytes(), 4096, 0).expect("parses");
    let wamids: Vec<&str> = batch.messages.iter().map(|m| m.wamid.as_str()).collect();
    assert_eq!(wamids, ["wamid.A", "wamid.B"]);
    assert_eq!(batch.messages[1].sender_name.as_deref(), Some("Bo"));
    let statuses: Vec<&str> = batch.statuses.iter().map(|s| s.wamid.as_str()).collect();
    assert_eq!(statuses, ["wamid.OUT2", "wamid.OUT3"]);
    assert_eq!(batch.skipped, 1, "the status without a state");
}

/// A message whose parts are not as documented (a text's body `null`, an id of context that
/// is a number) but that names its sender and id is kept, as a message of an unknown kind with
/// its raw JSON: traced and answered, not lost. Before, it was skipped and only counted.
#[test]
fn a_message_not_as_documented_is_kept_by_its_id_and_sender() {
    let body = serde_json::json!({ "object": "whatsapp_business_account", "entry": [{ "changes": [{ "field": "messages", "value": { "messages": [
        { "from": "111", "id": "wamid.ODD", "timestamp": "1739321024", "type": "text", "text": { "body": null }, "group_id": "g-2" },
        { "from": "111", "id": 7, "type": "text", "text": { "body": null } },
        { "from": "111", "id": "wamid.GROUP", "type": "text", "text": { "body": null }, "group_id": 12 }
    ] } }] }] });
    let batch = parse(body.to_string().as_bytes(), 10_000, 5).expect("parse");
    assert_eq!(batch.messages.len(), 1, "{batch:?}");
    let m = &batch.messages[0];
    assert_eq!((m.wamid.as_str(), m.sender.as_str(), m.chat_id.as_str(), m.msg_type.as_str(), m.text.as_deref(), m.sent_at), ("wamid.ODD", "111", "g-2", "malformed", None, 1_739_321_024_000));
    assert!(m.raw.as_deref().is_some_and(|r| r.contains("\"body\":null")), "{:?}", m.raw);
    assert_eq!((batch.skipped, batch.unreadable), (2, 2), "the one without a readable id, and the one whose group cannot be read");
}

#[test]
fn every_entry_change_message_and_status_is_read() {
    let body = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [
            { "id": "1", "changes": [
                { "field": "messages", "value": { "metadata": { "phone_number_id": "42" }, "messages": [
                    { "from": "111", "id": "wamid.A", "timestamp": "1739321024", "type": "text", "text": { "body": "hi" },
                      "context": { "from": "42", "id": "wamid.Q" } },
                    { "from": "111", "id": "wamid.B", "timestamp": "1739321025", "type": "interactive",
                      "interactive": { "type": "list_reply", "list_reply": { "id": "row-2", "title": "Tuesday", "description": "x" } } }
                ] } },
                { "field": "account_update", "value": {} }
            ] },
            { "id": "2", "changes": [
                { "field": "messages", "value": { "metadata": { "phone_number_id": "42" }, "messages": [
                    { "from": "222", "id": "wamid.C", "timestamp": "1739321026", "type": "sticker", "sticker": { "id": "m1" }, "group_id": "g-1" },
                    { "from": "222", "type": "text", "text": { "body": "no id" } }
                ], "statuses": [
                    { "id": "wamid.S", "status": "failed", "timestamp": "1739321030", "recipient_id": "333",
                      "errors": [{ "code": 131047, "title": "Re-engagement message" }] }
                ] } }
            ] }
        ]
    });
    let batch = parse(body.to_string().as_bytes(), 10_000, 5).expect("parse");
    assert_eq!(batch.messages.len(), 3);
    assert_eq!(batch.skipped, 2, "the other field and the message without an id");
    assert_eq!(batch.unreadable, 1, "the message without an id; another field is no one's message");
    let a = &batch.messages[0];
    assert_eq!((a.msg_type.as_str(), a.text.as_deref(), a.context_id.as_deref(), a.sent_at), ("text", Some("hi"), Some("wamid.Q"), 1_739_321_024_000));
    assert_eq!(a.phone_number_id, "42");
    let b = &batch.messages[1];
    assert_eq!((b.msg_type.as_str(), b.text.as_deref(), b.reply_id.as_deref()), ("interactive.list_reply", Some("Tuesday"), Some("row-2")));
    let c = &batch.messages[2];
    assert_eq!((c.msg_type.as_str(), c.chat_id.as_str(), c.sender.as_str(), c.is_group), ("sticker", "g-1", "222", true));
    assert!(c.raw.as_deref().is_some_and(|r| r.contains("\"sticker\"")));
    assert_eq!(batch.statuses.len(), 1);
    assert_eq!(batch.statuses[0].state, DeliveryState::Failed);
    assert_eq!(batch.statuses[0].error_code.as_deref(), Some("131047"));
}

#[test]
fn large_raw_objects_are_not_kept_verbatim_and_other_objects_are_ignored() {
    let long = "x".repeat(500);
    let body = serde_json::json!({ "object": "whatsapp_business_account", "entry": [{ "changes": [{ "field": "messages", "value": {
        "messages": [{ "from": "1", "id": "wamid.L", "timestamp": "1", "type": "text", "text": { "body": long } }] } }] }] });
    let batch = parse(body.to_string().as_bytes(), 100, 0).expect("parse");
    assert!(batch.messages[0].raw_truncated && batch.messages[0].raw.is_none());
    assert_eq!(batch.messages[0].text.as_deref().map(str::len), Some(500), "the parsed text is kept whole");
    let page = parse(br#"{"object":"page","entry":[]}"#, 100, 0).expect("another product's post is read");
    assert_eq!((page.other_object.as_deref(), page.messages.len(), page.skipped), (Some("page"), 0, 1), "and ignored");
    assert!(parse(b"not json", 100, 0).is_err());
}
