//! The upstream servers' own state, read from their Prometheus `/metrics` pages in the
//! background (the text format is read by `base::exposition`, the crate's one reader of it):
//! `known.rs` maps the engines' metric names (each engine's file under `base::engine`) to engine-neutral gauges, `scrape.rs` runs one task per upstream that reads the page at an
//! interval and publishes what it found to the meter's
//! [`ServerStateRegistry`](crate::meter::server_state::ServerStateRegistry), whose exact time
//! integrals every request reads at its start and end. Nothing here is on a request's path.

pub mod known;
pub mod scrape;
#[cfg(test)]
mod tests;

pub use scrape::spawn_scrapers;
