//! URL redaction: the one way a URL is shown to anyone. Userinfo (`user:secret@`) and query
//! values (`?api_key=…`) are secrets more often than not; every URL tokentap prints, logs,
//! traces, stores or answers goes through [`redact_url`] or is stripped by [`without_userinfo`]
//! before it is kept.

use http::uri::{Authority, Uri};

/// What stands in for a removed secret.
const MASK: &str = "***";

/// `text` with the userinfo of its authority and every query value replaced by `***`
/// (`http://u:p@h/x?key=v&flag` → `http://***@h/x?key=***&flag`). Works on any text, URL or
/// not, and never fails: text that is not a URL comes back with its query values masked.
pub fn redact_url(text: &str) -> String {
    let (before_query, query) = match text.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (text, None),
    };
    let mut out = String::with_capacity(text.len());
    match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            out.push_str(scheme);
            out.push_str("://");
            match authority.rsplit_once('@') {
                Some((_userinfo, host)) => {
                    out.push_str(MASK);
                    out.push('@');
                    out.push_str(host);
                }
                None => out.push_str(authority),
            }
            out.push_str(path);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        let (query, fragment) = match query.split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (query, None),
        };
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, _value)) => {
                    out.push_str(key);
                    out.push('=');
                    out.push_str(MASK);
                }
                None => out.push_str(pair),
            }
        }
        if let Some(fragment) = fragment {
            out.push('#');
            out.push_str(fragment);
        }
    }
    out
}

/// `uri` without userinfo in its authority; `None` if it had none. hyper never turns userinfo
/// into credentials (and HTTP/2 forbids it in `:authority`), so an upstream URL keeps only
/// what can be shown.
pub fn without_userinfo(uri: &Uri) -> Option<Uri> {
    let authority = uri.authority()?;
    let (_userinfo, host) = authority.as_str().rsplit_once('@')?;
    let mut parts = uri.clone().into_parts();
    parts.authority = Some(Authority::try_from(host).ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_and_query_values_are_masked() {
        for (input, expected) in [
            ("http://user:secret@host:8000/v1", "http://***@host:8000/v1"),
            ("https://tok@h", "https://***@h"),
            ("http://h/p?api_key=s3cret&x", "http://h/p?api_key=***&x"),
            (
                "http://u:p@h/p?a=1&b=2#frag",
                "http://***@h/p?a=***&b=***#frag",
            ),
            ("http://host:1/no/creds", "http://host:1/no/creds"),
            ("not a url", "not a url"),
            ("", ""),
            ("http://a@b@c/x", "http://***@c/x"),
            ("http://h/path@not-userinfo", "http://h/path@not-userinfo"),
        ] {
            assert_eq!(redact_url(input), expected, "{input}");
            assert!(!redact_url(input).contains("secret"), "{input}");
        }
    }

    #[test]
    fn userinfo_is_stripped_from_uris() {
        let uri: Uri = "http://user:secret@127.0.0.1:9/base".parse().unwrap();
        let stripped = without_userinfo(&uri).unwrap();
        assert_eq!(stripped.to_string(), "http://127.0.0.1:9/base");
        let plain: Uri = "http://127.0.0.1:9/".parse().unwrap();
        assert_eq!(without_userinfo(&plain), None);
    }
}
