//! Compute-unit masks for `hipExtStreamCreateWithCUMask`: bit `i % 32` of
//! word `i / 32` enables CU `i`. The partition manager's [`CuSet`] makes
//! them; this checks one against the device before the runtime sees it.
//!
//! On MI300-class parts the runtime hands mask bits to XCDs round-robin:
//! bit `i` is a CU of XCD `i % 8`. The partition manager's CU ids *are*
//! mask bits (`bulkhead_partition::Device::xcd_of(i) == i % 8`), so the
//! mask is the set's bits as they are, and a partition that owns an XCD
//! owns every eighth bit — the tests below check that on real plans.

use bulkhead_partition::CuSet;

use super::HipError;

/// Checks `words` as a CU mask for a device with `compute_units` CUs: at
/// least one CU, none past the device's last, no more words than it needs.
pub fn check_cu_mask(words: &[u32], compute_units: u32) -> Result<(), HipError> {
    let needed_words = compute_units.div_ceil(32) as usize;
    if words.len() > needed_words {
        return Err(HipError::CuMask(format!(
            "{} words for a device with {compute_units} compute units (at most {needed_words})",
            words.len()
        )));
    }
    if words.iter().all(|w| *w == 0) {
        return Err(HipError::CuMask(
            "it selects no compute unit; a stream needs at least one".into(),
        ));
    }
    let first_missing = words.iter().enumerate().find_map(|(i, word)| {
        let bits = word & !valid_bits(i as u32, compute_units);
        (bits != 0).then(|| i as u32 * 32 + bits.trailing_zeros())
    });
    if let Some(cu) = first_missing {
        return Err(HipError::CuMask(format!(
            "it selects compute unit {cu}, but the device has {compute_units} (0-{})",
            compute_units - 1
        )));
    }
    Ok(())
}

/// The bits of word `index` that name CUs below `compute_units`.
fn valid_bits(index: u32, compute_units: u32) -> u32 {
    match compute_units.saturating_sub(index * 32) {
        0 => 0,
        n if n >= 32 => u32::MAX,
        n => (1 << n) - 1,
    }
}

/// The mask for `set` on a device with `compute_units` CUs, checked. The
/// set must range over exactly the device's CUs (a plan for a 304-CU
/// MI325X does not fit a 38-CU CPX partition).
pub fn cu_mask_for(set: &CuSet, compute_units: u32) -> Result<Vec<u32>, HipError> {
    if set.width() != compute_units {
        return Err(HipError::CuMask(format!(
            "a CU set over {} compute units for a device with {compute_units}",
            set.width()
        )));
    }
    let words = set.hip_mask_words();
    check_cu_mask(&words, compute_units)?;
    Ok(words)
}

#[cfg(test)]
mod tests {
    use bulkhead_partition::{Compute, Device, GpuRequest, Isolation, TenantRequest, plan};

    use super::*;

