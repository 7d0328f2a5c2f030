//! The embedded SQLite store: synthetic sweeps, hourly production-matrix snapshots and the
//! reference matrices drift is measured against (`reference`), the captured workload (request
//! shapes, `workload.rs`), kept in
//! `<data_dir>/tokentap.sqlite3` so they survive a restart.
//!
//! Owns the schema and every SQL statement; callers see typed rows ([`SweepRow`],
//! [`SnapshotInfo`], [`Snapshot`]) and matrices as [`MatrixDoc`](tokentap_matrix::MatrixDoc) (stored as their JSON
//! rendering, read back through the same importer as any JSON matrix). Calls are blocking and
//! short (one statement under a mutex): call them from `spawn_blocking` on async paths. This
//! module never decides *when* to write — the snapshot task and the sweep engine do. `db.rs` is the
//! store and its rows; this file only declares and re-exports.

pub mod configs;
mod db;
pub mod reference;
mod workload;

pub use db::{
    Snapshot, SnapshotInfo, Store, StoreError, SweepRow, SweepState, FILE_NAME, SCHEMA_VERSION,
};
pub use workload::{WorkloadReader, WorkloadRow, EXPORT_PAGE_ROWS};
