use super::writer::GgufWriter;
use super::*;

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("u8", Value::U8(7))
        .metadata("i8", Value::I8(-7))
        .metadata("u16", Value::U16(65535))
        .metadata("i16", Value::I16(-300))
        .metadata("u32", Value::U32(1 << 31))
        .metadata("i32", Value::I32(-1))
        .metadata("f32", Value::F32(0.5))
        .metadata("bool", Value::Bool(true))
        .metadata("u64", Value::U64(u64::MAX))
        .metadata("i64", Value::I64(i64::MIN))
        .metadata("f64", Value::F64(-2.25))
        .metadata(
            "strs",
            Value::Array(Array::String(vec!["a".into(), "é🙂".into()])),
        )
        .metadata(
            "nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::I32(vec![]),
            ])),
        )
        .metadata("bools", Value::Array(Array::Bool(vec![true, false])));
    w.tensor_f32("a", &[4, 2], &[1.0; 8]);
    w.tensor("b", &[64], GgmlType::Q8_0, vec![0u8; 68]);
    w
}

fn parse(bytes: &[u8]) -> Result<GgufLayout, GgufError> {
    GgufLayout::parse(bytes, &Limits::default())
}

#[test]
fn round_trips_every_value_type_and_tensor_table() {
    let bytes = sample().to_bytes();
    let layout = parse(&bytes).unwrap();
    assert_eq!(layout.version, 3);
    let m = &layout.metadata;
    assert_eq!(m.len(), 15);
    assert_eq!(m.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(m.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(m.get("u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(m.get("i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(m.get_f32("f64").unwrap(), Some(-2.25));
    assert_eq!(m.get_bool("bool").unwrap(), Some(true));
    assert_eq!(m.get_str_array("strs").unwrap().unwrap(), ["a", "é🙂"]);
    assert_eq!(
        m.get("nested"),
        Some(&Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![])
        ])))
    );
    assert_eq!(layout.tensors.len(), 2);
    let b = layout.tensor("b").unwrap();
    assert_eq!((b.ty, b.size_bytes, b.offset), (GgmlType::Q8_0, 68, 32));
    assert_eq!(b.file_offset % 32, 0);
    assert_eq!(layout.tensor("a").unwrap().rows(), 2);
}

#[test]
fn typed_getters_name_the_key_on_mismatch() {
    let layout = parse(&sample().to_bytes()).unwrap();
    let err = layout.metadata.get_str("u32").unwrap_err().to_string();
    assert!(err.contains("\"u32\"") && err.contains("string"), "{err}");
    let err = layout.metadata.get_u32("i32").unwrap_err().to_string();
    assert!(err.contains("\"i32\""), "{err}");
    let err = layout
        .metadata
        .require_u64("llama.block_count")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("llama.block_count") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample().to_bytes();
    for len in 0..bytes.len() {
        let result = parse(&bytes[..len]);
        assert!(result.is_err(), "prefix of {len} bytes parsed");
    }
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = sample().to_bytes();
    bytes[0] = b'X';
    assert!(matches!(parse(&bytes), Err(GgufError::BadMagic { .. })));
    let mut bytes = sample().to_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::UnsupportedVersion(1))
    ));
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    let err = parse(&bytes).unwrap_err().to_string();
    assert!(err.contains("big-endian"), "{err}");
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = sample().to_bytes();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::LimitExceeded { .. })
    ));
    let mut bytes = sample().to_bytes();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::LimitExceeded { .. })
    ));
    // An array claiming 4M strings in a tiny file: refused by the bytes that remain.
    let mut w = GgufWriter::new();
    w.metadata("strs", Value::Array(Array::String(vec!["x".into()])));
    let mut bytes = w.to_bytes();
    let count_at = 24 + 8 + 4 + 4 + 4;
    bytes[count_at..count_at + 8].copy_from_slice(&(1u64 << 22).to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("\"strs\""), "{err}");
}

#[test]
fn huge_string_length_is_refused() {
    let mut bytes = sample().to_bytes();
    // First key's length field.
    bytes[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::LimitExceeded { .. })
    ));
}

