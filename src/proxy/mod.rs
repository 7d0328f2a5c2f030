//! The data path: the forwarding service, upstream clients and routing, request and response
//! bodies and their idle timeouts, header hygiene, and the one place errors become HTTP
//! statuses.

pub mod answers;
pub mod ask;
pub mod body;
pub mod connector;
pub mod describe;
pub mod error;
pub mod headers;
pub mod inline_pool;
pub mod relay;
pub mod request_body;
pub mod routes;
pub mod service;
pub mod timeout;
pub mod upstream;
pub mod usage_unasked;

pub use service::{Proxy, ProxyService, Synthetic};

/// The error every body on the data path yields: whatever the client's or the upstream's body
/// failed with, boxed so the request and response enums have one error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
