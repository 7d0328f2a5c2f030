//! The fleet matrix: a [`MatrixDoc`] built from PromQL over the series every tokentap replica
//! exports, summed over the replicas a selector picks (a fingerprint, a model, any label), so
//! every renderer and `matrix diff` take it as they take a sweep or a production window.
//!
//! Each figure follows the shipped recording rules (`deploy/prometheus/rules/
//! tokentap.rules.yml`, `cell:*`), written over the base series with `increase(…[window])`
//! so that any window works, not only the rules' 5m and 1h. Total tok/s is the decode tok/s per
//! stream (completion tokens ÷ decode request-seconds, from counters, exact) × the mean of the
//! requests' average active requests; medians and tails are `histogram_quantile` over buckets
//! summed across replicas; the cell's `per_request_tok_s` is 1 ÷ the TBT median, as it is in
//! every other matrix (as coarse as the TBT buckets; the exact decode tok/s per stream is Total
//! tok/s ÷ Average active requests, both in the cell).
//! All queries are evaluated at one instant, so every figure covers the same window.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::promql::{quote, PromClient, PromError, Sample};
use crate::base::wallclock::{format_rfc3339, unix_seconds};
use crate::base::Source;
use crate::matrix::doc::{CellStatus, DecodeCell, Fact, MatrixDoc, Metadata, PrefillRow, Tails};
use crate::matrix::units::parse_context;
use crate::matrix::EvidenceRule;
use crate::telemetry::names;

/// The info metric of each upstream's configuration fingerprint (one series per upstream and
/// fingerprint, value 1).
const CONFIG_INFO: &str = names::UPSTREAM_CONFIG_INFO;

/// Share of a cell's finished requests that may fail before the cell is an `Error`, as in the
/// in-process production matrix.
const ERROR_SHARE: f64 = crate::aggregate::cell::ERROR_SHARE;

/// What part of the fleet, over which window.
#[derive(Debug, Clone)]
pub struct FleetQuery {
    /// The served model; `None`: the only model with requests in the window.
    pub model: Option<String>,
    /// Production or synthetic traffic.
    pub source: Source,
    /// Only series with this `fingerprint` label.
    pub fingerprint: Option<String>,
    /// More PromQL label matchers, as written inside `{}` (e.g. `cluster="eu-1"`).
    pub matchers: Vec<String>,
    /// The window every figure covers, ending at the query time.
    pub window: Duration,
    /// Below it a cell is `Low evidence`.
    pub evidence: EvidenceRule,
}

/// Why no fleet matrix came out.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Prometheus(#[from] PromError),
    #[error("{url}: no tokentap requests of source {traffic} in the last {window} matching {{{selector}}}: is Prometheus scraping the sidecars, and is the window long enough?")]
    NoTraffic {
        url: String,
        traffic: &'static str,
        window: String,
        selector: String,
    },
    #[error("{url}: requests of several models in the window ({models}); choose one with --model")]
    SeveralModels { url: String, models: String },
    #[error("the window must be at least 1 s, found {0:?}")]
    Window(Duration),
}

impl FleetQuery {
    /// The window as PromQL writes it (`3600s`).
    pub fn range(&self) -> String {
        format!("{}s", self.window.as_secs().max(1))
    }

    /// The label matchers shared by every query (without braces): source, fingerprint, the
    /// extra matchers, and the model when known.
    pub fn selector(&self, model: Option<&str>) -> String {
        let mut parts = vec![format!("source={}", quote(self.source.as_str()))];
        if let Some(model) = model {
            parts.push(format!("model={}", quote(model)));
        }
        if let Some(fingerprint) = &self.fingerprint {
            parts.push(format!("fingerprint={}", quote(fingerprint)));
        }
        parts.extend(
            self.matchers
                .iter()
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty()),
        );
        parts.join(",")
    }
}

/// The cell a series belongs to: its context and concurrency labels.
type CellKey = (String, String);

