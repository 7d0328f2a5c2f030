//! A request's id: the one its client sent (`x-request-id`), when it is safe to repeat, else
//! one tokentap makes. It ties the timing handed back to a client (`Server-Timing`) to the
//! record, the span and the logs of its request.
//!
//! A client's value is repeated back to it and written into traces, so only a short run of
//! visible ASCII is taken as it is; anything else (empty, longer than [`MAX_REQUEST_ID_BYTES`],
//! spaces, control bytes, non-ASCII) is replaced by tokentap's own id, never cut or edited.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderName};

/// The request header a client names its request by.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client id taken as it is.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// The client's id when it is one run of 1 to [`MAX_REQUEST_ID_BYTES`] visible ASCII bytes
/// (`!` to `~`); `None` when it sent none, several, or an unsafe one.
pub fn from_client(headers: &HeaderMap) -> Option<Arc<str>> {
    let mut values = headers.get_all(&REQUEST_ID_HEADER).iter();
    let value = values.next()?;
    if values.next().is_some() {
        // Two ids name no one request.
        return None;
    }
    let bytes = value.as_bytes();
    let visible = !bytes.is_empty()
        && bytes.len() <= MAX_REQUEST_ID_BYTES
        && bytes.iter().all(|b| (b'!'..=b'~').contains(b));
    visible
        .then(|| std::str::from_utf8(bytes).ok())
        .flatten()
        .map(Arc::from)
}

/// A fresh id of tokentap's own: `tt-` and 16 hex digits, a counter hashed under a key drawn
/// once per process (std's random SipHash keys), so ids neither repeat within a process nor
/// follow on from another process's.
pub fn generate() -> Arc<str> {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    let mut hasher = keys.build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    Arc::from(format!("tt-{:016x}", hasher.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                REQUEST_ID_HEADER,
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn a_visible_ascii_id_is_taken_and_anything_else_is_not() {
        assert_eq!(
            from_client(&with(&[b"req-42/a:b"])).as_deref(),
            Some("req-42/a:b")
        );
        assert_eq!(from_client(&with(&[])), None);
        assert_eq!(from_client(&with(&[b""])), None);
        assert_eq!(from_client(&with(&[b"a b"])), None, "a space");
        assert_eq!(from_client(&with(&[b"a\tb"])), None, "a tab");
        assert_eq!(from_client(&with(&["é".as_bytes()])), None, "not ASCII");
        assert_eq!(from_client(&with(&[b"a", b"b"])), None, "two ids");
        let longest = "x".repeat(MAX_REQUEST_ID_BYTES);
        assert_eq!(
            from_client(&with(&[longest.as_bytes()])).as_deref(),
            Some(longest.as_str())
        );
        let longer = "x".repeat(MAX_REQUEST_ID_BYTES + 1);
        assert_eq!(from_client(&with(&[longer.as_bytes()])), None);
    }

    #[test]
    fn generated_ids_differ_and_are_safe_to_repeat() {
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 19, "{id}");
            assert!(from_client(&with(&[id.as_bytes()])).is_some(), "{id}");
        }
    }
}
