//! The speed-test matrix document: schema, import, renderers and diff. Placeholder.
pub mod cli;
