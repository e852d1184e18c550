//! Model names: what tenants put in `model`, what the gpu-host serves a
//! model under, and the file name of an API registration on disk.

/// Longest model name, in bytes.
pub const MAX_MODEL_NAME_BYTES: usize = 128;

/// The rule [`valid_model_name`] checks, for error messages.
pub const MODEL_NAME_RULE: &str =
    "use 1 to 128 of A-Z, a-z, 0-9, `.`, `:` and `-`, starting with a letter or digit";

/// `[A-Za-z0-9][A-Za-z0-9.:-]{0,127}`: inside what the gpu-host accepts
/// (it also takes `/`, which cannot name a file) and safe as a file name,
/// a URL segment and a metric label.
pub fn valid_model_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.len() <= MAX_MODEL_NAME_BYTES
        && bytes.all(|b| b.is_ascii_alphanumeric() || b".:-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for good in [
            "a",
            "0",
            "bulkhead-demo-tiny",
            "Llama-3.1:8b",
            &"a".repeat(128),
        ] {
            assert!(valid_model_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "..",
            "a/b",
            "a b",
            "a_b",
            "é",
            "a\0",
            &"a".repeat(129),
        ] {
            assert!(!valid_model_name(bad), "{bad:?}");
        }
    }
}
