//! The word-vector table: its file format and errors, the WordPiece tokenizer against the
//! reference tokenizer, and what the vectors change (and do not change) in a detection.

use std::sync::Arc;

use super::*;
use crate::lane::detector::{ChatKind, DetectorSettings, Index, ReasonCode, Role, ToolDoc};

/// A table file as `scripts/detector-vectors` writes it.
fn encode(pieces: &[&str], dims: usize, values: &[f32]) -> Vec<u8> {
    let vocab: String = pieces.iter().map(|p| format!("{p}\n")).collect();
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    for n in [VERSION, dims as u32, pieces.len() as u32, vocab.len() as u32] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(vocab.as_bytes());
    for v in values {
        out.extend_from_slice(&f32_to_f16(*v).to_le_bytes());
    }
    out
}

/// Half precision of a value that has an exact one (enough for the tests' values).
fn f32_to_f16(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    assert!((1..31).contains(&exp), "{v} is a normal half");
    sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

#[test]
fn halves_widen_exactly() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x3800), 0.5);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x0200), 2f32.powi(-15));
    assert_eq!(f16_to_f32(0x8000), -0.0);
    assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
    assert_eq!(f16_to_f32(f32_to_f16(0.375)), 0.375);
}

#[test]
fn a_table_reads_back_its_pieces_and_rows() {
    let bytes = encode(&["[UNK]", "rain", "##s"], 2, &[0.0, 0.0, 1.0, -0.5, 0.25, 2.0]);
    let table = WordVectors::parse(&bytes).expect("a valid table");
    assert_eq!((table.len(), table.dims()), (3, 2));
    assert_eq!(table.piece(2), "##s");
    assert_eq!(table.row(1), &[1.0, -0.5]);
    assert_eq!(table.row(2), &[0.25, 2.0]);
    assert_eq!(table.tokenize("Rains"), vec![1, 2]);
}

#[test]
fn a_bad_table_is_refused_with_a_stable_code() {
    let good = encode(&["[UNK]", "rain"], 2, &[0.0, 0.0, 1.0, 0.5]);
    let code = |bytes: &[u8]| WordVectors::parse(bytes).map(|_| ()).expect_err("refused").code();
    assert_eq!(code(&good[..10]), "VECTORS_SHORT");
    assert_eq!(code(&good[..good.len() - 1]), "VECTORS_SHORT");
    let mut magic = good.clone();
    magic[0] = b'X';
    assert_eq!(code(&magic), "VECTORS_BAD_MAGIC");
    let mut version = good.clone();
    version[8] = 2;
    assert_eq!(code(&version), "VECTORS_VERSION");
    let mut longer = good.clone();
    longer.push(0);
    assert_eq!(code(&longer), "VECTORS_CORRUPT");
    // Two rows of values but a vocab of one line.
    let vocab_short = {
        let mut b = encode(&["[UNK]rain"], 2, &[0.0, 0.0, 1.0, 0.5]);
        b[16..20].copy_from_slice(&2u32.to_le_bytes());
        b
    };
    assert_eq!(code(&vocab_short), "VECTORS_CORRUPT");
    let infinite = encode(&["[UNK]", "rain"], 2, &[0.0, 0.0, 1.0, 0.5]);
    let mut infinite = infinite;
    let n = infinite.len();
    infinite[n - 2..].copy_from_slice(&0x7c00u16.to_le_bytes());
    assert_eq!(code(&infinite), "VECTORS_CORRUPT");

    let dir = tempfile::tempdir().expect("temp dir");
    let missing = WordVectors::load(&dir.path().join("none.bin")).expect_err("no file");
    assert_eq!(missing.code(), "VECTORS_MISSING");
    let path = dir.path().join("table.bin");
    std::fs::write(&path, &good).expect("write");
    assert_eq!(WordVectors::load(&path).expect("loads").len(), 2);
}

