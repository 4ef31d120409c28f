//! Text normalisation shared by the index and the messages it scores: Unicode folding, splitting of
//! identifiers (snake_case, camelCase, dotted paths, letters against digits), stop words and
//! stemming. Tools and messages go through the same functions, so a tool named
//! `getWeatherForecast` and a person asking for "the weather forecasts" meet on `weather` and
//! `forecast`.

use std::collections::HashSet;

use rust_stemmers::{Algorithm, Stemmer};

use unicode_normalization::{UnicodeNormalization, char::is_combining_mark};

pub use crate::config::Language;

/// One word of a text after folding: `raw` is the lower-cased word, `stem` what it is indexed by,
/// `stop` whether it is a stop word (kept for phrase matching, ignored for scoring).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    pub raw: String,
    pub stem: String,
    pub stop: bool,
    /// Looks like a value (quoted, or a capitalised name inside a sentence).
    pub value: bool,
}

/// Folds and stems text; built once per index from the settings.
pub struct Analyzer {
    stemmer: Option<Stemmer>,
    stopwords: HashSet<String>,
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzer")
            .field("stopwords", &self.stopwords.len())
            .finish_non_exhaustive()
    }
}

impl Analyzer {
    pub fn new(language: Language, stopwords: &[String]) -> Self {
        let algorithm = match language {
            Language::None => None,
            Language::English => Some(Algorithm::English),
            Language::French => Some(Algorithm::French),
            Language::German => Some(Algorithm::German),
            Language::Spanish => Some(Algorithm::Spanish),
            Language::Portuguese => Some(Algorithm::Portuguese),
            Language::Italian => Some(Algorithm::Italian),
            Language::Dutch => Some(Algorithm::Dutch),
        };
        let mut analyzer = Self {
            stemmer: algorithm.map(Stemmer::create),
            stopwords: HashSet::new(),
        };
        // Stop words are compared after folding, so "Whats" and "what's" agree with the list.
        let folded: HashSet<String> = stopwords.iter().flat_map(|s| split_words(s)).collect();
        analyzer.stopwords = folded;
        analyzer
    }

    /// Every word of `text`, stop words included, in order.
    pub fn words(&self, text: &str) -> Vec<Word> {
        tokens(text)
            .into_iter()
            .map(|Token { text: raw, value }| {
                let stop = self.stopwords.contains(&raw) || raw.chars().all(|c| c.is_ascii_digit());
                let stem = self.stem(&raw);
                Word {
                    raw,
                    stem,
                    stop,
                    value,
                }
            })
            .collect()
    }

    /// The stems of the content words of `text` (stop words, lone letters and numbers left out).
    pub fn terms(&self, text: &str) -> Vec<String> {
        self.words(text)
            .into_iter()
            .filter(is_content)
            .map(|w| w.stem)
            .collect()
    }

    /// Whether `word` (folded) is one of the stop words.
    pub fn is_stopword(&self, word: &str) -> bool {
        self.stopwords.contains(word)
    }

    pub fn stem(&self, word: &str) -> String {
        match &self.stemmer {
            Some(stemmer) => stemmer.stem(word).into_owned(),
            None => word.to_owned(),
        }
    }
}

/// Whether a word carries meaning for scoring.
pub fn is_content(word: &Word) -> bool {
    !word.stop && word.raw.chars().count() > 1
}

/// Splits text into lower-cased, accent-free words. Identifiers are split too: `get_user_id`,
/// `getUserID`, `HTTPServer2` and `math.factorial` give `get user id`, `get user id`,
/// `http server 2` and `math factorial`. An apostrophe inside a word is read, not dropped:
/// "where's" is `where is`, "don't" `do not`, "l'heure" `l heure`.
pub fn split_words(text: &str) -> Vec<String> {
    tokens(text).into_iter().map(|t| t.text).collect()
}

/// A word of a message with a hint of its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    /// Quoted, or capitalised inside a sentence: likely a value (a name, a title, a place) rather
    /// than what is asked for.
    pub value: bool,
}

