//! Synthetic matrix sweeps: the plan, exact-length prompts, the runner that drives scouts and
//! decode cells through the proxy's own metering path, the cell arithmetic, and the manager
//! behind `POST /sweeps` (one sweep at a time, persisted).
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
//! `runner` (the procedure), `search` (the capacity search's next level, pure), `server_load` (the server's running and queued requests now, read through the upstream's scraper), `status` (progress and the JSON of `GET /sweeps/{id}`), `progress` (the progress line on stderr),
//! `store` (persistence seam over the shared SQLite store), `latest` (the latest synthetic matrix,
//! read by the admin endpoints), `manager` (one at a time, cancel, follow). The `tokentap sweep`
//! and `tokentap demo` commands are `app::sweep` and `app::demo`.

pub mod cell;
pub mod client;
pub mod discover;
pub mod driver;
pub mod latest;
pub mod manager;
pub mod plan;
pub mod progress;
pub mod prompt;
pub mod runner;
pub mod search;
pub mod server_load;
pub mod status;
pub mod store;

pub use latest::LatestMatrix;
pub use manager::{CancelError, StartError, SweepManager};
pub use plan::{Plan, PlanError, PromptMode, ServerFacts, SweepRequest};
pub use status::{Progress, SweepState, SweepStatus, SweepSummary};
pub use store::{MemoryStore, SweepStore};
