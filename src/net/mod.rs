//! Listeners: accepting TCP (and TLS) connections, serving HTTP/1.1 and HTTP/2 on them with
//! hyper, and shutting down gracefully. Shared by the data listener, the admin listener and
//! the simulator. Owns every connection task it spawns, and the limits that keep a hostile
//! peer from holding them: the first-request deadline (TLS handshake, protocol detection and
//! request head together), the connection limit, and the back-off when descriptors run out.
//!
//! Files by job: `shutdown` (the trigger, the signals), `options` (how a listener serves,
//! its builders), `accept` (the accept loop, its back-off, the drain), `connection` (one
//! connection: protocol, serving, bounds). This file only declares and re-exports.

mod accept;
mod connection;
pub mod faults;
pub mod limits;
mod options;
pub mod redact;
mod shutdown;
pub mod streams;
pub mod tls;
pub mod workers;

pub use accept::{serve, serve_until};
pub use connection::{ConnectionService, ServedBody};
pub use options::{
    ServerOptions, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_STREAM_BUFFER, PLAIN_MAX_CONNECTIONS,
};
pub use shutdown::{shutdown_pair, Shutdown, ShutdownTrigger, Signals};
