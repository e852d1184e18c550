//! `dequantize_row` against gguf-py's dequantization of the same raw blocks
//! (fixtures/dequant.json, written by fixtures/make_dequant.py).

use bulkhead_kernels::{GgmlType, dequantize_row};

fn type_named(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("fixture names unknown type {name}"))
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("fixture hex"))
        .collect()
}

#[test]
fn dequantize_row_matches_gguf_py_for_every_type() {
    let text = include_str!("fixtures/dequant.json");
    let fixture: serde_json::Value = serde_json::from_str(text).expect("fixture JSON");
    let cases = fixture["cases"].as_array().expect("cases array");
    let mut seen = Vec::new();
    for case in cases {
        let ty = type_named(case["type"].as_str().expect("type"));
        let cols = case["cols"].as_u64().expect("cols") as usize;
        seen.push(ty);
        for (r, row) in case["rows"].as_array().expect("rows").iter().enumerate() {
            let raw = hex_bytes(row["hex"].as_str().expect("hex"));
            let want: Vec<f32> = row["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v.as_f64().expect("value") as f32)
                .collect();
            assert_eq!(want.len(), cols);
            let mut got = vec![f32::NAN; cols];
            dequantize_row(ty, &raw, &mut got);
            // Relative to the row's scale: K-quant values are `d·q - m`
            // differences, so an element near zero carries the rounding of
            // its larger terms.
            let row_max = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-6 * w.abs().max(row_max * 1e-2);
                assert!(
                    (g - w).abs() <= tol,
                    "{ty} row {r} element {i}: got {g}, gguf-py {w}"
                );
            }
        }
    }
    for ty in GgmlType::ALL {
        assert!(seen.contains(&ty), "fixture lacks {ty}");
    }
}
