//! A borrowing, allocation-free JSON navigator for SSE event payloads.
//!
//! The hot path must not allocate per event, so instead of deserialising each chunk we walk
//! its bytes: find a member of an object, iterate an array, read an unsigned integer, ask
//! whether a string is empty. Every function takes a byte slice and a position, returns
//! positions into that same slice, never recurses (nesting is tracked with a counter, so
//! hostile depth cannot overflow the stack) and returns `None` on anything malformed. It
//! validates only as much as it needs: a payload that is not JSON yields `None`, not a panic.
//!
//! It reads JSON the way the servers behind tokentap do (Python's `json`, under pydantic,
//! sglang and vLLM): key names are compared after decoding their escapes
//! (`"stream\u005foptions"` is `stream_options`), and when a key occurs twice in an object the
//! last one wins. Reading a request differently from the server would make tokentap inject or
//! strip usage the client did or did not ask for.

/// The byte span `[start, end)` of one JSON value inside a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    /// The raw bytes of the value.
    pub fn bytes<'a>(&self, json: &'a [u8]) -> &'a [u8] {
        json.get(self.start..self.end).unwrap_or_default()
    }
}

/// One `"key": value` member of an object: the span of the key (quotes included) and of
/// the value. `key.start` is where a member removal must start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub key: Span,
    pub value: Span,
}

fn is_ws(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Index of the first non-whitespace byte at or after `pos`.
pub fn skip_ws(json: &[u8], mut pos: usize) -> usize {
    while json.get(pos).is_some_and(|&b| is_ws(b)) {
        pos += 1;
    }
    pos
}

/// End (exclusive) of the string whose opening quote is at `pos`.
fn string_end(json: &[u8], pos: usize) -> Option<usize> {
    if json.get(pos) != Some(&b'"') {
        return None;
    }
    let mut i = pos + 1;
    loop {
        let rest = json.get(i..)?;
        i += quote_or_backslash(rest)?;
        match json.get(i)? {
            b'"' => return Some(i + 1),
            _ => i += 2, // a backslash escapes the next byte
        }
    }
}

/// Index of the first `"` or `\\` in `bytes`. Most strings of an event are short (member
/// names, `"id"`), where a plain loop beats the SIMD search's setup; its text, ids and model
/// names are longer, where the SIMD search wins.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const SHORT: usize = 16;
    let (head, tail) = bytes.split_at(bytes.len().min(SHORT));
    match head.iter().position(|&b| b == b'"' || b == b'\\') {
        Some(at) => Some(at),
        None => memchr::memchr2(b'"', b'\\', tail).map(|at| at + head.len()),
    }
}

/// End (exclusive) of the value starting at `pos` (after whitespace). Objects and arrays are
/// skipped with a depth counter; strings inside them are honoured, escapes included.
pub fn value_end(json: &[u8], pos: usize) -> Option<usize> {
    let pos = skip_ws(json, pos);
    match *json.get(pos)? {
        b'"' => string_end(json, pos),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = pos;
            loop {
                // Straight to the next byte that matters: one tight scan of the slice, not a
                // bounds-checked step per byte (the top metering symbol in a proxy profile).
                let rest = json.get(i..)?;
                i += rest
                    .iter()
                    .position(|&b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))?;
                match *json.get(i)? {
                    b'"' => {
                        i = string_end(json, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            // Number, true, false, null: runs until a structural byte or whitespace.
            let mut i = pos;
            while let Some(&b) = json.get(i) {
                if matches!(b, b',' | b'}' | b']') || is_ws(b) {
                    break;
                }
                i += 1;
            }
            (i > pos).then_some(i)
        }
    }
}

/// Iterates the members of the object whose `{` is at `start` (after whitespace).
#[derive(Debug, Clone)]
pub struct Members<'a> {
    json: &'a [u8],
    pos: usize,
    done: bool,
}

/// Members of the object value at `start`; an empty iterator if it is not an object.
pub fn members(json: &[u8], start: usize) -> Members<'_> {
    let start = skip_ws(json, start);
    let ok = json.get(start) == Some(&b'{');
    Members {
        json,
        pos: start + 1,
        done: !ok,
    }
}

