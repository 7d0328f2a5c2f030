//! From measurements to matrix rows, the seed tool's arithmetic. Pure.
//!
//! * Total tok/s = completion tokens seen by the proxy's live synthetic counter inside the
//!   window ÷ window (the sum of usage increments, not chunks).
//! * Per-request tok/s, TBT and TTFT: medians over the cell's stream records (TBT =
//!   (last − first token) / (completion − 1); per-request = 1 / TBT).
//! * Average active requests: mean of the server's running gauge sampled in the window, else
//!   the mean of the records' own time-weighted averages.
//! * Completed requests: streams that finished by themselves inside the window.
//! * Prefill overlap and overlapping prefills: the production aggregator's sums
//!   ([`InterferenceSum`]) over the cell's stream records.
//! * SLO attainment: share of the cell's streams with targets that met them all ([`SloSum`]);
//!   goodput: total tok/s × the met streams' share of the streams' completion tokens.
//! * Shed: a cell whose failed streams were mostly shed by the engine (outcome `shed`: 429/503,
//!   a queue cap) is `Shed`, not `Error`.
//! * Prefill: the scout's (prompt − cached) ÷ TTFT and its TTFT.

use std::sync::Arc;
use std::time::Duration;

use crate::aggregate::cell::{
    tail_ms, BurstSum, FirstTokenSum, InterferenceSum, PromptCacheSum, ServerStateSum, SloSum,
    StepSum,
};
use crate::aggregate::sketch::QuantileSketch;
use crate::matrix::{CellStatus, DecodeCell, PrefillRow, Tails};
use crate::meter::record::SloVerdict;
use crate::meter::record::{prefill_rate, Outcome, RequestRecord};