/// [`split_words`], keeping which words look like values.
pub fn tokens(text: &str) -> Vec<Token> {
    let folded: Vec<char> = text.nfkd().filter(|c| !is_combining_mark(*c)).collect();
    let mut out = Vec::new();
    let mut current = String::new();
    // Inside quotes; whether the current piece starts a new word of the sentence, is capitalised.
    let mut quoted = false;
    let mut sentence_start = true;
    let mut piece_start = true;
    let mut capitalised = false;
    let flush = |current: &mut String, value: bool, out: &mut Vec<Token>| {
        if !current.is_empty() {
            out.push(Token {
                text: current.to_lowercase(),
                value,
            });
            current.clear();
        }
    };
    // Letters of a contraction's ending already read (see `apostrophe`).
    let mut skip_until = 0;
    for (i, &c) in folded.iter().enumerate() {
        if i < skip_until {
            continue;
        }
        let prev = i.checked_sub(1).map(|j| folded[j]);
        let next = folded.get(i + 1).copied();
        if matches!(
            c,
            '"' | '`' | '\u{201c}' | '\u{201d}' | '\u{2018}' | '\u{2019}' | '\''
        ) {
            let inside_word =
                prev.is_some_and(char::is_alphanumeric) && next.is_some_and(char::is_alphanumeric);
            if inside_word {
                let end = folded[i + 1..].iter().position(|c| !c.is_alphanumeric()).map_or(folded.len(), |p| i + 1 + p);
                let ending: String = folded[i + 1..end].iter().collect::<String>().to_lowercase();
                match apostrophe(&current.to_lowercase(), &ending) {
                    Apostrophe::Join => {}
                    Apostrophe::Split => {
                        flush(&mut current, quoted || capitalised, &mut out);
                        piece_start = true;
                    }
                    Apostrophe::Expand(base, words) => {
                        match base {
                            Base::Keep => {}
                            Base::DropN => {
                                current.pop();
                            }
                            Base::Word(word) => current = word.to_string(),
                        }
                        flush(&mut current, quoted || capitalised, &mut out);
                        out.extend(words.iter().map(|w| Token { text: (*w).to_string(), value: false }));
                        piece_start = true;
                        skip_until = end;
                    }
                }
                continue;
            }
            flush(&mut current, quoted || capitalised, &mut out);
            piece_start = true;
            if !quoted && next.is_some_and(|n| n.is_alphanumeric()) {
                quoted = true;
            } else if quoted && !next.is_some_and(char::is_alphanumeric) {
                quoted = false;
            }
            continue;
        }
        if !c.is_alphanumeric() {
            flush(&mut current, quoted || capitalised, &mut out);
            sentence_start |= matches!(c, '.' | '!' | '?' | ':' | ';' | '\n')
                && !(prev.is_some_and(|p| p.is_ascii_digit())
                    && next.is_some_and(|n| n.is_ascii_digit()));
            piece_start = true;
            continue;
        }
        if piece_start {
            // A new word: capitalised inside a sentence ("in Paris", not "Paris is").
            let word_end = folded[i..]
                .iter()
                .position(|c| !c.is_alphanumeric())
                .map_or(folded.len(), |p| i + p);
            let word = &folded[i..word_end];
            let title_case = word.len() > 1 && word[1..].iter().all(|c| !c.is_uppercase());
            capitalised = c.is_uppercase() && title_case && !sentence_start;
            sentence_start = false;
            piece_start = false;
        }
        if let Some(prev) = current.chars().last() {
            let boundary = (prev.is_lowercase() && c.is_uppercase())
                || (prev.is_alphabetic() && c.is_numeric())
                || (prev.is_numeric() && c.is_alphabetic())
                || (prev.is_uppercase()
                    && c.is_uppercase()
                    && next.is_some_and(char::is_lowercase));
            if boundary {
                flush(&mut current, quoted || capitalised, &mut out);
            }
        }
        current.push(c);
    }
    flush(&mut current, quoted || capitalised, &mut out);
    out
}

/// What an apostrophe between two letters means, from the piece before it and the letters after.
#[derive(Debug, PartialEq)]
enum Apostrophe {
    /// One word, the apostrophe dropped ("rock'n'roll" is `rocknroll`).
    Join,
    /// Two words: an elision ("l'heure", "dell'acqua", "qu'il").
    Split,
    /// A contraction: what becomes of the word before it, then the words its ending stands for
    /// (none for a possessive "'s").
    Expand(Base, &'static [&'static str]),
}