impl Iterator for Members<'_> {
    type Item = Member;

    fn next(&mut self) -> Option<Member> {
        if self.done {
            return None;
        }
        let result = self.step();
        if result.is_none() {
            self.done = true;
        }
        result
    }
}

impl Members<'_> {
    fn step(&mut self) -> Option<Member> {
        let json = self.json;
        let mut pos = skip_ws(json, self.pos);
        if json.get(pos) == Some(&b',') {
            pos = skip_ws(json, pos + 1);
        }
        if json.get(pos) != Some(&b'"') {
            return None; // `}` or malformed: either way, no more members
        }
        let key_end = string_end(json, pos)?;
        let colon = skip_ws(json, key_end);
        if json.get(colon) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(json, colon + 1);
        let value_end = value_end(json, value_start)?;
        self.pos = value_end;
        Some(Member {
            key: Span {
                start: pos,
                end: key_end,
            },
            value: Span {
                start: value_start,
                end: value_end,
            },
        })
    }
}

/// Iterates the element spans of the array whose `[` is at `start`.
#[derive(Debug, Clone)]
pub struct Elements<'a> {
    json: &'a [u8],
    pos: usize,
    done: bool,
}

/// Elements of the array value at `start`; an empty iterator if it is not an array.
pub fn elements(json: &[u8], start: usize) -> Elements<'_> {
    let start = skip_ws(json, start);
    let ok = json.get(start) == Some(&b'[');
    Elements {
        json,
        pos: start + 1,
        done: !ok,
    }
}

impl Iterator for Elements<'_> {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        if self.done {
            return None;
        }
        let json = self.json;
        let mut pos = skip_ws(json, self.pos);
        if json.get(pos) == Some(&b',') {
            pos = skip_ws(json, pos + 1);
        }
        if matches!(json.get(pos), None | Some(b']')) {
            self.done = true;
            return None;
        }
        let Some(end) = value_end(json, pos) else {
            self.done = true;
            return None;
        };
        self.pos = end;
        Some(Span { start: pos, end })
    }
}

/// The member `key` (given without quotes and escapes) of the object at `start`: the last one
/// whose decoded name is `key`, as the server's parser reads it.
pub fn member(json: &[u8], start: usize, key: &[u8]) -> Option<Member> {
    let [found] = last_members(json, start, [key]);
    found
}

/// The last member named by each of `keys` (decoded) in the object at `start`, found in one
/// pass: reading several fields of a large request body costs one walk over it, not one per
/// field.
pub fn last_members<const N: usize>(
    json: &[u8],
    start: usize,
    keys: [&[u8]; N],
) -> [Option<Member>; N] {
    let mut found = [None; N];
    for member in members(json, start) {
        let Some(raw) = key_raw(json, &member) else {
            continue;
        };
        // Looked at once per member, not once per key: names almost never carry escapes.
        let escaped = raw.contains(&b'\\');
        for (slot, key) in found.iter_mut().zip(keys) {
            if (!escaped && raw == key) || (escaped && decodes_to(raw, key)) {
                *slot = Some(member);
            }
        }
    }
    found
}

/// How many members of the object at `start` are named `key` (decoded).
pub fn member_count(json: &[u8], start: usize, key: &[u8]) -> usize {
    members(json, start)
        .filter(|m| key_is(json, m, key))
        .count()
}

fn key_is(json: &[u8], member: &Member, key: &[u8]) -> bool {
    key_raw(json, member).is_some_and(|raw| decodes_to(raw, key))
}

/// A member's name as written, between its quotes.
fn key_raw<'a>(json: &'a [u8], member: &Member) -> Option<&'a [u8]> {
    json.get(member.key.start + 1..member.key.end.checked_sub(1)?)
}

