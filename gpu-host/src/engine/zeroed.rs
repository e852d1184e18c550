//! Host memory for KV caches and packed weights: anonymous pages straight
//! from the kernel.
#![allow(unsafe_code)] // a float view of an anonymous mapping; see `ZeroedFloats`

use std::fmt;
use std::ops::{Deref, DerefMut};

use memmap2::{Advice, MmapMut};

/// `len` f32s in fresh anonymous pages: zero without being written, so
/// only the pages a pass writes become resident, and dropping the buffer
/// gives every page back to the kernel.
///
/// `vec![0.0; n]` does neither once the allocator has freed memory to
/// reuse: it zeroes the reused range by writing all of it. A new
/// partition layout's KV pool, allocated where the old layout's was
/// freed, took a gpu-host's resident memory to its whole `--kv-memory`
/// (the soak's finding 2).
pub(crate) struct ZeroedFloats {
    map: MmapMut,
    len: usize,
}

impl ZeroedFloats {
    /// `len` zero floats, or the kernel's refusal (address space or
    /// overcommit exhausted).
    pub(crate) fn new(len: usize) -> std::io::Result<ZeroedFloats> {
        let bytes = len
            .checked_mul(size_of::<f32>())
            .ok_or_else(|| std::io::Error::other(format!("{len} floats overflow usize bytes")))?;
        // An empty mapping is an error; one byte keeps `len` 0 valid.
        let map = MmapMut::map_anon(bytes.max(1))?;
        Ok(ZeroedFloats { map, len })
    }
}

impl Deref for ZeroedFloats {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned (so aligned for f32), at
        // least `4 · len` bytes long and lives as long as `self`; all its
        // bytes are initialized (zero or written), and every bit pattern is
        // an f32.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for ZeroedFloats {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl fmt::Debug for ZeroedFloats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZeroedFloats")
            .field("len", &self.len)
            .finish()
    }
}

/// The size of a transparent huge page on x86-64 (and of the alignment
/// that lets one back a range).
const HUGE_PAGE: usize = 2 << 20;

/// `len` bytes in fresh anonymous pages that the kernel may back with
/// transparent huge pages: aligned to 2 MiB and advised `MADV_HUGEPAGE`,
/// which the default `madvise` setting of
/// `/sys/kernel/mm/transparent_hugepage/enabled` needs (`never` refuses;
/// the bytes work the same on 4 KiB pages).
///
/// For data a pass streams in full every token, the packed weights: with
/// 4 KiB pages the hardware prefetchers stop at every page boundary and the
/// TLB misses one page in eight hundred; on an AMD EPYC (Zen 4, 2 vCPUs)
/// huge pages took one-thread 110m decode from 150 to 200 tokens/s (Q8_0)
/// and 260 to 340 (Q4_0). Every byte is written at load, so no page is
/// resident for nothing.
pub(crate) struct HugePageBytes {
    map: MmapMut,
    start: usize,
    len: usize,
}

impl HugePageBytes {
    /// `len` zero bytes, or the kernel's refusal of the mapping.
    pub(crate) fn new(len: usize) -> std::io::Result<HugePageBytes> {
        let mapped = len
            .checked_add(HUGE_PAGE)
            .ok_or_else(|| std::io::Error::other(format!("{len} bytes overflow usize")))?;
        let map = MmapMut::map_anon(mapped)?;
        let at = map.as_ptr() as usize;
        let start = at.next_multiple_of(HUGE_PAGE) - at;
        // Advice, not a requirement: a kernel without THP says no.
        let _ = map.advise(Advice::HugePage);
        Ok(HugePageBytes { map, start, len })
    }
}

impl AsRef<[u8]> for HugePageBytes {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl AsMut<[u8]> for HugePageBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}

impl fmt::Debug for HugePageBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HugePageBytes")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zero_holds_what_is_written_and_allows_empty() {
        let mut a = ZeroedFloats::new(3000).unwrap();
        assert_eq!(a.len(), 3000);
        assert!(a.iter().all(|&x| x == 0.0));
        a[2999] = 1.5;
        a[..2].copy_from_slice(&[-1.0, 2.0]);
        assert_eq!((a[0], a[1], a[2], a[2999]), (-1.0, 2.0, 0.0, 1.5));
        assert!(ZeroedFloats::new(0).unwrap().is_empty());
        assert!(ZeroedFloats::new(usize::MAX / 2).is_err());
    }

    #[test]
    fn huge_page_bytes_are_zero_aligned_and_hold_what_is_written() {
        let mut b = HugePageBytes::new(3 * HUGE_PAGE + 5).unwrap();
        assert_eq!(b.as_ref().len(), 3 * HUGE_PAGE + 5);
        assert_eq!(b.as_ref().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.as_ref().iter().all(|&x| x == 0));
        b.as_mut()[3 * HUGE_PAGE + 4] = 7;
        assert_eq!(b.as_ref()[3 * HUGE_PAGE + 4], 7);
        assert!(HugePageBytes::new(usize::MAX).is_err());
    }
}
