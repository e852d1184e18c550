//! The rule for names policy files give (tenants, classes, publishers):
//! safe in file names, URLs and metric labels.

pub(super) const NAME_RULE: &str =
    "use 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit";

/// `[a-z0-9][a-z0-9_-]{0,62}`: safe in file names, URLs, metric labels.
pub(super) fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}
