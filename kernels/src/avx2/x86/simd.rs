//! Loads, stores and small helpers shared by the AVX2 kernels. Loads take
//! fixed-size array references, so the only unsafety left is the pointer read
//! itself, which the array type bounds.

use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_u8x32(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_i8x32(b: &[i8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_i16x16(b: &[i16; 16]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_f32x4(x: &[f32; 4]) -> __m128 {
    // SAFETY: `x` is 4 readable f32; loadu has no alignment requirement.
    unsafe { _mm_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_u8x16(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_f32x8(x: &[f32; 8]) -> __m256 {
    // SAFETY: `x` is 8 readable f32; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// Eight little-endian f32 stored as raw bytes (F32 weights in a GGUF file).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_f32x8_le(b: &[u8; 32]) -> __m256 {
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement,
    // and x86 is little-endian so the bytes are the f32 values.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_f32x8(x: &mut [f32; 8], v: __m256) {
    // SAFETY: `x` is 8 writable f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
}

/// One f16 (as its two little-endian bytes) widened to f32 with F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_to_f32(lo: u8, hi: u8) -> f32 {
    let bits = i32::from(u16::from_le_bytes([lo, hi]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// Eight copies of the f16 `(lo, hi)` as f32, loaded with a broadcast that
/// depends on nothing (see [`f16_splat_mul`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_splat(lo: u8, hi: u8) -> __m256 {
    let bits = u16::from_le_bytes([lo, hi]) as i16;
    _mm256_cvtph_ps(_mm_set1_epi16(bits))
}

/// Eight copies of `f16(lo, hi) * y` (exactly `f16_to_f32(lo, hi) * y`).
///
/// The per-block scale of the dot loops. Going through a scalar
/// (`f16_to_f32`, then broadcast) lets LLVM load the f16 with
/// `vpinsrw xmmN, xmmACC, [mem], 0`, borrowing a live accumulator for the
/// unused lanes: a false dependency that chained each block's scale onto the
/// previous block's FMA and made the Q4_0/Q8_0 loops latency-bound. Here all
/// eight lanes are used, so the f16 is loaded with `vpbroadcastw`, which has
/// no input register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_splat_mul(lo: u8, hi: u8, y: f32) -> __m256 {
    let bits = u16::from_le_bytes([lo, hi]) as i16;
    _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(bits)), _mm256_set1_ps(y))
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of the eight i32 lanes (wrapping, as integer adds in any order are).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// How many bytes ahead of what it reads a decode kernel (the packed
/// matvecs, the F16 row dot) asks the CPU to fetch. Decode streams each
/// matrix once, in order, and one core's hardware prefetchers alone keep
/// too few lines in flight to reach the memory's bandwidth.
///
/// - Intel Xeon (2 vCPUs, AVX-512 VNNI, no AMX), weights on 4 KiB pages:
///   4 KiB ahead raised 110m decode, medians of 3–5 alternated runs, Q4_0
///   by about 25% at one and at two threads (76.6 to 95.6 tokens/s, 125.9
///   to 157.0), Q4_K_M by about 20%, Q8_0 by 7–9% and F16 by 25% and 38%;
///   2 and 8 KiB did no better.
/// - AMD EPYC (Zen 5, 2 vCPUs), weights on huge pages: 16 KiB ahead raised
///   one-thread 110m decode, three alternated runs each, Q4_0 from 386 to
///   482–510 tokens/s, Q4_K_M from 344–356 to 384–411, F16 from 118–125
///   to 133, Q8_0 from 245–256 to 257–268; at two threads Q4_0 from
///   512–580 to 566–611, F16 from 170–178 to 185–197. 1 KiB made it slower
///   (386 to 368), as it had on a Zen 5 with 4 KiB pages; 8 to 64 KiB
///   were alike.
pub(super) fn prefetch_ahead() -> usize {
    static AHEAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        let leaf = __cpuid(0);
        let mut vendor = [0u8; 12];
        for (at, word) in [leaf.ebx, leaf.edx, leaf.ecx].into_iter().enumerate() {
            vendor[4 * at..4 * at + 4].copy_from_slice(&word.to_le_bytes());
        }
        if &vendor == b"GenuineIntel" {
            4096
        } else {
            16384
        }
    })
}

/// Prefetches the cache lines `ahead` bytes past each of `block`'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch(block: &[u8], ahead: usize) {
    for at in (0..block.len()).step_by(64) {
        // A prefetch never faults, also past the end of the matrix.
        _mm_prefetch::<_MM_HINT_T0>(block.as_ptr().wrapping_add(ahead + at).cast());
    }
}
