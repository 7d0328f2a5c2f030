//! The speed-up search of `tokentap replay --find-speed`: the largest replay speed at which a
//! captured workload still meets an SLO on a deployment, found by a bounded search over
//! `--speed`, and its report (Markdown and JSON, schema `tokentap.find-speed/v1`).
//!
//! The search is pure ([`SpeedSearch`] proposes the next speed and is told whether it held);
//! the command runs each replay. From the start speed it doubles while the SLO holds (up to a
//! cap) or halves while it does not (down to a floor), then bisects the bracket geometrically
//! until the failing step is within the resolution of the passing one. It assumes attainment
//! falls as speed rises; it reports the speeds it measured, so a workload that is not monotonic
//! shows it in the table rather than being hidden.

use std::time::Duration;

use serde::Serialize;

use super::replay::ReplayTally;
use crate::meter::slo::SloTargets;

/// The bounds of the search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchBounds {
    /// The first speed tried (`--speed`, 1 by default).
    pub start: f64,
    /// The highest speed tried (`--max-speed`, 64 by default).
    pub cap: f64,
    /// The lowest speed tried: the start ÷ 16.
    pub floor: f64,
    /// Bisection stops when failing ÷ passing speed ≤ 1 + this (`--resolution`, 0.1).
    pub resolution: f64,
}

impl SearchBounds {
    /// How many replays the search runs at most: the doublings or halvings to the cap or the
    /// floor, then the bisections of one factor-2 bracket down to the resolution.
    pub fn max_replays(&self) -> usize {
        let steps = |ratio: f64| ratio.log2().ceil().max(0.0) as usize;
        let up = steps(self.cap / self.start);
        let down = steps(self.start / self.floor);
        let bisect = steps(2f64.ln() / (1.0 + self.resolution).ln());
        1 + up.max(down) + bisect
    }
}

/// Where the search stands: the highest speed that held and the lowest that did not.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedSearch {
    bounds: SearchBounds,
    holds: Option<f64>,
    fails: Option<f64>,
}

impl SpeedSearch {
    pub fn new(bounds: SearchBounds) -> Self {
        Self {
            bounds,
            holds: None,
            fails: None,
        }
    }

    /// The next speed to replay at; `None` when the search is over.
    pub fn next(&self) -> Option<f64> {
        let b = &self.bounds;
        match (self.holds, self.fails) {
            (None, None) => Some(b.start),
            (Some(holds), None) => (holds < b.cap).then(|| (holds * 2.0).min(b.cap)),
            (None, Some(fails)) => (fails > b.floor).then(|| (fails / 2.0).max(b.floor)),
            (Some(holds), Some(fails)) => {
                if fails <= holds * (1.0 + b.resolution) {
                    return None;
                }
                // Rounded to three significant digits (a speed is read by people), kept
                // strictly inside the bracket.
                let mid = round3((holds * fails).sqrt());
                let mid = if mid > holds && mid < fails {
                    mid
                } else {
                    (holds * fails).sqrt()
                };
                Some(mid)
            }
        }
    }

    /// What a replay at `speed` found.
    pub fn record(&mut self, speed: f64, held: bool) {
        if held {
            self.holds = Some(self.holds.map_or(speed, |h| h.max(speed)));
        } else {
            self.fails = Some(self.fails.map_or(speed, |f| f.min(speed)));
        }
    }

    pub fn holds(&self) -> Option<f64> {
        self.holds
    }

    pub fn fails(&self) -> Option<f64> {
        self.fails
    }
}

/// `x` to three significant digits.
fn round3(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return x;
    }
    let scale = 10f64.powi(2 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// One replay of the search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeedTrial {
    pub speed: f64,
    /// Requests the replay was to send (the trace, or its first `--max-requests`).
    pub requests: usize,
    /// Requests sent (fewer when the replay's time bound ended it first).
    pub sent: usize,
    /// Requests that met every target.
    pub met: usize,
    /// `met ÷ requests`: a request never sent or never recorded counts as missed.
    pub attainment: f64,
    pub held: bool,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// Requests that missed each target (alone); a request can miss several.
    pub missed_ttft: usize,
    pub missed_tbt: usize,
    pub missed_e2e: usize,
    /// Streams that failed (HTTP error, error event, no terminator).
    pub failed: usize,
    /// The replay was stopped by its time bound before every stream ended.
    pub stopped: bool,
    pub seconds: f64,
}

