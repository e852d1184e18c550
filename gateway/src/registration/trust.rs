//! The publishers whose keys may sign served models (policy reads them
//! from `trust.toml`).

use crate::signing::PublicKey;

/// The trusted publishers, in file order.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    pub publishers: Vec<Publisher>,
}

/// One `[[publishers]]` entry, its key read.
#[derive(Clone, Debug)]
pub struct Publisher {
    pub name: String,
    pub key: PublicKey,
}
