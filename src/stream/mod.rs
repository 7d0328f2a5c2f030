//! The stream layer: the pure SSE scanner, the JSON navigator, per-route event
//! classification, usage injection and its undoing, the body wrapper that applies them to
//! bytes as they pass, and the `Server-Timing` value it hands back at a request's end.
//!
//! Invariant: nothing here awaits or does I/O, and nothing allocates per event in the steady
//! state (benches/stream.rs and tests/alloc_tests.rs prove it). The body wrapper only polls
//! the body it wraps.

pub mod body;
pub mod classify;
pub mod edits;
pub mod fingerprint;
pub mod held;
pub mod json;
pub mod request;
pub mod rewrite;
pub mod sample;
pub mod sse;
pub mod timing;
