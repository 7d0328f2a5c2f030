//! The phases of `Proxy::handle`, in order, one file each: `admit` (where a request goes and
//! whether it may: routing, the route policy), `read` (its body, within the body limits),
//! `prepare` (the body inspected, usage options injected, the prompt fingerprinted), `start`
//! (what the request is recorded as, handed to the meter as one start record), `forward` (the
//! upstream's answer, measured on the way back) and `fail` (tokentap's own answer when the
//! upstream gave none). Each phase goes on with what it made of the request, forwards it as it
//! is, unmetered, or answers now (`service::Step`). This file only declares.

mod admit;
mod fail;
mod forward;
mod prepare;
mod read;
mod start;
