//! The error every body on the data path yields: whatever the client's or the upstream's body
//! failed with, boxed so the request and response enums have one error type.

/// A boxed error of a body on the data path.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
