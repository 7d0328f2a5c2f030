//! The matrix from records: streaming aggregation of per-request records into matrix cells,
//! over sliding windows, and the periodic production snapshots.
//!
//! - [`sketch`]: the bounded quantile sketch behind every median (1 % relative error).
//! - [`cell`]: [`CellAccumulator`], [`PrefillAccumulator`], [`MatrixAccumulator`] — records
//!   in, matrix cells out; shared by production windows and the synthetic sweep.
//! - [`window`]: [`ProductionMatrix`], the record sink that keeps time slices and answers
//!   "the matrix of the last hour".
//! - [`snapshot`]: the task that writes the production matrix to the store every interval.
//! - [`drift`]: the pinned reference matrices in memory, production compared with them, and
//!   the task that refreshes the drift gauges.
//!
//! Nothing here keeps a list of requests: memory is bounded by slices × cells × sketch bins.
//! The definitions of every column are in docs/metrics.md. This module never renders (the
//! matrix module does) and never touches the network.

pub mod cell;
pub mod config;
pub mod drift;
pub mod headroom;
pub mod sketch;
pub mod snapshot;
pub mod window;

pub use cell::{CellAccumulator, Fragment, MatrixAccumulator, PrefillAccumulator};
pub use sketch::QuantileSketch;
pub use window::{
    FingerprintFilter, ProductionMatrix, RecordFilter, Slicings, Window, WindowError, WindowMatrix,
    DEFAULT_WINDOW,
};
