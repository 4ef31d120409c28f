//! The detector's optional second signal: a table of static wordpiece vectors (made at setup by
//! `scripts/detector-vectors`) and the BERT-uncased WordPiece tokenizer that reads text into its
//! rows. A tool's vector is the normalised mean of the vectors of its name and description, a
//! message's the same; their cosine lets a tool that shares no word with the message rank.
//!
//! The file, little-endian: the magic `GHWVEC\0\0`, `u32` version (1), `u32` dims, `u32` count,
//! `u32` vocab bytes; the vocab, `count` wordpieces in row order each ended by `\n`; then
//! `count × dims` f16 values, row by row. The values are widened to f32 once, at load.
//!
//! The tokenizer is written here (about a hundred lines) rather than taken from the `tokenizers`
//! crate: that crate brings regex engines, rayon and serde models for every tokenizer family, and
//! only BERT's basic split and greedy WordPiece are needed.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use unicode_normalization::{UnicodeNormalization, char::is_combining_mark};

const MAGIC: &[u8; 8] = b"GHWVEC\0\0";
const VERSION: u32 = 1;
const HEADER: usize = 24;
/// BERT's limit: a longer word is one unknown token.
const MAX_WORD_CHARS: usize = 100;

/// Why a table could not be loaded. [`VectorsError::code`] is stable.
#[derive(Debug, thiserror::Error)]
pub enum VectorsError {
    #[error("{path}: no such file (run scripts/detector-vectors to make it)")]
    Missing { path: PathBuf },
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the table is shorter than its header says ({have} bytes, {want} needed)")]
    Short { have: usize, want: usize },
    #[error("not a word-vector table (bad magic)")]
    BadMagic,
    #[error("word-vector table version {0} is not supported (expected {VERSION})")]
    Version(u32),
    #[error("corrupt word-vector table: {0}")]
    Corrupt(&'static str),
}

impl VectorsError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "VECTORS_MISSING",
            Self::Read { .. } => "VECTORS_READ",
            Self::Short { .. } => "VECTORS_SHORT",
            Self::BadMagic => "VECTORS_BAD_MAGIC",
            Self::Version(_) => "VECTORS_VERSION",
            Self::Corrupt(_) => "VECTORS_CORRUPT",
        }
    }
}

/// A wordpiece vocab with one vector per piece.
pub struct WordVectors {
    dims: usize,
    pieces: Vec<String>,
    /// Pieces that start a word, and pieces that continue one (`##ing` kept as `ing`).
    starts: HashMap<String, u32>,
    continuations: HashMap<String, u32>,
    unknown: Option<u32>,
    values: Vec<f32>,
}

impl std::fmt::Debug for WordVectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordVectors").field("pieces", &self.pieces.len()).field("dims", &self.dims).finish_non_exhaustive()
    }
}

impl WordVectors {
    pub fn load(path: &Path) -> Result<Self, VectorsError> {
        let bytes = std::fs::read(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => VectorsError::Missing { path: path.to_owned() },
            _ => VectorsError::Read { path: path.to_owned(), source },
        })?;
        Self::parse(&bytes)
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, VectorsError> {
        if bytes.len() < HEADER {
            return Err(VectorsError::Short { have: bytes.len(), want: HEADER });
        }
        if &bytes[..8] != MAGIC {
            return Err(VectorsError::BadMagic);
        }
        let word = |i: usize| u32::from_le_bytes([bytes[8 + 4 * i], bytes[9 + 4 * i], bytes[10 + 4 * i], bytes[11 + 4 * i]]);
        let (version, dims, count, vocab_bytes) = (word(0), word(1) as usize, word(2) as usize, word(3) as usize);
        if version != VERSION {
            return Err(VectorsError::Version(version));
        }
        if dims == 0 || count == 0 {
            return Err(VectorsError::Corrupt("no dimensions or no rows"));
        }
        let want = count.checked_mul(dims).and_then(|n| n.checked_mul(2)).and_then(|n| n.checked_add(HEADER + vocab_bytes)).ok_or(VectorsError::Corrupt("sizes overflow"))?;
        if bytes.len() < want {
            return Err(VectorsError::Short { have: bytes.len(), want });
        }
        if bytes.len() > want {
            return Err(VectorsError::Corrupt("trailing bytes after the values"));
        }
        let vocab = std::str::from_utf8(&bytes[HEADER..HEADER + vocab_bytes]).map_err(|_| VectorsError::Corrupt("the vocab is not UTF-8"))?;
        let pieces: Vec<String> = vocab.strip_suffix('\n').ok_or(VectorsError::Corrupt("the vocab does not end a row"))?.split('\n').map(str::to_owned).collect();
        if pieces.len() != count {
            return Err(VectorsError::Corrupt("the vocab does not hold one piece per row"));
        }
        let values = bytes[HEADER + vocab_bytes..].chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect::<Vec<f32>>();
        if values.iter().any(|v| !v.is_finite()) {
            return Err(VectorsError::Corrupt("a value is not finite"));
        }
        Ok(Self::new(pieces, dims, values))
    }

