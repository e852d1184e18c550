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

#[derive(Debug, Default)]
struct Node {
    /// (byte, child index), kept sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

/// A byte trie over the special tokens' texts.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
}

impl SpecialMatcher {
    /// Builds the matcher; empty strings are ignored.
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = (u32, &'a str)>) -> Self {
        let mut nodes = vec![Node::default()];
        for (id, text) in tokens {
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
            nodes[at].token = Some(id);
        }
        Self { nodes }
    }

    /// True when there is no special token at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes[0].children.is_empty()
    }

    /// The longest special token starting at the beginning of `bytes`.
    fn longest_at(&self, bytes: &[u8]) -> Option<(u32, usize)> {
        let mut at = 0usize;
        let mut best = None;
        for (i, &b) in bytes.iter().enumerate() {
            let node = &self.nodes[at];
            match node.children.binary_search_by_key(&b, |&(k, _)| k) {
                Ok(pos) => at = node.children[pos].1 as usize,
                Err(_) => break,
            }
            if let Some(id) = self.nodes[at].token {
                best = Some((id, i + 1));
            }
        }
        best
    }

    /// Splits `text` into text fragments and special tokens.
    pub(crate) fn split(&self, text: &str) -> Vec<Fragment> {
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
        while i < bytes.len() {
            let starts_token = root
                .children
                .binary_search_by_key(&bytes[i], |&(k, _)| k)
                .is_ok();
            let found = if starts_token {
                self.longest_at(&bytes[i..])
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
        let m = SpecialMatcher::new([(1, "<|a|>"), (2, "<|a|><|b|>"), (3, "|>"), (4, "")]);
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
        let m = SpecialMatcher::new([(7, "é")]);
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
}
