//! The tamper-evident audit log (stub while it is built).
pub mod entry;
pub mod frame;
pub mod merkle;
pub mod note;
pub mod time;
