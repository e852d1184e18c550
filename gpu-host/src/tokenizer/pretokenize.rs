//! Hand-written equivalents of the pre-tokenizer regexes of byte-level BPE
//! vocabularies. Each function returns the byte ranges of the pieces, in
//! order, covering the whole input.
//!
//! Writing them out avoids look-ahead (`\s+(?!\S)`) and runs in one linear
//! pass. The regexes, in Oniguruma / Python leftmost-first semantics:
//!
//! * GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! * Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! * Qwen2: as Llama 3 with `\p{N}` (single digits).

use std::ops::Range;

use super::unicode::{CharClass, classify};

/// Which regex family splits text before BPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// The original GPT-2 regex.
    Gpt2,
    /// Every `\p{N}` isolated first, then the GPT-2 regex (StarCoder, SmolLM).
    Gpt2IsolatedDigits,
    /// The Llama 3 regex; `max_digits` is 3 for Llama 3 and 1 for Qwen2.
    Llama3 { max_digits: usize },
}

impl PreTokenizer {
    /// Maps `tokenizer.ggml.pre` to a pre-tokenizer; `None` when unknown.
    pub(crate) fn from_gguf_name(name: &str) -> Option<Self> {
        Some(match name {
            "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" => Self::Gpt2,
            "starcoder" | "refact" | "smollm" | "codeshell" | "command-r" => {
                Self::Gpt2IsolatedDigits
            }
            "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "pixtral" => {
                Self::Llama3 { max_digits: 3 }
            }
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "megrez" | "hunyuan" => {
                Self::Llama3 { max_digits: 1 }
            }
            _ => return None,
        })
    }

    /// Splits `text` into pre-token byte ranges.
    pub(crate) fn split(self, text: &str) -> Vec<Range<usize>> {
        let chars: Vec<(usize, char, CharClass)> = text
            .char_indices()
            .map(|(i, c)| (i, c, classify(c)))
            .collect();
        let mut out = Vec::new();
        let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _, _)| b);
        let mut push = |start: usize, end: usize| out.push(byte_at(start)..byte_at(end));
        match self {
            Self::Gpt2 => split_gpt2(&chars, 0, chars.len(), &mut push),
            Self::Gpt2IsolatedDigits => {
                let mut start = 0;
                for (i, &(_, _, class)) in chars.iter().enumerate() {
                    if class == CharClass::Number {
                        split_gpt2(&chars, start, i, &mut push);
                        push(i, i + 1);
                        start = i + 1;
                    }
                }
                split_gpt2(&chars, start, chars.len(), &mut push);
            }
            Self::Llama3 { max_digits } => split_llama3(&chars, max_digits, &mut push),
        }
        out
    }
}

type Chars = [(usize, char, CharClass)];

fn class_at(chars: &Chars, i: usize, end: usize) -> Option<CharClass> {
    (i < end).then(|| chars[i].2)
}

fn char_at(chars: &Chars, i: usize, end: usize) -> Option<char> {
    (i < end).then(|| chars[i].1)
}

/// End of the run of chars from `i` (exclusive bound `end`) satisfying `pred`.
fn run_end(
    chars: &Chars,
    mut i: usize,
    end: usize,
    pred: impl Fn(char, CharClass) -> bool,
) -> usize {
    while i < end && pred(chars[i].1, chars[i].2) {
        i += 1;
    }
    i
}

/// Length of a contraction (`'s`, `'re`, ...) starting at `i`, or 0.
fn contraction_len(chars: &Chars, i: usize, end: usize, ignore_case: bool) -> usize {
    if char_at(chars, i, end) != Some('\'') {
        return 0;
    }
    let fold = |c: Option<char>| {
        c.map(|c| {
            if ignore_case {
                c.to_ascii_lowercase()
            } else {
                c
            }
        })
    };
    let a = fold(char_at(chars, i + 1, end));
    let b = fold(char_at(chars, i + 2, end));
    match (a, b) {
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
        (Some('s' | 't' | 'm' | 'd'), _) => 2,
        _ => 0,
    }
}

/// `\s+(?!\S)|\s+` at `i`, which must be whitespace: all of the run when it
/// reaches `end`, else all but its last char (which then prefixes the next
/// piece), else the single whitespace char.
fn whitespace_piece(chars: &Chars, i: usize, end: usize) -> usize {
    let run = run_end(chars, i, end, |_, c| c == CharClass::Space);
    if run == end || run - i == 1 {
        run
    } else {
        run - 1
    }
}

fn split_gpt2(chars: &Chars, mut i: usize, end: usize, push: &mut impl FnMut(usize, usize)) {
    while i < end {
        let next = gpt2_piece(chars, i, end);
        push(i, next);
        i = next;
    }
}

fn gpt2_piece(chars: &Chars, i: usize, end: usize) -> usize {
    let contraction = contraction_len(chars, i, end, false);
    if contraction > 0 {
        return i + contraction;
    }
    let j = if chars[i].1 == ' ' { i + 1 } else { i };
    match class_at(chars, j, end) {
        Some(CharClass::Letter) => return run_end(chars, j, end, |_, c| c == CharClass::Letter),
        Some(CharClass::Number) => return run_end(chars, j, end, |_, c| c == CharClass::Number),
        Some(CharClass::Other) => return run_end(chars, j, end, |_, c| c == CharClass::Other),
        Some(CharClass::Space) | None => {}
    }
    // Here chars[i] is whitespace (a lone trailing ' ' included).
    whitespace_piece(chars, i, end)
}

fn is_cr_lf(c: char) -> bool {
    c == '\r' || c == '\n'
}

fn split_llama3(chars: &Chars, max_digits: usize, push: &mut impl FnMut(usize, usize)) {
    let end = chars.len();
    let mut i = 0;
    while i < end {
        let next = llama3_piece(chars, i, end, max_digits);
        push(i, next);
        i = next;
    }
}