#[test]
fn unknown_tensor_and_value_types() {
    let mut w = GgufWriter::new();
    w.tensor("t", &[32], GgmlType::F32, vec![0; 128]);
    let mut bytes = w.to_bytes();
    // type id sits after name (8 + 1), n_dims (4), one dim (8).
    let at = 24 + 9 + 4 + 8;
    bytes[at..at + 4].copy_from_slice(&10u32.to_le_bytes()); // Q2_K: unsupported
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::UnknownTensorType { type_id: 10, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "tensor \"t\": tensor type Q2_K (GGML id 10) is not one the engine computes with"
    );
    // The lenient scan still reads the table, with the type's id.
    let scan = TensorTypes::scan(&bytes, &Limits::default()).unwrap();
    assert_eq!(scan.tensors, [("t".to_string(), 10)]);
    assert_eq!(type_name(10), "Q2_K");
    assert_eq!(type_name(23), "IQ4_XS");
    assert_eq!(type_name(8), "Q8_0");
    assert_eq!(type_name(4), "unknown type id 4");

    let mut w = GgufWriter::new();
    w.metadata("k", Value::U8(1));
    let mut bytes = w.to_bytes();
    bytes[24 + 9..24 + 13].copy_from_slice(&77u32.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::UnknownValueType { type_id: 77, .. }),
        "{err}"
    );
}

#[test]
fn bad_shapes() {
    for (dims, ty, want) in [
        (vec![0u64], GgmlType::F32, "size 0"),
        (vec![1 << 21, 1 << 21], GgmlType::F32, "more than"),
        (vec![288], GgmlType::Q4K, "multiple"),
        (vec![1, 1, 1, 1, 1], GgmlType::F32, "dimensions"),
    ] {
        let mut w = GgufWriter::new();
        w.tensor("t", &dims, ty, vec![]);
        let err = parse(&w.to_bytes()).unwrap_err().to_string();
        assert!(
            err.contains(want) && err.contains("\"t\""),
            "{dims:?}: {err}"
        );
    }
}

#[test]
fn out_of_file_overlapping_misaligned_and_duplicate_tensors() {
    // Out of file: declare 64 floats but ship 8.
    let mut w = GgufWriter::new();
    w.tensor("big", &[64], GgmlType::F32, vec![0; 32]);
    let err = parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(err, GgufError::OutOfFile { .. }), "{err}");

    // Overlap: point the second tensor's offset at the first.
    let mut w = GgufWriter::new();
    w.tensor_f32("x", &[8], &[0.0; 8])
        .tensor_f32("y", &[8], &[0.0; 8]);
    let mut bytes = w.to_bytes();
    let y_offset_at = 24 + (9 + 4 + 8 + 4 + 8) + (9 + 4 + 8 + 4);
    bytes[y_offset_at..y_offset_at + 8].copy_from_slice(&0u64.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(matches!(err, GgufError::Overlap { .. }), "{err}");

    bytes[y_offset_at..y_offset_at + 8].copy_from_slice(&4u64.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::Misaligned { offset: 4, .. }),
        "{err}"
    );

    bytes[y_offset_at..y_offset_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert!(matches!(err, GgufError::OutOfFile { .. }), "{err}");

    let mut w = GgufWriter::new();
    w.tensor_f32("x", &[8], &[0.0; 8])
        .tensor_f32("x", &[8], &[0.0; 8]);
    assert!(matches!(
        parse(&w.to_bytes()),
        Err(GgufError::DuplicateTensor(_))
    ));
}

