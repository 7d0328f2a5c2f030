//! The admin's query strings: decoding `%XX` and `+` the one way every admin endpoint does,
//! escaping a value for the page's links, the renderings a `?format=` may name, and the query
//! `/matrix` and `/` share ([`MatrixQuery`]), parsed and checked against what the proxy counts.

use crate::aggregate::{Window, DEFAULT_WINDOW};
use crate::base::Source;
use crate::matrix::Format;
use crate::meter::labels::{dimension_named, dimensions, SliceFilter, TENANT};

use super::view::{FingerprintChoice, View};

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

/// Renderings `/matrix` offers.
pub const OFFERED: [Format; 6] = [
    Format::Json,
    Format::Markdown,
    Format::Csv,
    Format::Html,
    Format::Svg,
    Format::Llmd,
];

/// The renderings of a sweep's (or a reference's) matrix alone (`?format=`; `status`, the
/// default, is the whole status).
pub const MATRIX_ALONE: [Format; 3] = [Format::Json, Format::Markdown, Format::Html];

/// The query parameters `/matrix` and `/` understand, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixQuery {
    pub source: Source,
    pub window: Window,
    pub format: Option<Format>,
    pub model: Option<String>,
    /// `compare=reference`: production ÷ the pinned reference instead of a matrix.
    pub compare_reference: bool,
    /// The upstream whose reference to compare with (default: where the model is routed).
    pub upstream: Option<String>,
    /// `fingerprint=current|all|ID`: which configurations the production matrix covers.
    pub fingerprint: FingerprintChoice,
    /// `compare=previous`: the current configuration ÷ the previous one.
    pub compare_previous: bool,
    /// `tenant=NAME`, `priority=BAND`, any slice dimension's `NAME=VALUE`: one slice of the
    /// traffic (taken where `allowed` names `tenant`).
    pub slice: SliceFilter,
}

impl MatrixQuery {
    /// Parses a query string; the error names the parameter and what it accepts.
    pub fn parse(query: Option<&str>, allowed: &[&str]) -> Result<MatrixQuery, String> {
        let mut parsed = MatrixQuery {
            source: Source::Production,
            window: DEFAULT_WINDOW,
            format: None,
            model: None,
            compare_reference: false,
            upstream: None,
            fingerprint: FingerprintChoice::Current,
            compare_previous: false,
            slice: SliceFilter::default(),
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or_else(|| {
                format!("query parameter `{key}` is not valid percent-encoded UTF-8")
            })?;
            let sliced = allowed.contains(&TENANT.name);
            let a_dimension = sliced && dimension_named(key).is_some();
            if !allowed.contains(&key) && !a_dimension {
                let mut takes: Vec<&str> = allowed.to_vec();
                if sliced {
                    takes.extend(dimensions().iter().map(|d| d.name));
                    takes.dedup();
                }
                return Err(format!(
                    "unknown query parameter `{key}`; this endpoint takes {}",
                    takes.join(", ")
                ));
            }
            match key {
                "source" => {
                    parsed.source = Source::parse(&value).ok_or_else(|| {
                        format!("source `{value}`: expected production or synthetic")
                    })?;
                }
                "window" => parsed.window = Window::parse(&value).map_err(|e| e.to_string())?,
                "format" => {
                    parsed.format = Some(Format::parse_among(&value, &OFFERED)?);
                }
                "model" if !value.is_empty() => parsed.model = Some(value),
                "upstream" if !value.is_empty() => parsed.upstream = Some(value),
                "compare" => match &*value {
                    "reference" => parsed.compare_reference = true,
                    "previous" => parsed.compare_previous = true,
                    _ => {
                        return Err(format!(
                            "compare `{value}`: expected compare=reference or compare=previous"
                        ))
                    }
                },
                "fingerprint" => {
                    parsed.fingerprint = FingerprintChoice::parse(&value).ok_or_else(|| {
                        format!("fingerprint `{value}`: expected current, all or a 12-hex-digit id")
                    })?;
                }
                _ => {
                    parsed.slice.read_parameter(key, &value)?;
                }
            }
        }
        Ok(parsed)
    }
}

/// The parameters a slice was asked by (`tenant= and priority=`).
fn asked_slice(slice: &SliceFilter) -> String {
    let names: Vec<String> = slice
        .parameters()
        .map(|(name, _)| format!("{name}="))
        .collect();
    names.join(" and ")
}

/// A slice the proxy can answer: a tenant it counts (`[tenants]` on, the name in the allow
/// list or `other`), of the production matrix, not of a comparison.
pub fn check_slice(view: View<'_>, query: &MatrixQuery) -> Result<(), String> {
    if query.slice.is_all() {
        return Ok(());
    }
    if query.source == Source::Synthetic {
        return Err(format!(
            "{} narrow the production matrix; leave out source=synthetic (sweeps have no slice)",
            asked_slice(&query.slice)
        ));
    }
    if query.compare_reference || query.compare_previous {
        return Err(format!(
            "{} narrow the matrix; compare=… compares all production traffic, so leave them out",
            asked_slice(&query.slice)
        ));
    }
    if let Some(tenant) = query.slice.get(TENANT.name) {
        let tenants = &view.proxy.tenants;
        if !tenants.enabled() {
            return Err(format!("tenant `{tenant}`: tenants are off; set [tenants] header or [tenants.keys] to count them (docs/metrics.md, \"Tenants\")"));
        }
        if !tenants.counts(tenant) {
            return Err(format!(
                "tenant `{tenant}` is not counted; the tenants are {}",
                tenants.names().join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_and_errors_name_the_parameter() {
        let all = ["source", "window", "format", "model"];
        let q = MatrixQuery::parse(
            Some("source=synthetic&window=5m&format=md&model=a%2Fb+c"),
            &all,
        )
        .unwrap();
        assert_eq!(q.source, Source::Synthetic);
        assert_eq!(q.window, Window::Last(std::time::Duration::from_secs(300)));
        assert_eq!(q.format, Some(Format::Markdown));
        assert_eq!(q.model.as_deref(), Some("a/b c"));
        assert_eq!(
            MatrixQuery::parse(None, &all).unwrap().window,
            DEFAULT_WINDOW
        );
        for (query, needle) in [
            ("source=both", "source"),
            ("window=3d", "3d"),
            ("format=pdf", "format"),
            ("colour=red", "colour"),
            ("model=%zz", "model"),
        ] {
            let error = MatrixQuery::parse(Some(query), &all).unwrap_err();
            assert!(error.contains(needle), "{query}: {error}");
        }
        assert_eq!(
            Format::from_accept("text/csv, */*", &OFFERED),
            Some(Format::Csv)
        );
        assert_eq!(Format::from_accept("", &OFFERED), Some(Format::Json));
    }

    #[test]
    fn percent_decoding_rejects_what_is_not_an_escape() {
        assert_eq!(percent_decode("a%2Fb+c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("%2B%c3%a9").as_deref(), Some("+é"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        for bad in ["%zz", "%4", "a%", "%%41", "%FF", "%e9"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }
}
