//! Query-string values: decoding `%XX` and `+` the one way every admin endpoint does.

/// Decodes `%XX` and `+` in a query value; `None` for bad escapes or non-UTF-8.
///
/// The crate passes a malformed escape through as text; a query naming a model that way is a
/// mistake worth a 400, so every `%` must start a two-digit hex escape.
pub fn percent_decode(text: &str) -> Option<String> {
    let escapes_well_formed = text.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_well_formed {
        return None;
    }
    // A literal `+` arrives as `%2B`, so turning `+` into a space first is exact.
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}
