//! `GET /matrix?source=production|synthetic&window=…&format=json|md|csv|html|svg&model=…`:
//! the production matrix over a window, or the latest synthetic one, in any rendering.
//! `compare=reference` (json, md, html; `upstream=` to choose the reference's upstream) gives
//! the production window ÷ the pinned reference per cell instead (`matrix::compare`).
//! `fingerprint=current|all|ID` chooses which of the upstream's configurations the
//! production matrix covers (default `current`: the one it runs now, plus requests from
//! before it was first read); the document's metadata is filled from that configuration's
//! facts. `compare=previous` gives the current configuration's cells ÷ the previous one's
//! (`matrix::diff`). `tenant=NAME` and `priority=BAND` narrow the production matrix to one
//! tenant's requests (`[tenants]`) or one band of the requests' `priority` field.
//!
//! Also owns [`synthetic_matrix`]: the sweep engine's [`LatestMatrix`](crate::sweep::LatestMatrix) slot, else the store's
//! latest finished sweep.
//! Renders through `matrix::*`; computes nothing itself beyond choosing what to render.

use std::sync::Arc;
use std::time::SystemTime;

use http::{header, Request, Response, StatusCode};

use crate::aggregate::config::{apply_config, fingerprint_of, set_fingerprint};
use crate::aggregate::{FingerprintFilter, RecordFilter, Window, DEFAULT_WINDOW};
use crate::base::Source;
use crate::matrix::doc::{MatrixDoc, Metadata};
use crate::meter::identity::{ConfigEntry, FingerprintId};
use crate::meter::priority::PriorityBand;
use crate::proxy::body::ResponseBody;
use crate::proxy::upstream::Upstream;

use super::query::percent_decode;
use super::state::{json_error, respond, AdminState};
use crate::matrix::Format;

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

/// The production matrix of `model` (or the busiest) over `window`, of the configuration the
/// upstream runs now; an empty document with a note when nothing ended in the window. `None`
/// only when a named model had no traffic.
pub fn production_matrix(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
) -> Option<MatrixDoc> {
    production_matrix_of(state, window, model, FingerprintChoice::Current)
}

/// Which of an upstream's configurations a production matrix covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FingerprintChoice {
    /// The one each upstream runs now (and requests from before it was first read).
    #[default]
    Current,
    /// Every configuration together.
    All,
    /// This one.
    Id(FingerprintId),
}

impl FingerprintChoice {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "current" | "" => Some(Self::Current),
            "all" => Some(Self::All),
            _ => FingerprintId::parse(text).map(Self::Id),
        }
    }
}

/// The upstream requests for `model` go to (the default one when no model is named).
pub fn routed_upstream<'a>(state: &'a AdminState, model: Option<&str>) -> &'a Arc<Upstream> {
    let router = &state.proxy.router;
    model
        .and_then(|m| router.by_model(m))
        .unwrap_or_else(|| router.default_upstream())
}

/// The configuration each upstream runs now, and requests from before it was first read
/// (`fingerprint=current`; `/capacity` judges these too).
pub fn current_configurations(state: &AdminState) -> FingerprintFilter {
    let mut ids: Vec<FingerprintId> = state
        .proxy
        .meter
        .identities()
        .all()
        .iter()
        .map(|u| u.current())
        .collect();
    ids.push(FingerprintId::UNKNOWN);
    ids.sort();
    ids.dedup();
    FingerprintFilter::Only(ids)
}

/// One tenant's or one priority band's share of the production traffic (`?tenant=`,
/// `?priority=`); the default is all of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrafficSlice {
    pub tenant: Option<String>,
    pub priority: Option<PriorityBand>,
}

impl TrafficSlice {
    pub fn is_all(&self) -> bool {
        self.tenant.is_none() && self.priority.is_none()
    }
}

/// As [`production_matrix`], of the configurations `choice` names; the metadata is filled
/// from the configuration's facts and names the others the window holds.
pub fn production_matrix_of(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
    choice: FingerprintChoice,
) -> Option<MatrixDoc> {
    production_matrix_sliced(state, window, model, choice, &TrafficSlice::default())
}

