//! The data path: the forwarding service, upstream clients and routing, request and response
//! bodies, header hygiene, and the one place errors become HTTP statuses.

pub mod body;
pub mod error;
pub mod headers;
pub mod service;
pub mod upstream;
pub mod usage_unasked;

pub use service::{Proxy, ProxyService, Synthetic};
