//! The GGUF byte parser. Every read is bounds-checked; every count is checked
//! against [`Limits`] and the bytes that remain before anything is allocated.

use std::collections::HashMap;
use std::ops::Range;

use bulkhead_kernels::GgmlType;

use super::GgufError;
use super::metadata::{Array, Metadata, Value, ValueType};

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest alignment accepted; llama.cpp writes 32, and anything above a page is absurd.
const MAX_ALIGNMENT: u64 = 1 << 16;
/// GGML tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// Hard limits on what a GGUF file may declare, so that no allocation is sized
/// by an unchecked field.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Tensors in one file (a 70B Llama has ~720; MoE files a few thousand).
    pub max_tensors: u64,
    /// Metadata entries in one file (real files have a few dozen).
    pub max_metadata_entries: u64,
    /// Bytes of one string (chat templates are the longest, tens of KiB).
    pub max_string_bytes: u64,
    /// Elements of one array (vocabularies and merge lists reach a few hundred thousand).
    pub max_array_len: u64,
    /// Array elements over all metadata together, bounding the memory the
    /// metadata can make us allocate (a 256k vocabulary with scores, types
    /// and merges is about 1.1 million).
    pub max_metadata_elements: u64,
    /// Nesting depth of arrays of arrays.
    pub max_array_depth: u32,
    /// Elements of one tensor (2^40 ≈ 1.1e12, beyond any single weight matrix).
    pub max_tensor_elements: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tensors: 1 << 16,
            max_metadata_entries: 1 << 16,
            max_string_bytes: 1 << 24,
            max_array_len: 1 << 22,
            max_metadata_elements: 1 << 23,
            max_array_depth: 4,
            max_tensor_elements: 1 << 40,
        }
    }
}

/// One tensor's entry in the table: name, shape, type and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// GGML dimensions, innermost first (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Byte size of the tensor's data.
    pub size_bytes: u64,
    /// Absolute offset in the file.
    pub file_offset: u64,
}

impl TensorInfo {
    /// Total number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row length (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    /// Number of rows (product of the outer dimensions).
    pub fn rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }

    /// The byte range in the file (checked against the file length at parse time).
    pub fn file_range(&self) -> Range<usize> {
        // Both ends were verified to be <= file length, which is a usize.
        self.file_offset as usize..(self.file_offset + self.size_bytes) as usize
    }
}

/// Everything a GGUF header declares, validated against the file's length.
#[derive(Clone, Debug)]
pub struct GgufLayout {
    /// Format version, 2 or 3.
    pub version: u32,
    /// Key/value metadata.
    pub metadata: Metadata,
    /// Tensor table in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment` or the default 32.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    by_name: HashMap<String, usize>,
}

impl GgufLayout {
    /// Parses and validates a whole GGUF file held in `bytes`.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<GgufLayout, GgufError> {
        let mut r = Reader {
            bytes,
            pos: 0,
            metadata_elements: 0,
        };
        let Head {
            version,
            tensor_count,
            metadata,
            alignment,
        } = read_head(&mut r, limits)?;

        // Each tensor entry takes at least 8 (name len) + 4 (n_dims) + 8 (one dim) + 4 + 8 bytes.
        r.ensure_count("tensor table", tensor_count, 32)?;
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut by_name = HashMap::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            let name = r.string("tensor name", limits)?;
            let n_dims = r.u32("tensor dimension count")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadShape {
                    tensor: name,
                    reason: format!("{n_dims} dimensions (must be 1..={MAX_DIMS})"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64("tensor dimension")?);
            }
            let type_id = r.u32("tensor type")?;
            let offset = r.u64("tensor offset")?;
            let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
                tensor: name.clone(),
                type_id,
            })?;
            let elements = element_count(&name, &dims, limits)?;
            if dims[0] % ty.block_elements() as u64 != 0 {
                return Err(GgufError::BadShape {
                    tensor: name,
                    reason: format!(
                        "row length {} is not a multiple of the {} block size {}",
                        dims[0],
                        ty,
                        ty.block_elements()
                    ),
                });
            }
            let size_bytes = ty.bytes_for(elements).map_err(|e| GgufError::BadShape {
                tensor: name.clone(),
                reason: e.to_string(),
            })?;
            if offset % alignment != 0 {
                return Err(GgufError::Misaligned {
                    tensor: name,
                    offset,
                    alignment,
                });
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                size_bytes,
                file_offset: 0,
            });
        }

        let data_offset = (r.pos as u64).next_multiple_of(alignment);
        let file_len = bytes.len();
        for t in &mut tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size_bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len as u64 => t.file_offset = start,
                _ => {
                    return Err(GgufError::OutOfFile {
                        tensor: t.name.clone(),
                        start: data_offset.saturating_add(t.offset),
                        end: data_offset
                            .saturating_add(t.offset)
                            .saturating_add(t.size_bytes),
                        file_len,
                    });
                }
            }
        }
        check_overlap(&tensors)?;

        Ok(GgufLayout {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            by_name,
        })
    }

    /// Looks a tensor up by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}