/// Sums by cell of `increase(metric{selector, extra}[window])`.
fn increase_by(labels: &str, metric: &str, selector: &str, extra: &str, range: &str) -> String {
    let comma = if extra.is_empty() { "" } else { "," };
    format!("sum by ({labels}) (increase({metric}{{{selector}{comma}{extra}}}[{range}]))")
}

fn quantile_by(labels: &str, q: f64, metric: &str, selector: &str, range: &str) -> String {
    format!(
        "histogram_quantile({q}, sum by ({labels}, le) (rate({metric}_bucket{{{selector}}}[{range}])))"
    )
}

const CELL: &str = "context_bucket, concurrency_bucket";
const ROW: &str = "context_bucket";

/// Series by cell, finite values only.
fn by_cell(samples: Vec<Sample>) -> BTreeMap<CellKey, f64> {
    samples
        .into_iter()
        .filter(|s| s.value.is_finite())
        .map(|s| {
            (
                (
                    s.label("context_bucket").to_owned(),
                    s.label("concurrency_bucket").to_owned(),
                ),
                s.value,
            )
        })
        .collect()
}

/// Series by context row, finite values only.
fn by_row(samples: Vec<Sample>) -> BTreeMap<String, f64> {
    samples
        .into_iter()
        .filter(|s| s.value.is_finite())
        .map(|s| (s.label("context_bucket").to_owned(), s.value))
        .collect()
}

/// Everything the queries say about one cell (increases over the window, quantiles in s).
#[derive(Debug, Default, Clone)]
struct CellFigures {
    completion_tokens: Option<f64>,
    decode_seconds: Option<f64>,
    active_sum: Option<f64>,
    active_count: Option<f64>,
    busy_seconds: Option<f64>,
    overlapping_sum: Option<f64>,
    overlapping_count: Option<f64>,
    prompt_sum: Option<f64>,
    prompt_count: Option<f64>,
    ok_requests: f64,
    failed: BTreeMap<String, f64>,
    slo_met: f64,
    slo_judged: f64,
    goodput_tokens: Option<f64>,
    /// TTFT p50, p90, p99; TBT p50, p90, p99; ITL p90, p99 (seconds).
    quantiles: [Option<f64>; 8],
}

fn positive(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite() && *v > 0.0)
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    Some(numerator? / positive(denominator)?).filter(|v| v.is_finite())
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a rounded, clamped, non-negative count of streams"
)]
fn count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

impl CellFigures {
    fn to_cell(&self, context_tokens: u64, concurrency: u32) -> DecodeCell {
        let decode_per_stream = ratio(self.completion_tokens, self.decode_seconds);
        let average_active = ratio(self.active_sum, self.active_count);
        let total = decode_per_stream.zip(average_active).map(|(p, a)| p * a);
        let failures: f64 = self.failed.values().sum();
        let finished = self.ok_requests + failures;
        let status = if failures >= 0.5 && failures > ERROR_SHARE * finished {
            let worst = self
                .failed
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or("failed", |(outcome, _)| outcome.as_str());
            CellStatus::error(&format!(
                "{} of {} requests failed (mostly {worst})",
                count(failures),
                count(finished)
            ))
        } else {
            CellStatus::Valid
        };
        let ms = |i: usize| {
            self.quantiles
                .get(i)
                .copied()
                .flatten()
                .filter(|v| v.is_finite())
                .map(|s| s * 1000.0)
        };
        let slo_attainment = (self.slo_judged > 0.0).then(|| self.slo_met / self.slo_judged);
        DecodeCell {
            tokens_per_step: None,
            prompt_cache: None,
            first_tokens: None,
            context_tokens,
            concurrency,
            status,
            total_tok_s: total,
            // 1 ÷ TBT, what "per-request tok/s" means on the seed pages and in every other
            // matrix (issue 45.2); the counters' decode tok/s per stream is Total ÷ Average active.
            per_request_tok_s: ms(3).filter(|t| *t > 0.0).map(|t| 1000.0 / t),
            ttft_ms: ms(0),
            tbt_ms: ms(3),
            average_active_requests: average_active,
            completed_requests: Some(count(self.ok_requests)),
            output_tokens: self.completion_tokens.map(count),
            measured_for_s: ratio(self.decode_seconds, average_active),
            prompt_tokens: ratio(self.prompt_sum, self.prompt_count).map(count),
            prefill_overlap_share: ratio(self.busy_seconds, self.decode_seconds),
            overlapping_prefills: ratio(self.overlapping_sum, self.overlapping_count),
            slo_attainment,
            goodput_tok_s: slo_attainment
                .and_then(|_| Some(total? * ratio(self.goodput_tokens, self.completion_tokens)?)),
            server_state: None,
            tails: Tails::from_values([ms(1), ms(2), ms(4), ms(5), ms(6), ms(7)]),
            production_in_flight: None,
        }
    }
}

