use super::*;

const FILE: &str = "# tools\napproval_mode = \"auto\"\n\n[[tool]]\n# the search\nname = \"search\"\ntriggers = [\"look up\"]\n\n[[tool]]\nname = \"fetch\"\n";

fn case(message: &str, expect: &str) -> Case {
    let expect: Expect = expect.parse().expect("expectation");
    serde_json::from_value(serde_json::json!({ "name": "c", "message": message, "expect": expect })).expect("case")
}

fn result(should_plan: bool, code: ReasonCode, confidence: f32, candidates: &[&str]) -> CaseResult {
    let observed = crate::evals::judge::Observed { route: if should_plan { "plan" } else { "normal_chat" }.into(), should_plan, candidates: candidates.iter().map(|c| c.to_string()).collect(), code: code.as_str().into(), confidence, ..Default::default() };
    CaseResult { name: "c".into(), expect: String::new(), detector: crate::evals::Verdict { pass: false, observed, why: "x".into() }, plan: None }
}

const TITLED: &str = "[[tool]]\nname = \"tide_table\"\ntitle = \"Tide times\"\n\n[[tool]]\nname = \"weather\"\n";

#[test]
fn a_right_tool_short_of_the_threshold_gets_its_own_threshold_first() {
    let settings = EvalSettings::default();
    let edits = edits_for(&case("When is high water in Porto?", "tool:tide_table"), &result(false, ReasonCode::BelowThreshold, 0.437, &["tide_table"]), TITLED, &settings);
    assert_eq!(edits[0], Edit { strategy: "adjust_threshold", tool: "tide_table".into(), key: THRESHOLD, phrase: "0.43".into() });
    assert!(edits[1..].iter().all(|e| e.strategy != "adjust_threshold"), "{edits:?}");
    // Below the lowest threshold a repair may set, it proposes phrases only.
    let edits = edits_for(&case("When is high water in Porto?", "tool:tide_table"), &result(false, ReasonCode::BelowThreshold, 0.2, &["tide_table"]), TITLED, &settings);
    assert!(!edits.is_empty() && edits.iter().all(|e| e.strategy != "adjust_threshold"), "{edits:?}");
    // A wrong tool on top is not the threshold's fault.
    let edits = edits_for(&case("When is high water in Porto?", "tool:tide_table"), &result(false, ReasonCode::BelowThreshold, 0.45, &["weather", "tide_table"]), TITLED, &settings);
    assert!(edits.iter().all(|e| e.strategy != "adjust_threshold"), "{edits:?}");
}

#[test]
fn a_tool_that_planned_chat_just_above_the_threshold_gets_a_higher_one() {
    let settings = EvalSettings::default();
    let edits = edits_for(&case("The weather was lovely at the wedding", "normal_chat"), &result(true, ReasonCode::CandidatesFound, 0.512, &["weather"]), TITLED, &settings);
    assert_eq!(edits[0], Edit { strategy: "adjust_threshold", tool: "weather".into(), key: THRESHOLD, phrase: "0.52".into() });
    assert!(edits[1..].iter().all(|e| e.strategy == "add_when_not_to_use" && e.tool == "weather"), "{edits:?}");
    let edits = edits_for(&case("The weather was lovely at the wedding", "normal_chat"), &result(true, ReasonCode::CandidatesFound, 0.95, &["weather"]), TITLED, &settings);
    assert!(edits.iter().all(|e| e.strategy != "adjust_threshold"), "above the highest threshold a repair may set: {edits:?}");
    let edits = edits_for(&case("The weather was lovely at the wedding", "clarify"), &result(true, ReasonCode::CandidatesFound, 0.512, &["weather"]), TITLED, &settings);
    assert!(!edits.is_empty() && edits.iter().all(|e| e.strategy != "adjust_threshold"), "not planning is no clarification: {edits:?}");
}

#[test]
fn a_phrase_naming_the_tool_becomes_an_alias_and_others_triggers() {
    let settings = EvalSettings::default();
    let edits = edits_for(&case("Show the tide chart for Porto", "tool:tide_table"), &result(false, ReasonCode::NoCandidate, 0.0, &[]), TITLED, &settings);
    let kind = |phrase: &str| edits.iter().find(|e| e.phrase == phrase).map(|e| (e.strategy, e.key)).unwrap_or_else(|| panic!("{phrase:?} is not proposed: {edits:?}"));
    assert_eq!(kind("tide chart"), ("add_alias", "aliases"), "it shares a word with the name");
    assert_eq!(kind("show the tide"), ("add_alias", "aliases"));
    assert_eq!(kind("chart for porto"), ("add_trigger", "triggers"));
    assert_eq!(kind("porto"), ("add_trigger", "triggers"));
    let alias = edits.iter().find(|e| e.phrase == "tide chart").expect("proposed");
    let out = apply(TITLED, alias).expect("applies");
    assert!(out.contains("aliases = [\"tide chart\"]"), "{out}");
}