    /// A table from its parts: `values` holds `pieces.len() × dims` numbers, row by row.
    pub fn new(pieces: Vec<String>, dims: usize, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), pieces.len() * dims, "one row of `dims` values per piece");
        let mut starts = HashMap::new();
        let mut continuations = HashMap::new();
        for (id, piece) in pieces.iter().enumerate() {
            match piece.strip_prefix("##") {
                Some(rest) if !rest.is_empty() => continuations.entry(rest.to_owned()).or_insert(id as u32),
                _ => starts.entry(piece.clone()).or_insert(id as u32),
            };
        }
        let unknown = starts.get("[UNK]").copied();
        Self { dims, pieces, starts, continuations, unknown, values }
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub fn piece(&self, id: u32) -> &str {
        &self.pieces[id as usize]
    }

    pub fn row(&self, id: u32) -> &[f32] {
        let start = id as usize * self.dims;
        &self.values[start..start + self.dims]
    }

    /// The wordpiece ids of `text`, as BERT uncased reads it: control characters dropped,
    /// lower-cased, accents stripped, split on white space, punctuation and CJK ideographs, then
    /// each word cut greedily into the longest pieces of the vocab (`##` continuing a word). A word
    /// that cannot be cut is one `[UNK]` (left out when the vocab has none).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        for word in basic_words(text) {
            self.word_pieces(&word, &mut ids);
        }
        ids
    }

    fn word_pieces(&self, word: &str, ids: &mut Vec<u32>) {
        if word.chars().count() > MAX_WORD_CHARS {
            ids.extend(self.unknown);
            return;
        }
        let found = ids.len();
        let mut start = 0;
        while start < word.len() {
            let map = if start == 0 { &self.starts } else { &self.continuations };
            let rest = &word[start..];
            // The longest prefix of `rest` (on a character boundary) that is a piece.
            let piece = rest.char_indices().map(|(i, c)| i + c.len_utf8()).rev().find_map(|end| map.get(&rest[..end]).map(|&id| (id, end)));
            let Some((id, end)) = piece else {
                ids.truncate(found);
                ids.extend(self.unknown);
                return;
            };
            ids.push(id);
            start += end;
        }
    }

    /// The normalised mean of the rows of `ids` that `keep` lets through, or `None` when none
    /// does (or they cancel out).
    pub fn embed(&self, ids: &[u32], keep: impl Fn(u32) -> bool) -> Option<Vec<f32>> {
        let mut sum = vec![0.0f32; self.dims];
        let mut any = false;
        for &id in ids.iter().filter(|&&id| keep(id)) {
            any = true;
            for (s, v) in sum.iter_mut().zip(self.row(id)) {
                *s += v;
            }
        }
        let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt();
        if !any || norm <= f32::EPSILON {
            return None;
        }
        sum.iter_mut().for_each(|v| *v /= norm);
        Some(sum)
    }
}

/// The vectors of an index's tools, and which wordpieces carry no meaning (special tokens,
/// punctuation, the detector's stop words).
pub(super) struct ToolVectors {
    pub vectors: Arc<WordVectors>,
    skip: Vec<bool>,
    /// One normalised row per tool, in index order; zero for a tool with no content piece.
    tools: Vec<f32>,
}

impl std::fmt::Debug for ToolVectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolVectors").field("vectors", &self.vectors).field("tools", &(self.tools.len() / self.vectors.dims.max(1))).finish_non_exhaustive()
    }
}

impl ToolVectors {
    /// `texts`: each tool's text ("split name: description"), in index order.
    pub fn build(vectors: Arc<WordVectors>, texts: &[String], is_stopword: impl Fn(&str) -> bool) -> Self {
        let skip = vectors.pieces.iter().map(|p| (p.starts_with('[') && p.ends_with(']')) || !p.bytes().any(|b| b.is_ascii_alphanumeric()) || is_stopword(p)).collect();
        let mut this = Self { vectors, skip, tools: Vec::with_capacity(texts.len()) };
        let dims = this.vectors.dims;
        for text in texts {
            let row = this.embed(text).unwrap_or_else(|| vec![0.0; dims]);
            this.tools.extend(row);
        }
        this
    }