/// What precedes the tensor table.
struct Head {
    version: u32,
    tensor_count: u64,
    metadata: Metadata,
    alignment: u64,
}

fn read_head(r: &mut Reader<'_>, limits: &Limits) -> Result<Head, GgufError> {
    let magic = r.array4("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = r.u64("tensor count")?;
    let kv_count = r.u64("metadata entry count")?;
    check_limit("tensor count", tensor_count, limits.max_tensors)?;
    check_limit(
        "metadata entry count",
        kv_count,
        limits.max_metadata_entries,
    )?;
    let mut metadata = Metadata::default();
    for _ in 0..kv_count {
        let key = r.string("metadata key", limits)?;
        let type_id = r.u32("metadata value type")?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = r.value(&key, ty, limits, 0)?;
        metadata.insert(key, value)?;
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_u64().ok_or_else(|| GgufError::WrongType {
                key: "general.alignment".into(),
                expected: "unsigned integer",
                found: format!("{:?}", v.value_type()),
            })?;
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(GgufError::BadAlignment(a));
            }
            a
        }
    };
    Ok(Head {
        version,
        tensor_count,
        metadata,
        alignment,
    })
}

/// A file's metadata and the name and type id of each tensor, read without
/// the checks that need a type's block layout: for describing a file whose
/// tensors the engine cannot read ([`GgufError::UnknownTensorType`]).
#[derive(Clone, Debug)]
pub struct TensorTypes {
    pub metadata: Metadata,
    /// (name, GGML type id), in file order.
    pub tensors: Vec<(String, u32)>,
}

impl TensorTypes {
    /// Reads the header, metadata and tensor table of `bytes`.
    pub fn scan(bytes: &[u8], limits: &Limits) -> Result<TensorTypes, GgufError> {
        let mut r = Reader {
            bytes,
            pos: 0,
            metadata_elements: 0,
        };
        let head = read_head(&mut r, limits)?;
        r.ensure_count("tensor table", head.tensor_count, 32)?;
        let mut tensors = Vec::with_capacity(head.tensor_count as usize);
        for _ in 0..head.tensor_count {
            let name = r.string("tensor name", limits)?;
            let n_dims = r.u32("tensor dimension count")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadShape {
                    tensor: name,
                    reason: format!("{n_dims} dimensions (must be 1..={MAX_DIMS})"),
                });
            }
            for _ in 0..n_dims {
                r.u64("tensor dimension")?;
            }
            let type_id = r.u32("tensor type")?;
            r.u64("tensor offset")?;
            tensors.push((name, type_id));
        }
        Ok(TensorTypes {
            metadata: head.metadata,
            tensors,
        })
    }
}

fn check_limit(what: &str, count: u64, limit: u64) -> Result<(), GgufError> {
    if count > limit {
        return Err(GgufError::LimitExceeded {
            what: what.to_string(),
            count,
            limit,
        });
    }
    Ok(())
}

fn element_count(name: &str, dims: &[u64], limits: &Limits) -> Result<u64, GgufError> {
    let mut elements: u64 = 1;
    for &d in dims {
        if d == 0 {
            return Err(GgufError::BadShape {
                tensor: name.to_string(),
                reason: format!("dimension of size 0 in {dims:?}"),
            });
        }
        elements = elements
            .checked_mul(d)
            .filter(|&e| e <= limits.max_tensor_elements)
            .ok_or_else(|| GgufError::BadShape {
                tensor: name.to_string(),
                reason: format!(
                    "shape {dims:?} has more than {} elements",
                    limits.max_tensor_elements
                ),
            })?;
    }
    Ok(elements)
}

