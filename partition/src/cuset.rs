//! A set of compute units (or CPU cores) as a bitset over the device's
//! compute-unit ids. On HIP the ids are the bit positions of
//! `hipExtStreamCreateWithCUMask`'s mask, so [`CuSet::hip_mask_words`] is
//! exactly what that call takes.

use std::fmt;

/// A set of compute-unit ids below a fixed width (the device's count).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CuSet {
    width: u32,
    words: Vec<u64>,
}

impl CuSet {
    /// The empty set over `width` ids.
    pub fn empty(width: u32) -> CuSet {
        CuSet {
            width,
            words: vec![0; width.div_ceil(64) as usize],
        }
    }

    /// Every id below `width`.
    pub fn full(width: u32) -> CuSet {
        let mut set = CuSet::empty(width);
        for id in 0..width {
            set.insert(id);
        }
        set
    }

    /// The ids in `ids`; those at or past `width` are ignored.
    pub fn from_ids(width: u32, ids: impl IntoIterator<Item = u32>) -> CuSet {
        let mut set = CuSet::empty(width);
        for id in ids {
            set.insert(id);
        }
        set
    }

    /// How many ids the set ranges over (the device's compute units).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Adds `id`; returns false (and changes nothing) past the width.
    pub fn insert(&mut self, id: u32) -> bool {
        if id >= self.width {
            return false;
        }
        self.words[(id / 64) as usize] |= 1 << (id % 64);
        true
    }

    pub fn remove(&mut self, id: u32) {
        if id < self.width {
            self.words[(id / 64) as usize] &= !(1 << (id % 64));
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        id < self.width && self.words[(id / 64) as usize] & (1 << (id % 64)) != 0
    }

    /// The number of ids in the set.
    pub fn len(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// The ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.width).filter(|id| self.contains(*id))
    }

    pub fn is_disjoint(&self, other: &CuSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    /// Removes every id of `other` from this set.
    pub fn remove_all(&mut self, other: &CuSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !b;
        }
    }

    /// The mask `hipExtStreamCreateWithCUMask(stream, len, words)` takes:
    /// 32-bit words, bit `i % 32` of word `i / 32` for id `i`. A 304-CU
    /// MI325X mask is 10 words, the last with 16 bits used.
    pub fn hip_mask_words(&self) -> Vec<u32> {
        (0..self.width.div_ceil(32))
            .map(|w| {
                let word = self.words[(w / 2) as usize];
                if w % 2 == 0 {
                    word as u32
                } else {
                    (word >> 32) as u32
                }
            })
            .collect()
    }
}

/// `{0-37, 40, 48}`: ranges keep a 304-bit set readable in logs.
impl fmt::Debug for CuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut ids = self.iter().peekable();
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            parts.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
        }
        write!(f, "{{{}}}/{}", parts.join(", "), self.width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_track_membership_within_their_width() {
        let mut set = CuSet::empty(304);
        assert!(set.insert(0) && set.insert(303) && set.insert(64));
        assert!(!set.insert(304), "past the width");
        assert_eq!(set.len(), 3);
        assert!(set.contains(303) && !set.contains(304));
        set.remove(64);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 303]);
        assert_eq!(format!("{set:?}"), "{0, 303}/304");
        assert_eq!(format!("{:?}", CuSet::full(10)), "{0-9}/10");
    }

    #[test]
    fn hip_masks_are_32_bit_words_in_id_order() {
        let full = CuSet::full(304);
        let words = full.hip_mask_words();
        assert_eq!(words.len(), 10);
        assert!(words[..9].iter().all(|w| *w == u32::MAX));
        assert_eq!(words[9], 0xFFFF, "304 = 9 * 32 + 16");
        let set = CuSet::from_ids(304, [1, 33, 300]);
        let words = set.hip_mask_words();
        assert_eq!(words[0], 0b10);
        assert_eq!(words[1], 0b10);
        assert_eq!(words[9], 1 << 12);
    }

    #[test]
    fn disjointness_and_removal() {
        let a = CuSet::from_ids(100, 0..50);
        let b = CuSet::from_ids(100, 50..100);
        assert!(a.is_disjoint(&b));
        let mut all = CuSet::full(100);
        all.remove_all(&a);
        assert_eq!(all, b);
        assert!(!all.is_disjoint(&CuSet::from_ids(100, [70])));
    }
}
