//! Tokenizers built from GGUF metadata: SentencePiece-style (`llama`) and
//! byte-level BPE (`gpt2`), compatible with llama.cpp and Hugging Face
//! `tokenizers` on the vocabularies Bulkhead serves.

mod bpe;
mod gguf;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;

use std::collections::HashMap;
use std::ops::Range;

use pretokenize::PreTokenizer;
use special::{Fragment, Kind, SpecialMatcher};
pub use stream::{StreamDecoder, TextStream};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

/// Largest vocabulary accepted. Real ones are ≤ 262k; 4M bounds the memory a
/// hostile file can make us allocate for per-token tables.
pub const MAX_VOCAB_TOKENS: usize = 1 << 22;
/// Longest token text accepted. Real tokens are at most a few hundred bytes;
/// the cap bounds per-token work in the special-token trie and merges.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Most merge rules accepted (real vocabularies have < 1M).
pub const MAX_MERGES: usize = 1 << 22;
/// Longest merge rule: two maximal tokens and the separating space.
pub const MAX_MERGE_BYTES: usize = 2 * MAX_TOKEN_BYTES + 1;

/// Token texts that end generation besides EOS/EOT (llama.cpp's list).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

/// Marks the start of user-written text in a rendered prompt
/// ([`Tokenizer::encode_marked`]); a Unicode noncharacter, which no
/// vocabulary spells and no client needs to send.
pub const LITERAL_START: char = '\u{FDD0}';
/// Marks the end of user-written text in a rendered prompt.
pub const LITERAL_END: char = '\u{FDD1}';

/// `text` without its literal marks, and the byte ranges of the result
/// they enclosed (sorted, disjoint; see [`Tokenizer::encode_marked`]).
fn unmark(text: &str) -> (String, Vec<Range<usize>>) {
    let mut plain = String::with_capacity(text.len());
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut open: Option<usize> = None;
    for c in text.chars() {
        match c {
            LITERAL_START => {
                open.get_or_insert(plain.len());
            }
            LITERAL_END => {
                // Unopened: literal back to the last range (or the start).
                let start = open
                    .take()
                    .unwrap_or_else(|| ranges.last().map_or(0, |r| r.end));
                ranges.push(start..plain.len());
            }
            c => plain.push(c),
        }
    }
    if let Some(start) = open {
        ranges.push(start..plain.len());
    }
    ranges.retain(|r| !r.is_empty());
    (plain, ranges)
}

/// Tokenizer settings, named after the GGUF `tokenizer.ggml.*` keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerConfig {
    /// `tokenizer.ggml.model`: `"llama"` (SentencePiece-style) or `"gpt2"` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer (`"default"`, `"gpt-2"`, `"llama-bpe"`, `"qwen2"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token texts, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: SentencePiece merge scores (higher merges first).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs; the index is the rank.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece only; default true).
    pub add_space_prefix: Option<bool>,
}

