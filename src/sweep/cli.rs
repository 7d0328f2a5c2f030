//! `tokentap sweep`.
