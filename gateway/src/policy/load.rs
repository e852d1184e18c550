//! Reading and validating a policy folder (in progress on a branch).

use std::path::Path;

use super::{Policy, PolicyError, PolicyErrors};

/// Reads and validates every file of the policy folder `dir`.
pub fn load(dir: &Path) -> Result<Policy, PolicyErrors> {
    Err(PolicyErrors(vec![PolicyError::at_path(
        dir,
        "policy loading is not built yet",
    )]))
}
