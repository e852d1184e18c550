//! Per-tenant admission limits, checked after authentication and before any
//! GPU work.

mod headers;
mod shape;

pub use headers::{RateLimitHeaders, format_reset, retry_after_secs};
pub use shape::{ShapeError, check_request_shape};
