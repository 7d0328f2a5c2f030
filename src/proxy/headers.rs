//! Header hygiene between client and upstream: hop-by-hop headers are per connection
//! (RFC 9110 §7.6.1) and must not be forwarded; everything else is. Two are about the message
//! and pass: `TE: trailers` (the client takes trailers: without it the upstream may not send
//! them, and hyper sends an HTTP/1 client none) and `Trailer` (which trailer fields follow).

use http::header::{self, HeaderMap, HeaderName};

/// Headers that describe one connection, never the message.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
    // TE: only `trailers` is about the message (and the only value HTTP/2 allows).
    let trailers = takes_trailers(headers);
    headers.remove(header::TE);
    if trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
}

/// True when a request says its client takes trailers (`TE: trailers`, RFC 9110 §10.1.4):
/// hyper's HTTP/1 server sends a response's trailers only then.
pub fn takes_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

/// True when a response's `Trailer` header already names `field` (any case, any list).
pub fn announces_trailer(headers: &HeaderMap, field: &str) -> bool {
    headers
        .get_all(header::TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|name| name.trim().eq_ignore_ascii_case(field))
}

/// True for `text/event-stream` (any parameters).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_connection_scoped_headers_only() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        headers.insert("x-private", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        headers.insert(
            header::CONTENT_TYPE,
            "text/event-stream; charset=utf-8".parse().unwrap(),
        );
        headers.insert(header::TE, "gzip, trailers;q=1".parse().unwrap());
        headers.insert(header::TRAILER, "x-checksum".parse().unwrap());
        remove_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 4);
        assert!(headers.contains_key(header::AUTHORIZATION));
        assert_eq!(headers[header::TE], "trailers");
        assert_eq!(headers[header::TRAILER], "x-checksum");
        assert!(is_event_stream(&headers));
        let mut headers = HeaderMap::new();
        headers.insert(header::TE, "gzip".parse().unwrap());
        remove_hop_by_hop(&mut headers);
        assert!(headers.is_empty());
    }
}