    fn message(result: Result<impl std::fmt::Debug, HipError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn masks_of_the_partition_manager_pass() {
        // XCD 3 of an MI325X: CUs with i mod 8 == 3.
        let xcd3 = CuSet::from_ids(304, (0..304).filter(|i| i % 8 == 3));
        let words = cu_mask_for(&xcd3, 304).unwrap();
        assert_eq!(words.len(), 10);
        assert_eq!(words[0], 0x0808_0808);
        assert_eq!(words[9], 0x0808, "CUs 291 and 299 in the last, 16-bit word");
        assert!(cu_mask_for(&CuSet::full(304), 304).is_ok());
        // A shorter mask (the low CUs only) is allowed.
        assert!(check_cu_mask(&[0xff], 304).is_ok());
    }

    /// The XCDs a mask's bits land on (bit `i` → XCD `i % 8`), with the
    /// number of bits on each: the hardware's rule, applied to the words
    /// themselves rather than to the set they came from.
    fn xcds_of(words: &[u32]) -> std::collections::BTreeMap<u32, u32> {
        let mut xcds = std::collections::BTreeMap::new();
        for (w, word) in words.iter().enumerate() {
            for bit in 0..32 {
                if word & (1 << bit) != 0 {
                    *xcds.entry((w as u32 * 32 + bit) % 8).or_insert(0) += 1;
                }
            }
        }
        xcds
    }

    fn tenant(name: &str, isolation: Isolation, cus: u32, hbm_gib: u64) -> TenantRequest {
        TenantRequest {
            tenant: name.into(),
            gpu: GpuRequest {
                compute: Compute::Cus(cus),
                hbm_bytes: Some(hbm_gib << 30),
                isolation,
                weight: 1,
                kv_wait: None,
            },
        }
    }

    #[test]
    fn a_38_cu_dedicated_tenant_lands_on_exactly_one_xcd() {
        let device = Device::mi325x();
        let layout = plan(
            &device,
            16 << 30,
            &[
                tenant("acme", Isolation::Dedicated, 38, 20),
                tenant("demo", Isolation::Shared, 10, 10),
            ],
        )
        .unwrap();
        let (acme, _) = layout.placement("acme").unwrap();
        let words = cu_mask_for(&acme.cus, 304).unwrap();
        assert_eq!(xcds_of(&words), [(0, 38)].into(), "all 38 bits on XCD 0");
        // Every eighth bit from 0: 0x01010101 in each full word.
        assert!(words[..9].iter().all(|w| *w == 0x0101_0101), "{words:x?}");
        assert_eq!(words[9], 0x0101, "bits 288 and 296");
        // The pool is the other seven XCDs, whole.
        let pool = cu_mask_for(&layout.shared().unwrap().cus, 304).unwrap();
        assert_eq!(xcds_of(&pool), (1..8).map(|k| (k, 38)).collect());
        assert_eq!(
            layout.shared().unwrap().whole_xcds,
            (1..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn masks_of_a_mixed_plan_are_disjoint_cover_the_device_and_keep_xcds() {
        let device = Device::mi325x();
        let layout = plan(
            &device,
            16 << 30,
            &[
                tenant("acme", Isolation::Dedicated, 76, 40),
                tenant("beta", Isolation::Dedicated, 40, 20),
                tenant("gamma", Isolation::Dedicated, 38, 10),
                tenant("demo", Isolation::Shared, 10, 10),
            ],
        )
        .unwrap();
        let mask = |tenant: &str| {
            let (p, _) = layout.placement(tenant).unwrap();
            cu_mask_for(&p.cus, 304).unwrap()
        };
        let (acme, beta, gamma) = (mask("acme"), mask("beta"), mask("gamma"));
        let pool = cu_mask_for(&layout.shared().unwrap().cus, 304).unwrap();
        // Whole XCDs for multiples of 38, in tenant order.
        assert_eq!(xcds_of(&acme), [(0, 38), (1, 38)].into());
        assert_eq!(xcds_of(&gamma), [(2, 38)].into());
        // 40 CUs spread over the five XCDs no one owns: 8 on each.
        assert_eq!(xcds_of(&beta), (3..8).map(|k| (k, 8)).collect());
        assert_eq!(xcds_of(&pool), (3..8).map(|k| (k, 30)).collect());
        for w in 0..10 {
            let words = [acme[w], beta[w], gamma[w], pool[w]];
            for (i, a) in words.iter().enumerate() {
                for b in &words[i + 1..] {
                    assert_eq!(a & b, 0, "word {w}: masks overlap");
                }
            }
            let union = words.iter().fold(0, |u, x| u | x);
            let full = if w == 9 { 0xffff } else { u32::MAX };
            assert_eq!(union, full, "word {w}: a CU in no partition");
        }
    }

    #[test]
    fn bad_masks_are_refused_naming_the_problem() {
        assert_eq!(
            message(check_cu_mask(&[0; 10], 304)),
            "invalid CU mask: it selects no compute unit; a stream needs at least one"
        );
        assert_eq!(
            message(check_cu_mask(&[], 304)),
            message(check_cu_mask(&[0], 304))
        );
        assert_eq!(
            message(check_cu_mask(&[1; 11], 304)),
            "invalid CU mask: 11 words for a device with 304 compute units (at most 10)"
        );
        let mut words = vec![0; 10];
        words[9] = 1 << 16;
        assert_eq!(
            message(check_cu_mask(&words, 304)),
            "invalid CU mask: it selects compute unit 304, but the device has 304 (0-303)"
        );
        // A 38-CU CPX partition: word 1 has 6 valid bits.
        assert!(check_cu_mask(&[u32::MAX, 0x3f], 38).is_ok());
        assert!(check_cu_mask(&[u32::MAX, 0x7f], 38).is_err());
        assert_eq!(
            message(cu_mask_for(&CuSet::full(304), 38)),
            "invalid CU mask: a CU set over 304 compute units for a device with 38"
        );
    }
}