#[test]
fn a_threshold_edit_writes_a_number_and_refuses_nonsense() {
    let edit = Edit { strategy: "adjust_threshold", tool: "weather".into(), key: THRESHOLD, phrase: "0.42".into() };
    let out = apply(TITLED, &edit).expect("applies");
    assert!(out.contains("name = \"weather\"\nplan_threshold = 0.42"), "{out}");
    assert!(matches!(apply(&out, &edit), Err(EditError::Unchanged(_))));
    for bad in ["1.5", "0", "high"] {
        assert!(matches!(apply(TITLED, &Edit { phrase: bad.into(), ..edit.clone() }), Err(EditError::Threshold(_))), "{bad}");
    }
    assert!(matches!(apply(TITLED, &Edit { strategy: "model", ..edit }), Err(EditError::KeyNotAllowed(_))), "only the deterministic strategy sets a threshold");
}

#[test]
fn phrases_are_shortest_first_and_skip_filler_edges() {
    let p = phrases("Could you check the tide times for Porto?", 3);
    assert_eq!(p, vec!["tide times", "check the tide", "times for porto", "check", "times", "porto"]);
    assert!(phrases("Is it on?", 6).is_empty(), "only filler and short words");
    let private = phrases("Refund order 48213 to +351912345678 please", 3);
    assert!(private.iter().all(|p| !p.chars().any(char::is_numeric)), "{private:?}");
    assert!(private.contains(&"refund order".to_string()), "{private:?}");
    let mailed = phrases("Please email john.doe@gmail.com the refund form @ana", 3);
    assert!(mailed.iter().all(|p| !p.contains("john") && !p.contains("gmail") && !p.contains("ana")), "{mailed:?}");
    assert!(mailed.contains(&"refund form".to_string()), "{mailed:?}");
    let around = phrases("invoice to ana@example.com tomorrow", 3);
    assert!(!around.iter().any(|p| p.contains("invoice") && p.contains("tomorrow")), "no phrase the message never held: {around:?}");
}

#[test]
fn a_model_trigger_is_words_of_a_request() {
    assert!(fits_as_trigger("is it up") && fits_as_trigger("menu card") && fits_as_trigger("opening"));
    assert!(!fits_as_trigger("the") && !fits_as_trigger("menu") && !fits_as_trigger(""), "a filler or short word matches everything");
    assert!(!fits_as_trigger("order 48213") && !fits_as_trigger("write ana@example.com"), "the customer's numbers and addresses");
}

#[test]
fn the_model_adds_to_what_the_owner_wrote() {
    let edit = Edit { strategy: "model", tool: "search".into(), key: "when_not_to_use", phrase: "Not for greetings.".into() };
    let once = apply(FILE, &edit).expect("applies");
    let again = apply(&once, &Edit { phrase: "Not for thanks.".into(), ..edit.clone() }).expect("applies");
    assert!(again.contains("when_not_to_use = \"Not for greetings. Not for thanks.\""), "{again}");
    assert!(matches!(apply(&again, &edit), Err(EditError::Unchanged(_))));
}

#[test]
fn an_edit_keeps_comments_and_changes_one_tool() {
    let out = apply(FILE, &Edit { strategy: "add_trigger", tool: "search".into(), key: "triggers", phrase: "tide times".into() }).expect("applies");
    assert!(out.contains("# the search") && out.contains("# tools"));
    assert!(out.contains("triggers = [\"look up\", \"tide times\"]"), "{out}");
    let out = apply(FILE, &Edit { strategy: "add_trigger", tool: "fetch".into(), key: "triggers", phrase: "open it".into() }).expect("applies");
    assert!(out.contains("name = \"fetch\"\ntriggers = [\"open it\"]"), "{out}");
    let out = apply(FILE, &Edit { strategy: "add_when_not_to_use", tool: "fetch".into(), key: "when_not_to_use", phrase: "hello there".into() }).expect("applies");
    assert!(out.contains(r#"when_not_to_use = 'Not for messages like "hello there".'"#), "{out}");
    assert!(matches!(apply(FILE, &Edit { strategy: "add_trigger", tool: "search".into(), key: "triggers", phrase: "Look Up".into() }), Err(EditError::Unchanged(_))));
    assert!(matches!(apply(FILE, &Edit { strategy: "add_trigger", tool: "nope".into(), key: "triggers", phrase: "x".into() }), Err(EditError::NoTool(_))));
    assert_eq!(declared_tools(FILE), vec!["search", "fetch"]);
    let out = apply(FILE, &Edit { strategy: "model", tool: "fetch".into(), key: "when_to_use", phrase: "A link to open.".into() }).expect("applies");
    assert!(out.contains("when_to_use = \"A link to open.\""), "{out}");
    assert!(matches!(apply(FILE, &Edit { strategy: "model", tool: "fetch".into(), key: "handler", phrase: "x".into() }), Err(EditError::KeyNotAllowed(_))));
}
