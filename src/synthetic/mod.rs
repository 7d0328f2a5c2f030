//! Synthetic traffic's ground floor, below the sweep and the replay: one stream through the
//! data path and what it showed (`driver`: the typed [`StreamFailure`]), small bounded control
//! requests (`client`), exact-length prompts (`prompt`), the server's running and queued
//! requests now (`server_load`), the records of a run's requests by tag (`collect`), and the
//! one door all of them go through (`path`: the [`DataPath`] trait — stream a request, a control
//! request, a record sink scoped to a value's life, production in flight, synthetic tokens, the
//! server's load and state, abort — with [`ProxyPath`], its implementation over the proxy).
//!
//! Everything synthetic enters the proxy through [`crate::proxy::Proxy::handle`] tagged
//! [`crate::proxy::Synthetic`], so the same metering code measures it as measures production.
//! The layers above (`sweep`, `workload`) hold an `Arc<dyn DataPath>`, never the proxy itself,
//! so a scripted fake can stand in for the data path in their tests. Nothing here sends
//! sglang's `abort_all`: other clients share the server.

pub mod client;
pub mod collect;
pub mod driver;
pub mod path;
pub mod prompt;
pub mod server_load;

pub use crate::proxy::answers::Answers;
pub use collect::RecordCollector;
pub use driver::{StreamEnd, StreamFailure, StreamPhase, StreamRequest, StreamSignals};
pub use path::{BoxFuture, DataPath, Described, ProxyPath, ServerLoad, SinkScope};
pub use server_load::LoadGauges;
