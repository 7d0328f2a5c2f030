//! `tokentap demo`: the first command of the README. With no arguments it starts the simulator
//! (a seed profile) and the proxy in-process on loopback ephemeral ports, runs a short sweep
//! through the proxy's admin-side manager, then sends ordinary client traffic through the proxy's
//! data listener in two phases, each measured by its own production aggregator:
//!
//! * **steady**: a few sweep cells reproduced by plain clients (same prompt length, same number
//!   of streams, warm prompt); the report marks where they agree with the sweep within 5 %;
//! * **mixed**: a burst of cold prompts of many lengths at changing concurrency; the report puts
//!   each cell's measured prefill interference beside its gap to the sweep.
//!
//! Comparisons are made only between columns that mean the same on both sides, with their
//! definitions beside the tables. It writes an HTML report and says what to open and try next.
//!
//! Everything it starts is stopped before it returns (unless `--keep-running`, until Ctrl-C).
//!
//! One file per step, in order: `start.rs` (the simulator and the proxy, configured as a value),
//! `sweep.rs`, `steady.rs`, `mixed.rs` (each traffic phase measured by its own aggregator,
//! `phase.rs`), `finish.rs` (the report shown and written); `report.rs` and `table.rs` render
//! it; `http.rs` is the one client exchange every plain request goes through.

mod args;
mod finish;
pub(crate) mod http;
mod machine;
mod mixed;
mod phase;
mod report;
mod run;
mod start;
mod steady;
mod sweep;
mod table;

pub use args::{DemoArgs, DEMO_PROFILE};
pub use mixed::{burst, BurstSummary};
pub use report::{DemoReport, AGREEMENT, DEFINITIONS};
pub use run::run;
pub use steady::steady_cells;
pub(crate) use steady::wait_until_server_idle;
pub use table::TextTable;