impl SpeedTrial {
    /// The trial of a replay at `speed` that was to send `requests`.
    pub fn new(
        speed: f64,
        requests: usize,
        sent: usize,
        tally: &ReplayTally,
        attainment_target: f64,
    ) -> Self {
        let denominator = requests.max(tally.recorded).max(1);
        let attainment = tally.met as f64 / denominator as f64;
        let ms = |q: f64| tally.ttft_quantile(q).map(|d| d.as_secs_f64() * 1000.0);
        Self {
            speed,
            requests,
            sent,
            met: tally.met,
            attainment,
            held: attainment >= attainment_target,
            ttft_p50_ms: ms(0.50),
            ttft_p95_ms: ms(0.95),
            ttft_p99_ms: ms(0.99),
            missed_ttft: tally.missed_ttft,
            missed_tbt: tally.missed_tbt,
            missed_e2e: tally.missed_e2e,
            failed: 0,
            stopped: false,
            seconds: 0.0,
        }
    }
}

/// The answer of a search, with every replay it ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeedReport {
    pub schema: &'static str,
    /// The trace file.
    pub trace: String,
    /// The deployment replayed against (a URL, a profile, a matrix file).
    pub deployment: String,
    /// The targets, in milliseconds (`None`: not set).
    pub slo: SloMillis,
    /// The share of requests that must meet every target.
    pub attainment_target: f64,
    pub start: f64,
    pub cap: f64,
    pub floor: f64,
    pub resolution: f64,
    /// The highest speed at which the SLO held (`None`: not even at the floor).
    pub holds: Option<SpeedTrial>,
    /// The lowest speed above it at which it did not (`None`: it held at the cap).
    pub fails: Option<SpeedTrial>,
    /// The target that most requests missed at the failing step.
    pub limited_by: Option<&'static str>,
    /// The search was stopped (Ctrl-C) before it ended: the answer is partial.
    pub stopped: bool,
    /// Every replay, in the order run.
    pub replays: Vec<SpeedTrial>,
}

/// SLO targets in milliseconds, for the JSON report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SloMillis {
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl From<&SloTargets> for SloMillis {
    fn from(t: &SloTargets) -> Self {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        Self {
            ttft_ms: ms(t.ttft),
            tbt_ms: ms(t.tbt),
            e2e_ms: ms(t.e2e),
        }
    }
}

impl SpeedReport {
    /// The report of `replays` run by `search`.
    pub fn new(
        search: &SpeedSearch,
        replays: Vec<SpeedTrial>,
        trace: String,
        deployment: String,
        slo: &SloTargets,
        attainment_target: f64,
    ) -> Self {
        let find = |speed: Option<f64>| {
            speed.and_then(|s| replays.iter().rev().find(|t| t.speed == s).cloned())
        };
        let holds = find(search.holds());
        let fails = find(search.fails());
        let limited_by = fails.as_ref().and_then(|f| {
            [
                ("ttft", f.missed_ttft),
                ("tbt", f.missed_tbt),
                ("e2e", f.missed_e2e),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(_, n)| *n)
            .map(|(name, _)| name)
        });
        let b = search.bounds;
        Self {
            schema: "tokentap.find-speed/v1",
            trace,
            deployment,
            slo: SloMillis::from(slo),
            attainment_target,
            start: b.start,
            cap: b.cap,
            floor: b.floor,
            resolution: b.resolution,
            holds,
            fails,
            limited_by,
            stopped: false,
            replays,
        }
    }

    /// The one-sentence answer.
    pub fn sentence(&self) -> String {
        let answer = self.answer();
        if self.stopped {
            format!("{answer} The search was stopped before it ended: this is partial.")
        } else {
            answer
        }
    }

    fn answer(&self) -> String {
        let pct = |a: f64| format!("{:.1} %", a * 100.0);
        let limit = match (self.limited_by, &self.fails) {
            (Some(name), Some(f)) => {
                let missed = match name {
                    "ttft" => f.missed_ttft,
                    "tbt" => f.missed_tbt,
                    _ => f.missed_e2e,
                };
                let label = match name {
                    "ttft" => "TTFT",
                    "tbt" => "TBT",
                    _ => "end to end",
                };
                format!(
                    "; limited by {label}: {missed} of {} requests missed it at {}×",
                    f.requests,
                    speed(f.speed)
                )
            }
            _ => String::new(),
        };
        match (&self.holds, &self.fails) {
            (Some(h), Some(f)) => format!(
                "This traffic could grow {}× on this deployment: the SLO holds at {}× \
                 (attainment {}) and fails at {}× (attainment {}){limit}.",
                speed(h.speed),
                speed(h.speed),
                pct(h.attainment),
                speed(f.speed),
                pct(f.attainment),
            ),
            (Some(h), None) => format!(
                "The SLO holds even at the cap, {}× (attainment {}): no failing speed was measured \
                 (raise --max-speed).",
                speed(h.speed),
                pct(h.attainment)
            ),
            (None, Some(f)) => format!(
                "The SLO fails even at {}×, the lowest speed tried (attainment {}){limit}.",
                speed(f.speed),
                pct(f.attainment),
            ),
            (None, None) => "No replay ran.".into(),
        }
    }

