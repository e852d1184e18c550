//! Model registration: the gateway serves only models whose weights match
//! a signed registration. A registration is a model folder's signature
//! bundle verified with the key of a publisher in `trust.toml`, plus the
//! weights file to serve; configured ones come from gateway.toml, others
//! through the admin API (kept in the `[models] registry` folder, or in the
//! state database that replicas share).
//!
//! ```text
//! claim (name, dir, file, bundle) ─verify with trust─▶ Registration ─LoadModel(size, chunk root, sha256)─▶ gpu-host hashes every byte
//! ```
//!
//! - [`verify`]: a claim to a [`Registration`] (no file access).
//! - `disk`: the registry folder, one JSON file per API registration.
//! - `db`: the same records in the state database, shared by replicas.
//! - `store`: either of the two, as the reconciler uses it.
//!
//! `crate::reconcile` keeps the gpu-host's models equal to the registrations.

mod db;
mod disk;
mod error;
mod name;
mod store;
mod trust;
mod verify;

pub(crate) use db::{RegistryDb, TOPIC as REGISTRATIONS_TOPIC};
pub use db::{RegistryImported, import_registry};
pub use disk::MAX_API_REGISTRATIONS;
pub(crate) use disk::{Record, RegistryDir};
pub use error::RegistrationError;
pub use name::{MAX_MODEL_NAME_BYTES, MODEL_NAME_RULE, valid_model_name};
pub(crate) use store::{RegistrySource, RegistryStore};
pub use trust::{Publisher, Trust};
pub use verify::{
    Claim, MAX_DIR_BYTES, MAX_REGISTRATION_BUNDLE_BYTES, Registration, Source, verify,
};
