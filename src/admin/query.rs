//! Query-string values: decoding `%XX` and `+` the one way every admin endpoint does, and
//! escaping a value for the page's links.

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

/// What a model name keeps unescaped in a query string: letters, digits and `-._~/`.
const QUERY_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Escapes a model name for a query string (the reverse of `percent_decode`).
pub fn query_escape(text: &str) -> String {
    let out = percent_encoding::utf8_percent_encode(text, QUERY_ESCAPED).to_string();
    debug_assert_eq!(percent_decode(&out).as_deref(), Some(text));
    out
}
