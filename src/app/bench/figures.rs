//! The self-check's figures and verdict: the direct and proxied rounds' samples pooled into
//! percentiles, what the proxy added (proxied − direct), the streams that came through intact,
//! CPU per event and memory per stream, judged against the bars of the product contract
//! (docs/benchmarks.md) where this machine can judge them.

use std::time::Duration;

use serde::Serialize;

use super::client::StreamSample;

/// The product's bars (SPEC §9) the self-check can judge.
pub const BAR_ADDED_TTFT_P99_MS: f64 = 1.0;
pub const BAR_ADDED_GAP_P99_MS: f64 = 0.2;
pub const BAR_KIB_PER_STREAM: f64 = 16.0;
/// Below this many cores client, upstream and proxy cannot be kept off each other's cores, so
/// added latency is printed but not judged (the same rule as `scripts/bench.sh overhead`).
pub const MIN_CORES_TO_JUDGE_LATENCY: usize = 8;
/// The direct path's TTFT p50 moving more than this between rounds: the machine was too busy
/// for the latency difference to mean anything.
pub const NOISE_SPREAD: f64 = 0.25;

/// Percentiles of one path, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PathFigures {
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
}

impl PathFigures {
    pub fn of(samples: &[StreamSample]) -> Self {
        let mut ttft: Vec<f64> = samples.iter().filter_map(|s| s.ttft).map(ms).collect();
        let mut gaps: Vec<f64> = samples
            .iter()
            .flat_map(|s| s.gaps.iter().copied().map(ms))
            .collect();
        PathFigures {
            ttft_p50_ms: percentile(&mut ttft, 0.50),
            ttft_p99_ms: percentile(&mut ttft, 0.99),
            gap_p50_ms: percentile(&mut gaps, 0.50),
            gap_p99_ms: percentile(&mut gaps, 0.99),
        }
    }
}

/// What the proxy added: proxied − direct, per percentile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Added {
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
}

impl Added {
    pub fn between(direct: &PathFigures, proxied: &PathFigures) -> Self {
        Added {
            ttft_p50_ms: proxied.ttft_p50_ms - direct.ttft_p50_ms,
            ttft_p99_ms: proxied.ttft_p99_ms - direct.ttft_p99_ms,
            gap_p50_ms: proxied.gap_p50_ms - direct.gap_p50_ms,
            gap_p99_ms: proxied.gap_p99_ms - direct.gap_p99_ms,
        }
    }
}

/// Streams through the proxy, by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Intact {
    /// Proxied streams run.
    pub streams: u64,
    /// Complete, and (against the simulator) the same content in the same order as direct.
    pub intact: u64,
    /// Complete, but content lost, repeated or reordered against direct.
    pub altered: u64,
    /// Not complete: refused, cut or timed out.
    pub failed: u64,
    /// Whether content was compared with direct (the simulator answers the same question the
    /// same way; a sampling engine need not).
    pub compared_with_direct: bool,
}

impl Intact {
    /// Proxied samples judged against the first direct answer of the same stream index.
    pub fn judge(proxied: &[StreamSample], direct: &[StreamSample], compare: bool) -> Self {
        let mut intact = Intact {
            compared_with_direct: compare,
            ..Intact::default()
        };
        for sample in proxied {
            intact.streams += 1;
            if !sample.complete {
                intact.failed += 1;
                continue;
            }
            let reference = direct
                .iter()
                .find(|d| d.index == sample.index && d.complete);
            let same = reference.is_none_or(|d| {
                d.content_digest == sample.content_digest
                    && d.content_events == sample.content_events
            });
            if !compare || same {
                intact.intact += 1;
            } else {
                intact.altered += 1;
            }
        }
        intact
    }
}

/// The whole self-check, as printed and as `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub upstream: String,
    pub cores: usize,
    pub streams: u32,
    pub tokens: u32,
    pub rounds: u32,
    pub direct: PathFigures,
    pub proxied: PathFigures,
    pub added: Added,
    pub frames: Intact,
    /// Direct streams that were not complete (the upstream's own failures).
    pub direct_failed: u64,
    /// SSE events the proxy forwarded in the measured rounds.
    pub events: u64,
    /// The proxy's CPU time over the measured rounds ÷ the events it forwarded.
    pub cpu_us_per_event: Option<f64>,
    /// The proxy's resident memory at its peak in a round above its peak in the warm-up (a few
    /// streams), ÷ the streams added: what one more stream in flight costs, fixed growth out.
    pub kib_per_stream: Option<f64>,
    /// The direct path's TTFT p50 in each round (what the noise check reads).
    pub direct_ttft_p50_ms_by_round: Vec<f64>,
    /// Set when the machine moved too much between rounds to judge added latency.
    pub noise: Option<String>,
    /// One line: the headline, then every finding.
    pub verdict: String,
    /// The bars missed.
    pub over: Vec<String>,
    /// What held, and what could not be judged here.
    pub notes: Vec<String>,
    pub passed: bool,
}

