//! The bottom layer: the vocabulary every domain shares ([`Route`], [`Source`], what tokentap
//! knows of each engine in `engine`: detection, self-description, metric names, usage, aborts,
//! tokenizers, control routes), the one reader of the Prometheus text format
//! (`exposition`), and small helpers (wall clock, durations, JSON string writing, escaping, the
//! poison-tolerant lock).
//!
//! The crate `tokentap-base` (`tokentap::base`): it depends on no other crate of the workspace,
//! so every crate and module may use it.

pub mod duration;
pub mod engine;
pub mod error;
pub mod escape;
pub mod exposition;
pub mod json;
pub mod lock;
pub mod route;
pub mod source;
pub mod wallclock;

pub use route::Route;
pub use source::Source;
