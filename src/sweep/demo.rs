//! `tokentap demo`.
