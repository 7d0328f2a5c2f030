//! The admin listener: health, readiness, Prometheus metrics, the matrix (`matrix`), the page
//! (`page`), live headroom (`capacity`), the captured workload (`workload`), the sweep API
//! (`sweeps`) and the reference API (`reference`); starting sweeps and pinning references always
//! need the token. Bound to loopback by default; with `admin.token` set, everything but
//! `/healthz` and `/readyz` needs `Authorization: Bearer <token>`, or, for reading (`GET`) and
//! the page's own sweep form, a browser session from `POST /login` (`session`). A browser asking
//! for HTML without either is sent to the login form.
//!
//! The files stand on four floors, each importing only from the floors below it:
//!
//! 1. `sessions.rs`, the session table and the failed-credential record, as data; `view/`, the
//!    figures the page and the endpoints share (the production and synthetic matrices,
//!    production ÷ the reference, live headroom), read from a `View` the state lends it.
//! 2. `state.rs`: `AdminState`, the credential checks (the bearer token, throttled per client
//!    address; browser sessions; the `Host` check that keeps a token-less admin to loopback
//!    names), the response helpers, the hyper service; `query.rs`: the query strings, decoded
//!    one way, and the query `/matrix` and `/` share.
//! 3. The endpoint files, one per family, importing only `state`, `query` and `view`:
//!    `matrix.rs` (`/matrix`), `conversations.rs` (`/matrix?view=sessions`), `page/` (`/`), `capacity.rs` (`/capacity`, the capacity gauges),
//!    `status.rs` (`/status`, the one verdict),
//!    `sweeps.rs` (the sweep API), `reference.rs` (the reference API), `workload.rs`
//!    (`/workload`, streamed), `session.rs` (`/login`, `/logout`, the page's CSRF-checked forms).
//! 4. `routes.rs`: the route table (method, path, access, handler); access is checked from the
//!    table before any handler runs.
//!
//! This file only declares and re-exports.

pub mod capacity;
pub mod conversations;
pub mod matrix;
pub mod page;
pub mod query;
pub mod reference;
pub mod routes;
pub mod session;
pub mod sessions;
pub mod state;
pub mod status;
pub mod sweeps;
pub mod view;
pub mod workload;

pub use routes::{Access, AdminRoute, ROUTES};
pub use state::{
    json_error, json_response, read_body, respond, service, unauthorized, AdminState, LoginBodies,
};
