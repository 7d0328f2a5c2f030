//! The admin listener: health, readiness, Prometheus metrics, the matrix (`matrix`), the page
//! (`page`), live headroom (`capacity`), the captured workload (`workload`), the sweep API (`sweeps`) and the reference API
//! (`reference`); starting sweeps and pinning references always need the token. Bound to loopback by
//! default; with `admin.token` set, everything but `/healthz` and `/readyz` needs
//! `Authorization: Bearer <token>`, or, for reading (`GET`) and the page's own sweep form, a
//! browser session from `POST /login` (`session`). A browser asking for HTML without either is
//! sent to the login form.
//!
//! `routes.rs` is the route table (method, path, access, handler) and checks access from it;
//! `state.rs` holds what the endpoints share and the credential checks; each endpoint family
//! lives in its own file. This file only declares and re-exports.

pub mod capacity;
pub mod matrix;
pub mod page;
pub mod query;
pub mod reference;
pub mod routes;
pub mod session;
pub mod sessions;
pub mod slices;
pub mod state;
pub mod sweeps;
pub mod workload;

pub use routes::{Access, AdminRoute, ROUTES};
pub use state::{json_error, json_response, read_body, respond, service, unauthorized, AdminState};
