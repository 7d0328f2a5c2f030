//! What a metered request adds to the page ([`RecordSink`] for [`PrometheusMetrics`]): the
//! in-flight gauge at its start, its cell's series registered at 0 where it is expected, and at
//! its end its outcome, timings, tokens (split by the concurrency bucket they were emitted in)
//! and SLO verdict.

use std::sync::Arc;

use crate::meter::record::{Outcome, RequestRecord, SloVerdict};
use crate::meter::{ExpectedCell, RecordSink, RequestLabels};

use super::flush::flush;
use super::keys::CellKey;
use super::sink::PrometheusMetrics;

impl PrometheusMetrics {
    /// SLO counters: the verdict at the request's own cell, a met request's tokens split by
    /// concurrency bucket like the completion tokens.
    fn record_slo(&self, r: &RequestRecord) {
        let Some(verdict) = SloVerdict::JUDGED.iter().position(|v| *v == r.slo.verdict) else {
            return;
        };
        let key = |bucket: usize| CellKey::of_record(r, bucket);
        if let Some(counter) = self
            .slo_cell(key(r.buckets.concurrency))
            .requests
            .get(verdict)
        {
            counter.increment(1);
        }
        if r.slo.verdict != SloVerdict::Met {
            return;
        }
        if r.interference.split.total_tokens() == 0 {
            self.slo_cell(key(r.buckets.concurrency))
                .goodput_tokens
                .increment(r.tokens.completion);
            return;
        }
        for (bucket, &tokens) in r.interference.split.tokens.iter().enumerate() {
            if tokens > 0 {
                self.slo_cell(key(bucket))
                    .goodput_tokens
                    .increment(u64::from(tokens));
            }
        }
    }
}

impl RecordSink for PrometheusMetrics {
    fn started(&self, labels: &RequestLabels) {
        let key = (
            Arc::clone(&labels.model),
            Arc::clone(&labels.upstream),
            labels.route,
            labels.source,
        );
        self.base(key).inflight.increment(1.0);
    }

    fn expected(&self, labels: &RequestLabels, cell: ExpectedCell) {
        // Creating the handles registers every series of the cell at 0.
        self.cell(CellKey {
            model: Arc::clone(&labels.model),
            upstream: Arc::clone(&labels.upstream),
            route: labels.route,
            source: labels.source,
            context: cell.context,
            concurrency: cell.concurrency,
            fingerprint: cell.fingerprint,
            slice: labels.slice.clone(),
        });
    }