/// Every piece of all-MiniLM-L6-v2's vocab (tokenizer.json) that greedy matching can meet in
/// [`REFERENCE`]'s words: the longest match only ever looks up pieces of the word itself, so
/// with these the tokenizer must cut as it does with the whole vocab.
const PIECES: &str = r###"["!", "##0", "##a", "##ab", "##able", "##af", "##ai", "##as", "##ast", "##at", "##ath", "##ay", "##b", "##bl", "##ble", "##c", "##ca", "##cas", "##cast", "##cy", "##d", "##da", "##day", "##e", "##ea", "##ec", "##eca", "##el", "##ell", "##ello", "##en", "##ency", "##er", "##ert", "##es", "##et", "##f", "##fa", "##ff", "##ffa", "##fo", "##for", "##h", "##he", "##her", "##i", "##iv", "##ive", "##j", "##l", "##ld", "##le", "##ll", "##llo", "##lo", "##m", "##me", "##n", "##na", "##nc", "##ncy", "##o", "##od", "##oda", "##on", "##op", "##or", "##ore", "##p", "##q", "##r", "##re", "##ren", "##rf", "##rl", "##rr", "##rre", "##rt", "##s", "##st", "##su", "##sum", "##sume", "##t", "##th", "##the", "##ther", "##to", "##top", "##u", "##um", "##ume", "##ur", "##v", "##ve", "##ver", "##vert", "##w", "##we", "##weather", "##y", "##z", "##zy", "##zz", "##zzy", "##€", "'", ",", "1", "10", "[UNK]", "_", "c", "co", "con", "convert", "cu", "currency", "d", "do", "don", "g", "ge", "get", "h", "he", "hell", "hello", "n", "na", "naive", "r", "re", "res", "resume", "s", "st", "stop", "t", "to", "tod", "today", "u", "un", "una", "w", "we", "weather", "wo", "world", "x", "¥", "—", "…", "京", "東"]"###;

/// Texts and their tokens from the `tokenizers` library with all-MiniLM-L6-v2's tokenizer.json
/// (`Tokenizer.encode(text, add_special_tokens=False).tokens`).
const REFERENCE: &[(&str, &[&str])] = &[
    ("unaffable", &["una", "##ffa", "##ble"]),
    ("Héllo, WORLD! naïve résumé", &["hello", ",", "world", "!", "naive", "resume"]),
    ("getWeatherForecast", &["get", "##weather", "##for", "##eca", "##st"]),
    ("convert_currency 10€ to ¥", &["convert", "_", "currency", "10", "##€", "to", "¥"]),
    ("東京 weather—today…", &["東", "京", "weather", "—", "today", "…"]),
    ("don't stop", &["don", "'", "t", "stop"]),
    ("xyzzyqqqjjj", &["x", "##y", "##zzy", "##q", "##q", "##q", "##j", "##j", "##j"]),
];

#[test]
fn wordpiece_cuts_as_the_reference_tokenizer() {
    let pieces: Vec<String> = serde_json::from_str(PIECES).expect("pieces");
    let values = vec![0.0; pieces.len()];
    let table = WordVectors::new(pieces, 1, values);
    for (text, want) in REFERENCE {
        let got: Vec<&str> = table.tokenize(text).into_iter().map(|id| table.piece(id)).collect();
        assert_eq!(&got, want, "{text}");
    }
    // A word this vocab cannot cut (it has no `##7`) is one unknown token, whatever pieces it
    // began with.
    let got: Vec<&str> = table.tokenize("unaffable§ Resumé!").into_iter().map(|id| table.piece(id)).collect();
    assert_eq!(got, ["una", "##ffa", "##ble", "[UNK]", "resume", "!"]);
    let got: Vec<&str> = table.tokenize("unaffable7").into_iter().map(|id| table.piece(id)).collect();
    assert_eq!(got, ["[UNK]"]);
}

/// A tiny table: weather words near each other, invoice words near each other, restaurant words
/// near each other. "rain" and "umbrella" appear in no tool's text below.
fn tiny_table() -> Arc<WordVectors> {
    let rows: &[(&str, [f32; 4])] = &[
        ("[UNK]", [0.0; 4]),
        ("[CLS]", [0.0; 4]),
        (":", [0.5, 0.5, 0.5, 0.5]),
        (".", [0.5, 0.5, 0.5, 0.5]),
        ("the", [0.5, 0.5, 0.5, 0.5]),
        ("for", [0.5, 0.5, 0.5, 0.5]),
        ("a", [0.5, 0.5, 0.5, 0.5]),
        ("weather", [1.0, 0.0, 0.0, 0.0]),
        ("forecast", [1.0, 0.25, 0.0, 0.0]),
        ("rain", [1.0, 0.0, 0.0, 0.25]),
        ("umbrella", [0.75, 0.0, 0.25, 0.0]),
        ("city", [0.5, 0.0, 0.0, 0.5]),
        ("get", [0.25, 0.25, 0.25, 0.25]),
        ("send", [0.0, 1.0, 0.0, 0.25]),
        ("invoice", [0.0, 1.0, 0.0, 0.0]),
        ("customer", [0.0, 1.0, 0.25, 0.0]),
        ("book", [0.0, 0.0, 1.0, 0.0]),
        ("table", [0.0, 0.25, 1.0, 0.0]),
        ("restaurant", [0.0, 0.0, 1.0, 0.25]),
        ("reserve", [0.0, 0.0, 1.0, 0.0]),
    ];
    let pieces = rows.iter().map(|(p, _)| (*p).to_owned()).collect();
    let values = rows.iter().flat_map(|(_, v)| *v).collect();
    Arc::new(WordVectors::new(pieces, 4, values))
}