impl Report {
    /// Judges the figures: frames always, memory where measured, latency where the machine
    /// can (cores enough, rounds quiet enough).
    pub fn judge(mut self) -> Self {
        self.noise = noise(&self.direct_ttft_p50_ms_by_round);
        let mut over = Vec::new();
        let mut notes = Vec::new();
        let f = &self.frames;
        if f.failed > 0 || f.altered > 0 {
            over.push(format!(
                "{} of {} streams not intact ({} failed, {} altered)",
                f.failed + f.altered,
                f.streams,
                f.failed,
                f.altered
            ));
        } else {
            notes.push(format!(
                "{} of {} streams intact{}",
                f.intact,
                f.streams,
                if f.compared_with_direct {
                    ", frame for frame as direct"
                } else {
                    ""
                }
            ));
        }
        // The bar is for idle streams (a few KiB of each buffer touched); a stream in flight
        // has its buffers written through, so its figure is shown, not held to that bar.
        if let Some(kib) = self.kib_per_stream {
            notes.push(format!(
                "memory {kib:.1} KiB per stream in flight, not judged: the {BAR_KIB_PER_STREAM:.0} KiB bar is for idle streams"
            ));
        }
        let latency = format!(
            "added TTFT p99 {:+.2} ms (bar {BAR_ADDED_TTFT_P99_MS}), per-frame p99 {:+.2} ms (bar {BAR_ADDED_GAP_P99_MS})",
            self.added.ttft_p99_ms, self.added.gap_p99_ms
        );
        if let Some(noise) = &self.noise {
            notes.push(latency);
            notes.push(format!("latency not judged: {noise}"));
        } else if self.cores < MIN_CORES_TO_JUDGE_LATENCY {
            notes.push(latency);
            notes.push(format!(
                "latency not judged: client, upstream and proxy share {} cores (needs {MIN_CORES_TO_JUDGE_LATENCY}+)",
                self.cores
            ));
        } else if self.added.ttft_p99_ms > BAR_ADDED_TTFT_P99_MS
            || self.added.gap_p99_ms > BAR_ADDED_GAP_P99_MS
        {
            over.push(latency);
        } else {
            notes.push(latency);
        }
        self.passed = over.is_empty();
        self.verdict = if over.is_empty() {
            format!("within the bars: {}", notes.join("; "))
        } else {
            format!("OVER: {}; {}", over.join("; "), notes.join("; "))
        };
        self.over = over;
        self.notes = notes;
        self
    }

    /// The human report: one line per figure, then the verdict.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let (d, p, a) = (&self.direct, &self.proxied, &self.added);
        out.push_str(&format!(
            "tokentap bench: {} streams × {} tokens, {} rounds, upstream {} ({} cores)\n",
            self.streams, self.tokens, self.rounds, self.upstream, self.cores
        ));
        out.push_str("                      direct     tokentap   added\n");
        for (name, direct, proxied, added) in [
            ("TTFT p50", d.ttft_p50_ms, p.ttft_p50_ms, a.ttft_p50_ms),
            ("TTFT p99", d.ttft_p99_ms, p.ttft_p99_ms, a.ttft_p99_ms),
            ("frame gap p50", d.gap_p50_ms, p.gap_p50_ms, a.gap_p50_ms),
            ("frame gap p99", d.gap_p99_ms, p.gap_p99_ms, a.gap_p99_ms),
        ] {
            out.push_str(&format!(
                "  {name:<16} {direct:>8.2} ms {proxied:>8.2} ms {added:>+8.3} ms\n"
            ));
        }
        let f = &self.frames;
        out.push_str(&format!(
            "  streams          {} intact, {} altered, {} failed of {} through tokentap ({} failed direct)\n",
            f.intact, f.altered, f.failed, f.streams, self.direct_failed
        ));
        out.push_str(&match self.cpu_us_per_event {
            Some(us) => format!(
                "  CPU per event    {us:.1} µs ({} events forwarded)\n",
                self.events
            ),
            None => "  CPU per event    not measured (no /proc)\n".to_owned(),
        });
        out.push_str(&match self.kib_per_stream {
            Some(kib) => format!("  memory           {kib:.1} KiB per stream in flight (resident, beyond the warm-up's)\n"),
            None => "  memory           not measured (no /proc)\n".to_owned(),
        });
        out.push_str(if self.passed {
            "verdict: within the bars\n"
        } else {
            "verdict: OVER the bars\n"
        });
        for over in &self.over {
            out.push_str(&format!("  over: {over}\n"));
        }
        for note in &self.notes {
            out.push_str(&format!("  {note}\n"));
        }
        out
    }
}

