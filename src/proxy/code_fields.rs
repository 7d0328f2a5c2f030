//! Request fields an engine runs as code (`proxy.code_fields`; the fields and the routes whose
//! bodies carry them are declared in the engine home, `base::engine::CodeField`): which field a
//! request may carry, the 403 that refuses it, and the guard for a body too long to be read
//! whole first.
//!
//! A body read whole (up to `metering.max_parse_bytes`) is checked as the engine's parser
//! reads it (`stream::request::carries_field`) and refused before anything goes upstream. A
//! longer one is forwarded as it streams — refusing every large request (a chat with images)
//! would refuse real clients — through [`GuardedBody`]: a scanner reads every JSON string of
//! it with its escapes decoded, and the moment a key named like the field appears, at any
//! depth, the body fails. The upstream then has an incomplete JSON document, which its parser
//! rejects: the field is never read, so no code runs, and the client gets the failure.
//!
//! sglang decompresses a body sent with `x-body-compressed: zstd` before any route reads it
//! (`SGLANG_ENABLE_REQUEST_DECOMPRESSION=1`, `entrypoints/http_request_decompression.py`), so
//! such a body is checked as it will be read: decompressed ([`decompressed`]), at most the parse
//! limit of it. One that cannot be (too long to be read whole, corrupt, or longer than the limit
//! once decompressed) is refused: a field hidden in it could not be ruled out.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::box_error::BoxError;
use super::request_body::DynBody;
use crate::base::engine::CodeField;

/// The header that asks sglang to decompress the body, and the one value it decompresses
/// (`_DECOMPRESSORS`; starlette's `Headers.get` reads the first such header; another value is
/// answered 400 by sglang itself, before any route reads the body).
pub const BODY_COMPRESSED: &str = "x-body-compressed";
const ZSTD: &[u8] = b"zstd";

/// Whether the engine will read this request's body decompressed.
pub fn decompressed_by_engine(headers: &HeaderMap) -> bool {
    headers
        .get(BODY_COMPRESSED)
        .is_some_and(|value| value.as_bytes() == ZSTD)
}

/// The smallest zstd window accepted whatever the parse limit (a frame's window is often larger
/// than its content: 2 MiB at zstd's default level).
const MIN_WINDOW: u64 = 8 << 20;

/// A zstd body as the engine reads it (its first frame, as python-zstandard's `stream_reader`
/// does), at most `limit` bytes of it; else why it cannot be checked.
pub fn decompressed(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
    let window = limit_u64.max(MIN_WINDOW);
    let decoder = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(body, window)
        .map_err(|error| format!("not a zstd frame tokentap can read: {error}"))?;
    let mut out = Vec::new();
    decoder
        .take(limit_u64.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|error| format!("a corrupt zstd frame: {error}"))?;
    if out.len() > limit {
        return Err(format!(
            "longer than metering.max_parse_bytes ({limit} bytes) once decompressed"
        ));
    }
    Ok(out)
}

/// A body tokentap could not read whole, forwarded while a [`FieldScanner`] looks for a field
/// run as code: found, the body fails (the upstream never gets a whole document).
pub struct GuardedBody {
    inner: DynBody,
    scanner: FieldScanner,
    engine: &'static str,
}

impl GuardedBody {
    /// Guards the rest of a body whose first bytes (`read`) were already scanned by `scanner`.
    pub fn new(inner: DynBody, scanner: FieldScanner, engine: &'static str) -> Self {
        Self {
            inner,
            scanner,
            engine,
        }
    }
}