/// What the runner gathered for one decode cell.
#[derive(Debug, Clone)]
pub struct CellMeasurement {
    pub context: u64,
    pub concurrency: u32,
    pub window: Duration,
    pub window_tokens: u64,
    /// The server's running-requests gauge, sampled during the window.
    pub running_samples: Vec<f64>,
    pub completed_in_window: u64,
    /// Records of every stream the cell started (first streams and restarts).
    pub records: Vec<Arc<RequestRecord>>,
    /// Why streams failed (empty when none did).
    pub failures: Vec<String>,
    /// Streams started in all (for the error message).
    pub streams: usize,
    /// Mean production requests in flight to the same server during the window (`None`
    /// when not sampled).
    pub production_in_flight: Option<f64>,
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values.get(mid).copied()
    } else {
        Some((values.get(mid - 1)? + values.get(mid)?) / 2.0)
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The decode cell of a measurement.
pub fn decode_cell(m: &CellMeasurement) -> DecodeCell {
    if let Some(first) = m.failures.first() {
        let failed = m.failures.len();
        let shed = m
            .records
            .iter()
            .filter(|r| r.outcome == Outcome::Shed)
            .count();
        if shed > 0 && 2 * shed >= failed {
            // The engine refused the cell's load (429/503, a queue cap): a status of its own,
            // a miss for capacity, not a broken measurement.
            let reason = format!("{shed} of {} streams shed", m.streams.max(shed));
            return DecodeCell::status_only(m.context, m.concurrency, CellStatus::shed(&reason));
        }
        let reason = if failed == 1 {
            format!("{first} (1 of {} streams)", m.streams.max(1))
        } else {
            format!(
                "{first} ({failed} of {} streams failed)",
                m.streams.max(failed)
            )
        };
        return DecodeCell::status_only(m.context, m.concurrency, CellStatus::error(&reason));
    }
    let window_s = m.window.as_secs_f64();
    let with_tokens: Vec<&Arc<RequestRecord>> = m
        .records
        .iter()
        .filter(|r| r.timing.ttft.is_some())
        .collect();
    let per_request = median(
        with_tokens
            .iter()
            .filter_map(|r| r.tokens.per_second)
            .collect(),
    );
    let tbt = median(
        with_tokens
            .iter()
            .filter_map(|r| r.timing.tbt.map(millis))
            .collect(),
    );
    let ttft = median(
        with_tokens
            .iter()
            .filter_map(|r| r.timing.ttft.map(millis))
            .collect(),
    );
    let average_active = if m.running_samples.is_empty() {
        let values: Vec<f64> = with_tokens
            .iter()
            .map(|r| r.interference.average_active)
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    } else {
        Some(m.running_samples.iter().sum::<f64>() / m.running_samples.len() as f64)
    };
    let prompt_tokens = most_common(m.records.iter().filter_map(|r| r.tokens.prompt));
    let mut interference = InterferenceSum::default();
    let mut slo = SloSum::default();
    let mut server_state = ServerStateSum::default();
    let mut first_tokens = FirstTokenSum::default();
    let mut prompt_cache = PromptCacheSum::default();
    let mut steps = StepSum::default();
    let mut bursts = BurstSum::default();
    for record in &with_tokens {
        steps.add(record);
        bursts.add(record);
        first_tokens.add(record);
        prompt_cache.add(record);
        interference.add(record);
        server_state.add(record);
        slo.add_verdict(record.slo.verdict);
        if record.slo.verdict == SloVerdict::Met {
            slo.met_tokens += record.tokens.completion as f64;
        }
    }
    let record_tokens: u64 = with_tokens.iter().map(|r| r.tokens.completion).sum();
    let tails = stream_tails(&with_tokens);
    let total_tok_s = (window_s > 0.0).then(|| m.window_tokens as f64 / window_s);
    DecodeCell {
        tokens_per_step: steps.tokens_per_step(),
        prompt_cache: prompt_cache.to_prompt_cache(),
        first_tokens: first_tokens.to_first_tokens(),
        context_tokens: m.context,
        concurrency: m.concurrency,
        // A sweep stream handed over at once measured the delivery, not the engine.
        status: bursts.status().unwrap_or(CellStatus::Valid),
        total_tok_s,
        per_request_tok_s: per_request,
        ttft_ms: ttft,
        tbt_ms: tbt,
        average_active_requests: average_active,
        completed_requests: Some(m.completed_in_window),
        output_tokens: Some(m.window_tokens),
        measured_for_s: Some(window_s),
        prompt_tokens,
        prefill_overlap_share: interference.share(),
        overlapping_prefills: interference.mean_overlapping_prefills(),
        slo_attainment: slo.attainment(),
        goodput_tok_s: slo.goodput(total_tok_s, record_tokens as f64),
        server_state: server_state.to_state(),
        tails,
        production_in_flight: m.production_in_flight,
    }
}

/// p90 and p99 of the streams' TTFT and TBT (one sample per stream) and of their ITL (one
/// per generated token after the first), through the production aggregator's sketch so both
/// matrices compute a tail alike.
fn stream_tails(records: &[&Arc<RequestRecord>]) -> Option<Tails> {
    let mut ttft = QuantileSketch::new();
    let mut tbt = QuantileSketch::new();
    let mut itl = QuantileSketch::new();
    for record in records {
        if let Some(value) = record.timing.ttft {
            ttft.add(value.as_secs_f64(), 1.0);
        }
        if let Some(value) = record.timing.tbt {
            tbt.add(value.as_secs_f64(), 1.0);
        }
        for (gap, count) in record.timing.itl.buckets() {
            itl.add(gap, count as f64);
        }
    }
    // Each tail only where its own samples carry it: streams for TTFT and TBT, tokens for ITL.
    let streams = ttft.weight();
    Tails::from_values([
        tail_ms(&ttft, 0.9, streams),
        tail_ms(&ttft, 0.99, streams),
        tail_ms(&tbt, 0.9, tbt.weight()),
        tail_ms(&tbt, 0.99, tbt.weight()),
        tail_ms(&itl, 0.9, itl.weight()),
        tail_ms(&itl, 0.99, itl.weight()),
    ])
}

/// How far a sweep cell's measured average active requests may sit from its concurrency
/// (relative) before the cell is Off target: it measured another cell.
pub const OFF_TARGET_ACTIVE_SHARE: f64 = 0.25;
/// Prefill overlap above which a cell that ran beside production traffic is Off target: other
/// requests' prefills stalled its decode (the sweep's own restarts overlap little).
pub const OFF_TARGET_PREFILL_OVERLAP: f64 = 0.10;

/// Why a measured (`Valid`) sweep cell did not measure its label, or `None` when it did: its
/// average active requests are more than [`OFF_TARGET_ACTIVE_SHARE`] off its concurrency, or
/// production requests ran beside it and prefill overlap exceeded
/// [`OFF_TARGET_PREFILL_OVERLAP`]. The text names the figures.
pub fn off_target(cell: &DecodeCell) -> Option<String> {
    if !cell.status.is_valid() {
        return None;
    }
    let target = f64::from(cell.concurrency);
    let beside = cell
        .production_in_flight
        .map(|p| format!(" with {p:.1} production requests in flight on average"))
        .unwrap_or_default();
    if let Some(active) = cell
        .average_active_requests
        .filter(|a| a.is_finite() && (a - target).abs() > OFF_TARGET_ACTIVE_SHARE * target)
    {
        return Some(format!(
            "the server averaged {active:.1} active requests, not {}{beside}",
            cell.concurrency
        ));
    }
    let overlap = cell.prefill_overlap_share.unwrap_or(0.0);
    if cell.production_in_flight.is_some() && overlap > OFF_TARGET_PREFILL_OVERLAP {
        return Some(format!(
            "production prefills overlapped {:.0} % of its decode{beside}",
            overlap * 100.0
        ));
    }
    None
}

/// The prefill row of a scout's record (or its failure).
pub fn prefill_row(
    context: u64,
    record: Option<&RequestRecord>,
    failure: Option<&str>,
) -> PrefillRow {
    let failed = |reason: &str| PrefillRow {
        context_tokens: context,
        requests_at_once: 1,
        status: CellStatus::error(reason),
        prompt_tok_s: None,
        ttft_ms: None,
        completed_requests: None,
        prompt_tokens: None,
    };
    if let Some(reason) = failure {
        return failed(reason);
    }
    let Some(record) = record else {
        return failed("the proxy published no record for the scout request");
    };
    if record.outcome != Outcome::Ok {
        return failed(&format!(
            "scout request ended {} (HTTP {})",
            record.outcome.label(),
            record.status
        ));
    }
    // Prefill ends with the first token delivered, visible or not: a scout's one token can be
    // silent (vLLM's `"text":""` for a partial UTF-8 byte, counted only by usage).
    let Some(ttft) = record.timing.to_first_delivery.or(record.timing.ttft) else {
        return failed("the scout request produced no token");
    };
    // The record's own rate is timed to the first visible token: recomputed when that differs.
    let rate = if record.timing.ttft == Some(ttft) {
        record.tokens.prefill_per_second
    } else {
        prefill_rate(record.tokens.prompt, record.tokens.cached, Some(ttft))
    };
    let prompt_tok_s = rate.or_else(|| {
        let prompt = record.tokens.prompt.unwrap_or(context) as f64;
        (ttft.as_secs_f64() > 0.0).then(|| prompt / ttft.as_secs_f64())
    });
    PrefillRow {
        context_tokens: context,
        requests_at_once: 1,
        status: CellStatus::Valid,
        prompt_tok_s,
        ttft_ms: Some(millis(ttft)),
        completed_requests: Some(1),
        prompt_tokens: record.tokens.prompt,
    }
}

/// The most frequent value (ties: the larger), `None` when empty.
fn most_common(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for value in values {
        match counts.iter_mut().find(|(v, _)| *v == value) {
            Some((_, n)) => *n += 1,
            None => counts.push((value, 1)),
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(v, n)| (n, v))
        .map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::Route;
    use crate::base::Source;
    use crate::meter::record::{Interference, Timing, Tokens};
    use crate::meter::RequestLabels;
    use std::time::SystemTime;

    fn record(ttft_ms: u64, tbt_ms: f64, active: f64) -> Arc<RequestRecord> {
        let tbt = Duration::from_secs_f64(tbt_ms / 1000.0);
        Arc::new(RequestRecord {
            labels: RequestLabels {
                source: Source::Synthetic,
                route: Route::Completions,
                ..RequestLabels::for_test()
            },
            timing: Timing {
                started_at: SystemTime::now(),
                ttft: Some(Duration::from_millis(ttft_ms)),
                to_first_delivery: Some(Duration::from_millis(ttft_ms)),
                duration: Duration::from_secs(3),
                tbt: Some(tbt),
                ..Timing::default()
            },
            tokens: Tokens {
                prompt: Some(8192),
                cached: Some(8191),
                completion: 300,
                completion_exact: true,
                events: 300,
                coalesced_events: 0,
                max: Some(4096),
                per_second: Some(1.0 / tbt.as_secs_f64()),
                prefill_per_second: None,
                reasoning: None,
            },
            interference: Interference {
                average_active: active,
                ..Interference::default()
            },
            ..RequestRecord::for_test()
        })
    }

    fn measurement(records: Vec<Arc<RequestRecord>>) -> CellMeasurement {
        CellMeasurement {
            context: 8192,
            concurrency: 3,
            window: Duration::from_secs(2),
            window_tokens: 600,
            running_samples: vec![],
            completed_in_window: 0,
            records,
            failures: vec![],
            streams: 3,
            production_in_flight: None,
        }
    }

    #[test]
    fn a_cell_beside_production_or_off_its_concurrency_is_off_target() {
        let mut cell = DecodeCell::status_only(8192, 1, CellStatus::Valid);
        cell.average_active_requests = Some(1.1);
        assert_eq!(off_target(&cell), None);
        // The cell: "8K × 1" at 5.0 average active with 4 production streams.
        cell.average_active_requests = Some(5.0);
        cell.production_in_flight = Some(4.0);
        assert_eq!(
            off_target(&cell).as_deref(),
            Some("the server averaged 5.0 active requests, not 1 with 4.0 production requests in flight on average")
        );
        // On target by count, but production's prefills stalled 40 % of its decode.
        let mut stalled = DecodeCell::status_only(8192, 4, CellStatus::Valid);
        stalled.average_active_requests = Some(4.6);
        stalled.prefill_overlap_share = Some(0.4);
        assert_eq!(
            off_target(&stalled),
            None,
            "its own restarts: no production"
        );
        stalled.production_in_flight = Some(0.6);
        assert!(off_target(&stalled)
            .unwrap()
            .starts_with("production prefills overlapped 40 %"));
        assert_eq!(
            off_target(&DecodeCell::status_only(8192, 4, CellStatus::NotRun)),
            None
        );
    }

    #[test]
    fn valid_cell_uses_medians_and_the_window() {
        let m = measurement(vec![
            record(100, 10.0, 3.0),
            record(300, 12.0, 3.0),
            record(200, 11.0, 2.0),
        ]);
        let cell = decode_cell(&m);
        assert_eq!(cell.status, CellStatus::Valid);
        assert_eq!(cell.total_tok_s, Some(300.0));
        assert!((cell.tbt_ms.unwrap() - 11.0).abs() < 1e-6);
        assert!((cell.per_request_tok_s.unwrap() - 1000.0 / 11.0).abs() < 1e-6);
        assert!((cell.ttft_ms.unwrap() - 200.0).abs() < 1e-6);
        assert!((cell.average_active_requests.unwrap() - 8.0 / 3.0).abs() < 1e-9);
        assert_eq!(cell.output_tokens, Some(600));
        assert_eq!(cell.measured_for_s, Some(2.0));
        assert_eq!(cell.prompt_tokens, Some(8192));
        let sampled = CellMeasurement {
            running_samples: vec![3.0, 3.0, 2.0, 4.0],
            ..m
        };
        assert_eq!(decode_cell(&sampled).average_active_requests, Some(3.0));
    }

    #[test]
    fn streams_the_engine_shed_make_a_shed_cell() {
        let mut shed = (*record(100, 10.0, 1.0)).clone();
        shed.outcome = Outcome::Shed;
        shed.status = 503;
        let mut m = measurement(vec![record(100, 10.0, 1.0), Arc::new(shed)]);
        m.failures = vec!["HTTP 503: The request queue is full.".into()];
        m.streams = 4;
        let cell = decode_cell(&m);
        assert_eq!(cell.status, CellStatus::Shed("1 of 4 streams shed".into()));
        cell.validate().unwrap();
    }

    #[test]
    fn failures_make_an_error_cell() {
        let mut m = measurement(vec![record(100, 10.0, 1.0)]);
        m.failures = vec!["HTTP 500: boom".into(), "HTTP 500: boom".into()];
        m.streams = 4;
        let cell = decode_cell(&m);
        assert_eq!(
            cell.status,
            CellStatus::Error("HTTP 500: boom (2 of 4 streams failed)".into())
        );
        assert!(!cell.has_figures());
        cell.validate().unwrap();
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn scout_rows() {
        let r = record(500, 10.0, 1.0);
        let mut cold = (*r).clone();
        cold.tokens.prefill_per_second = Some(16_384.0);
        let row = prefill_row(8192, Some(&cold), None);
        assert_eq!(row.status, CellStatus::Valid);
        assert_eq!(row.prompt_tok_s, Some(16_384.0));
        assert_eq!(row.ttft_ms, Some(500.0));
        // The one token was silent: no visible first token, prefill still timed (1 fresh token).
        let mut silent = (*r).clone();
        silent.timing.ttft = None;
        silent.timing.to_first_delivery = Some(Duration::from_millis(250));
        let row = prefill_row(8192, Some(&silent), None);
        assert_eq!(row.status, CellStatus::Valid);
        assert_eq!(row.ttft_ms, Some(250.0));
        assert_eq!(row.prompt_tok_s, Some(4.0));
        let failed = prefill_row(8192, None, Some("HTTP 400: too long"));
        assert_eq!(
            failed.status,
            CellStatus::Error("HTTP 400: too long".into())
        );
        failed.validate().unwrap();
    }
}
