//! Behaviour of the detector with the shipped catalog (config/tools.toml) loaded, and with small
//! catalogs made for one rule each. Tests may name tools; the detector itself never does.

use serde_json::json;

use super::*;

const SHIPPED_TOOLS: &str = include_str!("../../../../config/tools.toml");

/// The shipped tools as the catalog would hand them over. `enable_all` switches on tools that
/// ship disabled (web_search waits for a provider), as an owner who configured one would.
fn shipped(enable_all: bool) -> Vec<ToolDoc> {
    let config: toml::Value = toml::from_str(SHIPPED_TOOLS).expect("config/tools.toml parses");
    let tools = config
        .get("tool")
        .and_then(|t| t.as_array())
        .expect("config/tools.toml has [[tool]]");
    tools
        .iter()
        .map(|tool| doc_from_toml(tool, enable_all))
        .collect()
}

fn doc_from_toml(tool: &toml::Value, enable_all: bool) -> ToolDoc {
    let text = |key: &str| {
        tool.get(key)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let list = |key: &str| -> Vec<String> {
        tool.get(key)
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let schema = tool
        .get("input_schema")
        .map(|s| serde_json::to_value(s).expect("schema is JSON"))
        .unwrap_or_default();
    ToolDoc {
        name: text("name"),
        title: text("title"),
        description: text("description"),
        when_to_use: text("when_to_use"),
        when_not_to_use: text("when_not_to_use"),
        aliases: list("aliases"),
        triggers: list("triggers"),
        tags: list("tags"),
        params: ParamDoc::from_schema(&schema),
        owner_only: text("audience") == "owner_only",
        chat_types: list("chat_types")
            .iter()
            .map(|c| {
                if c == "group" {
                    ChatKind::Group
                } else {
                    ChatKind::Direct
                }
            })
            .collect(),
        enabled: enable_all
            || tool
                .get("enabled")
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
        plan_threshold: tool.get("plan_threshold").and_then(toml::Value::as_float).map(|t| t as f32),
    }
}

/// The connector example of config/tools.toml, as an owner would declare it.
fn lookup_order() -> ToolDoc {
    ToolDoc {
        name: "lookup_order".into(),
        title: "Look up an order".into(),
        description: "Finds an order in the shop by its number and returns its status.".into(),
        when_to_use: "The customer asks where their order is and gives an order number.".into(),
        params: ParamDoc::from_schema(&json!({
            "type": "object",
            "properties": { "order_id": { "type": "string" }, "chat_id": { "type": "string" } }
        })),
        enabled: true,
        ..ToolDoc::default()
    }
}

/// A tool whose text overlaps every never-plan message: without the conversation and memory
/// rules, its triggers alone would plan them.
fn chatty_tool() -> ToolDoc {
    ToolDoc {
        name: "notes".into(),
        description: "Remembers, rewrites and explains notes about a friend; continue a note."
            .into(),
        triggers: [
            "remember",
            "my friend",
            "tell you earlier",
            "say before",
            "rewrite this",
            "explain this",
            "thanks",
            "okay",
            "how are you",
            "continue",
            "hello",
            "hi",
            "good morning",
        ]
        .map(String::from)
        .to_vec(),
        enabled: true,
        ..ToolDoc::default()
    }
}

fn build(docs: Vec<ToolDoc>) -> Index {
    Index::build(docs, DetectorSettings::default())
}

fn detect(index: &Index, message: &str) -> Detection {
    index.detect(message, Role::Owner, ChatKind::Direct, &[])
}

fn names(detection: &Detection) -> Vec<&str> {
    detection
        .candidates
        .iter()
        .map(|c| c.name.as_str())
        .collect()
}

const NEVER_PLAN: &[(&str, ReasonCode)] = &[
    ("Do you remember my friend?", ReasonCode::MemoryQuestion),
    ("What did I tell you earlier?", ReasonCode::MemoryQuestion),
    ("Can you rewrite this?", ReasonCode::Conversational),
    ("Explain this.", ReasonCode::Conversational),
    ("Thanks.", ReasonCode::Conversational),
    ("Okay.", ReasonCode::Conversational),
    ("How are you?", ReasonCode::Conversational),
    ("What did I say before?", ReasonCode::MemoryQuestion),
    ("Continue.", ReasonCode::Conversational),
    ("Hi!", ReasonCode::Conversational),
    ("Hello there", ReasonCode::Conversational),
    ("Good morning :)", ReasonCode::Conversational),
    ("hey, thank you so much!", ReasonCode::Conversational),
    ("What's up?", ReasonCode::Conversational),
    ("What's my name?", ReasonCode::MemoryQuestion),
    ("whats my name", ReasonCode::MemoryQuestion),
    ("Do you know my name?", ReasonCode::MemoryQuestion),
    ("What did you tell me yesterday?", ReasonCode::MemoryQuestion),
];

#[test]
fn conversation_and_memory_never_plan_with_the_shipped_catalog() {
    let mut docs = shipped(true);
    docs.push(chatty_tool());
    let index = build(docs);
    for (message, reason) in NEVER_PLAN {
        let detection = detect(&index, message);
        assert!(!detection.should_plan, "{message:?} planned: {detection:?}");
        assert_eq!(detection.reason, *reason, "{message:?}");
        assert!(
            detection.candidates.is_empty(),
            "{message:?} has candidates"
        );
    }
}

#[test]
fn a_request_after_a_name_or_a_reminder_still_reaches_the_tool() {
    // Customers often introduce themselves, or point back at what they said, before they ask:
    // neither asks what was said before, so the request plans as it would alone.
    let mut docs = shipped(true);
    docs.push(lookup_order());
    let index = build(docs);
    let request = "Can you look up the status of order number 4821 in the shop?";
    let messages = [
        request.to_string(),
        format!("Hi, my name is Ana Lima. {request}"),
        format!("Hello! My name's Ana. {request}"),
        format!("As I told you yesterday: {request}"),
        format!("You said to write again. {request}"),
    ];
    for message in messages {
        let detection = index.detect(&message, Role::Customer, ChatKind::Direct, &[]);
        assert!(detection.should_plan, "{message:?}: {detection:?}");
        assert_eq!(detection.reason, ReasonCode::CandidatesFound, "{message:?}");
        assert_eq!(names(&detection).first(), Some(&"lookup_order"), "{message:?}");
    }
}

#[test]
fn conversation_stays_in_chat_even_after_a_tool_result() {
    let index = build(shipped(true));
    let recent = [RecentContext {
        tool: "web_search".into(),
        summary: "Rust 1.90 released".into(),
        ..Default::default()
    }];
    for message in [
        "Thanks.",
        "Okay, thanks for that",
        "Do you remember it?",
        "How are you?",
    ] {
        let detection = index.detect(message, Role::Customer, ChatKind::Direct, &recent);
        assert!(!detection.should_plan, "{message:?} planned: {detection:?}");
    }
}

#[test]
fn current_and_latest_requests_plan_the_configured_search_tool() {
    let index = build(shipped(true));
    for message in [
        "What's the latest news about the Rust language?",
        "Search for opening hours of the Louvre today",
    ] {
        let detection = detect(&index, message);
        assert!(detection.should_plan, "{message:?}: {detection:?}");
        assert_eq!(detection.reason, ReasonCode::CandidatesFound);
        assert_eq!(
            names(&detection).first(),
            Some(&"web_search"),
            "{message:?}"
        );
        assert!(detection.confidence >= index.settings().plan_threshold);
    }
}

#[test]
fn a_link_plans_the_configured_fetch_tool() {
    let index = build(shipped(true));
    let detection = detect(
        &index,
        "What does this page say? https://example.com/pricing",
    );
    assert!(detection.should_plan, "{detection:?}");
    assert_eq!(names(&detection).first(), Some(&"web_fetch"));
    // A link is itself the request: with a word or two around it, or alone.
    for message in ["summarise https://example.com/menu please", "what's on the menu at https://example.com/menu", "https://example.com/menu"] {
        let detection = detect(&index, message);
        assert!(detection.should_plan, "{message:?}: {detection:?}");
        assert_eq!(names(&detection).first(), Some(&"web_fetch"), "{message:?}");
    }
}

#[test]
fn disabled_tools_are_never_candidates() {
    // web_search ships disabled until a provider is configured.
    let index = build(shipped(false));
    let detection = detect(&index, "What's the latest news about the Rust language?");
    assert!(!names(&detection).contains(&"web_search"), "{detection:?}");
    assert!(!detection.should_plan);
    let disabled = ToolDoc {
        enabled: false,
        ..lookup_order()
    };
    let index = build(vec![disabled]);
    assert!(index.is_empty());
    assert!(
        detect(&index, "Where is my order 4821? Look up the order status")
            .candidates
            .is_empty()
    );
}

#[test]
fn connector_requests_become_candidates() {
    let mut docs = shipped(true);
    docs.push(lookup_order());
    let index = build(docs);
    // Named precisely, a request plans on the description alone.
    let detection = detect(
        &index,
        "Can you look up the status of order number 4821 in the shop?",
    );
    assert!(detection.should_plan, "{detection:?}");
    assert_eq!(names(&detection).first(), Some(&"lookup_order"));
    // A short one is a candidate, below the threshold without triggers ...
    let detection = detect(&index, "Where is my order 4821?");
    assert_eq!(
        names(&detection).first(),
        Some(&"lookup_order"),
        "{detection:?}"
    );
    // ... and plans once the owner configures a trigger for it.
    let mut docs = shipped(true);
    docs.push(ToolDoc {
        triggers: vec!["where is my order".into()],
        ..lookup_order()
    });
    let index = build(docs);
    let detection = detect(&index, "Where is my order 4821?");
    assert!(detection.should_plan, "{detection:?}");
    assert_eq!(names(&detection).first(), Some(&"lookup_order"));
    // People write it short, with a straight or a typographic apostrophe; a trigger may be
    // written short too.
    for message in ["Where's my order 4821?", "where\u{2019}s my order #4821"] {
        let detection = detect(&index, message);
        assert!(detection.should_plan, "{message:?}: {detection:?}");
        assert_eq!(names(&detection).first(), Some(&"lookup_order"));
    }
    let mut docs = shipped(true);
    docs.push(ToolDoc { triggers: vec!["where's my order".into()], ..lookup_order() });
    let detection = detect(&build(docs), "Where is my order 4821?");
    assert!(detection.should_plan, "{detection:?}");
}

#[test]
fn owner_only_tools_are_never_candidates_for_customers() {
    let refund = ToolDoc {
        name: "issue_refund".into(),
        description: "Issues a refund for an order to the customer's card.".into(),
        triggers: vec!["refund".into()],
        owner_only: true,
        enabled: true,
        ..ToolDoc::default()
    };
    let mut docs = shipped(true);
    docs.push(refund);
    docs.push(lookup_order());
    let index = build(docs);
    let message = "Please refund my order 4821";
    let owner = index.detect(message, Role::Owner, ChatKind::Direct, &[]);
    assert_eq!(names(&owner).first(), Some(&"issue_refund"), "{owner:?}");
    let customer = index.detect(message, Role::Customer, ChatKind::Direct, &[]);
    assert!(!names(&customer).contains(&"issue_refund"), "{customer:?}");
    // Nor through a follow-up of a context that names it.
    let recent = [RecentContext {
        tool: "issue_refund".into(),
        ..Default::default()
    }];
    let followup = index.detect("what about it?", Role::Customer, ChatKind::Direct, &recent);
    assert!(!names(&followup).contains(&"issue_refund"), "{followup:?}");
    // Nor for an owner in a group, where everyone would read its answer.
    let group = index.detect(message, Role::Owner, ChatKind::Group, &[]);
    assert!(!names(&group).contains(&"issue_refund"), "{group:?}");
}

#[test]
fn tools_limited_to_direct_chats_are_not_offered_in_groups() {
    let direct_only = ToolDoc {
        chat_types: vec![ChatKind::Direct],
        ..lookup_order()
    };
    let index = build(vec![direct_only]);
    let message = "Can you look up the status of order number 4821 in the shop?";
    assert!(
        !index
            .detect(message, Role::Owner, ChatKind::Direct, &[])
            .candidates
            .is_empty()
    );
    assert!(
        index
            .detect(message, Role::Owner, ChatKind::Group, &[])
            .candidates
            .is_empty()
    );
}

#[test]
fn when_not_to_use_lowers_a_score() {
    let plain = ToolDoc {
        name: "page_reader".into(),
        description: "Reads a web page and returns its text.".into(),
        enabled: true,
        ..ToolDoc::default()
    };
    let warned = ToolDoc {
        name: "page_reader_2".into(),
        when_not_to_use: "Internal intranet addresses.".into(),
        ..plain.clone()
    };
    let settings = DetectorSettings {
        candidate_ratio: 0.0,
        ..DetectorSettings::default()
    };
    let index = Index::build(vec![plain, warned], settings);
    let detection = detect(&index, "Read the intranet page about holidays");
    let score = |name: &str| {
        detection
            .candidates
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.score)
    };
    let (plain, warned) = (
        score("page_reader").expect("plain ranked"),
        score("page_reader_2").expect("warned ranked"),
    );
    assert!(warned < plain, "{warned} !< {plain}");
    // The same message without the warned words scores both alike.
    let detection = detect(&index, "Read the web page about holidays");
    assert_eq!(detection.candidates[0].score, detection.candidates[1].score);
}

#[test]
fn a_vague_followup_without_recent_context_stays_in_chat() {
    let index = build(shipped(true));
    for message in [
        "What about it?",
        "How about the second one?",
        "Open it.",
        "Compare those",
    ] {
        let detection = detect(&index, message);
        assert!(!detection.should_plan, "{message:?}: {detection:?}");
        assert_eq!(
            detection.reason,
            ReasonCode::FollowupWithoutContext,
            "{message:?}"
        );
        assert!(detection.followup.is_none());
    }
}

fn search_context() -> RecentContext {
    RecentContext {
        id: Some("ctx-1".into()),
        tool: "web_search".into(),
        args: json!({ "query": "weather in Lisbon" }),
        summary: "Sunny in Lisbon, 24°C".into(),
        entities: vec!["Lisbon".into(), "https://weather.example/lisbon".into()],
        age_secs: 60,
    }
}

#[test]
fn a_vague_followup_with_recent_context_gives_a_hint() {
    let index = build(shipped(true));
    let recent = [search_context()];
    let detection = index.detect(
        "What about Saturday?",
        Role::Customer,
        ChatKind::Direct,
        &recent,
    );
    assert!(detection.should_plan, "{detection:?}");
    assert_eq!(detection.reason, ReasonCode::FollowupContext);
    let hint = detection.followup.clone().expect("a hint");
    assert!(hint.possible);
    assert_eq!(hint.context_index, Some(0));
    assert_eq!(hint.context_id.as_deref(), Some("ctx-1"));
    assert_eq!(hint.kind, FollowupKind::SameTool);
    assert_eq!(names(&detection).first(), Some(&"web_search"));

    let summarize = index.detect("Summarize that", Role::Customer, ChatKind::Direct, &recent);
    assert_eq!(
        summarize.followup.map(|h| h.kind),
        Some(FollowupKind::AnswerFromContext)
    );

    let open = index.detect("Open the link", Role::Customer, ChatKind::Direct, &recent);
    assert_eq!(
        open.followup.as_ref().map(|h| h.kind),
        Some(FollowupKind::NewTool),
        "{open:?}"
    );
    assert_eq!(names(&open).get(1), Some(&"web_fetch"));
}

#[test]
fn followups_pick_the_named_context_ask_when_unclear_and_ignore_old_ones() {
    let index = build(shipped(true));
    let fetch = RecentContext {
        id: Some("ctx-2".into()),
        tool: "web_fetch".into(),
        entities: vec!["Porto".into()],
        age_secs: 30,
        ..Default::default()
    };
    let recent = [fetch, search_context()];
    let named = index.detect("and in Lisbon?", Role::Owner, ChatKind::Direct, &recent);
    assert_eq!(
        named.followup.as_ref().and_then(|h| h.context_index),
        Some(1),
        "{named:?}"
    );
    let unclear = index.detect("what about it?", Role::Owner, ChatKind::Direct, &recent);
    assert_eq!(
        unclear.followup.map(|h| h.kind),
        Some(FollowupKind::Clarify)
    );
    let old = [RecentContext {
        age_secs: 10 * 24 * 3600,
        ..search_context()
    }];
    let stale = index.detect("what about it?", Role::Owner, ChatKind::Direct, &old);
    assert!(!stale.should_plan, "{stale:?}");
    assert_eq!(stale.reason, ReasonCode::FollowupWithoutContext);
}

#[test]
fn at_most_max_candidates_are_returned() {
    let docs: Vec<ToolDoc> = (0..20)
        .map(|i| ToolDoc {
            name: format!("report_{i}"),
            description: "Builds a sales report.".into(),
            enabled: true,
            ..ToolDoc::default()
        })
        .collect();
    let settings = DetectorSettings {
        max_candidates: 3,
        ..DetectorSettings::default()
    };
    let index = Index::build(docs, settings);
    assert_eq!(detect(&index, "build the sales report").candidates.len(), 3);
}

#[test]
fn the_detector_names_no_configured_tool() {
    let sources = [
        include_str!("mod.rs"),
        include_str!("doc.rs"),
        include_str!("detection.rs"),
        include_str!("index/mod.rs"),
        include_str!("index/build.rs"),
        include_str!("text.rs"),
    ];
    let configured: Vec<String> = shipped(true)
        .into_iter()
        .map(|d| d.name)
        .chain([lookup_order().name])
        .collect();
    assert!(configured.len() >= 2);
    for name in &configured {
        for source in sources {
            assert!(
                !source.contains(name.as_str()),
                "the detector source names the tool {name}"
            );
        }
    }
}

#[test]
fn parameters_come_from_the_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "description": "City name" },
            "units": { "type": "string", "enum": ["metric", "imperial"] },
            "filters": { "type": "object", "properties": { "min_rating": { "title": "Lowest rating" } } },
            "stops": { "type": "array", "items": { "type": "object", "properties": { "name": { "description": "Stop" } } } }
        }
    });
    let params = ParamDoc::from_schema(&schema);
    let find = |name: &str| {
        params
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.description.as_str())
    };
    assert_eq!(find("city"), Some("City name"));
    assert_eq!(find("units"), Some(" metric imperial"));
    assert_eq!(find("filters.min_rating"), Some("Lowest rating"));
    assert_eq!(find("stops.name"), Some("Stop"));
}

