//! Unicode character classes the pre-tokenizers need (`\p{L}`, `\p{N}`, `\s`).
//!
//! The tables come from the `regex` crate's own Unicode data, so a character
//! is a letter here exactly when `\p{L}` matches it there. They are built once
//! per process by scanning every scalar value (tens of milliseconds).

use std::sync::OnceLock;

use regex::Regex;

/// The coarse class of one character, as the GPT-2 / Llama 3 regexes see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s` (Unicode White_Space)
    Space,
    /// Anything else (punctuation, symbols, marks, controls).
    Other,
}

struct Tables {
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let all: String = (0x80..=0x10_FFFF).filter_map(char::from_u32).collect();
        let ranges = |pattern: &str| -> Vec<(u32, u32)> {
            let re = Regex::new(pattern).expect("constant Unicode class pattern compiles");
            re.find_iter(&all)
                .filter_map(|m| {
                    let s = m.as_str();
                    let first = s.chars().next()?;
                    let last = s.chars().next_back()?;
                    Some((u32::from(first), u32::from(last)))
                })
                .collect()
        };
        // Surrogates are skipped in `all`, so a run can span the gap; no
        // letter or number class touches D800..DFFF, so that is harmless.
        Tables {
            letters: ranges(r"\p{L}+"),
            numbers: ranges(r"\p{N}+"),
        }
    })
}

fn in_ranges(ranges: &[(u32, u32)], c: u32) -> bool {
    match ranges.binary_search_by(|&(lo, _)| lo.cmp(&c)) {
        Ok(_) => true,
        Err(0) => false,
        Err(i) => ranges[i - 1].1 >= c,
    }
}

/// Classifies `c` (ASCII takes a fast path).
pub(crate) fn classify(c: char) -> CharClass {
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            CharClass::Letter
        } else if c.is_ascii_digit() {
            CharClass::Number
        } else if c.is_ascii_whitespace() || c == '\x0b' {
            CharClass::Space
        } else {
            CharClass::Other
        };
    }
    if c.is_whitespace() {
        return CharClass::Space;
    }
    let t = tables();
    let cp = u32::from(c);
    if in_ranges(&t.letters, cp) {
        CharClass::Letter
    } else if in_ranges(&t.numbers, cp) {
        CharClass::Number
    } else {
        CharClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_agree_with_regex_on_samples() {
        let letter = Regex::new(r"^\p{L}$").unwrap();
        let number = Regex::new(r"^\p{N}$").unwrap();
        let space = Regex::new(r"^\s$").unwrap();
        for c in (0..0x3_0000).step_by(7).filter_map(char::from_u32) {
            let s = c.to_string();
            let expected = if letter.is_match(&s) {
                CharClass::Letter
            } else if number.is_match(&s) {
                CharClass::Number
            } else if space.is_match(&s) {
                CharClass::Space
            } else {
                CharClass::Other
            };
            assert_eq!(classify(c), expected, "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn spot_checks() {
        assert_eq!(classify('é'), CharClass::Letter);
        assert_eq!(classify('中'), CharClass::Letter);
        assert_eq!(classify('٣'), CharClass::Number);
        assert_eq!(classify('½'), CharClass::Number);
        assert_eq!(classify('\u{3000}'), CharClass::Space);
        assert_eq!(classify('\u{85}'), CharClass::Space);
        assert_eq!(classify('\u{0301}'), CharClass::Other);
        assert_eq!(classify('😀'), CharClass::Other);
        assert_eq!(classify('\x0b'), CharClass::Space);
    }
}
