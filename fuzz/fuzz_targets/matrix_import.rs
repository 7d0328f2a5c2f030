//! Any text through the matrix importers (seed text, Markdown, JSON): errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = tokentap::matrix::parse_any(text);
    }
});
