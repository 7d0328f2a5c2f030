//! `GET /`: the admin page — the verdict, then production ÷ the latest sweep on one grid (shared axes, a fixed
//! scale around ×1, the "why" in each cell), then the two heat maps on the same axes and
//! colour scale, one self-contained HTML document (inline CSS, no scripts, no external
//! assets) that reloads itself every [`REFRESH_SECONDS`] with a meta refresh, so everything is
//! in the DOM without JavaScript. Query: `window=` (1m … 24h, `all`), `model=`, and `tenant=`,
//! `priority=` (the production side narrowed to one tenant or priority band). Below the grids:
//! live headroom, the drift grid (production ÷ the reference pinned for the model, when one
//! is) and the production "All measurements" table (prefill rows included).
//!
//! `serve.rs` answers the request: it reads the query, gathers the documents from the view
//! layer (`admin::view`) and puts the page together; `render.rs` renders the grids, headroom
//! and tables (pure); `slices.rs` the slice filters (tenant, priority band, any registered dimension) and the per-priority table;
//! `header.rs` each upstream's configuration (below the matrices) and a logged-in browser's
//! controls (log out in the header, the sweep form under the synthetic matrix); `verdict.rs`
//! the one verdict (`view::status`) first under the header. Builds only markup around `matrix::html` fragments; the figures come
//! from the view layer. This file only declares and re-exports.

mod header;
mod render;
mod serve;
mod slices;
mod verdict;

pub use render::{render, REFRESH_SECONDS};
pub use serve::handle;
