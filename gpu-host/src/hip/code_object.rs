//! What `hipModuleLoadData` is given: a code object (an AMDGPU ELF) or a
//! clang offload bundle of them, one per arch, as `hipcc --genco` writes.
//! Checked here first so that garbage, a CPU ELF or a bundle without code
//! for the device is an error naming the problem, not the runtime's
//! `hipErrorInvalidImage` / `hipErrorNoBinaryForGpu`.

use super::HipError;

/// Larger than every kernel set we build (a few MiB for all archs).
pub const MAX_CODE_OBJECT_BYTES: usize = 256 << 20;

/// More entries than any bundle we build (host + a handful of archs).
const MAX_BUNDLE_ENTRIES: u64 = 64;

const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Compressed bundles (`--offload-compress`, ROCm 6.2+).
const COMPRESSED_BUNDLE_MAGIC: &[u8] = b"CCOB";
const ELF_MAGIC: &[u8] = b"\x7fELF";
/// `e_machine` of AMD GPU code objects.
const EM_AMDGPU: u16 = 224;
/// The triple of device entries in a bundle; the target id follows it.
const AMDGCN_TRIPLE: &str = "amdgcn-amd-amdhsa--";

/// What a code object holds, as far as we can tell without the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeObject {
    /// A single AMDGPU ELF (its arch is in `e_flags`; the runtime checks it).
    Elf,
    /// An offload bundle with device code for these target ids
    /// ("gfx90a", "gfx942:sramecc+:xnack-").
    Bundle { targets: Vec<String> },
    /// A compressed bundle: its contents are only known after inflating,
    /// which the runtime does.
    CompressedBundle,
}

impl CodeObject {
    /// Reads the header of `image`, refusing what cannot be a code object.
    pub fn parse(image: &[u8]) -> Result<CodeObject, HipError> {
        let bad = |why: String| Err(HipError::CodeObject(why));
        if image.is_empty() {
            return bad("it is empty".into());
        }
        if image.len() > MAX_CODE_OBJECT_BYTES {
            return bad(format!(
                "{} bytes, more than the {MAX_CODE_OBJECT_BYTES}-byte limit",
                image.len()
            ));
        }
        if image.starts_with(BUNDLE_MAGIC) {
            return bundle_targets(image).map(|targets| CodeObject::Bundle { targets });
        }
        if image.starts_with(COMPRESSED_BUNDLE_MAGIC) {
            return Ok(CodeObject::CompressedBundle);
        }
        if image.starts_with(ELF_MAGIC) {
            return match image.get(18..20) {
                Some(&[lo, hi]) if u16::from_le_bytes([lo, hi]) == EM_AMDGPU => Ok(CodeObject::Elf),
                Some(&[lo, hi]) => bad(format!(
                    "an ELF for machine {}, not an AMD GPU ({EM_AMDGPU})",
                    u16::from_le_bytes([lo, hi])
                )),
                _ => bad("a truncated ELF header".into()),
            };
        }
        bad(format!(
            "it starts with {:02x?}, neither an offload bundle nor an ELF",
            &image[..image.len().min(8)]
        ))
    }

    /// Refuses a bundle that has no code for `arch` ("gfx942"); an ELF or
    /// compressed bundle passes (the runtime decides).
    pub fn check_arch(&self, arch: &str) -> Result<(), HipError> {
        let CodeObject::Bundle { targets } = self else {
            return Ok(());
        };
        if targets.iter().any(|t| t.split(':').next() == Some(arch)) {
            return Ok(());
        }
        Err(HipError::CodeObject(format!(
            "it has code for {}, not for this device's {arch} (build with BULKHEAD_HIP_ARCHS={arch})",
            if targets.is_empty() {
                "no GPU".to_string()
            } else {
                targets.join(", ")
            }
        )))
    }
}

