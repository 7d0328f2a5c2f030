//! The speed-test matrix: one document type for production and synthetic results, its importers
//! (seed page text, Markdown, JSON), its renderings (Markdown, JSON, CSV, HTML, SVG, an aligned terminal table,
//! llm-d benchmark reports), the diff of
//! two matrices, the drift of production against a pinned reference (`compare`) and what a simulator can infer from one.
//!
//! Everything here is pure (strings and structs in, strings and structs out) except `file`, which
//! reads files for the commands and other modules (the `tokentap matrix` command is `app::matrix`). Producers
//! (sweep engine, production aggregator) build a [`MatrixDoc`] in code and call
//! [`MatrixDoc::validate`]; consumers render it with the functions re-exported here.
//!
//! The crate `tokentap-matrix` (`tokentap::matrix`), on `tokentap-base` only: the format cannot
//! reach the proxy (the compiler keeps that).
pub mod advise;
pub mod capacity;
pub mod compare;
pub mod csv;
pub mod diff;
pub mod doc;
pub mod evidence;
pub mod facts;
pub mod file;
pub mod format;
pub mod grid;
pub mod html;
pub mod import;
pub mod infer;
pub mod llmd;
pub mod markdown;
pub mod notes;
pub mod page;
pub mod redact;
pub mod seed;
pub mod side_by_side;
pub mod svg;
pub mod table;
pub mod text_import;
pub mod units;
pub mod validate;

pub use diff::{diff, DiffColumn, MatrixDiff};
pub use doc::{
    CellStatus, DecodeCell, Engine, Fact, FirstTokens, Hardware, MatrixDoc, Metadata, ModelInfo,
    PrefillRow, PromptCache, RunInfo, Source, Tails, SCHEMA,
};
pub use evidence::EvidenceRule;
pub use file::{load, LoadError};
pub use format::Format;
pub use import::{parse_any, ImportError};
pub use markdown::render_markdown;
pub use redact::redact_launch_command;
pub use table::render_table;
pub use validate::ValidationError;

/// The stable JSON rendering (pretty-printed, fields in struct order, trailing newline).
pub fn render_json(doc: &MatrixDoc) -> String {
    tokentap_base::json::pretty_json_line(doc)
}
