//! Splits text around special tokens written literally in it, leftmost-longest
//! (as Hugging Face's added-vocabulary matcher does).

use std::ops::Range;

/// One piece of input after special-token splitting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Plain text, to be tokenized normally.
    Text(Range<usize>),
    /// A special token matched literally.
    Token(u32),
}

/// What a matched token is to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A control token (or the unknown token): it steers the model, so text
    /// a user wrote (a literal range) never becomes one.
    Control,
    /// A user-defined added token: ordinary vocabulary that tokenizes as a
    /// whole, matched wherever it is written (llama.cpp and Hugging Face
    /// match these even with special-token parsing off).
    Added,
}

#[derive(Debug, Default)]
struct Node {
    /// (byte, child index), kept sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<(u32, Kind)>,
}

/// A byte trie over the special tokens' texts.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
}

impl SpecialMatcher {
    /// Builds the matcher; empty strings are ignored.
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = (u32, &'a str, Kind)>) -> Self {
        let mut nodes = vec![Node::default()];
        for (id, text, kind) in tokens {
            if text.is_empty() {
                continue;
            }
            let mut at = 0usize;
            for &b in text.as_bytes() {
                at = match nodes[at].children.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(pos) => nodes[at].children[pos].1 as usize,
                    Err(pos) => {
                        let child = nodes.len();
                        nodes[at].children.insert(pos, (b, child as u32));
                        nodes.push(Node::default());
                        child
                    }
                };
            }
            // With duplicate texts the later id wins, as in llama.cpp's map.
            nodes[at].token = Some((id, kind));
        }
        Self { nodes }
    }

    /// True when there is no special token at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes[0].children.is_empty()
    }

    /// The longest token starting at the beginning of `bytes` that `allowed`
    /// accepts given its kind and length.
    fn longest_at(
        &self,
        bytes: &[u8],
        allowed: impl Fn(Kind, usize) -> bool,
    ) -> Option<(u32, usize)> {
        let mut at = 0usize;
        let mut best = None;
        for (i, &b) in bytes.iter().enumerate() {
            let node = &self.nodes[at];
            match node.children.binary_search_by_key(&b, |&(k, _)| k) {
                Ok(pos) => at = node.children[pos].1 as usize,
                Err(_) => break,
            }
            if let Some((id, kind)) = self.nodes[at].token
                && allowed(kind, i + 1)
            {
                best = Some((id, i + 1));
            }
        }
        best
    }

    /// Splits `text` into text fragments and special tokens, every token
    /// spelled in it recognised.
    #[cfg(test)]
    pub(crate) fn split(&self, text: &str) -> Vec<Fragment> {
        self.split_outside(text, &[])
    }

    /// Splits `text` into text fragments and special tokens, except that no
    /// control token is recognised where its spelling overlaps one of
    /// `literal` (sorted, disjoint byte ranges of `text`): there it stays
    /// text. Added tokens are recognised everywhere.
    pub(crate) fn split_outside(&self, text: &str, literal: &[Range<usize>]) -> Vec<Fragment> {
        let mut out = Vec::new();
        if self.is_empty() {
            if !text.is_empty() {
                out.push(Fragment::Text(0..text.len()));
            }
            return out;
        }
        let bytes = text.as_bytes();
        let root = &self.nodes[0];
        let mut text_start = 0;
        let mut i = 0;
        // The first literal range that does not end before `i`.
        let mut next_literal = 0;
        while i < bytes.len() {
            while literal.get(next_literal).is_some_and(|r| r.end <= i) {
                next_literal += 1;
            }
            let starts_token = root
                .children
                .binary_search_by_key(&bytes[i], |&(k, _)| k)
                .is_ok();
            let found = if starts_token {
                let literal_from = literal.get(next_literal).map_or(usize::MAX, |r| r.start);
                self.longest_at(&bytes[i..], |kind, len| {
                    kind == Kind::Added || i + len <= literal_from
                })
            } else {
                None
            };
            if let Some((id, len)) = found {
                if text_start < i {
                    out.push(Fragment::Text(text_start..i));
                }
                out.push(Fragment::Token(id));
                i += len;
                text_start = i;
                continue;
            }
            i += 1;
        }
        if text_start < bytes.len() {
            out.push(Fragment::Text(text_start..bytes.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let c = Kind::Control;
        let m = SpecialMatcher::new([
            (1, "<|a|>", c),
            (2, "<|a|><|b|>", c),
            (3, "|>", c),
            (4, "", c),
        ]);
        let text = "x<|a|><|b|>y<|a|>|>";
        assert_eq!(
            m.split(text),
            [
                Fragment::Text(0..1),
                Fragment::Token(2),
                Fragment::Text(11..12),
                Fragment::Token(1),
                Fragment::Token(3),
            ]
        );
        assert_eq!(m.split(""), []);
        assert_eq!(m.split("<|"), [Fragment::Text(0..2)]);
    }

    #[test]
    fn multibyte_text_is_not_cut() {
        let m = SpecialMatcher::new([(7, "é", Kind::Control)]);
        let text = "aéb€";
        assert_eq!(
            m.split(text),
            [
                Fragment::Text(0..1),
                Fragment::Token(7),
                Fragment::Text(3..7)
            ]
        );
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one literal range, not a range of numbers
    fn no_control_token_is_read_where_it_overlaps_a_literal_range() {
        let m = SpecialMatcher::new([
            (1, "<|eot|>", Kind::Control),
            (2, "<|a|><|eot|>", Kind::Control),
            (3, "<added>", Kind::Added),
        ]);
        // "<|eot|>x<|eot|>y<added>" with the middle "x<|eot|>y<added>" literal.
        let text = "<|eot|>x<|eot|>y<added><|eot|>";
        assert_eq!(
            m.split_outside(text, &[7..23]),
            [
                Fragment::Token(1),
                Fragment::Text(7..16),
                Fragment::Token(3),
                Fragment::Token(1),
            ]
        );
        // A control token may not reach into a literal range either, and a
        // shorter one that stops before it is taken instead.
        let text = "<|a|><|eot|>";
        assert_eq!(m.split_outside(text, &[5..12]), [Fragment::Text(0..12)]);
        let m = SpecialMatcher::new([
            (1, "<|a|>", Kind::Control),
            (2, "<|a|><|b|>", Kind::Control),
        ]);
        assert_eq!(
            m.split_outside("<|a|><|b|>", &[6..7]),
            [Fragment::Token(1), Fragment::Text(5..10)]
        );
        // Every range literal: only added tokens.
        assert_eq!(m.split_outside("<|a|>", &[0..5]), [Fragment::Text(0..5)]);
    }
}
