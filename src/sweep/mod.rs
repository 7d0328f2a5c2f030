//! Synthetic matrix sweeps (the seed tool's procedure): the plan, exact-length prompts, the
//! runner that drives scouts and decode cells through the proxy's own metering path, the cell
//! arithmetic, the
//! manager behind `POST /sweeps` (one sweep at a time, persisted), and the `tokentap sweep` and
//! `tokentap demo` commands.
//!
//! Every synthetic request goes through [`crate::proxy::Proxy::handle`] tagged
//! [`crate::proxy::Synthetic`], so the cells are computed from the same
//! [`crate::meter::record::RequestRecord`]s and live token counters that measure production;
//! the runner never times anything with a private stopwatch except the window boundaries
//! themselves. This module must not touch the data path's internals (it is a client of
//! `Proxy`), and must never send sglang's `abort_all`: other clients share the server.
//!
//! Code map: `plan` (request → resolved plan, pure), `discover` (what the server says about
//! itself), `prompt` (token-id and calibrated text prompts), `driver` (one stream: send,
//! read, detect errors and output loops), `cell` (records + window → matrix cells, pure),
//! `runner` (the procedure), `status` (progress and the JSON of `GET /sweeps/{id}`), `progress` (the progress line on stderr),
//! `store` (persistence seam over the shared SQLite store), `manager` (one at a time, cancel, follow), `cli`
//! (`tokentap sweep`), `demo` (`tokentap demo`).

pub mod cell;
pub mod cli;
pub mod client;
pub mod demo;
pub mod discover;
pub mod driver;
pub mod manager;
pub mod plan;
pub mod progress;
pub mod prompt;
pub mod runner;
pub mod status;
pub mod store;

pub use manager::{CancelError, StartError, SweepManager};
pub use plan::{Plan, PlanError, PromptMode, ServerFacts, SweepRequest};
pub use status::{Progress, SweepState, SweepStatus, SweepSummary};
pub use store::{MemoryStore, SweepStore};