/// Runs `query` at `time`.
async fn ask(client: &PromClient, query: &str, time: f64) -> Result<Vec<Sample>, PromError> {
    client.query(query, time).await
}

/// The model the window's traffic is for: `query.model`, else the only one with requests.
async fn pick_model(
    client: &PromClient,
    query: &FleetQuery,
    time: f64,
) -> Result<String, FleetError> {
    let range = query.range();
    let selector = query.selector(query.model.as_deref());
    // Traffic shows as finished requests or as output tokens: a burst of long streams still
    // running, or one whose requests all ended in the window's first scrape, has the one
    // without the other.
    let mut models: BTreeMap<String, f64> = BTreeMap::new();
    for (metric, extra) in [
        (names::REQUESTS_TOTAL, ""),
        (names::TOKENS_TOTAL, "type=\"completion\""),
    ] {
        let answer = ask(
            client,
            &increase_by("model", metric, &selector, extra, &range),
            time,
        )
        .await?;
        for sample in answer {
            if sample.value.is_finite() && sample.value > 0.0 {
                *models.entry(sample.label("model").to_owned()).or_default() += sample.value;
            }
        }
    }
    if let Some(model) = &query.model {
        if models.contains_key(model) {
            return Ok(model.clone());
        }
    }
    match (models.len(), &query.model) {
        (1, None) => Ok(models.into_keys().next().unwrap_or_default()),
        (0, _) | (_, Some(_)) => Err(FleetError::NoTraffic {
            url: client.shown().to_owned(),
            traffic: query.source.as_str(),
            window: window_text(query.window),
            selector,
        }),
        _ => Err(FleetError::SeveralModels {
            url: client.shown().to_owned(),
            models: models.into_keys().collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The fleet matrix of `query` at `now` from `client`'s Prometheus.
pub async fn fleet_matrix(
    client: &PromClient,
    query: &FleetQuery,
    now: SystemTime,
) -> Result<MatrixDoc, FleetError> {
    if query.window < Duration::from_secs(1) {
        return Err(FleetError::Window(query.window));
    }
    let time = unix_seconds(now);
    let model = pick_model(client, query, time).await?;
    let selector = query.selector(Some(&model));
    let range = query.range();
    let mut cells: BTreeMap<CellKey, CellFigures> = BTreeMap::new();

    type Setter = fn(&mut CellFigures, f64);
    let sums: [(&str, &str, Setter); 9] = [
        (names::TOKENS_TOTAL, "type=\"completion\"", |c, v| {
            c.completion_tokens = Some(v);
        }),
        ("tokentap_decode_seconds_sum", "", |c, v| {
            c.decode_seconds = Some(v);
        }),
        ("tokentap_average_active_requests_sum", "", |c, v| {
            c.active_sum = Some(v);
        }),
        ("tokentap_average_active_requests_count", "", |c, v| {
            c.active_count = Some(v);
        }),
        ("tokentap_prefill_busy_seconds_sum", "", |c, v| {
            c.busy_seconds = Some(v);
        }),
        ("tokentap_overlapping_prefills_sum", "", |c, v| {
            c.overlapping_sum = Some(v);
        }),
        ("tokentap_overlapping_prefills_count", "", |c, v| {
            c.overlapping_count = Some(v);
        }),
        ("tokentap_prompt_tokens_sum", "", |c, v| {
            c.prompt_sum = Some(v);
        }),
        ("tokentap_prompt_tokens_count", "", |c, v| {
            c.prompt_count = Some(v);
        }),
    ];
    for (metric, extra, set) in sums {
        let q = increase_by(CELL, metric, &selector, extra, &range);
        for (key, value) in by_cell(ask(client, &q, time).await?) {
            set(cells.entry(key).or_default(), value);
        }
    }
    let goodput = increase_by(CELL, names::SLO_GOODPUT_TOKENS_TOTAL, &selector, "", &range);
    for (key, value) in by_cell(ask(client, &goodput, time).await?) {
        if let Some(cell) = cells.get_mut(&key) {
            cell.goodput_tokens = Some(value);
        }
    }
    // Outcomes and SLO verdicts, by their own label.
    let outcomes = increase_by(
        &format!("{CELL}, outcome"),
        names::REQUESTS_TOTAL,
        &selector,
        "",
        &range,
    );
    for sample in ask(client, &outcomes, time).await? {
        if !sample.value.is_finite() {
            continue;
        }
        let key = (
            sample.label("context_bucket").to_owned(),
            sample.label("concurrency_bucket").to_owned(),
        );
        let cell = cells.entry(key).or_default();
        match sample.label("outcome") {
            "ok" => cell.ok_requests += sample.value,
            // People press stop: a client abort is no failure of the server.
            "client_aborted" => {}
            other => *cell.failed.entry(other.to_owned()).or_default() += sample.value,
        }
    }
    let verdicts = increase_by(
        &format!("{CELL}, slo"),
        names::SLO_REQUESTS_TOTAL,
        &selector,
        "",
        &range,
    );
    for sample in ask(client, &verdicts, time).await? {
        if !sample.value.is_finite() {
            continue;
        }
        let key = (
            sample.label("context_bucket").to_owned(),
            sample.label("concurrency_bucket").to_owned(),
        );
        if let Some(cell) = cells.get_mut(&key) {
            cell.slo_judged += sample.value;
            if sample.label("slo") == "met" {
                cell.slo_met += sample.value;
            }
        }
    }
    let quantiles: [(f64, &str); 8] = [
        (0.5, names::TIME_TO_FIRST_TOKEN),
        (0.9, names::TIME_TO_FIRST_TOKEN),
        (0.99, names::TIME_TO_FIRST_TOKEN),
        (0.5, names::TIME_BETWEEN_TOKENS),
        (0.9, names::TIME_BETWEEN_TOKENS),
        (0.99, names::TIME_BETWEEN_TOKENS),
        (0.9, names::INTER_TOKEN_LATENCY),
        (0.99, names::INTER_TOKEN_LATENCY),
    ];
    for (index, (q, metric)) in quantiles.into_iter().enumerate() {
        let text = quantile_by(CELL, q, metric, &selector, &range);
        for (key, value) in by_cell(ask(client, &text, time).await?) {
            if let Some(slot) = cells.get_mut(&key).and_then(|c| c.quantiles.get_mut(index)) {
                *slot = Some(value);
            }
        }
    }

    let mut doc =
        MatrixDoc::new(metadata(client, query, &model, &selector, &range, now, time).await?);
    let mut beyond = BTreeSet::new();
    for ((context, concurrency), figures) in &cells {
        let (Ok(context_tokens), Ok(level)) = (parse_context(context), concurrency.parse::<u32>())
        else {
            beyond.insert(format!("{context} × {concurrency}"));
            continue;
        };
        let cell = figures.to_cell(context_tokens, level);
        if cell.per_request_tok_s.is_some() || cell.completed_requests.unwrap_or(0) > 0 {
            doc.decode.push(cell);
        }
    }
    doc.prefill = prefill_rows(client, &selector, &range, time).await?;
    doc.sort();
    let marked = query.evidence.apply(&mut doc);
    let notes = &mut doc.metadata.notes;
    if !beyond.is_empty() {
        notes.push(format!(
            "Cells beyond the ladders are in no row or column: {}.",
            beyond.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if marked > 0 {
        notes.push(format!(
            "{marked} cells have too little traffic in the window to be trusted (Low evidence: fewer than {} completed requests, {} s or {} output tokens).",
            query.evidence.min_requests, query.evidence.min_measured_s, query.evidence.min_output_tokens
        ));
    }
    Ok(doc)
}

/// Mean TTFT per cell in milliseconds (Σ TTFT ÷ requests, exact from the histogram's sum and
/// count, unlike the bucket-interpolated median), for the cells of `doc` (a fleet matrix of
/// `query`, whose served model it uses), over the same window at `now`.
pub async fn mean_ttft_ms(
    client: &PromClient,
    query: &FleetQuery,
    doc: &MatrixDoc,
    now: SystemTime,
) -> Result<BTreeMap<(u64, u32), f64>, FleetError> {
    let selector = query.selector(doc.metadata.model.served_model.as_deref());
    let range = query.range();
    let text = format!(
        "{} / {}",
        increase_by(
            CELL,
            "tokentap_time_to_first_token_seconds_sum",
            &selector,
            "",
            &range
        ),
        increase_by(
            CELL,
            "tokentap_time_to_first_token_seconds_count",
            &selector,
            "",
            &range
        )
    );
    let mut out = BTreeMap::new();
    for ((context, concurrency), seconds) in by_cell(ask(client, &text, unix_seconds(now)).await?) {
        if let (Ok(context_tokens), Ok(level)) =
            (parse_context(&context), concurrency.parse::<u32>())
        {
            out.insert((context_tokens, level), seconds * 1000.0);
        }
    }
    Ok(out)
}

/// The prefill rows by context: uncached prompt tokens per second of TTFT (exact from
/// counters, as `context:tokentap_prefill_tokens_per_second:ratio_rate5m`) and the median TTFT.
async fn prefill_rows(
    client: &PromClient,
    selector: &str,
    range: &str,
    time: f64,
) -> Result<Vec<PrefillRow>, PromError> {
    let prompt = by_row(
        ask(
            client,
            &increase_by(ROW, names::TOKENS_TOTAL, selector, "type=\"prompt\"", range),
            time,
        )
        .await?,
    );
    let cached = by_row(
        ask(
            client,
            &increase_by(ROW, names::TOKENS_TOTAL, selector, "type=\"cached\"", range),
            time,
        )
        .await?,
    );
    let ttft_sum = by_row(
        ask(
            client,
            &increase_by(
                ROW,
                "tokentap_time_to_first_token_seconds_sum",
                selector,
                "",
                range,
            ),
            time,
        )
        .await?,
    );
    let requests = by_row(
        ask(
            client,
            &increase_by(
                ROW,
                "tokentap_time_to_first_token_seconds_count",
                selector,
                "",
                range,
            ),
            time,
        )
        .await?,
    );
    let ttft_p50 = by_row(
        ask(
            client,
            &quantile_by(ROW, 0.5, names::TIME_TO_FIRST_TOKEN, selector, range),
            time,
        )
        .await?,
    );
    let mut rows = Vec::new();
    for (context, count_value) in &requests {
        let Ok(context_tokens) = parse_context(context) else {
            continue;
        };
        if *count_value <= 0.0 {
            continue;
        }
        let uncached = prompt
            .get(context)
            .map(|p| p - cached.get(context).copied().unwrap_or(0.0));
        rows.push(PrefillRow {
            context_tokens,
            requests_at_once: 1,
            status: CellStatus::Valid,
            prompt_tok_s: ratio(uncached, ttft_sum.get(context).copied()),
            ttft_ms: ttft_p50
                .get(context)
                .filter(|v| v.is_finite())
                .map(|s| s * 1000.0),
            completed_requests: Some(count(*count_value)),
            prompt_tokens: ratio(prompt.get(context).copied(), Some(*count_value)).map(count),
        });
    }
    Ok(rows)
}

/// The document's metadata: the model, the window, and what `tokentap_upstream_config_info`
/// says about the replicas' engine.
async fn metadata(
    client: &PromClient,
    query: &FleetQuery,
    model: &str,
    selector: &str,
    range: &str,
    now: SystemTime,
    time: f64,
) -> Result<Metadata, PromError> {
    let mut metadata = Metadata::default();
    metadata.model.served_model = Some(model.to_owned());
    metadata.run.source = Some(query.source);
    metadata.run.benchmark_tool = Some(format!(
        "tokentap v{} fleet matrix (PromQL)",
        env!("CARGO_PKG_VERSION")
    ));
    metadata.run.window_s = Some(query.window.as_secs_f64());
    metadata.run.started_at = now.checked_sub(query.window).map(format_rfc3339);
    metadata.run.ended_at = Some(format_rfc3339(now));
    // The replicas that served the window's traffic.
    let replicas = ask(
        client,
        &format!(
            "count(count by (job, instance) ((increase({}{{{selector}}}[{range}]) > 0) or (increase({}{{{selector},type=\"completion\"}}[{range}]) > 0)))",
            names::REQUESTS_TOTAL,
            names::TOKENS_TOTAL
        ),
        time,
    )
    .await?
    .first()
    .map_or(0, |s| count(s.value));
    // The configurations: the info series of the fingerprint (or of every fingerprint seen).
    let mut info_selector = Vec::new();
    if let Some(fingerprint) = &query.fingerprint {
        info_selector.push(format!("fingerprint={}", quote(fingerprint)));
    }
    info_selector.extend(query.matchers.iter().cloned());
    let configs = ask(
        client,
        &format!(
            "max by (fingerprint, engine, version) (max_over_time({CONFIG_INFO}{{{}}}[{range}]))",
            info_selector.join(",")
        ),
        time,
    )
    .await?;
    let engines: BTreeSet<&str> = configs.iter().map(|s| s.label("engine")).collect();
    let versions: BTreeSet<&str> = configs.iter().map(|s| s.label("version")).collect();
    let fingerprints: BTreeSet<&str> = configs.iter().map(|s| s.label("fingerprint")).collect();
    let only = |set: &BTreeSet<&str>| match set.iter().collect::<Vec<_>>().as_slice() {
        [one] if !one.is_empty() => Some((**one).to_owned()),
        _ => None,
    };
    metadata.engine.name = only(&engines);
    metadata.engine.version = only(&versions);
    let fingerprint_text = match (&query.fingerprint, fingerprints.len()) {
        (Some(id), _) => Some(id.clone()),
        (None, 0) => None,
        (None, _) => Some(fingerprints.iter().copied().collect::<Vec<_>>().join(", ")),
    };
    if let Some(text) = fingerprint_text {
        // The same fact a sidecar's own matrix and a sweep record their fingerprint in.
        metadata.extra_facts.push(Fact {
            section: crate::aggregate::config::FINGERPRINT_SECTION.to_owned(),
            key: crate::aggregate::config::FINGERPRINT_KEY.to_owned(),
            value: text,
        });
    }
    metadata.extra_facts.push(Fact {
        section: crate::matrix::facts::SECTION_RUN.to_owned(),
        key: "Replicas".to_owned(),
        value: replicas.to_string(),
    });
    metadata.notes.push(format!(
        "Fleet matrix from {} over {} ending {}: {{{selector}}} summed over {replicas} replicas.",
        client.shown(),
        window_text(query.window),
        format_rfc3339(now)
    ));
    metadata.notes.push(
        "Per request tok/s is 1 ÷ the TBT median, read from histogram buckets summed over the replicas (as coarse as the buckets); the decode tok/s per stream, exact from counters, is Total tok/s ÷ Average active requests (Σ completion tokens ÷ Σ decode request-seconds).".to_owned(),
    );
    if configs.len() > 1 && query.fingerprint.is_none() {
        metadata.notes.push(format!(
            "The window mixes {} configurations ({}): pass --fingerprint to see one.",
            fingerprints.len(),
            fingerprints.iter().copied().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(metadata)
}

/// A window as people write it: `1h`, `5m`, `90s`.
pub fn window_text(window: Duration) -> String {
    let seconds = window.as_secs();
    if seconds >= 3600 && seconds % 3600 == 0 {
        format!("{}h", seconds / 3600)
    } else if seconds >= 60 && seconds % 60 == 0 {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> FleetQuery {
        FleetQuery {
            model: None,
            source: Source::Production,
            fingerprint: Some("ab\"c".into()),
            matchers: vec!["cluster=\"eu\"".into(), "  ".into()],
            window: Duration::from_secs(3600),
            evidence: EvidenceRule::NONE,
        }
    }

    #[test]
    fn selectors_quote_their_values() {
        assert_eq!(
            query().selector(Some("a/b")),
            r#"source="production",model="a/b",fingerprint="ab\"c",cluster="eu""#
        );
        assert_eq!(query().range(), "3600s");
        assert_eq!(
            increase_by(CELL, "m", "s=\"1\"", "type=\"x\"", "60s"),
            "sum by (context_bucket, concurrency_bucket) (increase(m{s=\"1\",type=\"x\"}[60s]))"
        );
    }

    #[test]
    fn a_cell_follows_the_recording_rules() {
        let figures = CellFigures {
            completion_tokens: Some(1000.0),
            decode_seconds: Some(20.0),
            active_sum: Some(40.0),
            active_count: Some(10.0),
            busy_seconds: Some(2.0),
            ok_requests: 10.0,
            slo_met: 9.0,
            slo_judged: 10.0,
            goodput_tokens: Some(900.0),
            quantiles: [Some(0.1), None, None, Some(0.02), None, None, None, None],
            ..CellFigures::default()
        };
        let cell = figures.to_cell(8192, 4);
        assert_eq!(cell.status, CellStatus::Valid);
        // 1 ÷ the TBT median (20 ms); the decode tok/s per stream (1000 ÷ 20 s) is Total ÷
        // Average active.
        assert_eq!(cell.per_request_tok_s, Some(50.0));
        assert_eq!(cell.average_active_requests, Some(4.0));
        assert_eq!(cell.total_tok_s, Some(200.0));

        // Two quantities, two figures: a TBT median of 25 ms with the same counters.
        let slower_median = CellFigures {
            quantiles: [Some(0.1), None, None, Some(0.025), None, None, None, None],
            ..figures.clone()
        }
        .to_cell(8192, 4);
        assert_eq!(slower_median.per_request_tok_s, Some(40.0));
        assert_eq!(slower_median.total_tok_s, Some(200.0));
        assert_eq!(cell.measured_for_s, Some(5.0));
        assert_eq!(cell.prefill_overlap_share, Some(0.1));
        assert_eq!(cell.slo_attainment, Some(0.9));
        assert_eq!(cell.goodput_tok_s, Some(180.0));
        assert_eq!(cell.ttft_ms, Some(100.0));
        assert_eq!(cell.tbt_ms, Some(20.0));
        assert_eq!(cell.completed_requests, Some(10));

        let failing = CellFigures {
            ok_requests: 8.0,
            failed: BTreeMap::from([("timeout".to_owned(), 2.0)]),
            ..CellFigures::default()
        };
        assert_eq!(
            failing.to_cell(8192, 1).status,
            CellStatus::Error("2 of 10 requests failed (mostly timeout)".into())
        );
        // Nothing known: no figures, no division by zero.
        let empty = CellFigures::default().to_cell(8192, 1);
        assert_eq!(empty.per_request_tok_s, None);
        assert_eq!(empty.total_tok_s, None);
    }
}
