//! GGUF v2/v3 files: a bounds-checked parser over bytes and a memory-mapped model file.
//!
//! The parser trusts nothing: every count, length, dimension and offset is
//! checked against hard limits and the file size before anything is allocated
//! or sliced, so a hostile file yields a [`GgufError`] naming the problem.

mod error;
mod metadata;
mod parse;
pub mod writer;

use std::path::{Path, PathBuf};

use bulkhead_kernels::GgmlType;
use memmap2::Mmap;

pub use error::GgufError;
pub use metadata::{Array, Metadata, Value, ValueType};
pub use parse::{GgufLayout, Limits, TensorInfo, TensorTypes};

/// A GGUF file mapped into memory (weights are never copied).
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    map: Mmap,
    layout: GgufLayout,
    /// The map is the file's pages (`open`), not a resident copy.
    file_backed: bool,
}

impl Gguf {
    /// Maps `path` and parses its header, metadata and tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::File::open(&path).map_err(|source| GgufError::Io {
            path: path.clone(),
            source,
        })?;
        let map = map_file(&file).map_err(|source| GgufError::Io {
            path: path.clone(),
            source,
        })?;
        let layout = GgufLayout::parse(&map, &Limits::default())?;
        Ok(Gguf {
            path,
            map,
            layout,
            file_backed: true,
        })
    }

    /// Parses a file already copied into memory (the weight verifier's
    /// resident copy); `path` is kept for messages.
    pub fn from_resident(path: impl AsRef<Path>, map: Mmap) -> Result<Gguf, GgufError> {
        let layout = GgufLayout::parse(&map, &Limits::default())?;
        Ok(Gguf {
            path: path.as_ref().to_path_buf(),
            map,
            layout,
            file_backed: false,
        })
    }

    /// Lets the kernel drop the pages of `range` from this process's memory
    /// when they are the mapped file's (`open`): a later read faults them
    /// back in from the file, so nothing is lost. A no-op for a resident
    /// copy (`from_resident`), whose pages are the only copy and which the
    /// weight scrub reads. For weights the backend keeps in another form.
    #[allow(unsafe_code)]
    pub fn release_file_pages(&self, range: std::ops::Range<usize>) {
        if !self.file_backed || range.is_empty() || range.end > self.map.len() {
            return;
        }
        // SAFETY: the map is a private, read-only mapping of a file that
        // was never written through it, so every page equals the file's and
        // MADV_DONTNEED only drops our reference: a later access faults the
        // same bytes back in. (On anonymous memory it would zero them; that
        // case returned above.) A failure only leaves the pages resident.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.start,
                range.len(),
            )
        };
    }

    /// Frees the whole pages inside `range` of a resident copy
    /// (`from_resident`) and returns the byte range freed (possibly empty):
    /// those bytes read as zeros afterwards. Only for a range nothing reads
    /// again (a matrix whose packed form serves every view of it); the
    /// weight scrub must then skip it. `None` for a mapped file, whose
    /// pages [`Gguf::release_file_pages`] drops instead.
    #[allow(unsafe_code)]
    pub fn discard_resident_pages(
        &self,
        range: std::ops::Range<usize>,
    ) -> Option<std::ops::Range<usize>> {
        if self.file_backed || range.end > self.map.len() {
            return None;
        }
        let page = page_size();
        let start = range.start.next_multiple_of(page);
        let end = range.end / page * page;
        if start >= end {
            return Some(start..start);
        }
        // SAFETY: MADV_DONTNEED on private anonymous memory replaces the
        // pages with zero-filled ones: the memory stays mapped and readable,
        // so no access can fault or read freed memory. What changes is the
        // bytes' value, which the caller promises nothing reads (its views
        // of the range go through the packed copy, and the scrub is told).
        // A failure leaves the pages as they were.
        match unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        } {
            Ok(()) => Some(start..end),
            Err(_) => Some(start..start),
        }
    }

    /// Parses a file's bytes held in memory (crafted files in tests), in
    /// an anonymous mapping of their own; `path` is kept for messages.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> Result<Gguf, GgufError> {
        let io = |source| GgufError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        };
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(io)?;
        map[..bytes.len()].copy_from_slice(bytes);
        Self::from_resident(path.as_ref(), map.make_read_only().map_err(io)?)
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.layout.version
    }

    /// The key/value metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.layout.metadata
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.layout.tensors
    }

    /// The parsed layout (offsets, alignment).
    pub fn layout(&self) -> &GgufLayout {
        &self.layout
    }

    /// Looks a tensor up by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.layout.tensor(name)
    }

    /// The bytes of a tensor of this file (ranges were checked at parse time).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.file_range()]
    }

    /// The whole mapped file.
    pub fn mapped_bytes(&self) -> &[u8] {
        &self.map
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> usize {
        self.map.len()
    }
}

#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<Mmap> {
    // SAFETY: memmap2's `map` is unsafe because another process could truncate
    // or rewrite the file while it is mapped. The mapping is read-only, model
    // files are immutable inputs once registered (the weight verifier re-hashes
    // them), and the parser checks every range against the length it saw.
    // `populate` faults the pages in now (as llama.cpp does), so the first
    // forward pass does not pay for page faults.
    unsafe { memmap2::MmapOptions::new().populate().map(file) }
}

/// GGML's tensor types by id, as `ggml.h` (llama.cpp of llama-cpp-python
/// 0.3.36) numbers them, the ones the engine computes with included (ids
/// 4, 5, 31–33 and 36–38 are retired).
const GGML_TYPE_NAMES: [(u32, &str); 35] = [
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
    (42, "Q2_0"),
];

/// A tensor element type by its GGUF id, for messages about unsupported
/// types: GGML's name, or the id when GGML has none.
pub fn type_name(id: u32) -> String {
    if let Some(ty) = GgmlType::from_id(id) {
        return ty.name().to_string();
    }
    match GGML_TYPE_NAMES.iter().find(|(i, _)| *i == id) {
        Some((_, name)) => (*name).to_string(),
        None => format!("unknown type id {id}"),
    }
}

#[cfg(test)]
mod tests;

/// The kernel's page size (what `madvise` ranges are aligned to).
fn page_size() -> usize {
    rustix::param::page_size()
}