    fn record(&self, r: &Arc<RequestRecord>) {
        let base = self.base((
            Arc::clone(&r.labels.model),
            Arc::clone(&r.labels.upstream),
            r.labels.route,
            r.labels.source,
        ));
        base.inflight.decrement(1.0);
        if let Some(overhead) = r.overhead.request {
            base.overhead_request.record(overhead.as_secs_f64());
        }
        flush(&base.overhead_frame, &r.overhead.per_frame);
        if r.slo.header_invalid {
            base.slo_header_invalid.increment(1);
        }
        self.record_slo(r);

        let cell = self.cell(CellKey::of_record(r, r.buckets.concurrency));
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == r.outcome) {
            if let Some(counter) = cell.outcomes.get(i) {
                counter.increment(1);
            }
        }
        cell.duration.record(r.timing.duration.as_secs_f64());
        if let Some(ttft) = r.timing.ttft {
            cell.ttft.record(ttft.as_secs_f64());
        }
        if let Some(tbt) = r.timing.tbt {
            cell.tbt.record(tbt.as_secs_f64());
        }
        if let Some(answer) = r.timing.ttft_answer {
            cell.ttft_answer.record(answer.as_secs_f64());
        }
        if let Some(tool_call) = r.timing.ttft_tool_call {
            cell.ttft_tool_call.record(tool_call.as_secs_f64());
        }
        if let Some(reasoning) = r.tokens.reasoning {
            cell.reasoning_tokens.record(reasoning as f64);
        }
        if let Some(rate) = r.tokens.per_second {
            cell.per_request.record(rate);
        }
        if let Some(rate) = r.tokens.prefill_per_second {
            cell.prefill.record(rate);
        }
        if let Some(prompt) = r.tokens.prompt {
            cell.prompt.record(prompt as f64);
            cell.prompt_tokens.increment(prompt);
        }
        if let Some(cached) = r.tokens.cached {
            cell.cached_tokens.increment(cached);
        }
        cell.completion.record(r.tokens.completion as f64);
        if let Some(per_event) = r.tokens.per_event() {
            cell.tokens_per_event.record(per_event);
        }
        flush(&cell.itl, &r.timing.itl);
        if r.timing.decode.is_some() {
            cell.average_active.record(r.interference.average_active);
        }
        if let Some(share) = r.interference.prefill_overlap_share {
            cell.prefill_overlap.record(share);
        }
        if let Some(overlapping) = r.interference.overlapping_prefills {
            cell.overlapping_prefills.record(f64::from(overlapping));
        }
        // Completion tokens and decode seconds by the concurrency in force when they were
        // emitted: the production matrix's cells, summable across replicas.
        for (bucket, (&tokens, &seconds)) in r
            .interference
            .split
            .tokens
            .iter()
            .zip(r.interference.split.seconds.iter())
            .enumerate()
        {
            if tokens == 0 && seconds == 0.0 {
                continue;
            }
            let split = if bucket == r.buckets.concurrency {
                Arc::clone(&cell)
            } else {
                self.cell(CellKey::of_record(r, bucket))
            };
            split.completion_tokens.increment(u64::from(tokens));
            split.decode_seconds.record(seconds);
            if r.interference.prefill_overlap_share.is_some() {
                let busy = r
                    .interference
                    .prefill_busy
                    .get(bucket)
                    .copied()
                    .unwrap_or(0.0);
                split.prefill_busy.record(busy);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::buckets::Ladder;
    use crate::meter::identity::FingerprintId;
    use crate::telemetry::names::*;

    fn sink() -> Arc<PrometheusMetrics> {
        PrometheusMetrics::new(
            Ladder::contexts(&[1024, 4096]).unwrap(),
            Ladder::concurrency(&[1, 8]).unwrap(),
        )
        .unwrap()
    }

    fn labels_of(r: &RequestRecord) -> RequestLabels {
        r.labels.clone()
    }

    /// The value of the one sample of `name` whose labels contain every one of `labels`.
    fn sample(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
        let found: Vec<f64> = page
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().copied()
    }

    #[test]
    fn a_request_is_in_flight_from_start_to_record_and_counted_by_outcome() {
        let sink = sink();
        let mut record = RequestRecord::for_test();
        record.outcome = Outcome::Ok;
        record.tokens.prompt = Some(900);
        record.tokens.cached = Some(100);
        sink.started(&labels_of(&record));
        let page = sink.render();
        assert_eq!(sink_inflight(&page), Some(1.0), "{page}");
        sink.record(&Arc::new(record));
        let page = sink.render();
        assert_eq!(sink_inflight(&page), Some(0.0), "{page}");
        let ok = "outcome=\"ok\"";
        assert_eq!(sample(&page, REQUESTS_TOTAL, &[ok]), Some(1.0), "{page}");
        let other = Outcome::ALL
            .iter()
            .find(|o| **o != Outcome::Ok)
            .map(|o| format!("outcome=\"{}\"", o.label()))
            .unwrap();
        assert_eq!(sample(&page, REQUESTS_TOTAL, &[&other]), Some(0.0));
        assert_eq!(
            sample(&page, TOKENS_TOTAL, &["type=\"prompt\""]),
            Some(900.0)
        );
        assert_eq!(
            sample(&page, TOKENS_TOTAL, &["type=\"cached\""]),
            Some(100.0)
        );
    }

    fn sink_inflight(page: &str) -> Option<f64> {
        sample(page, INFLIGHT_REQUESTS, &["model=\"m\""])
    }

    #[test]
    fn an_expected_cell_is_on_the_page_at_zero_before_any_request_ends() {
        let sink = sink();
        let record = RequestRecord::for_test();
        sink.expected(
            &labels_of(&record),
            ExpectedCell {
                context: 2,
                concurrency: 1,
                fingerprint: FingerprintId::UNKNOWN,
            },
        );
        let page = sink.render();
        let cell = [
            "context_bucket=\">4K\"",
            "concurrency_bucket=\"8\"",
            "outcome=\"ok\"",
        ];
        assert_eq!(sample(&page, REQUESTS_TOTAL, &cell), Some(0.0), "{page}");
    }

    #[test]
    fn tokens_land_in_the_concurrency_bucket_they_were_emitted_in() {
        let sink = sink();
        let mut record = RequestRecord::for_test();
        record.buckets.concurrency = 2;
        record.tokens.completion = 8;
        record.interference.split.tokens[0] = 3;
        record.interference.split.seconds[0] = 0.3;
        record.interference.split.tokens[2] = 5;
        record.interference.split.seconds[2] = 0.5;
        sink.record(&Arc::new(record));
        let page = sink.render();
        let completion = |bucket: &str| {
            let bucket = format!("concurrency_bucket=\"{bucket}\"");
            sample(&page, TOKENS_TOTAL, &["type=\"completion\"", &bucket])
        };
        assert_eq!(completion("1"), Some(3.0), "{page}");
        assert_eq!(completion(">8"), Some(5.0), "{page}");
        assert_eq!(completion("8"), None, "no token was emitted at 8: {page}");
        // The outcome is counted once, at the request's own bucket.
        assert_eq!(
            sample(
                &page,
                REQUESTS_TOTAL,
                &["outcome=\"ok\"", "concurrency_bucket=\"1\""]
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &page,
                REQUESTS_TOTAL,
                &["outcome=\"ok\"", "concurrency_bucket=\">8\""]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn slo_series_appear_with_the_first_judged_request_and_met_tokens_are_goodput() {
        let sink = sink();
        let mut unjudged = RequestRecord::for_test();
        unjudged.tokens.completion = 4;
        sink.record(&Arc::new(unjudged.clone()));
        let page = sink.render();
        assert!(!page.contains(SLO_REQUESTS_TOTAL), "{page}");

        let mut met = unjudged.clone();
        met.slo.verdict = SloVerdict::Met;
        met.tokens.completion = 6;
        sink.record(&Arc::new(met));
        let mut missed = unjudged;
        missed.slo.verdict = SloVerdict::Missed;
        sink.record(&Arc::new(missed));
        let page = sink.render();
        assert_eq!(
            sample(&page, SLO_REQUESTS_TOTAL, &["slo=\"met\""]),
            Some(1.0)
        );
        assert_eq!(
            sample(&page, SLO_REQUESTS_TOTAL, &["slo=\"missed\""]),
            Some(1.0)
        );
        assert_eq!(
            sample(&page, SLO_GOODPUT_TOKENS_TOTAL, &[]),
            Some(6.0),
            "only the met request's tokens: {page}"
        );
    }
}