fn check_overlap(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.file_offset);
    for pair in order.windows(2) {
        if pair[0].file_offset + pair[0].size_bytes > pair[1].file_offset {
            return Err(GgufError::Overlap {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Array elements read so far, checked against `Limits::max_metadata_elements`.
    metadata_elements: u64,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, what: &str, n: u64) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                available: self.remaining(),
            });
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Fails early when `count` items of at least `min_bytes` each cannot fit in
    /// what remains, so that a huge count never drives an allocation.
    fn ensure_count(&self, what: &str, count: u64, min_bytes: u64) -> Result<(), GgufError> {
        let needed = count.saturating_mul(min_bytes);
        if needed > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: format!("{what} of {count} entries"),
                offset: self.pos,
                needed,
                available: self.remaining(),
            });
        }
        Ok(())
    }

    fn array4(&mut self, what: &str) -> Result<[u8; 4], GgufError> {
        let b = self.take(what, 4)?;
        Ok([b[0], b[1], b[2], b[3]])
    }

    fn array8(&mut self, what: &str) -> Result<[u8; 8], GgufError> {
        let b = self.take(what, 8)?;
        let mut out = [0u8; 8];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array4(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array8(what)?))
    }

    fn string(&mut self, what: &str, limits: &Limits) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        check_limit(&format!("{what} length"), len, limits.max_string_bytes)?;
        let offset = self.pos;
        let raw = self.take(what, len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::BadUtf8 {
            what: what.to_string(),
            offset,
        })
    }

    fn value(
        &mut self,
        key: &str,
        ty: ValueType,
        limits: &Limits,
        depth: u32,
    ) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.take(key, 1)?[0]),
            ValueType::I8 => Value::I8(self.take(key, 1)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.fixed(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.fixed(key)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.fixed(key)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.fixed(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.fixed(key)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.fixed(key)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.fixed(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.fixed(key)?)),
            ValueType::Bool => Value::Bool(self.bool(key)?),
            ValueType::String => Value::String(self.string(key, limits)?),
            ValueType::Array => Value::Array(self.array(key, limits, depth + 1)?),
        })
    }

    fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.take(what, N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn bool(&mut self, what: &str) -> Result<bool, GgufError> {
        match self.take(what, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(GgufError::WrongType {
                key: what.to_string(),
                expected: "bool (0 or 1)",
                found: format!("byte {other}"),
            }),
        }
    }

    fn array(&mut self, key: &str, limits: &Limits, depth: u32) -> Result<Array, GgufError> {
        if depth > limits.max_array_depth {
            return Err(GgufError::LimitExceeded {
                what: format!("metadata key {key:?}: array nesting depth"),
                count: depth as u64,
                limit: limits.max_array_depth as u64,
            });
        }
        let type_id = self.u32(key)?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
        })?;
        let len = self.u64(key)?;
        check_limit(
            &format!("metadata key {key:?}: array length"),
            len,
            limits.max_array_len,
        )?;
        self.ensure_count(
            &format!("metadata key {key:?}: array"),
            len,
            ty.min_encoded_bytes(),
        )?;
        self.metadata_elements += len;
        check_limit(
            "array elements in all metadata",
            self.metadata_elements,
            limits.max_metadata_elements,
        )?;
        let n = len as usize;
        macro_rules! prim {
            ($variant:ident, $t:ty) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(<$t>::from_le_bytes(self.fixed(key)?));
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(key, len)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(key, len)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => prim!(U16, u16),
            ValueType::I16 => prim!(I16, i16),
            ValueType::U32 => prim!(U32, u32),
            ValueType::I32 => prim!(I32, i32),
            ValueType::F32 => prim!(F32, f32),
            ValueType::U64 => prim!(U64, u64),
            ValueType::I64 => prim!(I64, i64),
            ValueType::F64 => prim!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(key)?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(key, limits)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(key, limits, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}