/// The device target ids of an uncompressed bundle: magic, entry count,
/// then (offset, size, id length, id) per entry, all little-endian.
fn bundle_targets(image: &[u8]) -> Result<Vec<String>, HipError> {
    let bad = |why: &str| HipError::CodeObject(format!("offload bundle: {why}"));
    let mut at = BUNDLE_MAGIC.len();
    let read_u64 = |at: &mut usize| -> Result<u64, HipError> {
        let bytes = image
            .get(*at..*at + 8)
            .ok_or_else(|| bad("truncated header"))?;
        *at += 8;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    };
    let entries = read_u64(&mut at)?;
    if entries == 0 || entries > MAX_BUNDLE_ENTRIES {
        return Err(bad(&format!(
            "{entries} entries (expected 1 to {MAX_BUNDLE_ENTRIES})"
        )));
    }
    let mut targets = Vec::new();
    for _ in 0..entries {
        let offset = read_u64(&mut at)?;
        let size = read_u64(&mut at)?;
        let id_len = read_u64(&mut at)?;
        let id = usize::try_from(id_len)
            .ok()
            .and_then(|len| image.get(at..at.checked_add(len)?))
            .ok_or_else(|| bad("an entry id runs past the end"))?;
        at += id.len();
        let id = std::str::from_utf8(id).map_err(|_| bad("an entry id is not UTF-8"))?;
        let end = offset.checked_add(size);
        if end.is_none_or(|end| end > image.len() as u64) {
            return Err(bad(&format!("entry {id:?} runs past the end")));
        }
        if let Some((_, target)) = id.split_once(AMDGCN_TRIPLE) {
            targets.push(target.to_string());
        }
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hipcc's output for gfx90a and gfx940 (see testdata/README.md).
    const BUNDLE: &[u8] = include_bytes!("testdata/add_one.gfx90a-gfx940.co");

    fn message(result: Result<impl std::fmt::Debug, HipError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn a_hipcc_bundle_lists_its_archs() {
        let code = CodeObject::parse(BUNDLE).unwrap();
        assert_eq!(
            code,
            CodeObject::Bundle {
                targets: vec!["gfx90a".into(), "gfx940".into()]
            }
        );
        assert!(code.check_arch("gfx90a").is_ok());
        assert_eq!(
            message(code.check_arch("gfx942")),
            "invalid code object: it has code for gfx90a, gfx940, not for this device's \
             gfx942 (build with BULKHEAD_HIP_ARCHS=gfx942)"
        );
    }

    #[test]
    fn the_elves_inside_the_bundle_are_amdgpu_code_objects() {
        // The gfx90a entry starts at 4096 (see testdata/README.md).
        let elf = &BUNDLE[4096..4096 + 4472];
        assert_eq!(CodeObject::parse(elf).unwrap(), CodeObject::Elf);
        let mut x86 = elf.to_vec();
        x86[18..20].copy_from_slice(&62u16.to_le_bytes());
        assert_eq!(
            message(CodeObject::parse(&x86)),
            "invalid code object: an ELF for machine 62, not an AMD GPU (224)"
        );
    }

    #[test]
    fn garbage_and_damaged_bundles_are_refused() {
        assert_eq!(
            message(CodeObject::parse(b"")),
            "invalid code object: it is empty"
        );
        assert!(
            message(CodeObject::parse(b"MZ\x90\x00 not a code object"))
                .contains("neither an offload bundle nor an ELF")
        );
        // Cut anywhere inside the entry table: an error, never a panic.
        for len in BUNDLE_MAGIC.len()..200 {
            let result = CodeObject::parse(&BUNDLE[..len]);
            assert!(result.is_err(), "{len} bytes parsed");
        }
        let mut huge_count = BUNDLE.to_vec();
        huge_count[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(message(CodeObject::parse(&huge_count)).contains("18446744073709551615 entries"));
        let mut past_end = BUNDLE.to_vec();
        // The second entry's size (after magic, count, entry 1 and offset 2).
        let size_at = 24 + 8 + (24 + "host-x86_64-unknown-linux".len()) + 8;
        past_end[size_at..size_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(message(CodeObject::parse(&past_end)).contains("runs past the end"));
        assert_eq!(
            CodeObject::parse(b"CCOB\x01\x00").unwrap(),
            CodeObject::CompressedBundle
        );
    }
}
