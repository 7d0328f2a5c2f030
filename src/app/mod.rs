//! The application layer: the `tokentap` command line and one module per command. Commands
//! compose the domain modules below (proxy, meter, sweep, sim, matrix, store, admin…); no
//! domain module imports anything from here.
//!
//! - [`cli`]: argument parsing, the runtime, exit codes.
//! - [`proxy`](mod@proxy): the one place a configuration becomes the proxy's data path
//!   ([`proxy::build_proxy`]), for serve, sweep, replay and (through serve) demo.
//! - [`serve`]: `tokentap serve`, and the wiring every command that runs a whole server shares
//!   ([`serve::ProxyServer`]: config → proxy, meter, sinks, listeners, tasks, shutdown).
//! - [`sweep`]: `tokentap sweep`.
//! - [`simulate`]: `tokentap simulate`.
//! - [`matrix`]: `tokentap matrix`.
//! - [`fleet`]: `tokentap fleet matrix|compare` (the fleet read back from PromQL).
//! - [`demo`]: `tokentap demo`.
//! - [`drift`]: the drift refresher (production against pinned references → the drift gauges).
//! - [`reference`](mod@reference): `tokentap reference` (pin, show, clear the drift reference through the admin API).
//! - [`workload`]: `tokentap workload export|convert`; [`replay`]: `tokentap replay`.
//! - [`rules`]: `tokentap rules` (the error-budget burn-rate alerts of `[slo]`, and their
//!   promtool unit tests).
//! - [`tenants`]: `tokentap tenants hash-key` (the hash a `[tenants.keys]` entry takes).
//! - [`bench`](mod@bench): `tokentap bench` (the overhead self-check: direct vs through a `serve` child).
//! - [`output`]: `--format table|md|json`, what sweep, replay and demo print when they end.
//! - [`store`]: what `tokentap matrix show --store` reads from the store.

pub mod bench;
pub mod cli;
pub mod demo;
pub mod drift;
pub mod fleet;
pub mod matrix;
pub mod output;
pub mod proxy;
pub mod reference;
pub mod replay;
pub mod rules;
pub mod serve;
pub mod simulate;
pub mod status;
pub mod store;
pub mod sweep;
pub mod tenants;
pub mod workload;

pub use cli::{main, Cli};