/// As [`production_matrix_of`], of one tenant's or priority band's requests.
pub fn production_matrix_sliced(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
    choice: FingerprintChoice,
    slice: &TrafficSlice,
) -> Option<MatrixDoc> {
    let now = SystemTime::now();
    let registry = state.proxy.meter.identities();
    let (filter, config): (FingerprintFilter, Option<ConfigEntry>) = match choice {
        FingerprintChoice::All => (FingerprintFilter::All, None),
        FingerprintChoice::Id(id) => (FingerprintFilter::Only(vec![id]), registry.config(id)),
        FingerprintChoice::Current => (
            current_configurations(state),
            routed_upstream(state, model).identity.current_config(),
        ),
    };
    let records = RecordFilter {
        fingerprints: filter.clone(),
        tenant: slice.tenant.clone(),
        priority: slice.priority,
    };
    let mut doc = match state.production.matrix_where(window, model, now, &records) {
        Some(doc) => doc,
        None if model.is_some() => return None,
        None => {
            let mut metadata = Metadata::default();
            metadata.run.source = Some(Source::Production);
            metadata.run.benchmark_tool = Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION")));
            metadata.notes.push(format!(
                "No production requests{} ended in the window ({}).",
                records
                    .describe()
                    .map_or_else(String::new, |slice| format!(" of {slice}")),
                window.label()
            ));
            MatrixDoc::new(metadata)
        }
    };
    cache_report_note(&mut doc, routed_upstream(state, model));
    match (&config, choice) {
        (Some(config), _) => apply_config(&mut doc.metadata, config),
        (None, FingerprintChoice::Id(id)) => set_fingerprint(&mut doc.metadata, id),
        (None, _) => {}
    }
    let served = model
        .map(str::to_owned)
        .or_else(|| doc.metadata.model.served_model.clone());
    if let Some(served) = served {
        let present = state.production.fingerprints(window, &served, now);
        let describe = |ids: &[(FingerprintId, u64)]| {
            ids.iter()
                .map(|(id, n)| format!("{id} ({n} requests)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if choice == FingerprintChoice::All {
            if !present.is_empty() {
                doc.metadata.notes.push(format!(
                    "Covers every configuration (fingerprint) of the upstream in the window: {}.",
                    describe(&present)
                ));
            }
        } else {
            let others: Vec<(FingerprintId, u64)> = present
                .into_iter()
                .filter(|(id, _)| !filter.admits(*id))
                .collect();
            if !others.is_empty() {
                doc.metadata.notes.push(format!(
                    "Other configurations (fingerprints) in this window, not in this matrix: {} (ask with ?fingerprint=ID or fingerprint=all).",
                    describe(&others)
                ));
            }
        }
    }
    Some(doc)
}

/// When the window has traffic but the server reported no cached prompt tokens, a note names
/// the engine's flag that turns the report on, and what stands in meanwhile: the server's own
/// prefix-cache counters ("Prefix cache hits", when it is scraped).
fn cache_report_note(doc: &mut MatrixDoc, upstream: &Upstream) {
    if doc.decode.is_empty() || doc.decode.iter().any(|c| c.prompt_cache.is_some()) {
        return;
    }
    let flag = upstream
        .engine()
        .and_then(|engine| engine.spec().usage.cache_report_flag.map(|f| (engine, f)));
    let scraped = doc.decode.iter().any(|c| {
        c.server_state
            .is_some_and(|s| s.prefix_cache_hit_rate.is_some())
    });
    let stand_in = if scraped {
        "the Prefix cache hits column (the server's own counters) stands in"
    } else {
        "scrape the server's /metrics (upstream.metrics_interval) for its own prefix-cache hit rate meanwhile"
    };
    doc.metadata.notes.push(match flag {
        Some((engine, flag)) => format!(
            "The server reports no cached prompt tokens, so TTFT is not split warm and cold: start {} with {flag} to have it report them; {stand_in}.",
            engine.name()
        ),
        None => format!(
            "The server reports no cached prompt tokens, so TTFT is not split warm and cold; {stand_in}."
        ),
    });
}

/// Renderings `/matrix` offers.
pub const OFFERED: [Format; 5] = [
    Format::Json,
    Format::Markdown,
    Format::Csv,
    Format::Html,
    Format::Svg,
];

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
    /// `tenant=NAME`, `priority=BAND`: one tenant's or one band's requests.
    pub slice: TrafficSlice,
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
            slice: TrafficSlice::default(),
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
                "tenant" if !value.is_empty() => parsed.slice.tenant = Some(value),
                "priority" if !value.is_empty() => {
                    parsed.slice.priority = Some(PriorityBand::parse(&value).ok_or_else(|| {
                        format!(
                            "priority `{value}`: expected a band ({}) or an integer",
                            PriorityBand::ALL.map(PriorityBand::label).join(", ")
                        )
                    })?);
                }
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
        &[
            "source",
            "window",
            "format",
            "model",
            "compare",
            "upstream",
            "fingerprint",
            "tenant",
            "priority",
        ],
    ) {
        Ok(query) => query,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    if let Err(message) = check_slice(state, &query) {
        return json_error(StatusCode::BAD_REQUEST, &message);
    }
    let format = query.format.unwrap_or_else(|| {
        Format::from_accept(
            request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            &OFFERED,
        )
        .unwrap_or(Format::Json)
    });
    if query.compare_reference {
        if query.source == Source::Synthetic {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=reference compares the production matrix; leave out source=synthetic",
            );
        }
        return compare_reference(state, &query, format);
    }
    if query.compare_previous {
        if query.source == Source::Synthetic {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=previous compares the production matrix; leave out source=synthetic",
            );
        }
        return compare_previous(state, &query, format);
    }
    let doc = match query.source {
        Source::Production => {
            match production_matrix_sliced(
                state,
                query.window,
                query.model.as_deref(),
                query.fingerprint,
                &query.slice,
            ) {
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

/// A slice the proxy can answer: a tenant it counts (`[tenants]` on, the name in the allow
/// list or `other`), of the production matrix, not of a comparison.
pub fn check_slice(state: &AdminState, query: &MatrixQuery) -> Result<(), String> {
    if query.slice.is_all() {
        return Ok(());
    }
    if query.source == Source::Synthetic {
        return Err("tenant= and priority= narrow the production matrix; leave out source=synthetic (sweeps have neither)".to_owned());
    }
    if query.compare_reference || query.compare_previous {
        return Err("tenant= and priority= narrow the matrix; compare=… compares all production traffic, so leave them out".to_owned());
    }
    if let Some(tenant) = &query.slice.tenant {
        let tenants = &state.proxy.tenants;
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

/// The production window compared with the reference pinned for its model: `Err` is the
/// answer to give instead (no traffic, no reference).
pub fn production_compare(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
    upstream: Option<&str>,
) -> Result<crate::matrix::compare::MatrixCompare, (StatusCode, String)> {
    // A wrong upstream name is a bad request whatever the traffic.
    if upstream.is_some() {
        super::reference::resolve_upstream(state, upstream, "")
            .map_err(|message| (StatusCode::BAD_REQUEST, message))?;
    }
    let production = production_matrix(state, window, model).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!(
                "no production request of model `{}` ended in the window ({})",
                model.unwrap_or(""),
                window.label()
            ),
        )
    })?;
    let named_model = model;
    let Some(model) = model
        .map(str::to_owned)
        .or_else(|| production.metadata.model.served_model.clone())
    else {
        return Err((
            StatusCode::NOT_FOUND,
            format!(
                "no production request ended in the window ({}), so there is no model to compare: name one with ?model=",
                window.label()
            ),
        ));
    };
    let upstream = super::reference::resolve_upstream(state, upstream, &model)
        .map_err(|message| (StatusCode::BAD_REQUEST, message))?;
    let reference = state.drift.reference(&upstream, &model).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!("no reference is pinned for upstream `{upstream}` and model `{model}`: pin one with `tokentap reference pin` (PUT /reference)"),
        )
    })?;
    // A reference pinned on one configuration is compared with that configuration's
    // production only; the comparison says so when the upstream runs another one now.
    let mut label = String::from("production");
    let production = match fingerprint_of(&reference.matrix.metadata) {
        None => production,
        Some(pinned) => {
            let now = state
                .proxy
                .meter
                .identities()
                .get(&upstream)
                .map(|u| u.current());
            let doc = production_matrix_of(state, window, named_model.or(Some(&model)), FingerprintChoice::Id(pinned))
                .ok_or_else(|| {
                    (
                        StatusCode::NOT_FOUND,
                        format!(
                            "the reference was pinned on configuration {pinned}; no production request of model `{model}` on that configuration ended in the window ({}){}",
                            window.label(),
                            now.filter(|n| *n != pinned)
                                .map(|n| format!(": upstream `{upstream}` runs configuration {n} now (its fingerprint differs)"))
                                .unwrap_or_default()
                        ),
                    )
                })?;
            label = match now.filter(|n| *n != pinned) {
                Some(now) => format!("production on configuration {pinned}, the reference's (the upstream runs {now} now: its fingerprint differs)"),
                None => format!("production on configuration {pinned}, the reference's"),
            };
            doc
        }
    };
    let mut compared = crate::matrix::compare::compare(
        &production,
        &reference.matrix,
        crate::aggregate::drift::reference_info(&reference),
        &state.drift.settings.evidence,
    );
    if compared.production.label.is_empty() {
        compared.production.label = label;
    }
    Ok(compared)
}