/// Whether the contents of a JSON string as written (`raw`, between the quotes) decode to
/// `expected`. Decodes escapes on the fly (`\n`, `\u005f`, surrogate pairs), allocating
/// nothing; a malformed escape or a lone surrogate never equals anything.
pub fn decodes_to(raw: &[u8], expected: &[u8]) -> bool {
    if !raw.contains(&b'\\') {
        return raw == expected;
    }
    let mut i = 0;
    let mut j = 0;
    while let Some(&byte) = raw.get(i) {
        if byte != b'\\' {
            if expected.get(j) != Some(&byte) {
                return false;
            }
            i += 1;
            j += 1;
            continue;
        }
        let Some((decoded, consumed)) = escape_at(raw, i) else {
            return false;
        };
        let mut utf8 = [0u8; 4];
        let encoded = decoded.encode_utf8(&mut utf8).as_bytes();
        if expected.get(j..j + encoded.len()) != Some(encoded) {
            return false;
        }
        i += consumed;
        j += encoded.len();
    }
    j == expected.len()
}

/// The character of the escape whose backslash is at `raw[at]`, and its length as written.
fn escape_at(raw: &[u8], at: usize) -> Option<(char, usize)> {
    let simple = match *raw.get(at + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let high = hex4(raw, at + 2)?;
            if !(0xD800..0xDC00).contains(&high) {
                // A BMP character, or a lone low surrogate (`from_u32` refuses it).
                return Some((char::from_u32(high)?, 6));
            }
            // A surrogate pair: `\uD83D\uDE00`.
            if raw.get(at + 6..at + 8) != Some(b"\\u") {
                return None;
            }
            let low = hex4(raw, at + 8)?;
            if !(0xDC00..0xE000).contains(&low) {
                return None;
            }
            let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
            return Some((char::from_u32(code)?, 12));
        }
        _ => return None,
    };
    Some((simple, 2))
}

/// Four hex digits at `raw[at..at + 4]`.
fn hex4(raw: &[u8], at: usize) -> Option<u32> {
    let digits = raw.get(at..at + 4)?;
    let mut value = 0;
    for &digit in digits {
        value = value * 16 + char::from(digit).to_digit(16)?;
    }
    Some(value)
}

/// The value span of `key` in the object at `start`.
pub fn get(json: &[u8], start: usize, key: &[u8]) -> Option<Span> {
    member(json, start, key).map(|m| m.value)
}

/// Walks a path of object keys from the object at `start`.
pub fn path(json: &[u8], start: usize, keys: &[&[u8]]) -> Option<Span> {
    let mut span = Span {
        start: skip_ws(json, start),
        end: json.len(),
    };
    for key in keys {
        span = get(json, span.start, key)?;
    }
    Some(span)
}

/// True if the span is the literal `null`.
pub fn is_null(json: &[u8], span: Span) -> bool {
    span.bytes(json) == b"null"
}

/// True if the span is a JSON string with at least one character.
pub fn is_nonempty_string(json: &[u8], span: Span) -> bool {
    let raw = span.bytes(json);
    raw.len() > 2 && raw.first() == Some(&b'"')
}

/// Length in raw bytes of a string's contents (escapes counted as written); `None` if the
/// span is not a string. Used to see whether cumulative `/generate` text grew.
pub fn string_raw_len(json: &[u8], span: Span) -> Option<usize> {
    let raw = span.bytes(json);
    (raw.len() >= 2 && raw.first() == Some(&b'"')).then(|| raw.len() - 2)
}

/// True if the span is an array with at least one element.
pub fn is_nonempty_array(json: &[u8], span: Span) -> bool {
    elements(json, span.start).next().is_some()
}

/// True if the span is an empty array `[]`.
pub fn is_empty_array(json: &[u8], span: Span) -> bool {
    span.bytes(json).first() == Some(&b'[') && elements(json, span.start).next().is_none()
}

/// True if the span holds a string that decodes to `expected`.
pub fn string_eq(json: &[u8], span: Span, expected: &[u8]) -> bool {
    let raw = span.bytes(json);
    raw.len() >= 2
        && raw.first() == Some(&b'"')
        && raw
            .get(1..raw.len() - 1)
            .is_some_and(|contents| decodes_to(contents, expected))
}