/// Names the rounds' spread when the direct path's TTFT p50 moved more than [`NOISE_SPREAD`].
fn noise(direct_ttft_p50_by_round: &[f64]) -> Option<String> {
    let lowest = direct_ttft_p50_by_round
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let highest = direct_ttft_p50_by_round
        .iter()
        .copied()
        .fold(0.0_f64, f64::max);
    (lowest > 0.0 && highest / lowest - 1.0 > NOISE_SPREAD).then(|| {
        format!(
            "the machine was busy (direct TTFT p50 {lowest:.2} to {highest:.2} ms across rounds, over {:.0} %)",
            NOISE_SPREAD * 100.0
        )
    })
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile (0 when there are no samples).
fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32, complete: bool, digest: u64) -> StreamSample {
        StreamSample {
            index,
            complete,
            content_digest: digest,
            content_events: 3,
            ..StreamSample::default()
        }
    }

    fn report(cores: usize, rounds: Vec<f64>, added_gap_p99: f64, kib: f64) -> Report {
        Report {
            upstream: "embedded simulator".into(),
            cores,
            streams: 500,
            tokens: 3,
            rounds: rounds.len() as u32,
            direct: PathFigures::default(),
            proxied: PathFigures::default(),
            added: Added {
                gap_p99_ms: added_gap_p99,
                ..Added::default()
            },
            frames: Intact {
                streams: 2,
                intact: 2,
                compared_with_direct: true,
                ..Intact::default()
            },
            direct_failed: 0,
            events: 10,
            cpu_us_per_event: Some(12.0),
            kib_per_stream: Some(kib),
            direct_ttft_p50_ms_by_round: rounds,
            noise: None,
            verdict: String::new(),
            over: Vec::new(),
            notes: Vec::new(),
            passed: false,
        }
        .judge()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut values, 0.5), 50.0);
        assert_eq!(percentile(&mut values, 0.99), 99.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
        assert_eq!(percentile(&mut [7.0], 0.99), 7.0);
    }

    /// A frame lost or reordered changes the digest: the stream is altered; a stream cut short
    /// failed; without comparison (a real engine) only completeness counts.
    #[test]
    fn streams_are_judged_against_direct_by_index() {
        let direct = [sample(0, true, 1), sample(1, true, 2), sample(2, true, 3)];
        let proxied = [sample(0, true, 1), sample(1, true, 99), sample(2, false, 3)];
        let judged = Intact::judge(&proxied, &direct, true);
        assert_eq!((judged.intact, judged.altered, judged.failed), (1, 1, 1));
        let judged = Intact::judge(&proxied, &direct, false);
        assert_eq!((judged.intact, judged.altered, judged.failed), (2, 0, 1));
    }

    #[test]
    fn the_verdict_judges_latency_only_on_quiet_dedicated_machines() {
        let quiet = report(16, vec![100.0, 101.0, 99.0], 0.05, 12.0);
        assert!(quiet.passed, "{}", quiet.verdict);
        assert!(
            quiet.verdict.starts_with("within the bars"),
            "{}",
            quiet.verdict
        );
        let slow = report(16, vec![100.0, 101.0], 0.5, 12.0);
        assert!(!slow.passed);
        assert!(
            slow.verdict.contains("per-frame p99 +0.50 ms"),
            "{}",
            slow.verdict
        );
        let shared = report(2, vec![100.0, 101.0], 0.5, 12.0);
        assert!(shared.passed, "{}", shared.verdict);
        assert!(
            shared.verdict.contains("share 2 cores"),
            "{}",
            shared.verdict
        );
        let busy = report(16, vec![100.0, 140.0], 0.5, 12.0);
        assert!(busy.passed, "{}", busy.verdict);
        assert!(busy
            .noise
            .as_deref()
            .is_some_and(|n| n.contains("100.00 to 140.00")));
        let heavy = report(16, vec![100.0], 0.05, 20.5);
        assert!(heavy.passed, "{}", heavy.verdict);
        assert!(
            heavy
                .verdict
                .contains("memory 20.5 KiB per stream in flight, not judged"),
            "{}",
            heavy.verdict
        );
        let text = heavy.to_text();
        assert!(text.contains("CPU per event    12.0 µs"), "{text}");
        assert!(
            text.lines().all(|line| line.chars().count() <= 120),
            "{text}"
        );
    }
}
