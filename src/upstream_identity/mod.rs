//! Which configuration each upstream runs: one background task per upstream follows what the
//! upstream says of itself (`proxy::describe`, the one reader, publishes each read on the
//! upstream: at start, every `[fingerprint] interval`, and as soon as it answers after failing);
//! `facts.rs` turns the answers and the operator's labels into facts and a fingerprint id, and
//! the id goes into the upstream's lock-free slot (`meter::identity`) that every request reads at
//! its start.
//!
//! A new configuration is an event: logged with what changed, written to the store
//! (`store::configs`) and shown by `tokentap_upstream_config_info`, the page and
//! `/matrix?compare=previous`. A flapping upstream (more than
//! `meter::identity::FLAP_CHANGES_PER_HOUR` changes an hour) is logged once and its label
//! fixed. Nothing here is on a request's path and nothing here can stop serving: every
//! question has a deadline and a size bound, a fact that cannot be read is absent.
//!
//! [`OutageWatch`] is the record sink that notices the upstream answering again. This file only
//! declares and re-exports: the task is `follow.rs`.

pub mod facts;
mod follow;

pub use follow::{spawn, OutageWatch};