    /// The readable summary.
    pub fn render_markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let target = |name: &str, ms: Option<f64>| ms.map(|v| format!("{name} ≤ {}", millis(v)));
        let slo: Vec<String> = [
            target("TTFT", self.slo.ttft_ms),
            target("TBT", self.slo.tbt_ms),
            target("end to end", self.slo.e2e_ms),
        ]
        .into_iter()
        .flatten()
        .collect();
        let _ = writeln!(out, "# Replay speed-up under an SLO\n");
        let _ = writeln!(out, "- trace: {}", self.trace);
        let _ = writeln!(out, "- deployment: {}", self.deployment);
        let _ = writeln!(
            out,
            "- SLO: {}, met by at least {:.0} % of the requests",
            slo.join(", "),
            self.attainment_target * 100.0
        );
        let _ = writeln!(
            out,
            "- search: from {}×, doubling up to {}× (halving down to {}×), then bisecting to {:.0} %\n",
            speed(self.start),
            speed(self.cap),
            speed(self.floor),
            self.resolution * 100.0
        );
        let _ = writeln!(out, "**{}**\n", self.sentence());
        let _ = writeln!(
            out,
            "| speed | requests | met | attainment | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | missed TTFT / TBT / e2e | failed | seconds | SLO |"
        );
        let _ = writeln!(
            out,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        let opt = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.0}"));
        for t in &self.replays {
            let requests = if t.sent < t.requests {
                format!("{} ({} sent)", t.requests, t.sent)
            } else {
                t.requests.to_string()
            };
            let _ = writeln!(
                out,
                "| {}× | {requests} | {} | {:.1} % | {} | {} | {} | {} / {} / {} | {} | {:.0}{} | {} |",
                speed(t.speed),
                t.met,
                t.attainment * 100.0,
                opt(t.ttft_p50_ms),
                opt(t.ttft_p95_ms),
                opt(t.ttft_p99_ms),
                t.missed_ttft,
                t.missed_tbt,
                t.missed_e2e,
                t.failed,
                t.seconds,
                if t.stopped { " (bound)" } else { "" },
                if t.held { "holds" } else { "fails" },
            );
        }
        out
    }

    /// The summary for a terminal: the same facts as [`Self::render_markdown`], the replays
    /// as an aligned table, every line at most 120 columns (long lines broken between words).
    pub fn render_table(&self) -> String {
        use crate::matrix::table::{TextTable, MAX_WIDTH};
        let markdown = self.render_markdown();
        let mut out = String::new();
        // The heading and the list, as plain lines wrapped between words.
        for line in markdown.lines().take_while(|l| !l.starts_with('|')) {
            let line = line
                .trim_start_matches("# ")
                .trim_start_matches("- ")
                .replace("**", "");
            if line.is_empty() {
                continue;
            }
            let mut current = String::new();
            for word in line.split(' ') {
                if !current.is_empty()
                    && current.chars().count() + 1 + word.chars().count() > MAX_WIDTH
                {
                    out.push_str(&current);
                    out.push('\n');
                    current.clear();
                }
                if !current.is_empty() {
                    current.push(' ');
                }
                current.push_str(word);
            }
            out.push_str(&current);
            out.push('\n');
        }
        let mut table = TextTable::new(&[
            "Speed",
            "Requests",
            "Met",
            "Attain",
            "TTFT p50",
            "p95",
            "p99",
            "Missed T/B/E",
            "Failed",
            "Seconds",
            "SLO",
        ]);
        table.numeric = vec![1, 2, 3, 4, 5, 6, 8, 9];
        let opt = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.0} ms"));
        table.rows = self
            .replays
            .iter()
            .map(|t| {
                vec![
                    format!("{}×", speed(t.speed)),
                    if t.sent < t.requests {
                        format!("{} ({} sent)", t.requests, t.sent)
                    } else {
                        t.requests.to_string()
                    },
                    t.met.to_string(),
                    format!("{:.1} %", t.attainment * 100.0),
                    opt(t.ttft_p50_ms),
                    opt(t.ttft_p95_ms),
                    opt(t.ttft_p99_ms),
                    format!("{} / {} / {}", t.missed_ttft, t.missed_tbt, t.missed_e2e),
                    t.failed.to_string(),
                    format!(
                        "{:.0}{}",
                        t.seconds,
                        if t.stopped { " (bound)" } else { "" }
                    ),
                    if t.held { "holds" } else { "fails" }.to_owned(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table.render(MAX_WIDTH));
        out
    }

    pub fn render_json(&self) -> String {
        crate::base::json::pretty_json_line(self)
    }
}

/// A speed as people read it: `2`, `2.83`, `0.0625`.
pub fn speed(s: f64) -> String {
    format!("{}", round3(s))
}

fn millis(ms: f64) -> String {
    if ms >= 1000.0 && (ms / 1000.0).fract() == 0.0 {
        format!("{} s", ms / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> SearchBounds {
        SearchBounds {
            start: 1.0,
            cap: 64.0,
            floor: 1.0 / 16.0,
            resolution: 0.1,
        }
    }

    /// Runs the search against a workload whose SLO holds up to `boundary`.
    fn run(boundary: f64) -> (SpeedSearch, Vec<f64>) {
        let mut search = SpeedSearch::new(bounds());
        let mut tried = Vec::new();
        while let Some(s) = search.next() {
            assert!(tried.len() < bounds().max_replays(), "{tried:?}");
            tried.push(s);
            search.record(s, s <= boundary);
        }
        (search, tried)
    }

    #[test]
    fn the_search_brackets_then_bisects_to_the_resolution() {
        let (search, tried) = run(3.0);
        assert_eq!(tried, [1.0, 2.0, 4.0, 2.83, 3.36, 3.08]);
        let (holds, fails) = (search.holds().unwrap(), search.fails().unwrap());
        assert!(
            holds <= 3.0 && fails > 3.0 && fails <= holds * 1.1,
            "{holds} {fails}"
        );
    }

    #[test]
    fn the_search_stops_at_the_cap_and_the_floor_within_its_bound() {
        let (search, tried) = run(1000.0);
        assert_eq!(tried, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        assert_eq!((search.holds(), search.fails()), (Some(64.0), None));
        let (search, tried) = run(0.01);
        assert_eq!(tried, [1.0, 0.5, 0.25, 0.125, 0.0625]);
        assert_eq!((search.holds(), search.fails()), (None, Some(0.0625)));
        let (search, _) = run(0.7);
        assert!(search.holds().unwrap() <= 0.7 && search.fails().unwrap() > 0.7);
        assert_eq!(bounds().max_replays(), 1 + 6 + 3);
    }

    #[test]
    fn a_trial_counts_unrecorded_requests_as_missed_and_the_report_names_the_limit() {
        let tally = ReplayTally {
            recorded: 9,
            met: 9,
            missed: 0,
            ttft: (1..=9).map(|i| Duration::from_millis(i * 100)).collect(),
            ..ReplayTally::default()
        };
        let trial = SpeedTrial::new(2.0, 10, 10, &tally, 0.95);
        assert!((trial.attainment - 0.9).abs() < 1e-9 && !trial.held);
        assert_eq!(trial.ttft_p95_ms, Some(900.0));
        let failing = SpeedTrial {
            missed_tbt: 3,
            missed_ttft: 1,
            ..trial.clone()
        };
        let mut search = SpeedSearch::new(bounds());
        search.record(1.0, true);
        search.record(2.0, false);
        let held = SpeedTrial::new(1.0, 10, 10, &ReplayTally { met: 10, ..tally }, 0.95);
        let report = SpeedReport::new(
            &search,
            vec![held, failing],
            "t.jsonl".into(),
            "sim".into(),
            &SloTargets::parse_header(b"ttft=2s,tbt=50ms").unwrap(),
            0.95,
        );
        assert_eq!(report.limited_by, Some("tbt"));
        assert!(report
            .sentence()
            .contains("holds at 1× (attainment 100.0 %) and fails at 2×"));
        let md = report.render_markdown();
        assert!(md.contains("TTFT ≤ 2 s, TBT ≤ 50 ms"), "{md}");
        let json: serde_json::Value = serde_json::from_str(&report.render_json()).unwrap();
        assert_eq!(json["fails"]["speed"], 2.0);
        assert_eq!(json["slo"]["tbt_ms"], 50.0);
        // For a terminal: the same facts, aligned, no Markdown, within 120 columns.
        let table = report.render_table();
        assert!(table.lines().all(|l| l.chars().count() <= 120), "{table}");
        assert!(!table.contains('|') && !table.contains("**"), "{table}");
        assert!(
            table.contains("holds at 1×") && table.contains("Missed T/B/E"),
            "{table}"
        );
    }
}