fn llama3_piece(chars: &Chars, i: usize, end: usize, max_digits: usize) -> usize {
    let (c, class) = (chars[i].1, chars[i].2);
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    let contraction = contraction_len(chars, i, end, true);
    if contraction > 0 {
        return i + contraction;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    let is_letter = |_: char, k: CharClass| k == CharClass::Letter;
    if class == CharClass::Letter {
        return run_end(chars, i, end, is_letter);
    }
    if class != CharClass::Number
        && !is_cr_lf(c)
        && class_at(chars, i + 1, end) == Some(CharClass::Letter)
    {
        return run_end(chars, i + 1, end, is_letter);
    }
    // \p{N}{1,max}
    if class == CharClass::Number {
        let limit = end.min(i + max_digits);
        return run_end(chars, i, limit, |_, k| k == CharClass::Number);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let j = if c == ' ' { i + 1 } else { i };
    if class_at(chars, j, end) == Some(CharClass::Other) {
        let others = run_end(chars, j, end, |_, k| k == CharClass::Other);
        return run_end(chars, others, end, |ch, _| is_cr_lf(ch));
    }
    // Here chars[i] is whitespace. `\s*[\r\n]+`: up to the last line break
    // of the whitespace run.
    let run = run_end(chars, i, end, |_, k| k == CharClass::Space);
    if let Some(last_break) = (i..run).rev().find(|&k| is_cr_lf(chars[k].1)) {
        return last_break + 1;
    }
    whitespace_piece(chars, i, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<&str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
    }

    const GPT2: PreTokenizer = PreTokenizer::Gpt2;
    const LLAMA3: PreTokenizer = PreTokenizer::Llama3 { max_digits: 3 };
    const QWEN2: PreTokenizer = PreTokenizer::Llama3 { max_digits: 1 };

    #[test]
    fn gpt2_contractions_are_case_sensitive() {
        assert_eq!(
            pieces(GPT2, "I'm don't WE'LL it's"),
            ["I", "'m", " don", "'t", " WE", "'", "LL", " it", "'s"]
        );
        assert_eq!(pieces(GPT2, "'sup"), ["'s", "up"]);
        assert_eq!(pieces(GPT2, "''s"), ["''", "s"]);
    }

    #[test]
    fn gpt2_whitespace_runs() {
        assert_eq!(pieces(GPT2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(GPT2, "a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(pieces(GPT2, "a\n\nb  "), ["a", "\n", "\n", "b", "  "]);
        assert_eq!(pieces(GPT2, " "), [" "]);
        assert_eq!(pieces(GPT2, "x ?! 12 3"), ["x", " ?!", " 12", " 3"]);
        assert_eq!(pieces(GPT2, "héllo wörld١٢"), ["héllo", " wörld", "١٢"]);
        assert_eq!(pieces(GPT2, "abc123def"), ["abc", "123", "def"]);
    }

    #[test]
    fn isolated_digits() {
        let p = PreTokenizer::Gpt2IsolatedDigits;
        assert_eq!(pieces(p, "ab 123x"), ["ab", " ", "1", "2", "3", "x"]);
    }

    #[test]
    fn llama3_splits() {
        assert_eq!(
            pieces(LLAMA3, "I'M don'T we'll"),
            ["I", "'M", " don", "'T", " we", "'ll"]
        );
        assert_eq!(pieces(LLAMA3, "1234567"), ["123", "456", "7"]);
        assert_eq!(pieces(QWEN2, "1234"), ["1", "2", "3", "4"]);
        assert_eq!(pieces(LLAMA3, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(LLAMA3, "\tfoo"), ["\tfoo"]);
        assert_eq!(pieces(LLAMA3, "(foo)"), ["(foo", ")"]);
        assert_eq!(pieces(LLAMA3, "x ...\n\ny"), ["x", " ...\n\n", "y"]);
        assert_eq!(pieces(LLAMA3, "a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(pieces(LLAMA3, "a\n\n\n"), ["a", "\n\n\n"]);
        assert_eq!(pieces(LLAMA3, "a\n  "), ["a", "\n", "  "]);
        assert_eq!(pieces(LLAMA3, "\r\nx"), ["\r\n", "x"]);
        assert_eq!(pieces(LLAMA3, "x\t(y"), ["x", "\t", "(y"]);
        assert_eq!(pieces(LLAMA3, "12abc"), ["12", "abc"]);
        assert_eq!(pieces(LLAMA3, "\n1"), ["\n", "1"]);
        assert_eq!(pieces(LLAMA3, "über 中文"), ["über", " 中文"]);
    }

    #[test]
    fn pieces_cover_input() {
        let text = "Hello,  world!\n\n  It's 2024 —\tnaïve café ١٢٣ 😀😀 \u{3000}x ";
        for pre in [GPT2, LLAMA3, QWEN2, PreTokenizer::Gpt2IsolatedDigits] {
            let joined: String = pieces(pre, text).concat();
            assert_eq!(joined, text);
        }
    }

    #[test]
    fn matches_regex_crate_where_no_lookahead_needed() {
        // Without trailing whitespace runs the look-ahead never fires, so the
        // plain alternation (minus `\s+(?!\S)`) must agree except at whitespace
        // runs of length > 1; compare on text with single spaces only.
        let re = regex::Regex::new(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+",
        )
        .unwrap();
        let text = "It's a café, isn't it? 12345 items\n(quoted) 'x' \"y\" \n-- done.\r\nÆsir ٣٤٥٦";
        let expected: Vec<&str> = re.find_iter(text).map(|m| m.as_str()).collect();
        assert_eq!(pieces(LLAMA3, text), expected);
    }
}
