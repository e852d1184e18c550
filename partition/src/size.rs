//! Byte sizes as operators write them (`"24GiB"`), parsed strictly: an
//! integer, then one unit from a fixed list, nothing else. `"24G"`, `"24 gb"`
//! or `"1.5GiB"` are refused rather than guessed at, because the binary and
//! decimal readings of "G" differ by 7% — on a 256 GiB device that is 18 GiB.

use crate::PartitionError;

/// Accepted units and their multipliers, binary then decimal.
const UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

/// Longest size text looked at; anything longer is not a size.
const MAX_SIZE_TEXT_BYTES: usize = 32;

/// Parses `"24GiB"`, `"512MiB"`, `"80GB"`, `"4096B"`: digits (`_` allowed
/// between them, as in TOML integers), then a unit from B, KiB, MiB, GiB,
/// TiB, kB, MB, GB, TB, with no space and no fraction.
pub fn parse_bytes(text: &str) -> Result<u64, PartitionError> {
    let invalid = |reason: &str| PartitionError::InvalidSize {
        text: text.chars().take(MAX_SIZE_TEXT_BYTES).collect(),
        reason: reason.to_string(),
    };
    if text.len() > MAX_SIZE_TEXT_BYTES {
        return Err(invalid("too long to be a size"));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(invalid(
            "expected a whole number followed by a unit, e.g. \"24GiB\"",
        ));
    }
    if number.ends_with('_') || number.contains("__") {
        return Err(invalid("`_` may only separate digits"));
    }
    if unit.starts_with('.') {
        return Err(invalid(
            "fractions are not accepted: use a smaller unit, e.g. \"1536MiB\" for 1.5 GiB",
        ));
    }
    let Some(&(_, multiplier)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(invalid(if unit.is_empty() {
            "a unit is required: B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB)"
        } else {
            "unknown unit: use B, KiB, MiB, GiB, TiB (or kB, MB, GB, TB), no space"
        }));
    };
    let value: u64 = number
        .replace('_', "")
        .parse()
        .map_err(|_| invalid("the number does not fit in 64 bits"))?;
    value
        .checked_mul(multiplier)
        .ok_or_else(|| invalid("more than 2^64 bytes"))
}

/// `bytes` for messages: a whole number of the largest unit it reaches
/// when exact (`"24GiB"`), else a whole number of a smaller unit when that
/// stays short (`"1536MiB"`), else two decimals (`"300.00GiB"`).
pub fn format_bytes(bytes: u64) -> String {
    const BINARY: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    // Counts past this are harder to read than a rounded figure.
    const MAX_WHOLE_COUNT: u64 = 10_000;
    let Some(&(largest, unit)) = BINARY.iter().find(|(_, unit)| bytes >= *unit) else {
        return format!("{bytes}B");
    };
    if bytes.is_multiple_of(unit) {
        return format!("{}{largest}", bytes / unit);
    }
    for (name, smaller) in BINARY.iter().filter(|(_, u)| *u < unit) {
        if bytes.is_multiple_of(*smaller) && bytes / smaller < MAX_WHOLE_COUNT {
            return format!("{}{name}", bytes / smaller);
        }
    }
    // f64 is exact enough for two decimals of a message.
    format!("{:.2}{largest}", bytes as f64 / unit as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units_parse() {
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1_024KiB"), Ok(1 << 20));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("4096B"), Ok(4096));
        assert_eq!(parse_bytes("0GiB"), Ok(0));
        assert_eq!(parse_bytes("16TiB"), Ok(16 << 40));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        for bad in [
            "", "24", "24G", "24 GiB", "24gib", "24gb", "1.5GiB", "GiB", "-1GiB", "+1GiB",
            "24GiB ", " 24GiB", "_1GiB", "1_GiB", "1__0GiB", "24GiBs", "0x10MiB",
        ] {
            let e = parse_bytes(bad).expect_err(bad);
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
        let e = parse_bytes("1.5GiB").unwrap_err().to_string();
        assert!(e.contains("1536MiB"), "{e}");
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert!(parse_bytes("16777216TiB").is_err());
        assert!(parse_bytes("99999999999999999999B").is_err());
        assert!(parse_bytes(&"9".repeat(40)).is_err());
    }

    #[test]
    fn formatting_prefers_whole_units() {
        assert_eq!(format_bytes(24 << 30), "24GiB");
        assert_eq!(format_bytes(256 << 30), "256GiB");
        assert_eq!(format_bytes(1536 << 20), "1536MiB");
        assert_eq!(format_bytes((3 << 29) + 1), "1.50GiB");
        assert_eq!(format_bytes((300 << 30) + 4096), "300.00GiB");
        assert_eq!(format_bytes(1000), "1000B");
        assert_eq!(format_bytes(0), "0B");
    }
}
