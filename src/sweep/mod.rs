//! Synthetic matrix sweeps: the plan, the runner that drives scouts and
//! decode cells through the proxy's own metering path, the cell arithmetic, and the manager
//! behind `POST /sweeps` (one sweep at a time, persisted).
//!
//! Every synthetic request goes through [`crate::proxy::Proxy::handle`] tagged
//! [`crate::proxy::Synthetic`], so the cells are computed from the same
//! [`crate::meter::record::RequestRecord`]s and live token counters that measure production;
//! the runner never times anything with a private stopwatch except the window boundaries
//! themselves. This module must not touch the data path's internals (it is a client of
//! the data path), and must never send sglang's `abort_all`: other clients share the server.
//!
//! The runner talks to the data path only through [`crate::synthetic::DataPath`] (streams,
//! control requests, a scoped record sink, production in flight, synthetic tokens, the server's
//! load, aborts); the stream driver, the prompts and the load reads are `synthetic`'s.
//!
//! Code map: `request` (what the user asks for), `facts` (what the server says about itself),
//! `plan` (the resolved plan), `resolve` (request → resolved plan, pure), `estimate` (how long
//! measurements take: the preview's duration and the running sweep's ETA, pure), `discover`
//! (reads the server's facts), `cell` (records + window → matrix cells, pure),
//! `preview` (what a plan would do, shown before it starts), `runner` (the procedure), `search` (the capacity search's next level, pure), `shape` (the like-production shape of a sweep's requests, read from production's matrix, pure), `status` (progress and the JSON of `GET /sweeps/{id}`), `progress` (the progress line on stderr),
//! `store` (persistence seam over the shared SQLite store), `latest` (the latest synthetic matrix,
//! read by the admin endpoints), `manager` (one at a time, cancel, follow). The `tokentap sweep`
//! and `tokentap demo` commands are `app::sweep` and `app::demo`.

pub mod cell;
pub mod discover;
pub mod estimate;
pub mod facts;
pub mod latest;
pub mod manager;
pub mod plan;
pub mod preview;
pub mod progress;
pub mod request;
pub mod resolve;
pub mod runner;
pub mod search;
pub mod shape;
pub mod status;
pub mod store;

pub use latest::LatestMatrix;
pub use manager::{CancelError, StartError, SweepManager};
pub use plan::{Plan, PlanError, PromptMode, ServerFacts, SweepRequest};
pub use preview::{PlanPreview, BESIDE_PRODUCTION_BOX};
pub use status::{Progress, SweepState, SweepStatus, SweepSummary};
pub use store::{MemoryStore, SweepStore};
