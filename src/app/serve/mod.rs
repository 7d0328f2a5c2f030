//! `tokentap serve`, one part per file: `args.rs` the arguments and the configuration layers
//! they name; `run.rs` the command (start, signals, shutdown); `server.rs` [`ProxyServer`], the
//! composition root, built from `services.rs` (what is built once from the configuration),
//! `listeners.rs` (binding the data and admin listeners, what a bind failure says, how each
//! serves) and `tasks.rs` (the background tasks and their shutdown, as one value). The proxy
//! itself is built by `app::proxy`, the one place serve, sweep and replay build it.

mod args;
mod listeners;
mod run;
mod server;
mod services;
mod tasks;

pub use args::{config_layers, ServeArgs};
pub use listeners::{bind_error, Listener};
pub use run::run;
pub use server::ProxyServer;