/// Why a tokenizer could not be built. All are faults of the model file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names an algorithm we do not implement.
    #[error("unsupported tokenizer model {0:?} (expected \"llama\" or \"gpt2\")")]
    UnknownModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not implement.
    #[error("unsupported BPE pre-tokenizer {0:?}")]
    UnknownPreTokenizer(String),
    /// The vocabulary is empty.
    #[error("tokenizer vocabulary is empty")]
    EmptyVocab,
    /// The vocabulary is larger than [`MAX_VOCAB_TOKENS`].
    #[error("tokenizer vocabulary has {len} tokens, more than the limit of {max}")]
    VocabTooLarge { len: usize, max: usize },
    /// A token text is longer than [`MAX_TOKEN_BYTES`].
    #[error("token {id} is {len} bytes long, more than the limit of {max}")]
    TokenTooLong { id: usize, len: usize, max: usize },
    /// A per-token array has a different length from the token list.
    #[error("{field} has {actual} entries but there are {expected} tokens")]
    LengthMismatch {
        field: &'static str,
        expected: usize,
        actual: usize,
    },
    /// A token type is not one of GGUF's values 0..=6.
    #[error("token {id} has invalid token type {value}")]
    InvalidTokenType { id: usize, value: i32 },
    /// A special-token id is outside the vocabulary.
    #[error("{field} is {id}, outside the vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        field: &'static str,
        id: u32,
        vocab_size: usize,
    },
    /// A byte-level BPE vocabulary has no merges.
    #[error("a \"gpt2\" tokenizer needs tokenizer.ggml.merges")]
    MissingMerges,
    /// There are more merges than [`MAX_MERGES`].
    #[error("tokenizer has {len} merges, more than the limit of {max}")]
    TooManyMerges { len: usize, max: usize },
    /// A merge rule is not two non-empty tokens separated by a space.
    #[error("merge {index} ({rule:?}) is malformed: {reason}")]
    MalformedMerge {
        index: usize,
        rule: String,
        reason: &'static str,
    },
    /// A GGUF metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] crate::gguf::GgufError),
}

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// 0: not specified; treated as normal.
    Undefined,
    /// 1: an ordinary piece.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, EOS, chat markers).
    Control,
    /// 4: a user-defined token, matched literally in text.
    UserDefined,
    /// 5: reserved, never produced.
    Unused,
    /// 6: a byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenType {
    fn from_gguf(value: i32) -> Option<Self> {
        Some(match value {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    /// How text containing this token's spelling yields the token itself:
    /// as a control token (only where special-token parsing is on) or as an
    /// added one (always); `None`: never.
    fn matched_as(self) -> Option<Kind> {
        match self {
            Self::Control | Self::Unknown => Some(Kind::Control),
            Self::UserDefined => Some(Kind::Added),
            _ => None,
        }
    }
}

#[derive(Debug)]
enum Model {
    SentencePiece {
        scores: Vec<f32>,
        /// `<0xNN>` token per byte, else the unknown token.
        byte_tokens: [Option<u32>; 256],
    },
    ByteLevelBpe {
        pre: PreTokenizer,
        merges: bpe::Merges,
        /// Token for each byte's GPT-2 character, else the unknown token.
        byte_tokens: [Option<u32>; 256],
        /// Take a whole pre-token when it is in the vocabulary (Llama 3).
        ignore_merges: bool,
        /// Compose text to Unicode NFC before splitting (Qwen2's HF normalizer).
        nfc: bool,
    },
}

/// An immutable tokenizer; cheap to share across threads.
#[derive(Debug)]
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Concatenated decoded bytes of every token; token `i` is
    /// `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    token_to_id: HashMap<String, u32>,
    specials: SpecialMatcher,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eot_id: Option<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Sorted ids that end generation.
    end_of_generation: Vec<u32>,
}

impl Tokenizer {
    /// Validates `cfg` and builds the tokenizer.
    pub fn new(cfg: TokenizerConfig) -> Result<Tokenizer, TokenizerError> {
        let n = cfg.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > MAX_VOCAB_TOKENS {
            return Err(TokenizerError::VocabTooLarge {
                len: n,
                max: MAX_VOCAB_TOKENS,
            });
        }
        if let Some((id, t)) = cfg
            .tokens
            .iter()
            .enumerate()
            .find(|(_, t)| t.len() > MAX_TOKEN_BYTES)
        {
            return Err(TokenizerError::TokenTooLong {
                id,
                len: t.len(),
                max: MAX_TOKEN_BYTES,
            });
        }
        let types = match &cfg.token_types {
            None => vec![TokenType::Normal; n],
            Some(raw) => {
                check_len("tokenizer.ggml.token_type", n, raw.len())?;
                raw.iter()
                    .enumerate()
                    .map(|(id, &value)| {
                        TokenType::from_gguf(value)
                            .ok_or(TokenizerError::InvalidTokenType { id, value })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let check_id = |field: &'static str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::IdOutOfRange {
                field,
                id,
                vocab_size: n,
            }),
            _ => Ok(id),
        };
        let bos_id = check_id("tokenizer.ggml.bos_token_id", cfg.bos_id)?;
        let eos_id = check_id("tokenizer.ggml.eos_token_id", cfg.eos_id)?;
        let eot_id = check_id("tokenizer.ggml.eot_token_id", cfg.eot_id)?;
        let unk_id = check_id("tokenizer.ggml.unknown_token_id", cfg.unk_id)?;
        let pad_id = check_id("tokenizer.ggml.padding_token_id", cfg.pad_id)?;

        let mut token_to_id = HashMap::with_capacity(n);
        for (id, t) in cfg.tokens.iter().enumerate() {
            // Later duplicates win, as in llama.cpp.
            token_to_id.insert(t.clone(), id as u32);
        }

        let (model, default_add_bos) = match cfg.model.as_str() {
            "llama" => {
                let scores = match cfg.scores {
                    Some(s) => {
                        check_len("tokenizer.ggml.scores", n, s.len())?;
                        s
                    }
                    None => vec![0.0; n],
                };
                let byte_tokens = std::array::from_fn(|b| {
                    token_to_id
                        .get(&format!("<0x{b:02X}>"))
                        .or_else(|| token_to_id.get(&char::from(b as u8).to_string()))
                        .copied()
                        .or(unk_id)
                });
                (
                    Model::SentencePiece {
                        scores,
                        byte_tokens,
                    },
                    true,
                )
            }
            "gpt2" => {
                let pre_name = cfg.pre.as_deref().unwrap_or("default");
                let pre = PreTokenizer::from_gguf_name(pre_name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre_name.to_owned()))?;
                let is_llama3 = matches!(pre_name, "llama-bpe" | "llama3" | "llama-v3");
                let merges = build_merges(cfg.merges.as_deref(), &token_to_id)?;
                let table = bpe::byte_to_char_table();
                let byte_tokens = std::array::from_fn(|b| {
                    token_to_id.get(&table[b].to_string()).copied().or(unk_id)
                });
                let model = Model::ByteLevelBpe {
                    pre,
                    merges,
                    byte_tokens,
                    ignore_merges: is_llama3,
                    // Qwen2's HF tokenizer has an NFC normalizer; llama.cpp skips it.
                    nfc: matches!(pre_name, "qwen2" | "deepseek-r1-qwen"),
                };
                (model, is_llama3)
            }
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        let char_to_byte = bpe::char_to_byte_map();
        for (text, &ty) in cfg.tokens.iter().zip(&types) {
            offsets.push(bytes.len());
            decoded_bytes(&model, text, ty, &char_to_byte, &mut bytes);
        }
        offsets.push(bytes.len());

        let specials = SpecialMatcher::new(
            cfg.tokens
                .iter()
                .zip(&types)
                .enumerate()
                .filter_map(|(id, (text, ty))| Some((id as u32, text.as_str(), ty.matched_as()?))),
        );

        let mut end_of_generation: Vec<u32> = END_OF_GENERATION_TEXTS
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied())
            .chain(eos_id)
            .chain(eot_id)
            .collect();
        end_of_generation.sort_unstable();
        end_of_generation.dedup();

        let is_spm = matches!(model, Model::SentencePiece { .. });
        Ok(Tokenizer {
            model,
            tokens: cfg.tokens,
            types,
            bytes,
            offsets,
            token_to_id,
            specials,
            bos_id,
            eos_id,
            eot_id,
            unk_id,
            pad_id,
            add_bos: cfg.add_bos.unwrap_or(default_add_bos),
            add_eos: cfg.add_eos.unwrap_or(false),
            add_space_prefix: is_spm && cfg.add_space_prefix.unwrap_or(true),
            end_of_generation,
        })
    }

    /// Tokenizes `text`. Special tokens written literally are recognised;
    /// `add_special` adds BOS/EOS as the model's config asks.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_outside(text, add_special, &[])
    }

    /// Tokenizes `text` with special-token parsing off: a control token's
    /// spelling is text like any other (user-defined added tokens still
    /// tokenize whole, as in llama.cpp and Hugging Face); `add_special`
    /// adds BOS/EOS as the model's config asks.
    pub fn encode_literal(&self, text: &str, add_special: bool) -> Vec<u32> {
        let whole = 0..text.len();
        self.encode_outside(text, add_special, std::slice::from_ref(&whole))
    }

    /// Tokenizes a rendered prompt whose user-written parts are marked
    /// ([`LITERAL_START`] … [`LITERAL_END`], as the chat template renders
    /// message content): control tokens are recognised only outside the
    /// marks, and the marks themselves are dropped. A start mark without an
    /// end keeps the rest literal, an end mark without a start everything
    /// before it: an unbalanced mark never leaves user text parsed.
    pub fn encode_marked(&self, text: &str, add_special: bool) -> Vec<u32> {
        let (plain, literal) = unmark(text);
        self.encode_outside(&plain, add_special, &literal)
    }

    fn encode_outside(&self, text: &str, add_special: bool, literal: &[Range<usize>]) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos_id);
        }
        let mut after_special = true;
        for fragment in self.specials.split_outside(text, literal) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    self.encode_text(&text[range], after_special, &mut out);
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos_id);
        }
        out
    }

    fn encode_text(&self, text: &str, after_special: bool, out: &mut Vec<u32>) {
        match &self.model {
            Model::SentencePiece { .. } => {
                // Every text fragment that starts the input or follows a
                // special token gets a `▁` prefix unless it already starts
                // with one: HF's Metaspace (prepend_scheme "always", as
                // transformers sets up Llama with legacy=True). llama.cpp
                // prefixes unconditionally, so " x" differs there.
                let mut escaped = String::with_capacity(text.len() + 3);
                let starts_with_space = text.starts_with([' ', '▁']);
                if self.add_space_prefix && after_special && !starts_with_space {
                    escaped.push('▁');
                }
                for c in text.chars() {
                    escaped.push(if c == ' ' { '▁' } else { c });
                }
                spm::tokenize(self, &escaped, out);
            }
            Model::ByteLevelBpe {
                pre,
                merges,
                byte_tokens,
                ignore_merges,
                nfc,
            } => {
                let composed;
                let text = if *nfc && is_nfc_quick(text.chars()) != IsNormalized::Yes {
                    composed = text.nfc().collect::<String>();
                    composed.as_str()
                } else {
                    text
                };
                let table = bpe::byte_to_char_table();
                let mut symbols = Vec::new();
                let mut mapped = String::new();
                for range in pre.split(text) {
                    let word = &text.as_bytes()[range];
                    if *ignore_merges {
                        mapped.clear();
                        mapped.extend(word.iter().map(|&b| table[usize::from(b)]));
                        if let Some(&id) = self.token_to_id.get(&mapped) {
                            out.push(id);
                            continue;
                        }
                    }
                    symbols.clear();
                    symbols.extend(word.iter().filter_map(|&b| byte_tokens[usize::from(b)]));
                    merges.apply(&symbols, out);
                }
            }
        }
    }

    /// Turns ids back into text (lossy UTF-8; special tokens as their text;
    /// ids outside the vocabulary are skipped).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id).unwrap_or_default());
        }
        let start = usize::from(self.add_space_prefix && bytes.first() == Some(&b' '));
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// A decoder that turns ids into text one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, self.add_space_prefix)
    }

    /// The raw bytes a token stands for.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.bytes[start..end])
    }

    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token spelled exactly `text` in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The token's GGUF type.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// End-of-turn token.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot_id
    }

    /// Unknown token.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    /// Padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Whether `encode(_, true)` prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos_id.is_some()
    }

    /// Whether generating `id` ends the turn (EOS, EOT, `<|im_end|>`, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }
}