    /// The normalised mean vector of the content pieces of `text`.
    pub fn embed(&self, text: &str) -> Option<Vec<f32>> {
        self.vectors.embed(&self.vectors.tokenize(text), |id| !self.skip[id as usize])
    }

    /// The cosine of `query` (normalised) with tool `doc`. Eight running sums, so that the
    /// compiler can use vector instructions (one sum in order cannot be reordered).
    pub fn cosine(&self, query: &[f32], doc: usize) -> f32 {
        let dims = self.vectors.dims;
        let row = &self.tools[doc * dims..(doc + 1) * dims];
        let mut sums = [0.0f32; 8];
        let (rows, queries) = (row.chunks_exact(8), query.chunks_exact(8));
        let tail: f32 = rows.remainder().iter().zip(queries.remainder()).map(|(a, b)| a * b).sum();
        for (a, b) in rows.zip(queries) {
            for ((sum, x), y) in sums.iter_mut().zip(a).zip(b) {
                *sum += x * y;
            }
        }
        sums.iter().sum::<f32>() + tail
    }
}

impl WordVectors {
    /// The table at `path`, loaded once per process and shared by every index built with it (the
    /// catalog reloads and MCP discoveries rebuild the index, not the table). An empty path means no
    /// table; one that cannot be loaded is reported once, as a warning, and the detector stays
    /// lexical-only.
    pub fn shared(path: &str) -> Option<Arc<WordVectors>> {
        static LOADED: Mutex<Vec<(String, Option<Arc<WordVectors>>)>> = Mutex::new(Vec::new());
        if path.is_empty() {
            return None;
        }
        let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, vectors)) = loaded.iter().find(|(p, _)| p == path) {
            return vectors.clone();
        }
        let vectors = match WordVectors::load(Path::new(path)) {
            Ok(vectors) => {
                tracing::info!(path, pieces = vectors.len(), dims = vectors.dims(), "detector word vectors loaded");
                Some(Arc::new(vectors))
            }
            Err(error) => {
                tracing::warn!(path, code = error.code(), %error, "detector word vectors not loaded: the detector is lexical-only");
                None
            }
        };
        loaded.push((path.to_owned(), vectors.clone()));
        vectors
    }
}

/// BERT's basic tokenizer: the words and punctuation marks of `text`, folded.
fn basic_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    let lowered: String = text.chars().filter(|&c| !(c == '\0' || c == '\u{fffd}' || (c.is_control() && !c.is_whitespace()))).flat_map(char::to_lowercase).collect();
    for c in lowered.nfd().filter(|&c| !is_combining_mark(c)) {
        if c.is_whitespace() {
            flush(&mut word, &mut words);
        } else if is_punctuation(c) || is_cjk(c) {
            flush(&mut word, &mut words);
            words.push(c.to_string());
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut words);
    words
}

/// BERT's punctuation: all non-alphanumeric ASCII, and Unicode punctuation. Rust's standard
/// library has no general category, so outside ASCII this takes the punctuation blocks (Latin-1,
/// General Punctuation, CJK Symbols and Punctuation, the full-width forms).
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c, '\u{a1}' | '\u{a7}' | '\u{ab}' | '\u{b6}' | '\u{b7}' | '\u{bb}' | '\u{bf}' | '\u{37e}' | '\u{387}')
        || (('\u{2010}'..='\u{2027}').contains(&c) || ('\u{2030}'..='\u{205e}').contains(&c)) && !c.is_alphanumeric()
        || ('\u{3001}'..='\u{3003}').contains(&c)
        || ('\u{3008}'..='\u{3011}').contains(&c)
        || ('\u{3014}'..='\u{301f}').contains(&c)
        || matches!(c, '\u{ff01}'..='\u{ff0f}' | '\u{ff1a}'..='\u{ff20}' | '\u{ff3b}'..='\u{ff40}' | '\u{ff5b}'..='\u{ff65}') && !matches!(c, '\u{ff04}' | '\u{ff0b}' | '\u{ff1c}'..='\u{ff1e}' | '\u{ff3e}' | '\u{ff40}' | '\u{ff5c}' | '\u{ff5e}')
}

/// CJK ideographs, which BERT splits one by one.
fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// IEEE half precision to single (subnormals included).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise the fraction.
            let shift = frac.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | ((frac << shift) & 0x3ff) << 13
        }
        (31, 0) => sign | 0x7f80_0000,
        (31, _) => sign | 0x7fc0_0000,
        _ => sign | ((exp + 112) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests;