/// The JSON integer at `span`, signed (`-3`, `7`), saturating at `i64`'s bounds; `None` for
/// anything else (a fraction, an exponent, a string): the request's `priority`.
pub fn as_i64(json: &[u8], span: Span) -> Option<i64> {
    let raw = span.bytes(json);
    let (negative, digits) = match raw.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, raw),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i64 = 0;
    for &b in digits {
        value = value.saturating_mul(10).saturating_add(i64::from(b - b'0'));
    }
    Some(if negative {
        value.saturating_neg()
    } else {
        value
    })
}

/// Reads a non-negative integer (a JSON number without sign, fraction or exponent; a
/// fraction like `12.0` is accepted and truncated). Saturates instead of overflowing.
pub fn as_u64(json: &[u8], span: Span) -> Option<u64> {
    let raw = span.bytes(json);
    let digits_end = raw
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(raw.len());
    if digits_end == 0 {
        return None;
    }
    let rest = raw.get(digits_end..).unwrap_or_default();
    if !(rest.is_empty()
        || (rest.first() == Some(&b'.') && rest[1..].iter().all(u8::is_ascii_digit)))
    {
        return None;
    }
    let mut value: u64 = 0;
    for &b in raw.get(..digits_end).unwrap_or_default() {
        value = value.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    Some(value)
}

/// The value span of a top-level member, with whitespace-insensitive start.
pub fn top(json: &[u8], key: &[u8]) -> Option<Span> {
    get(json, 0, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: &[u8] = br#"{"id":"x","choices":[{"index":0,"delta":{"reasoning_content":null,"content":"Hi \"there\""},"finish_reason":null}],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#;

    #[test]
    fn navigates_nested_members() {
        let choices = top(CHUNK, b"choices").unwrap();
        let first = elements(CHUNK, choices.start).next().unwrap();
        let content = path(CHUNK, first.start, &[b"delta", b"content"]).unwrap();
        assert_eq!(content.bytes(CHUNK), br#""Hi \"there\"""#);
        assert!(is_nonempty_string(CHUNK, content));
        let reasoning = path(CHUNK, first.start, &[b"delta", b"reasoning_content"]).unwrap();
        assert!(is_null(CHUNK, reasoning));
        let cached = path(
            CHUNK,
            0,
            &[b"usage", b"prompt_tokens_details", b"cached_tokens"],
        )
        .unwrap();
        assert_eq!(as_u64(CHUNK, cached), Some(8));
        assert_eq!(
            as_u64(
                CHUNK,
                path(CHUNK, 0, &[b"usage", b"completion_tokens"]).unwrap()
            ),
            Some(3)
        );
    }

    #[test]
    fn member_spans_cover_key_and_value() {
        let m = member(CHUNK, 0, b"usage").unwrap();
        assert_eq!(
            CHUNK[m.key.start..m.key.end].to_vec(),
            br#""usage""#.to_vec()
        );
        assert_eq!(CHUNK[m.value.end], b'}');
        assert_eq!(m.value.end + 1, CHUNK.len());
    }

    #[test]
    fn empty_and_malformed_inputs_yield_none() {
        for input in [
            &b""[..],
            b"{",
            b"{\"a\"",
            b"{\"a\":",
            b"{\"a\":[1,2",
            b"[DONE]",
            b"\"unterminated",
            b"{\"a\":\"\\",
            b"}}}}",
            b"nul",
        ] {
            let _ = top(input, b"a");
            let _ = value_end(input, 0);
            let _ = elements(input, 0).count();
            let _ = members(input, 0).count();
        }
        assert_eq!(top(b"{\"a\":", b"a"), None);
        assert!(is_empty_array(b"[ ]", Span { start: 0, end: 3 }));
        assert!(!is_nonempty_string(b"\"\"", Span { start: 0, end: 2 }));
    }

    #[test]
    fn numbers_are_read_defensively() {
        let span = |s: &'static [u8]| {
            (
                s,
                Span {
                    start: 0,
                    end: s.len(),
                },
            )
        };
        for (input, expected) in [
            (&b"0"[..], Some(0)),
            (b"4096", Some(4096)),
            (b"12.0", Some(12)),
            (b"-1", None),
            (b"1e3", None),
            (b"null", None),
            (b"99999999999999999999999", Some(u64::MAX)),
        ] {
            let (json, s) = span(input);
            assert_eq!(
                as_u64(json, s),
                expected,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn the_last_of_duplicate_keys_wins_as_in_python() {
        let json = br#"{"a":1,"b":2,"a":3}"#;
        assert_eq!(as_u64(json, top(json, b"a").unwrap()), Some(3));
        assert_eq!(member_count(json, 0, b"a"), 2);
        let nested = br#"{"o":{},"o":{"k":true}}"#;
        assert_eq!(
            path(nested, 0, &[b"o", b"k"]).unwrap().bytes(nested),
            b"true"
        );
    }

    #[test]
    fn key_names_are_compared_after_decoding_escapes() {
        let json = br#"{"stream\u005foptions":{"include\u005Fusage":true},"\"q\"":1,"\ud83d\ude00":2,"t\tab":3}"#;
        assert_eq!(
            path(json, 0, &[b"stream_options", b"include_usage"])
                .unwrap()
                .bytes(json),
            b"true"
        );
        assert_eq!(as_u64(json, top(json, b"\"q\"").unwrap()), Some(1));
        assert_eq!(
            as_u64(json, top(json, "\u{1F600}".as_bytes()).unwrap()),
            Some(2)
        );
        assert_eq!(as_u64(json, top(json, b"t\tab").unwrap()), Some(3));
        // Malformed escapes and lone surrogates equal nothing; nothing panics.
        for raw in [
            &br"\u00"[..],
            br"\x",
            br"\ud83d",
            br"\ud83d\u0041",
            br"\",
            br"\u12G4",
            br"\udc00",
        ] {
            assert!(!decodes_to(raw, b"x"));
            assert!(!decodes_to(raw, b""));
        }
        let stop = br#""message\u005fstop""#;
        let span = Span {
            start: 0,
            end: stop.len(),
        };
        assert!(string_eq(stop, span, b"message_stop"));
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics_and_agrees_with_serde(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24)) {
            let _ = decodes_to(&raw, b"stream_options");
            let mut quoted = vec![b'"'];
            quoted.extend_from_slice(&raw);
            quoted.push(b'"');
            if let Ok(decoded) = serde_json::from_slice::<String>(&quoted) {
                proptest::prop_assert!(decodes_to(&raw, decoded.as_bytes()));
            }
        }
    }

    #[test]
    fn a_string_ends_at_its_quote_on_either_side_of_the_short_scan() {
        // The first 16 bytes are searched by a loop, the rest by memchr: a quote or an escape
        // at every position up to well past that seam.
        for len in 0..48 {
            let mut plain = vec![b'"'];
            plain.extend(std::iter::repeat_n(b'a', len));
            plain.extend_from_slice(br#"","#);
            assert_eq!(string_end(&plain, 0), Some(len + 2), "{len} plain bytes");
            let mut escaped = vec![b'"'];
            escaped.extend(std::iter::repeat_n(b'a', len));
            escaped.extend_from_slice(b"\\\"b\",");
            assert_eq!(
                string_end(&escaped, 0),
                Some(len + 5),
                "an escape after {len} bytes"
            );
            let unterminated = &plain[..len + 1];
            assert_eq!(string_end(unterminated, 0), None);
        }
    }

    #[test]
    fn several_keys_found_in_one_walk_decode_escaped_names_and_take_the_last() {
        let json = br#"{"a":1,"b\u0061":2,"\u0061":3,"c":4,"ba":5}"#;
        let [a, ba, c, missing] = last_members(json, 0, [b"a", b"ba", b"c", b"d"]);
        let value = |m: Option<Member>| m.and_then(|m| as_u64(json, m.value));
        assert_eq!(value(a), Some(3), "the escaped name is the later `a`");
        assert_eq!(value(ba), Some(5));
        assert_eq!(value(c), Some(4));
        assert_eq!(missing, None);
    }

    #[test]
    fn deep_nesting_does_not_recurse() {
        let mut deep = vec![b'['; 1_000_000];
        deep.extend(vec![b']'; 1_000_000]);
        assert_eq!(value_end(&deep, 0), Some(deep.len()));
    }
}