/// `compare=previous`: the routed upstream's current configuration's production cells ÷ its
/// previous configuration's, over the window.
fn compare_previous(
    state: &AdminState,
    query: &MatrixQuery,
    format: Format,
) -> Response<ResponseBody> {
    let model = query.model.as_deref();
    let upstream = routed_upstream(state, model);
    let Some(current) = upstream.identity.current_config() else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "upstream `{}` has no known configuration now ({}): nothing to compare",
                upstream.name,
                upstream.identity.current()
            ),
        );
    };
    let Some(previous) = upstream.identity.previous_config() else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "upstream `{}` has run one configuration ({}) since tokentap started: there is no previous one to compare with",
                upstream.name, current.id
            ),
        );
    };
    let side = |entry: &ConfigEntry| {
        production_matrix_of(state, query.window, model, FingerprintChoice::Id(entry.id))
            .filter(|doc| !doc.decode.is_empty() || !doc.prefill.is_empty())
    };
    let (Some(before), Some(after)) = (side(&previous), side(&current)) else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "no production requests of both configurations (previous {}, current {}) ended in the window ({}): widen it with window=24h",
                previous.id,
                current.id,
                query.window.label()
            ),
        );
    };
    let mut diff = crate::matrix::diff::diff(&before, &after);
    diff.a.label = format!(
        "previous configuration {} ({} {})",
        previous.id,
        previous.engine(),
        previous.version()
    );
    diff.b.label = format!(
        "current configuration {} ({} {})",
        current.id,
        current.engine(),
        current.version()
    );
    let text = match format {
        Format::Json => crate::matrix::diff::render_diff_json(&diff),
        Format::Markdown => crate::matrix::diff::render_diff_markdown(&diff),
        Format::Html => crate::matrix::html::render_diff_html(&diff),
        Format::Csv | Format::Svg | Format::Table | Format::List => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=previous renders as json, md or html",
            )
        }
    };
    respond(StatusCode::OK, format.content_type(), text)
}

fn compare_reference(
    state: &AdminState,
    query: &MatrixQuery,
    format: Format,
) -> Response<ResponseBody> {
    use crate::matrix::compare::{
        render_compare_html, render_compare_json, render_compare_markdown,
    };
    let compared = match production_compare(
        state,
        query.window,
        query.model.as_deref(),
        query.upstream.as_deref(),
    ) {
        Ok(compared) => compared,
        Err((status, message)) => return json_error(status, &message),
    };
    let text = match format {
        Format::Json => render_compare_json(&compared),
        Format::Markdown => render_compare_markdown(&compared),
        Format::Html => render_compare_html(&compared),
        Format::Csv | Format::Svg | Format::Table | Format::List => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=reference renders as json, md or html",
            )
        }
    };
    respond(StatusCode::OK, format.content_type(), text)
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