#[test]
fn shipped_defaults_match_the_code_and_unknown_keys_fail() {
    let shipped: DetectorSettings = toml::from_str(SHIPPED_DEFAULTS).expect("defaults.toml parses");
    assert_eq!(shipped, DetectorSettings::default());
    let unknown = toml::from_str::<DetectorSettings>("max_candidate = 3");
    assert!(unknown.is_err());
    let partial: DetectorSettings =
        toml::from_str("max_candidates = 3\n[weights]\nname = 4.0").expect("partial parses");
    assert_eq!(partial.max_candidates, 3);
    assert_eq!(partial.weights.name, 4.0);
    assert_eq!(partial.weights.title, FieldWeights::default().title);
}

#[test]
fn the_index_can_be_shared_between_tasks() {
    fn shared<T: Send + Sync>() {}
    shared::<Index>();
}

#[test]
fn detection_serialises_with_stable_codes() {
    let index = build(shipped(true));
    let value = serde_json::to_value(detect(&index, "Thanks.")).expect("serialises");
    assert_eq!(value["reason"], "CONVERSATIONAL");
    assert_eq!(value["should_plan"], false);
    let recent: Vec<RecentContext> =
        serde_json::from_str(r#"[{"tool": "web_search", "args": {"query": "x"}, "summary": "s", "entities": ["X"], "age_secs": 5}]"#)
            .expect("recent contexts parse");
    let value = serde_json::to_value(index.detect(
        "what about it",
        Role::Owner,
        ChatKind::Direct,
        &recent,
    ))
    .expect("serialises");
    assert_eq!(value["reason"], "FOLLOWUP_CONTEXT");
    assert_eq!(value["followup"]["kind"], "same_tool");
    assert_eq!(ReasonCode::BelowThreshold.as_str(), "BELOW_THRESHOLD");
}

#[test]
fn a_followup_never_offers_a_tool_the_person_may_not_use() {
    let mut docs = shipped(true);
    docs.push(ToolDoc {
        name: "sales_report".into(),
        title: "Sales report".into(),
        description: "The shop's sales figures for a month.".into(),
        owner_only: true,
        enabled: true,
        ..ToolDoc::default()
    });
    let index = build(docs);
    let recent = [RecentContext {
        id: Some("ctx-9".into()),
        tool: "sales_report".into(),
        entities: vec!["March".into()],
        age_secs: 30,
        ..Default::default()
    }];
    let customer = index.detect("and what about March?", Role::Customer, ChatKind::Direct, &recent);
    assert!(!names(&customer).contains(&"sales_report"), "{customer:?}");
    let owner = index.detect("and what about March?", Role::Owner, ChatKind::Direct, &recent);
    assert!(names(&owner).contains(&"sales_report"), "{owner:?}");
}

#[test]
fn a_tools_own_plan_threshold_decides_when_it_is_the_best_candidate() {
    let message = "Where is my order 4821?";
    let shared = detect(&build(vec![lookup_order()]), message);
    let confidence = shared.confidence;
    assert!(confidence > 0.02 && confidence < 0.98, "{shared:?}");
    let lower = ToolDoc { plan_threshold: Some(confidence - 0.01), ..lookup_order() };
    let planned = detect(&build(vec![lower]), message);
    assert!(planned.should_plan && planned.reason == ReasonCode::CandidatesFound, "{planned:?}");
    let higher = ToolDoc { plan_threshold: Some(confidence + 0.01), ..lookup_order() };
    let stayed = detect(&build(vec![higher]), message);
    assert!(!stayed.should_plan && stayed.reason == ReasonCode::BelowThreshold, "{stayed:?}");
    assert_eq!(stayed.confidence, confidence, "the threshold moves the decision, not the confidence");
}