/// The word before a contraction's apostrophe.
#[derive(Debug, PartialEq)]
enum Base {
    Keep,
    /// Without its last letter: the "n" of "n't" ("don't" is `do not`).
    DropN,
    Word(&'static str),
}

/// English contractions, so that "where's my order" meets a trigger "where is my order" and
/// "don't" the stop words `do not`; and the elisions of French and Italian, whose article is a
/// word of its own. Anything else joins, as a name with an apostrophe does.
fn apostrophe(before: &str, ending: &str) -> Apostrophe {
    const ELIDED: [&str; 17] = ["l", "d", "j", "m", "n", "s", "t", "c", "qu", "jusqu", "lorsqu", "puisqu", "dell", "all", "nell", "sull", "dall"];
    /// Words after which "'s" is "is" rather than a possessive.
    const IS_AFTER: [&str; 13] = ["it", "that", "what", "where", "who", "how", "when", "why", "there", "here", "he", "she", "this"];
    match ending {
        "s" if before == "let" => Apostrophe::Expand(Base::Keep, &["us"]),
        "s" if IS_AFTER.contains(&before) => Apostrophe::Expand(Base::Keep, &["is"]),
        "s" => Apostrophe::Expand(Base::Keep, &[]),
        "re" => Apostrophe::Expand(Base::Keep, &["are"]),
        "m" => Apostrophe::Expand(Base::Keep, &["am"]),
        "ll" => Apostrophe::Expand(Base::Keep, &["will"]),
        "ve" => Apostrophe::Expand(Base::Keep, &["have"]),
        "d" => Apostrophe::Expand(Base::Keep, &["would"]),
        "t" if before.ends_with('n') => match before {
            "can" | "ca" => Apostrophe::Expand(Base::Word("can"), &["not"]),
            "won" => Apostrophe::Expand(Base::Word("will"), &["not"]),
            "shan" => Apostrophe::Expand(Base::Word("shall"), &["not"]),
            "ain" => Apostrophe::Expand(Base::Word("is"), &["not"]),
            _ => Apostrophe::Expand(Base::DropN, &["not"]),
        },
        _ if ELIDED.contains(&before) => Apostrophe::Split,
        _ => Apostrophe::Join,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_split_into_words() {
        assert_eq!(split_words("get_user_id"), ["get", "user", "id"]);
        assert_eq!(split_words("getUserID"), ["get", "user", "id"]);
        assert_eq!(split_words("HTTPServer2"), ["http", "server", "2"]);
        assert_eq!(split_words("math.factorial"), ["math", "factorial"]);
        assert_eq!(split_words("sha256sum"), ["sha", "256", "sum"]);
        assert_eq!(split_words("What's the Café?"), ["what", "is", "the", "cafe"]);
    }

    #[test]
    fn contractions_expand_and_elisions_split() {
        assert_eq!(split_words("Where's my order? I'd like it"), ["where", "is", "my", "order", "i", "would", "like", "it"]);
        assert_eq!(split_words("I don't, we can't, they won't, you're, I'm, we'll, I've"), ["i", "do", "not", "we", "can", "not", "they", "will", "not", "you", "are", "i", "am", "we", "will", "i", "have"]);
        assert_eq!(split_words("Let's see Ana's order, DON'T"), ["let", "us", "see", "ana", "order", "do", "not"]);
        assert_eq!(split_words("l'heure d'ouverture, dell'acqua, O'Brien"), ["l", "heure", "d", "ouverture", "dell", "acqua", "o", "brien"]);
        // Typographic apostrophes too; a quote around a word is no apostrophe.
        assert_eq!(split_words("where\u{2019}s 'my order'"), ["where", "is", "my", "order"]);
    }

    #[test]
    fn quoted_and_capitalised_words_are_values() {
        let values = |text: &str| -> Vec<String> {
            tokens(text)
                .into_iter()
                .filter(|t| t.value)
                .map(|t| t.text)
                .collect()
        };
        assert_eq!(
            values("Find books by 'Jane Austen' in London. Paris is nice"),
            ["jane", "austen", "london"]
        );
        assert_eq!(
            values("Search \"rust async\" docs, it's NASA time"),
            ["rust", "async"]
        );
    }

    #[test]
    fn stems_and_stop_words() {
        let analyzer = Analyzer::new(Language::English, &["the".into(), "for".into()]);
        assert_eq!(
            analyzer.terms("Searching the forecasts for 3 days"),
            ["search", "forecast", "day"]
        );
        let none = Analyzer::new(Language::None, &[]);
        assert_eq!(
            none.terms("Searching forecasts"),
            ["searching", "forecasts"]
        );
    }
}
