//! The weight verifier: model files are copied into memory the host owns and
//! hashed in the same pass (one read, every core), checked against the digest
//! they were registered with, then re-hashed chunk by chunk in the background
//! while resident. A chunk that no longer matches takes its model out of
//! service at once.
//!
//! ```text
//! file ─pread 4 MiB chunks on all cores─▶ anonymous memory (read-only after)
//!         └─ leaf hash per chunk ─▶ chunk root == registered? ─▶ serve
//!                                                 scrub thread ─▶ leaf i again == leaf i? ─no─▶ quarantine
//! ```

mod hook;
mod idle;
mod resident;
mod scrub;
mod state;

pub use hook::flip_resident_bit;
pub use resident::{Expected, LoadError, ResidentFile, load_resident};
pub use scrub::{ScrubConfig, Scrubbable, Scrubber};
pub use state::{Piece, WeightState, WeightStatus};