/// The error a guarded body fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body carries `{field}`, which {engine} runs as code: cut off before its end (proxy.code_fields)")]
pub struct CodeFieldInBody {
    pub field: &'static str,
    pub engine: &'static str,
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.scanner.found() {
            return Poll::Ready(Some(Err(this.cut())));
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if this.scanner.feed(data) {
                        // This frame never leaves: the upstream's document stays incomplete.
                        return Poll::Ready(Some(Err(this.cut())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.scanner.found() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl GuardedBody {
    fn cut(&self) -> BoxError {
        Box::new(CodeFieldInBody {
            field: self.scanner.field,
            engine: self.engine,
        })
    }
}

/// Reads JSON text in pieces and says when a string equal to `field` (escapes decoded) is
/// followed by `:` — a member named `field`, at any depth. Pure; constant memory.
#[derive(Debug, Clone)]
pub struct FieldScanner {
    field: &'static str,
    state: State,
    /// The current string's decoded bytes, while they still match the field's start.
    matched: usize,
    /// The current string has not diverged from the field (nor passed its length).
    candidate: bool,
    /// A string equal to the field just closed: a `:` after whitespace makes it a key.
    after_candidate: bool,
    found: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Outside,
    InString,
    Escape,
    /// `\u` and the hex digits read so far, with their value.
    Unicode {
        digits: u8,
        value: u32,
    },
}

impl FieldScanner {
    pub fn new(field: &CodeField) -> Self {
        Self {
            field: field.field,
            state: State::Outside,
            matched: 0,
            candidate: false,
            after_candidate: false,
            found: false,
        }
    }

    pub fn found(&self) -> bool {
        self.found
    }

    /// Reads `bytes`; true once the field has been seen (in these bytes or before).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            if self.found {
                break;
            }
            self.step(byte);
        }
        self.found
    }

    fn step(&mut self, byte: u8) {
        match self.state {
            State::Outside => {
                if self.after_candidate {
                    match byte {
                        b' ' | b'\t' | b'\n' | b'\r' => return,
                        b':' => {
                            self.found = true;
                            return;
                        }
                        _ => self.after_candidate = false,
                    }
                }
                if byte == b'"' {
                    self.state = State::InString;
                    self.matched = 0;
                    self.candidate = true;
                }
            }
            State::InString => match byte {
                b'"' => {
                    self.state = State::Outside;
                    self.after_candidate = self.candidate && self.matched == self.field.len();
                }
                b'\\' => self.state = State::Escape,
                byte => self.decoded(u32::from(byte)),
            },
            State::Escape => {
                self.state = State::InString;
                match byte {
                    b'u' => {
                        self.state = State::Unicode {
                            digits: 0,
                            value: 0,
                        }
                    }
                    b'n' => self.decoded(u32::from(b'\n')),
                    b't' => self.decoded(u32::from(b'\t')),
                    b'r' => self.decoded(u32::from(b'\r')),
                    b'b' => self.decoded(8),
                    b'f' => self.decoded(12),
                    other => self.decoded(u32::from(other)),
                }
            }
            State::Unicode { digits, value } => {
                let Some(digit) = char::from(byte).to_digit(16) else {
                    // Not JSON: the engine's parser rejects it; nothing to match.
                    self.state = State::InString;
                    self.candidate = false;
                    return;
                };
                let value = value * 16 + digit;
                if digits == 3 {
                    self.state = State::InString;
                    self.decoded(value);
                } else {
                    self.state = State::Unicode {
                        digits: digits + 1,
                        value,
                    };
                }
            }
        }
    }

    /// One decoded character (a byte of ASCII, or any code point) of the current string.
    fn decoded(&mut self, character: u32) {
        if !self.candidate {
            return;
        }
        let expected = self.field.as_bytes().get(self.matched);
        if expected.is_some_and(|&b| u32::from(b) == character) {
            self.matched += 1;
        } else {
            self.candidate = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELD: CodeField = CodeField {
        field: "custom_logit_processor",
        routes: &["/generate"],
        opened_by: "--enable-custom-logit-processor",
    };

    fn found_in_pieces(text: &str) -> bool {
        // Every split in two, and byte by byte: the answer does not depend on the pieces.
        let bytes = text.as_bytes();
        let whole = FieldScanner::new(&FIELD).feed(bytes);
        for at in 0..=bytes.len() {
            let mut scanner = FieldScanner::new(&FIELD);
            scanner.feed(&bytes[..at]);
            assert_eq!(scanner.feed(&bytes[at..]), whole, "{text} split at {at}");
        }
        let mut scanner = FieldScanner::new(&FIELD);
        for byte in bytes {
            scanner.feed(std::slice::from_ref(byte));
        }
        assert_eq!(scanner.found(), whole, "{text} byte by byte");
        whole
    }

    #[test]
    fn a_key_named_like_the_field_is_found_however_it_is_written_and_wherever() {
        for text in [
            r#"{"text":"hi","custom_logit_processor":"8004"}"#,
            r#"{"custom\u005flogit_processor" : 1}"#,
            r#"{"a":{"b":[{"\u0063ustom_logit_processor":null}]}}"#,
            "{\"custom_logit_processor\"\n:\"x\"}",
            r#"{"x":"\"","custom_logit_processor":1}"#,
        ] {
            assert!(found_in_pieces(text), "{text}");
        }
    }

    #[test]
    fn the_name_as_a_value_or_inside_a_longer_string_is_not_a_key() {
        for text in [
            r#"{"text":"custom_logit_processor"}"#,
            r#"{"text":"custom_logit_processor", "b": 1}"#,
            r#"{"text":"what is \"custom_logit_processor\":"}"#,
            r#"{"custom_logit_processors":1}"#,
            r#"{"xcustom_logit_processor":1}"#,
            r#"{"text":"hi"}"#,
        ] {
            assert!(!found_in_pieces(text), "{text}");
        }
    }
}
