//! `GET /matrix?source=production|synthetic&window=…&format=json|md|csv|html|svg&model=…`:
//! the production matrix over a window, or the latest synthetic one, in any rendering.
//!
//! Also owns [`synthetic_matrix`]: the sweep engine's [`LatestMatrix`](crate::sweep::LatestMatrix) slot, else the store's
//! latest finished sweep.
//! Renders through `matrix::*`; computes nothing itself beyond choosing what to render.

use std::sync::Arc;
use std::time::SystemTime;

use http::{header, Request, Response, StatusCode};

use crate::aggregate::{Window, DEFAULT_WINDOW};
use crate::base::Source;
use crate::matrix::doc::{MatrixDoc, Metadata};
use crate::proxy::body::ResponseBody;

use super::{json_error, respond, AdminState};

/// The message when there is no synthetic matrix to show.
pub const NO_SWEEP: &str = "no synthetic sweep has run yet: start one with `tokentap sweep --admin URL` (POST /sweeps); until then only the production matrix exists";

/// The latest synthetic matrix: the sweep engine's slot, else the store's latest finished
/// sweep, else `None`.
pub async fn synthetic_matrix(
    state: &AdminState,
) -> Result<Option<Arc<MatrixDoc>>, crate::store::StoreError> {
    if let Some(doc) = state.synthetic.get() {
        return Ok(Some(doc));
    }
    let Some(store) = state.store.clone() else {
        return Ok(None);
    };
    let row = tokio::task::spawn_blocking(move || store.latest_finished_sweep())
        .await
        .unwrap_or(Ok(None))?;
    Ok(row.and_then(|row| row.matrix).map(Arc::new))
}

/// The production matrix of `model` (or the busiest) over `window`; an empty document with a
/// note when nothing ended in the window. `None` only when a named model had no traffic.
pub fn production_matrix(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
) -> Option<MatrixDoc> {
    let now = SystemTime::now();
    match state.production.matrix(window, model, now) {
        Some(doc) => Some(doc),
        None if model.is_some() => None,
        None => {
            let mut metadata = Metadata::default();
            metadata.run.source = Some(Source::Production);
            metadata.run.benchmark_tool = Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION")));
            metadata.notes.push(format!(
                "No production requests ended in the window ({}).",
                window.label()
            ));
            Some(MatrixDoc::new(metadata))
        }
    }
}

/// Renderings `/matrix` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Markdown,
    Csv,
    Html,
    Svg,
}

impl Format {
    fn parse(text: &str) -> Option<Format> {
        match text {
            "json" => Some(Format::Json),
            "md" | "markdown" => Some(Format::Markdown),
            "csv" => Some(Format::Csv),
            "html" => Some(Format::Html),
            "svg" => Some(Format::Svg),
            _ => None,
        }
    }

    /// From the Accept header when no `format=` is given; JSON by default.
    fn from_accept(accept: &str) -> Format {
        let accept = accept.to_ascii_lowercase();
        if accept.contains("text/markdown") {
            Format::Markdown
        } else if accept.contains("text/csv") {
            Format::Csv
        } else if accept.contains("text/html") {
            Format::Html
        } else if accept.contains("image/svg") {
            Format::Svg
        } else {
            Format::Json
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Markdown => "text/markdown; charset=utf-8",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Html => "text/html; charset=utf-8",
            Format::Svg => "image/svg+xml",
        }
    }

    fn render(self, doc: &MatrixDoc) -> String {
        match self {
            Format::Json => crate::matrix::render_json(doc),
            Format::Markdown => crate::matrix::render_markdown(doc),
            Format::Csv => crate::matrix::csv::render_csv(doc),
            Format::Html => crate::matrix::html::render_html(doc),
            Format::Svg => crate::matrix::svg::render_svg(doc),
        }
    }
}

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

/// The query parameters `/matrix` and `/` understand, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixQuery {
    pub source: Source,
    pub window: Window,
    pub format: Option<Format>,
    pub model: Option<String>,
}

impl MatrixQuery {
    /// Parses a query string; the error names the parameter and what it accepts.
    pub fn parse(query: Option<&str>, allowed: &[&str]) -> Result<MatrixQuery, String> {
        let mut parsed = MatrixQuery {
            source: Source::Production,
            window: DEFAULT_WINDOW,
            format: None,
            model: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or_else(|| {
                format!("query parameter `{key}` is not valid percent-encoded UTF-8")
            })?;
            if !allowed.contains(&key) {
                return Err(format!(
                    "unknown query parameter `{key}`; this endpoint takes {}",
                    allowed.join(", ")
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
                    parsed.format = Some(Format::parse(&value).ok_or_else(|| {
                        format!("format `{value}`: expected json, md, csv, html or svg")
                    })?);
                }
                "model" if !value.is_empty() => parsed.model = Some(value),
                _ => {}
            }
        }
        Ok(parsed)
    }
}

/// `GET /matrix`.
pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let query = match MatrixQuery::parse(
        request.uri().query(),
        &["source", "window", "format", "model"],
    ) {
        Ok(query) => query,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    let format = query.format.unwrap_or_else(|| {
        Format::from_accept(
            request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
        )
    });
    let doc = match query.source {
        Source::Production => {
            match production_matrix(state, query.window, query.model.as_deref()) {
                Some(doc) => Arc::new(doc),
                None => {
                    return json_error(
                        StatusCode::NOT_FOUND,
                        &format!(
                            "no production request of model `{}` ended in the window ({})",
                            query.model.as_deref().unwrap_or(""),
                            query.window.label()
                        ),
                    )
                }
            }
        }
        Source::Synthetic => match synthetic_matrix(state).await {
            Ok(Some(doc)) => doc,
            Ok(None) => return json_error(StatusCode::NOT_FOUND, NO_SWEEP),
            Err(error) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "store read failed"
                );
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot read the latest sweep from the store: {error}"),
                );
            }
        },
    };
    respond(StatusCode::OK, format.content_type(), format.render(&doc))
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
        assert_eq!(Format::from_accept("text/csv, */*"), Format::Csv);
        assert_eq!(Format::from_accept(""), Format::Json);
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
