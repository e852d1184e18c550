//! Byte-level BPE (GPT-2 style): bytes map to printable characters, then
//! adjacent symbols merge in order of merge rank.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves,
/// the rest to U+0100 upwards in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            u32::from(b)
        } else {
            let cp = next;
            next += 1;
            cp
        };
        table[usize::from(b)] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

/// The inverse of [`byte_to_char_table`] as a lookup.
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Merge rules keyed by the ids of the pair.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    /// (left id, right id) → (rank, merged id)
    pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    pub(crate) fn insert(&mut self, left: u32, right: u32, rank: u32, merged: u32) {
        // An earlier (lower-rank) duplicate wins.
        self.pairs.entry((left, right)).or_insert((rank, merged));
    }

    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.pairs.get(&(left, right)).copied()
    }

    /// Applies the merges to a word given as its initial symbol ids, writing
    /// the resulting ids to `out`. Lowest rank first, leftmost on ties; a
    /// heap keeps long words at O(n log n).
    pub(crate) fn apply(&self, symbols: &[u32], out: &mut Vec<u32>) {
        if symbols.len() < 2 {
            out.extend_from_slice(symbols);
            return;
        }
        let n = symbols.len();
        let mut ids = symbols.to_vec();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut alive = vec![true; n];
        // (rank, left position, expected left id, expected right id)
        let mut heap = BinaryHeap::new();
        let push_pair = |heap: &mut BinaryHeap<_>, ids: &[u32], left: usize, right: usize| {
            if let Some((rank, _)) = self.get(ids[left], ids[right]) {
                heap.push(Reverse((rank, left, ids[left], ids[right])));
            }
        };
        for i in 0..n - 1 {
            push_pair(&mut heap, &ids, i, i + 1);
        }
        while let Some(Reverse((_, left, left_id, right_id))) = heap.pop() {
            let right = next[left];
            if !alive[left] || right >= n || ids[left] != left_id || ids[right] != right_id {
                continue;
            }
            let Some((_, merged)) = self.get(left_id, right_id) else {
                continue;
            };
            ids[left] = merged;
            alive[right] = false;
            next[left] = next[right];
            if next[left] < n {
                prev[next[left]] = left;
            }
            if prev[left] < n {
                push_pair(&mut heap, &ids, prev[left], left);
            }
            if next[left] < n {
                push_pair(&mut heap, &ids, left, next[left]);
            }
        }
        let mut i = 0;
        while i < n {
            out.push(ids[i]);
            i = next[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection() {
        let table = byte_to_char_table();
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        assert_eq!(table[usize::from(b'a')], 'a');
        let back = char_to_byte_map();
        assert_eq!(back.len(), 256);
        for b in 0..=255u8 {
            assert_eq!(back[&table[usize::from(b)]], b);
        }
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        // ids: a=0 b=1 ab=2 bb=3 abb=4
        let mut m = Merges::default();
        m.insert(1, 1, 0, 3); // b b
        m.insert(0, 1, 1, 2); // a b
        m.insert(2, 1, 2, 4); // ab b
        let mut out = Vec::new();
        m.apply(&[0, 1, 1], &mut out); // a b b → a bb (rank 0 first)
        assert_eq!(out, [0, 3]);
        out.clear();
        m.apply(&[0, 1, 0, 1, 1, 1], &mut out); // a b a b b b
        // rank 0 "b b" leftmost at positions 3,4 → a b a bb b; then a b → ab ab? "a b" rank1 at 0 → ab a bb b
        assert_eq!(out, [2, 0, 3, 1]);
        out.clear();
        m.apply(&[1, 1, 1, 1], &mut out);
        assert_eq!(out, [3, 3]);
    }
}
