//! SentencePiece-style tokenization as llama.cpp's `llm_tokenizer_spm` does
//! it: start from UTF-8 characters, repeatedly merge the adjacent pair whose
//! concatenation is the highest-scoring vocabulary entry, and spell whatever
//! is left unknown as `<0xNN>` byte tokens.

use std::collections::BinaryHeap;

/// What the SPM merge loop needs from the vocabulary.
pub(crate) trait SpmVocab {
    /// The id and score of the token spelled exactly `text`.
    fn lookup(&self, text: &str) -> Option<(u32, f32)>;
    /// The byte-fallback token for `byte`, else the unknown token.
    fn byte_token(&self, byte: u8) -> Option<u32>;
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    // Highest score first; on ties the leftmost pair (llama.cpp's order).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Tokenizes `text` (spaces already escaped as `▁`) and appends ids to `out`.
pub(crate) fn tokenize(vocab: &impl SpmVocab, text: &str, out: &mut Vec<u32>) {
    const NONE: usize = usize::MAX;
    let mut symbols: Vec<Symbol> = text
        .char_indices()
        .map(|(start, c)| Symbol {
            start,
            len: c.len_utf8(),
            prev: NONE,
            next: NONE,
        })
        .collect();
    let n = symbols.len();
    for (i, sym) in symbols.iter_mut().enumerate() {
        sym.prev = i.wrapping_sub(1);
        sym.next = if i + 1 < n { i + 1 } else { NONE };
    }
    let mut queue = BinaryHeap::new();
    let try_add =
        |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (symbols[left], symbols[right]);
            let piece = &text[l.start..r.start + r.len];
            if let Some((_, score)) = vocab.lookup(piece) {
                queue.push(Bigram {
                    score,
                    left,
                    right,
                    len: piece.len(),
                });
            }
        };
    for i in 1..n {
        try_add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        // Skip pairs one of whose symbols has since been merged away.
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len || l.next != bigram.right {
            continue;
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.right].len = 0;
        symbols[bigram.left].next = r.next;
        if r.next != NONE {
            symbols[r.next].prev = bigram.left;
        }
        try_add(&mut queue, &symbols, l.prev, bigram.left);
        try_add(&mut queue, &symbols, bigram.left, r.next);
    }
    let mut i = if n == 0 { NONE } else { 0 };
    while i != NONE {
        let sym = symbols[i];
        let piece = &text[sym.start..sym.start + sym.len];
        match vocab.lookup(piece) {
            Some((id, _)) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| vocab.byte_token(b))),
        }
        i = sym.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Vocab(HashMap<&'static str, (u32, f32)>);

    impl SpmVocab for Vocab {
        fn lookup(&self, text: &str) -> Option<(u32, f32)> {
            self.0.get(text).copied()
        }
        fn byte_token(&self, byte: u8) -> Option<u32> {
            Some(1000 + u32::from(byte))
        }
    }

    fn vocab() -> Vocab {
        Vocab(HashMap::from([
            ("▁", (1, -1.0)),
            ("a", (2, -2.0)),
            ("b", (3, -2.0)),
            ("ab", (4, -3.0)),
            ("▁a", (5, -1.5)),
            ("▁ab", (6, -0.5)),
            ("bb", (7, -2.5)),
        ]))
    }

    fn tok(text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        tokenize(&vocab(), text, &mut out);
        out
    }

    #[test]
    fn merges_by_score() {
        // ▁a (-1.5) beats ab (-3); then ▁a+b = ▁ab.
        assert_eq!(tok("▁ab"), [6]);
        // "abb": ab (-3) vs bb (-2.5): bb wins → a bb.
        assert_eq!(tok("abb"), [2, 7]);
        // Equal scores: leftmost first. "bbb" → bb b.
        assert_eq!(tok("bbb"), [7, 3]);
        assert_eq!(tok(""), Vec::<u32>::new());
    }

    #[test]
    fn unknown_chars_fall_back_to_bytes() {
        assert_eq!(tok("a€"), [2, 1000 + 0xE2, 1000 + 0x82, 1000 + 0xAC]);
    }
}
