//! Splitting long replies: WhatsApp text bodies hold at most 4,096 characters. Parts end at a
//! paragraph break when one is near enough, else at a sentence end, else at a space; a part is
//! cut mid-word only when it has no space at all.

/// The Cloud API's limit on `text.body`, in characters.
pub const MAX_CHARS: usize = 4096;

/// Splits `text` into parts of at most `max` characters (not bytes). Empty input gives no parts.
pub fn split(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut parts = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        // Byte offset just past the first `max` characters, or the whole rest.
        let Some((limit, _)) = rest.char_indices().nth(max) else {
            parts.push(rest.to_string());
            break;
        };
        let window = &rest[..limit];
        // Breaks too early would make tiny parts; only accept those past a quarter of the window.
        let floor = window.len() / 4;
        let cut = last_break(window, &["\n\n"], floor)
            .or_else(|| last_break(window, &[". ", "! ", "? ", ".\n", "!\n", "?\n", "\n"], floor))
            .or_else(|| window.rfind(char::is_whitespace).filter(|&i| i > 0))
            .unwrap_or(limit);
        let (part, tail) = rest.split_at(cut);
        let part = part.trim_end();
        if !part.is_empty() {
            parts.push(part.to_string());
        }
        rest = tail.trim_start();
    }
    parts
}

/// The byte offset just after the last `separators` match (keeping sentence punctuation in the
/// part), when it lies past `floor`.
fn last_break(window: &str, separators: &[&str], floor: usize) -> Option<usize> {
    separators
        .iter()
        .filter_map(|sep| window.rfind(sep).map(|i| i + sep.trim_end().len().max(1).min(sep.len())))
        .filter(|&end| end > floor)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(parts: &[String]) -> Vec<usize> {
        parts.iter().map(|p| p.chars().count()).collect()
    }

    #[test]
    fn short_text_is_one_part_and_empty_text_none() {
        assert_eq!(split("Hello there.", MAX_CHARS), vec!["Hello there.".to_string()]);
        assert!(split("   ", MAX_CHARS).is_empty());
    }

    #[test]
    fn paragraphs_win_over_sentences() {
        let a = "First paragraph sentence one. Sentence two.";
        let b = "Second paragraph is here. And more.";
        let parts = split(&format!("{a}\n\n{b}"), 60);
        assert_eq!(parts, vec![a.to_string(), b.to_string()]);
    }

    #[test]
    fn sentences_when_no_paragraph_fits() {
        let parts = split("One two three. Four five six. Seven eight nine.", 32);
        assert_eq!(parts, vec!["One two three. Four five six.".to_string(), "Seven eight nine.".to_string()]);
    }

    #[test]
    fn counts_characters_not_bytes_and_never_exceeds_the_limit() {
        let sentence = "Grüße aus Köln, schön dass du fragst! ";
        let text = sentence.repeat(400);
        let parts = split(&text, MAX_CHARS);
        assert!(parts.len() >= 4, "{}", parts.len());
        assert!(chars(&parts).iter().all(|&n| n <= MAX_CHARS), "{:?}", chars(&parts));
        assert!(parts.iter().all(|p| p.ends_with('!')), "every part ends on a sentence");
        let rejoined: String = parts.join(" ");
        assert_eq!(rejoined.split_whitespace().count(), text.split_whitespace().count(), "nothing lost");
    }

    #[test]
    fn words_longer_than_a_part_are_cut() {
        let parts = split(&"x".repeat(10), 4);
        assert_eq!(parts, vec!["xxxx", "xxxx", "xx"]);
        let parts = split(&format!("{} tail", "y".repeat(9000)), MAX_CHARS);
        assert_eq!(chars(&parts), vec![4096, 4096, 813]);
    }
}