#[test]
fn duplicate_keys_bad_bools_and_alignment() {
    let mut w = GgufWriter::new();
    w.metadata("k", Value::U8(1)).metadata("k", Value::U8(2));
    assert!(matches!(
        parse(&w.to_bytes()),
        Err(GgufError::DuplicateKey(_))
    ));

    let mut w = GgufWriter::new();
    w.metadata("b", Value::Bool(true));
    let mut bytes = w.to_bytes();
    // header (24) + key length (8) + "b" (1) + value type (4)
    bytes[37] = 2;
    assert!(matches!(parse(&bytes), Err(GgufError::WrongType { .. })));

    for bad in [0u32, 3, 1 << 20] {
        let mut w = GgufWriter::new();
        w.metadata("general.alignment", Value::U32(bad));
        assert!(
            matches!(parse(&w.to_bytes()), Err(GgufError::BadAlignment(_))),
            "{bad}"
        );
    }
    let mut w = GgufWriter::new();
    w.metadata("general.alignment", Value::U32(64))
        .tensor_f32("t", &[4], &[1.0; 4]);
    let layout = parse(&w.to_bytes()).unwrap();
    assert_eq!((layout.alignment, layout.data_offset % 64), (64, 0));
}

#[test]
fn nesting_depth_is_bounded() {
    let mut a = Array::U8(vec![1]);
    for _ in 0..10 {
        a = Array::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.metadata("deep", Value::Array(a));
    assert!(matches!(
        parse(&w.to_bytes()),
        Err(GgufError::LimitExceeded { .. })
    ));
}

#[test]
fn invalid_utf8_key_is_named() {
    let mut w = GgufWriter::new();
    w.metadata("kk", Value::U8(1));
    let mut bytes = w.to_bytes();
    bytes[32] = 0xff;
    let err = parse(&bytes).unwrap_err().to_string();
    assert!(err.contains("UTF-8") && err.contains("32"), "{err}");
}

#[test]
fn open_maps_a_file_and_reports_missing_files() {
    let dir = std::env::temp_dir().join(format!("bulkhead-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    std::fs::write(&path, sample().to_bytes()).unwrap();
    let g = Gguf::open(&path).unwrap();
    let a = g.tensor("a").unwrap();
    let data = g.tensor_data(a);
    assert_eq!(&data[..4], &1.0f32.to_le_bytes());
    let err = Gguf::open(dir.join("missing.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Random byte flips in a valid file never panic the parser.
        #[test]
        fn mutated_files_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let mut bytes = sample().to_bytes();
            let n = bytes.len();
            for (at, val) in flips {
                bytes[at % n] = val;
            }
            let _ = parse(&bytes);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut with_magic = b"GGUF\x03\x00\x00\x00".to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = parse(&with_magic);
        }
    }
}

/// Releasing a file-backed tensor's pages loses nothing: the bytes read
/// back are the file's. A resident copy ignores the request.
#[test]
fn released_file_pages_read_back_the_same_bytes() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models/llama-q8_0.gguf");
    let g = Gguf::open(&path).unwrap();
    let before = g.mapped_bytes().to_vec();
    let t = g.tensor("blk.0.ffn_up.weight").unwrap().clone();
    g.release_file_pages(t.file_range());
    g.release_file_pages(0..g.file_len());
    assert_eq!(g.mapped_bytes(), &before[..]);

    let mut copy = memmap2::MmapMut::map_anon(before.len()).unwrap();
    copy.copy_from_slice(&before);
    let resident = Gguf::from_resident(&path, copy.make_read_only().unwrap()).unwrap();
    resident.release_file_pages(0..resident.file_len());
    assert_eq!(resident.mapped_bytes(), &before[..]);
}

#[test]
fn the_tensor_type_scan_keeps_the_parsers_limits() {
    let bytes = sample().to_bytes();
    let scan = TensorTypes::scan(&bytes, &Limits::default()).unwrap();
    let names: Vec<&str> = scan.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(scan.tensors[1].1, GgmlType::Q8_0.id());
    assert!(scan.metadata.get("general.architecture").is_some());
    // Cut anywhere in the header or the table: a clean error.
    let table_end = bytes.len() - 128;
    for cut in (0..table_end).step_by(7) {
        assert!(TensorTypes::scan(&bytes[..cut], &Limits::default()).is_err());
    }
    let few = Limits {
        max_tensors: 1,
        ..Limits::default()
    };
    assert!(matches!(
        TensorTypes::scan(&bytes, &few),
        Err(GgufError::LimitExceeded { .. })
    ));
}
