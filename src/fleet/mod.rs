//! The fleet: many replicas, each with a tokentap sidecar, and a PromQL store (Prometheus,
//! Thanos, Mimir) holding what they all export. This module owns reading the fleet back as
//! matrices: `promql` (a small instant-query client, bounded in time and size), `matrix`
//! (the fleet matrix document from PromQL, per fingerprint or any label selector), `compare`
//! (a canary's cells ÷ the baseline's over the same window, with each side's evidence) and
//! `spread` (a fleet sweep's per-cell min, median and max over the replicas). The commands are
//! `app::fleet` and `app::sweep` (`--admin URL1,URL2,…`). File order: `promql` ← `matrix`;
//! `compare` and `spread` are pure and import neither.
pub mod compare;
pub mod matrix;
pub mod promql;
pub mod spread;
