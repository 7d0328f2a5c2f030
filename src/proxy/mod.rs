//! The data path: the forwarding service, upstream clients and routing, request and response
//! bodies and their idle timeouts, header hygiene, and the one place errors become HTTP
//! statuses.

pub mod answers;
pub mod ask;
pub mod body;
pub mod box_error;
pub mod code_fields;
pub mod connector;
pub mod describe;
pub mod error;
pub mod headers;
pub mod inline_pool;
mod phase;
pub mod readiness;
pub mod refusals;
pub mod relay;
pub mod request_body;
pub mod request_id;
pub mod routes;
pub mod server_info;
pub mod service;
pub mod sessions;
pub mod slice;
pub mod tenants;
pub mod timeout;
pub mod turns;
pub mod upstream;
pub mod usage_unasked;

pub use box_error::BoxError;
pub use service::{Proxy, ProxyService, Synthetic};