impl spm::SpmVocab for Tokenizer {
    fn lookup(&self, text: &str) -> Option<(u32, f32)> {
        let id = *self.token_to_id.get(text)?;
        match &self.model {
            Model::SentencePiece { scores, .. } => Some((id, scores[id as usize])),
            Model::ByteLevelBpe { .. } => Some((id, 0.0)),
        }
    }

    fn byte_token(&self, byte: u8) -> Option<u32> {
        match &self.model {
            Model::SentencePiece { byte_tokens, .. } | Model::ByteLevelBpe { byte_tokens, .. } => {
                byte_tokens[usize::from(byte)]
            }
        }
    }
}

fn check_len(field: &'static str, expected: usize, actual: usize) -> Result<(), TokenizerError> {
    if expected == actual {
        Ok(())
    } else {
        Err(TokenizerError::LengthMismatch {
            field,
            expected,
            actual,
        })
    }
}

fn build_merges(
    rules: Option<&[String]>,
    token_to_id: &HashMap<String, u32>,
) -> Result<bpe::Merges, TokenizerError> {
    let rules = rules.ok_or(TokenizerError::MissingMerges)?;
    if rules.len() > MAX_MERGES {
        return Err(TokenizerError::TooManyMerges {
            len: rules.len(),
            max: MAX_MERGES,
        });
    }
    let mut merges = bpe::Merges::default();
    let mut joined = String::new();
    for (index, rule) in rules.iter().enumerate() {
        let malformed = |reason| TokenizerError::MalformedMerge {
            index,
            rule: rule.chars().take(64).collect(),
            reason,
        };
        if rule.len() > MAX_MERGE_BYTES {
            return Err(malformed("longer than the limit"));
        }
        // Like llama.cpp, look for the separator from the second byte on so
        // that a left part starting with a space still parses.
        let sep = rule
            .as_bytes()
            .iter()
            .skip(1)
            .position(|&b| b == b' ')
            .map(|p| p + 1)
            .ok_or_else(|| malformed("no space separator"))?;
        let (left, right) = (&rule[..sep], &rule[sep + 1..]);
        if right.is_empty() {
            return Err(malformed("empty right part"));
        }
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        // Rules naming tokens outside the vocabulary can never fire; skip
        // them rather than refuse the model (llama.cpp tolerates them too).
        if let (Some(&l), Some(&r), Some(&m)) = (
            token_to_id.get(left),
            token_to_id.get(right),
            token_to_id.get(joined.as_str()),
        ) {
            merges.insert(l, r, index as u32, m);
        }
    }
    Ok(merges)
}

/// Appends the bytes `text` (of type `ty`) decodes to.
fn decoded_bytes(
    model: &Model,
    text: &str,
    ty: TokenType,
    char_to_byte: &HashMap<char, u8>,
    out: &mut Vec<u8>,
) {
    if matches!(
        ty,
        TokenType::Control | TokenType::UserDefined | TokenType::Unknown
    ) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    match model {
        Model::SentencePiece { .. } => {
            if let Some(b) = parse_byte_token(text).filter(|_| ty == TokenType::Byte) {
                out.push(b);
                return;
            }
            for c in text.chars() {
                let c = if c == '▁' { ' ' } else { c };
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
        Model::ByteLevelBpe { .. } => {
            for c in text.chars() {
                match char_to_byte.get(&c) {
                    Some(&b) => out.push(b),
                    None => {
                        let mut buf = [0; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
    }
}

/// Parses `<0xNN>`.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests;