fn tools() -> Vec<ToolDoc> {
    let tool = |name: &str, description: &str| ToolDoc { name: name.into(), description: description.into(), ..ToolDoc::default() };
    vec![
        tool("send_invoice", "Send an invoice to a customer."),
        tool("get_weather_forecast", "The weather forecast for a city."),
        tool("book_table", "Reserve a table at the restaurant."),
    ]
}

fn settings() -> DetectorSettings {
    DetectorSettings { vectors: String::new(), ..DetectorSettings::default() }
}

#[test]
fn a_message_word_in_no_tool_text_ranks_the_tool_its_vector_is_near() {
    let message = "Rain or umbrella?";
    let lexical = Index::build_with(tools(), settings(), None);
    let detection = lexical.detect(message, Role::Owner, ChatKind::Direct, &[]);
    assert!(detection.candidates.is_empty(), "{detection:?}");
    assert_eq!(detection.reason, ReasonCode::NoCandidate);

    let with = Index::build_with(tools(), settings(), Some(tiny_table()));
    assert!(with.has_vectors());
    let detection = with.detect(message, Role::Owner, ChatKind::Direct, &[]);
    assert_eq!(detection.candidates.first().map(|c| c.name.as_str()), Some("get_weather_forecast"), "{detection:?}");
    // The vectors offer candidates; they never plan on their own.
    assert!(!detection.should_plan);
    assert_eq!((detection.reason, detection.confidence), (ReasonCode::NoCandidate, 0.0));
}

#[test]
fn the_plan_decision_stays_the_lexical_one_of_the_top_tool() {
    let lexical = Index::build_with(tools(), settings(), None);
    let with = Index::build_with(tools(), settings(), Some(tiny_table()));
    for message in ["send the invoice to the customer please", "book a table", "weather forecast for the city", "what is the forecast"] {
        let a = lexical.detect(message, Role::Owner, ChatKind::Direct, &[]);
        let b = with.detect(message, Role::Owner, ChatKind::Direct, &[]);
        assert_eq!(a.candidates.first().map(|c| &c.name), b.candidates.first().map(|c| &c.name), "{message}");
        assert_eq!((a.should_plan, a.reason, a.confidence), (b.should_plan, b.reason, b.confidence), "{message}");
    }
    // With no weight the vectors only add the tools no word matched, after the others.
    let zero = Index::build_with(tools(), DetectorSettings { vector_weight: 0.0, candidate_ratio: 0.0, ..settings() }, Some(tiny_table()));
    let detection = zero.detect("reserve a table", Role::Owner, ChatKind::Direct, &[]);
    assert_eq!(detection.candidates.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["book_table", "send_invoice", "get_weather_forecast"]);
}

#[test]
fn tools_a_person_may_not_use_are_not_ranked_by_their_vectors() {
    let mut docs = tools();
    docs[1].owner_only = true;
    let with = Index::build_with(docs, settings(), Some(tiny_table()));
    let detection = with.detect("rain or umbrella", Role::Customer, ChatKind::Direct, &[]);
    assert!(detection.candidates.iter().all(|c| c.name != "get_weather_forecast"), "{detection:?}");
    let detection = with.detect("rain or umbrella", Role::Owner, ChatKind::Direct, &[]);
    assert_eq!(detection.candidates.first().map(|c| c.name.as_str()), Some("get_weather_forecast"));
}

#[test]
fn the_table_of_a_path_is_loaded_once_and_a_bad_one_leaves_the_detector_lexical() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vectors.bin");
    let table = tiny_table();
    let pieces: Vec<&str> = (0..table.len() as u32).map(|id| table.piece(id)).collect();
    let values: Vec<f32> = (0..table.len() as u32).flat_map(|id| table.row(id).to_vec()).collect();
    std::fs::write(&path, encode(&pieces, 4, &values)).expect("write");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let first = WordVectors::shared(&path).expect("loads");
    let second = WordVectors::shared(&path).expect("still there");
    assert!(Arc::ptr_eq(&first, &second));
    let index = Index::build(tools(), DetectorSettings { vectors: path, ..DetectorSettings::default() });
    assert!(index.has_vectors());
    let detection = index.detect("rain or umbrella", Role::Owner, ChatKind::Direct, &[]);
    assert_eq!(detection.candidates.first().map(|c| c.name.as_str()), Some("get_weather_forecast"));

    let bad = dir.path().join("bad.bin");
    std::fs::write(&bad, b"GHWVEC").expect("write");
    let index = Index::build(tools(), DetectorSettings { vectors: bad.to_str().expect("utf-8").to_owned(), ..DetectorSettings::default() });
    assert!(!index.has_vectors());
    assert!(index.detect("rain or umbrella", Role::Owner, ChatKind::Direct, &[]).candidates.is_empty());
    assert!(!Index::build(tools(), settings()).has_vectors());
}
