//! The production matrix over a sliding window: [`ProductionMatrix`] is a [`RecordSink`] that
//! files each finished record into time slices, and answers "the matrix of the last 5 minutes
//! … 24 hours, or since start" by merging slices.
//!
//! Two rings of slices: one-minute slices covering the last two hours and one-hour slices
//! covering the last day, plus one accumulator since start. A record goes into the slice of
//! the minute and of the hour in which it ended. Memory is the number of slices × cells ×
//! sketch bins, bounded whatever the traffic; nothing is kept per request. The sink's
//! `record` takes one mutex for a few map lookups and sketch insertions.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::base::duration::parse_duration;
use crate::base::lock;
use crate::base::Source;
use crate::matrix::doc::{MatrixDoc, Metadata};
use crate::matrix::evidence::EvidenceRule;
use crate::meter::buckets::Ladder;
use crate::meter::identity::FingerprintId;
use crate::meter::labels::{
    dimensions, one_line, Dimension, SliceFilter, SliceValue, TrafficSlice,
};
use crate::meter::record::RequestRecord;
use crate::meter::RecordSink;

use super::cell::MatrixAccumulator;
use crate::base::wallclock::format_rfc3339;

/// Shortest window a production matrix can be asked for (the slice width).
pub const MIN_WINDOW: Duration = Duration::from_secs(60);
/// Longest window short of `all` (the hour ring's reach).
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The window when none is asked for.
pub const DEFAULT_WINDOW: Window = Window::Last(Duration::from_secs(3600));

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
/// Two hours of minute slices: enough to reach back to the hour boundary before "an hour ago".
const MINUTE_SLICES: usize = 120;
/// A day of hour slices, plus the current hour.
const HOUR_SLICES: usize = 25;

/// Which records a production matrix covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Records that ended within this long before now.
    Last(Duration),
    /// Every record since the proxy started.
    All,
}

/// A window that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("window `{text}`: {reason}; write e.g. 5m, 1h, 24h or all")]
    Invalid { text: String, reason: String },
    #[error("window `{text}` is outside 1m … 24h; use `all` for everything since start")]
    OutOfRange { text: String },
}

impl Window {
    /// Parses `5m`, `90s`, `1h`, `24h` (1 minute … 24 hours) or `all`.
    pub fn parse(text: &str) -> Result<Window, WindowError> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(Window::All);
        }
        let duration = parse_duration(text).map_err(|reason| WindowError::Invalid {
            text: text.to_owned(),
            reason,
        })?;
        if duration < MIN_WINDOW || duration > MAX_WINDOW {
            return Err(WindowError::OutOfRange {
                text: text.to_owned(),
            });
        }
        Ok(Window::Last(duration))
    }

    /// `5m`, `1h`, `90s`, `all`.
    pub fn label(&self) -> String {
        match self {
            Window::All => "all".to_owned(),
            Window::Last(duration) => {
                let seconds = duration.as_secs();
                if seconds % HOUR == 0 {
                    format!("{}h", seconds / HOUR)
                } else if seconds % MINUTE == 0 {
                    format!("{}m", seconds / MINUTE)
                } else {
                    format!("{seconds}s")
                }
            }
        }
    }
}

/// Accumulators by model, the upstream's configuration (two configurations never share
/// one) and traffic slice (tenant, priority band, …: each dimension bounded by its producer).
type ByModel = HashMap<SliceKey, MatrixAccumulator>;

/// What one accumulator of a slice holds the records of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SliceKey {
    model: Arc<str>,
    fingerprint: FingerprintId,
    slice: TrafficSlice,
}

/// Which records a matrix covers: configurations, and one slice of the traffic when asked
/// (`/matrix?tenant=…&priority=…`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordFilter {
    pub fingerprints: FingerprintFilter,
    pub slice: SliceFilter,
}

impl RecordFilter {
    fn admits(&self, key: &SliceKey) -> bool {
        self.fingerprints.admits(key.fingerprint) && self.slice.admits(&key.slice)
    }

    /// Says in words which slice of the traffic a document covers (nothing for all of it).
    pub fn describe(&self) -> Option<String> {
        self.slice.describe()
    }
}

/// The values each slice dimension took in one model's records in a window, with request
/// counts: what the page offers to filter by. A dimension with a fixed set of values lists
/// them in its order, any other busiest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slicings {
    pub by_dimension: Vec<(&'static Dimension, Vec<(SliceValue, u64)>)>,
}

impl Slicings {
    /// The values seen of the dimension called `name`.
    pub fn values(&self, name: &str) -> &[(SliceValue, u64)] {
        self.by_dimension
            .iter()
            .find(|(dimension, _)| dimension.name == name)
            .map_or(&[], |(_, values)| values.as_slice())
    }
}

/// Configurations kept per model in the since-start accumulators; past it the one first seen
/// longest ago goes (the time slices expire by themselves).
pub const MAX_FINGERPRINTS_PER_MODEL: usize = 8;

/// Which configurations a matrix covers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FingerprintFilter {
    /// Every record, whatever configuration served it (what the matrix was before
    /// fingerprints).
    #[default]
    All,
    /// Only records served by one of these.
    Only(Vec<FingerprintId>),
}

impl FingerprintFilter {
    pub fn admits(&self, id: FingerprintId) -> bool {
        match self {
            Self::All => true,
            Self::Only(ids) => ids.contains(&id),
        }
    }
}

#[derive(Debug)]
struct Slice {
    /// Unix seconds the slice starts at (a multiple of its ring's width).
    start: u64,
    models: ByModel,
}

/// Slices of one width, oldest first, at most `capacity` of them.
#[derive(Debug)]
struct Ring {
    width: u64,
    capacity: usize,
    slices: VecDeque<Slice>,
}

impl Ring {
    fn new(width: u64, capacity: usize) -> Self {
        Self {
            width,
            capacity,
            slices: VecDeque::new(),
        }
    }

    /// The slice holding `at` (Unix seconds), created if needed; evicts slices that fell out.
    fn slice_at(&mut self, at: u64) -> Option<&mut ByModel> {
        let start = at - at % self.width;
        let newest = self.slices.back().map_or(start, |s| s.start.max(start));
        let oldest_kept = newest.saturating_sub(self.width * (self.capacity as u64 - 1));
        while self.slices.front().is_some_and(|s| s.start < oldest_kept) {
            self.slices.pop_front();
        }
        if start < oldest_kept {
            return None;
        }
        let position = self.slices.partition_point(|s| s.start < start);
        if self.slices.get(position).is_none_or(|s| s.start != start) {
            self.slices.insert(
                position,
                Slice {
                    start,
                    models: ByModel::new(),
                },
            );
        }
        self.slices.get_mut(position).map(|s| &mut s.models)
    }
}

#[derive(Debug)]
struct Slices {
    minutes: Ring,
    hours: Ring,
    all: ByModel,
    /// The configurations of `all`, first seen first (for [`MAX_FINGERPRINTS_PER_MODEL`]).
    all_order: VecDeque<(Arc<str>, FingerprintId)>,
}

/// One model's matrix over a window, with the window's bounds.
#[derive(Debug, Clone)]
pub struct WindowMatrix {
    pub model: Arc<str>,
    pub accumulator: MatrixAccumulator,
    pub window: Window,
    pub from: SystemTime,
    pub to: SystemTime,
}

/// The streaming aggregator of one source's records (production, normally).
#[derive(Debug)]
pub struct ProductionMatrix {
    contexts: Ladder,
    concurrency: Ladder,
    source: Source,
    /// Cells below it are marked `Low evidence` in every document made here.
    evidence: EvidenceRule,
    started_at: SystemTime,
    slices: Mutex<Slices>,
}

impl ProductionMatrix {
    /// An empty aggregator of `source` records over the given ladders, judging its cells by
    /// the default evidence rule.
    pub fn new(contexts: Ladder, concurrency: Ladder, source: Source) -> Arc<Self> {
        Self::with_evidence(contexts, concurrency, source, EvidenceRule::default())
    }

    /// As [`ProductionMatrix::new`], with the evidence rule given (`[evidence]`).
    pub fn with_evidence(
        contexts: Ladder,
        concurrency: Ladder,
        source: Source,
        evidence: EvidenceRule,
    ) -> Arc<Self> {
        Self::starting_at(contexts, concurrency, source, evidence, SystemTime::now())
    }

    /// As [`ProductionMatrix::with_evidence`], with the start time given (tests).
    pub fn starting_at(
        contexts: Ladder,
        concurrency: Ladder,
        source: Source,
        evidence: EvidenceRule,
        started_at: SystemTime,
    ) -> Arc<Self> {
        Arc::new(Self {
            contexts,
            concurrency,
            source,
            evidence,
            started_at,
            slices: Mutex::new(Slices {
                minutes: Ring::new(MINUTE, MINUTE_SLICES),
                hours: Ring::new(HOUR, HOUR_SLICES),
                all: ByModel::new(),
                all_order: VecDeque::new(),
            }),
        })
    }

    pub fn contexts(&self) -> &Ladder {
        &self.contexts
    }

    pub fn concurrency(&self) -> &Ladder {
        &self.concurrency
    }

    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The evidence rule its documents apply.
    pub fn evidence(&self) -> EvidenceRule {
        self.evidence
    }

    /// Files a record under the time it ended (head in + duration).
    pub fn add(&self, record: &RequestRecord) {
        let ended = record
            .timing
            .started_at
            .checked_add(record.timing.duration)
            .unwrap_or(record.timing.started_at);
        // One accumulator for the record, merged into three places: the per-record work
        // (splitting, sketch keys) is done once.
        let mut single = MatrixAccumulator::default();
        single.add_record(record, &self.concurrency);
        let at = epoch_second(ended);
        let key = SliceKey {
            model: Arc::clone(&record.labels.model),
            fingerprint: record.labels.fingerprint,
            slice: record.labels.slice.clone(),
        };
        let configuration = (Arc::clone(&record.labels.model), record.labels.fingerprint);
        let mut slices = lock::lock(&self.slices);
        let Slices {
            minutes,
            hours,
            all,
            all_order,
        } = &mut *slices;
        if !all_order.contains(&configuration) {
            let same_model = all_order
                .iter()
                .filter(|(m, _)| *m == configuration.0)
                .count();
            if same_model >= MAX_FINGERPRINTS_PER_MODEL {
                if let Some(oldest) = all_order.iter().position(|(m, _)| *m == configuration.0) {
                    if let Some((model, fingerprint)) = all_order.remove(oldest) {
                        all.retain(|k, _| !(k.model == model && k.fingerprint == fingerprint));
                    }
                }
            }
            all_order.push_back(configuration);
        }
        for models in [minutes.slice_at(at), hours.slice_at(at), Some(all)]
            .into_iter()
            .flatten()
        {
            models.entry(key.clone()).or_default().merge(&single);
        }
    }

    /// The configurations whose records of `model` ended in `window`, with their request
    /// counts, busiest first.
    pub fn fingerprints(
        &self,
        window: Window,
        model: &str,
        now: SystemTime,
    ) -> Vec<(FingerprintId, u64)> {
        let mut counts: HashMap<FingerprintId, u64> = HashMap::new();
        self.each_slice(window, now, |models| {
            for (key, accumulator) in models {
                if &*key.model == model {
                    *counts.entry(key.fingerprint).or_default() += accumulator.requests;
                }
            }
        });
        let mut out: Vec<(FingerprintId, u64)> = counts.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Every model's accumulated figures over `window` ending at `now`, every configuration
    /// together.
    pub fn window(&self, window: Window, now: SystemTime) -> Vec<WindowMatrix> {
        self.window_of(window, now, &FingerprintFilter::All)
    }

    /// Calls `each` with every slice (or the since-start accumulators) `window` ending at
    /// `now` covers; returns when the window starts.
    fn each_slice(
        &self,
        window: Window,
        now: SystemTime,
        mut each: impl FnMut(&ByModel),
    ) -> SystemTime {
        let slices = lock::lock(&self.slices);
        let now_s = epoch_second(now);
        match window {
            Window::All => {
                each(&slices.all);
                self.started_at
            }
            Window::Last(length) => {
                // The second the window starts in, from its exact start: `now` and `length`
                // each cut to whole seconds could start it up to a second late, and a
                // snapshot taken late after one taken just before a minute ended (its window
                // 1.9 s, cut to 1) then missed that minute's last records.
                let from_s = now.checked_sub(length).map_or(0, epoch_second);
                if length.as_secs() <= HOUR {
                    for slice in &slices.minutes.slices {
                        if slice.start + MINUTE > from_s && slice.start <= now_s {
                            each(&slice.models);
                        }
                    }
                } else {
                    // Minute slices back to the hour boundary before "an hour ago", whole
                    // hours before that.
                    let cut = now_s.saturating_sub(HOUR) / HOUR * HOUR;
                    for slice in &slices.minutes.slices {
                        if slice.start >= cut && slice.start <= now_s {
                            each(&slice.models);
                        }
                    }
                    for slice in &slices.hours.slices {
                        if slice.start < cut && slice.start + HOUR > from_s {
                            each(&slice.models);
                        }
                    }
                }
                // Nothing predates the aggregator: a window reaching further back covers less.
                now.checked_sub(length)
                    .unwrap_or(self.started_at)
                    .max(self.started_at)
            }
        }
    }

    /// Every model's figures over `window` ending at `now`, of the configurations `filter`
    /// admits.
    pub fn window_of(
        &self,
        window: Window,
        now: SystemTime,
        filter: &FingerprintFilter,
    ) -> Vec<WindowMatrix> {
        let filter = RecordFilter {
            fingerprints: filter.clone(),
            ..RecordFilter::default()
        };
        self.window_where(window, now, &filter)
    }

    /// The values each slice dimension took in `model`'s records in `window`.
    pub fn slicings(&self, window: Window, model: &str, now: SystemTime) -> Slicings {
        let mut seen: HashMap<(&'static str, SliceValue), u64> = HashMap::new();
        self.each_slice(window, now, |models| {
            for (key, accumulator) in models {
                if &*key.model != model {
                    continue;
                }
                for (dimension, value) in key.slice.iter() {
                    *seen.entry((dimension, value.clone())).or_default() += accumulator.requests;
                }
            }
        });
        let by_dimension = dimensions()
            .into_iter()
            .filter_map(|dimension| {
                let mut values: Vec<(SliceValue, u64)> = seen
                    .iter()
                    .filter(|((name, _), _)| *name == dimension.name)
                    .map(|((_, value), count)| (value.clone(), *count))
                    .collect();
                if values.is_empty() {
                    return None;
                }
                match dimension.values {
                    Some(order) => values
                        .sort_by_key(|(value, _)| order.iter().position(|v| *v == value.as_str())),
                    None => values.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0))),
                }
                Some((dimension, values))
            })
            .collect();
        Slicings { by_dimension }
    }

    /// Every model's figures over `window` ending at `now`, of the records `filter` admits.
    pub fn window_where(
        &self,
        window: Window,
        now: SystemTime,
        filter: &RecordFilter,
    ) -> Vec<WindowMatrix> {
        let mut merged: HashMap<Arc<str>, MatrixAccumulator> = HashMap::new();
        let from = self.each_slice(window, now, |models| {
            for (key, accumulator) in models {
                if filter.admits(key) {
                    merged
                        .entry(Arc::clone(&key.model))
                        .or_default()
                        .merge(accumulator);
                }
            }
        });
        let mut out: Vec<WindowMatrix> = merged
            .into_iter()
            .map(|(model, accumulator)| WindowMatrix {
                model,
                accumulator,
                window,
                from,
                to: now,
            })
            .collect();
        // Busiest model first.
        out.sort_by(|a, b| {
            b.accumulator
                .output_tokens
                .cmp(&a.accumulator.output_tokens)
                .then_with(|| a.model.cmp(&b.model))
        });
        out
    }

    /// The matrix of `model` (the busiest model when `None`) over `window` ending at `now`;
    /// `None` when no record of that model ended in the window.
    pub fn matrix(
        &self,
        window: Window,
        model: Option<&str>,
        now: SystemTime,
    ) -> Option<MatrixDoc> {
        self.matrix_of(window, model, now, &FingerprintFilter::All)
    }

    /// As [`ProductionMatrix::matrix`], of the configurations `filter` admits.
    pub fn matrix_of(
        &self,
        window: Window,
        model: Option<&str>,
        now: SystemTime,
        filter: &FingerprintFilter,
    ) -> Option<MatrixDoc> {
        let filter = RecordFilter {
            fingerprints: filter.clone(),
            ..RecordFilter::default()
        };
        self.matrix_where(window, model, now, &filter)
    }

    /// As [`ProductionMatrix::matrix`], of the records `filter` admits; a document of one
    /// tenant or priority band says so in its notes.
    pub fn matrix_where(
        &self,
        window: Window,
        model: Option<&str>,
        now: SystemTime,
        filter: &RecordFilter,
    ) -> Option<MatrixDoc> {
        let all = self.window_where(window, now, filter);
        let chosen = match model {
            Some(name) => all.iter().find(|w| &*w.model == name)?,
            None => all.first()?,
        };
        let others: Vec<&str> = all
            .iter()
            .filter(|w| !Arc::ptr_eq(&w.model, &chosen.model))
            .map(|w| &*w.model)
            .collect();
        let mut doc = self.document(chosen, &others);
        if let Some(slice) = filter.describe() {
            doc.metadata
                .notes
                .insert(0, format!("Only the requests of {slice}."));
        }
        Some(doc)
    }

    /// The document of one model's window; `others` are named in a note.
    pub fn document(&self, window: &WindowMatrix, others: &[&str]) -> MatrixDoc {
        let mut metadata = Metadata::default();
        metadata.model.served_model = Some(one_line(&window.model));
        metadata.run.source = Some(self.source);
        metadata.run.benchmark_tool = Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION")));
        metadata.run.decode_test = Some(format!("{} traffic", capitalised(self.source.as_str())));
        metadata.run.prefill_mode = Some("Cold requests in the window".to_owned());
        let length = window
            .to
            .duration_since(window.from)
            .unwrap_or(Duration::ZERO);
        // Tenths of a second: what a page prints, and the JSON says no more than it measured.
        metadata.run.window_s = Some((length.as_secs_f64() * 10.0).round() / 10.0);
        metadata.run.started_at = Some(format_rfc3339(window.from));
        metadata.run.ended_at = Some(format_rfc3339(window.to));
        metadata.notes.push(format!(
            "Aggregated from {} {} requests that ended in the window ({}).",
            window.accumulator.requests,
            self.source.as_str(),
            window.window.label()
        ));
        if !others.is_empty() {
            let names: Vec<String> = others.iter().map(|m| one_line(m)).collect();
            metadata.notes.push(format!(
                "Other models in this window: {} (ask with ?model=).",
                names.join(", ")
            ));
        }
        let mut doc = window
            .accumulator
            .to_doc(&self.contexts, &self.concurrency, metadata);
        let thin = self.evidence.apply(&mut doc);
        if thin > 0 {
            doc.metadata.notes.push(format!(
                "{thin} {} below the evidence rule ({}): marked Low evidence, shown greyed and never compared.",
                if thin == 1 { "cell is" } else { "cells are" },
                self.evidence.describe()
            ));
        }
        let thin_ttft = self.evidence.thin_ttft(&doc);
        if !thin_ttft.is_empty() {
            doc.metadata.notes.push(format!(
                "TTFT rests on fewer than {} completed requests in {}: read it with its n; it is not compared.",
                self.evidence.min_requests,
                thin_ttft.join(", ")
            ));
        }
        doc
    }

    /// Sketch bins held by every slice (memory accounting: 16 bytes each).
    pub fn sketch_bins(&self) -> usize {
        let slices = lock::lock(&self.slices);
        let count = |models: &ByModel| models.values().map(|m| m.sketch_bins()).sum::<usize>();
        slices
            .minutes
            .slices
            .iter()
            .chain(&slices.hours.slices)
            .map(|s| count(&s.models))
            .sum::<usize>()
            + count(&slices.all)
    }

    /// Slices held (at most 120 minute slices and 25 hour slices).
    pub fn slice_count(&self) -> usize {
        let slices = lock::lock(&self.slices);
        slices.minutes.slices.len() + slices.hours.slices.len()
    }
}

impl RecordSink for ProductionMatrix {
    fn record(&self, record: &Arc<RequestRecord>) {
        if record.labels.source == self.source {
            self.add(record);
        }
    }
}

/// The whole second since the Unix epoch that `time` falls in (0 before it): the slices' clock.
fn epoch_second(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::cell::test_records::record;
    use crate::meter::buckets::{DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
    use crate::meter::record::Outcome;

    fn aggregator(start: SystemTime) -> Arc<ProductionMatrix> {
        ProductionMatrix::starting_at(
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
            Source::Production,
            EvidenceRule::NONE,
            start,
        )
    }

    /// A one-stream request of `tokens` tokens that ended at `end`.
    fn ending_at(end: SystemTime, tokens: u64, model: &str) -> RequestRecord {
        let ms = Duration::from_millis;
        let mut r = record(
            Some(1000),
            &[(0, tokens)],
            ms(100),
            ms(10),
            1.0,
            Outcome::Ok,
        );
        r.timing.started_at = end - r.timing.duration;
        r.labels.model = Arc::from(model);
        r
    }

    /// A window starts where its length says, to the second it falls in: a late snapshot's
    /// window of 1.9 s reaches back into the minute that ended 1.1 s before it.
    #[test]
    fn a_window_with_a_fraction_of_a_second_reaches_back_as_far_as_it_says() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_020);
        let production = aggregator(start);
        // 1_750_000_020 is a whole minute.
        let at = |ms: u64| start + Duration::from_millis(ms);
        production.add(&ending_at(at(59_600), 7, "m"));
        let doc = production.matrix(
            Window::Last(Duration::from_millis(1_900)),
            Some("m"),
            at(61_100),
        );
        let tokens: u64 = doc.map_or(0, |doc| {
            doc.decode.iter().filter_map(|c| c.output_tokens).sum()
        });
        assert_eq!(tokens, 7);
    }

    #[test]
    fn windows_take_the_records_that_ended_inside_them() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        let production = aggregator(start);
        let at = |s: u64| start + Duration::from_secs(s);
        production.add(&ending_at(at(30), 10, "m")); // 3 h before "now"
        production.add(&ending_at(at(3 * 3600 - 1800), 20, "m")); // 30 min before
        production.add(&ending_at(at(3 * 3600 - 120), 40, "m")); // 2 min before
        production.add(&ending_at(at(3 * 3600 - 100), 5, "n"));
        let now = at(3 * 3600);
        let tokens = |window: Window, model: &str| {
            production
                .matrix(window, Some(model), now)
                .map_or(0, |doc| {
                    doc.decode
                        .iter()
                        .filter_map(|c| c.output_tokens)
                        .sum::<u64>()
                })
        };
        let minutes = |m: u64| Window::Last(Duration::from_secs(m * 60));
        assert_eq!(tokens(minutes(5), "m"), 40);
        assert_eq!(tokens(minutes(60), "m"), 60);
        assert_eq!(tokens(minutes(120), "m"), 60);
        assert_eq!(tokens(minutes(24 * 60), "m"), 70);
        assert_eq!(tokens(Window::All, "m"), 70);
        assert_eq!(tokens(minutes(5), "n"), 5);
        // The busiest model is the default, and the others are named.
        let doc = production.matrix(minutes(60), None, now).unwrap();
        doc.validate().unwrap();
        assert_eq!(doc.metadata.model.served_model.as_deref(), Some("m"));
        assert!(doc
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("Other models in this window: n")));
        assert_eq!(doc.metadata.run.window_s, Some(3600.0));
        // A window of any length is said in tenths of a second, never as a raw float.
        let odd = production
            .matrix(
                Window::Last(Duration::from_nanos(222_904_716_322)),
                None,
                now,
            )
            .unwrap();
        assert_eq!(odd.metadata.run.window_s, Some(222.9));
        assert!(crate::matrix::render_markdown(&odd).contains("222.9 s"));
        assert_eq!(
            doc.metadata.run.ended_at.as_deref(),
            Some("2025-06-15T18:06:40Z")
        );
        assert!(production.matrix(minutes(5), Some("nobody"), now).is_none());
        // A production document survives JSON exactly, and Markdown at page precision (what
        // it writes imports back to the same page).
        let markdown = crate::matrix::render_markdown(&doc);
        let reimported = crate::matrix::parse_any(&markdown).unwrap();
        assert_eq!(crate::matrix::render_markdown(&reimported), markdown);
        assert_eq!(reimported.metadata, doc.metadata);
        let json = crate::matrix::render_json(&doc);
        assert_eq!(crate::matrix::parse_any(&json).unwrap(), doc);
    }

    #[test]
    fn memory_stays_bounded_whatever_the_traffic() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        let production = aggregator(start);
        let ms = Duration::from_millis;
        // Three simulated days of traffic with widely varying prompts, latencies and levels.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..60_000u64 {
            let bucket = (next() % 9) as usize;
            let mut r = record(
                Some(next() % 1_200_000),
                &[(bucket, 1 + next() % 300)],
                ms(1 + next() % 60_000),
                Duration::from_micros(100 + next() % 500_000),
                1.0 + (next() % 200) as f64,
                Outcome::Ok,
            );
            r.timing.started_at = start + Duration::from_secs(i * 4);
            production.add(&r);
        }
        assert!(production.slice_count() <= MINUTE_SLICES + HOUR_SLICES);
        let bins = production.sketch_bins();
        eprintln!(
            "{} slices, {bins} sketch bins ({} KiB) after 60,000 adversarial records",
            production.slice_count(),
            bins * 16 / 1024
        );
        // Slices × (9 × 9 cells × 3 sketches + 9 rows × 4 sketches) × 256 bins is the bound;
        // the real figure is far below it.
        let bound = (MINUTE_SLICES + HOUR_SLICES + 1) * (9 * 9 * 3 + 9 * 4) * 256;
        assert!(bins < bound, "{bins} ≥ {bound}");
        let doc = production
            .matrix(Window::All, None, start + Duration::from_secs(240_000))
            .unwrap();
        doc.validate().unwrap();
    }

    #[test]
    fn window_texts() {
        assert_eq!(
            Window::parse("5m"),
            Ok(Window::Last(Duration::from_secs(300)))
        );
        assert_eq!(Window::parse("24h"), Ok(Window::Last(MAX_WINDOW)));
        assert_eq!(Window::parse("ALL"), Ok(Window::All));
        assert!(Window::parse("30s")
            .unwrap_err()
            .to_string()
            .contains("1m … 24h"));
        assert!(Window::parse("2d").unwrap_err().to_string().contains("2d"));
        assert_eq!(Window::Last(Duration::from_secs(300)).label(), "5m");
        assert_eq!(DEFAULT_WINDOW.label(), "1h");
    }

    #[test]
    fn configurations_never_mix_and_stay_bounded() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        let production = aggregator(start);
        let at = |s: u64| start + Duration::from_secs(s);
        let a = FingerprintId::from_hash(0xa);
        let b = FingerprintId::from_hash(0xb);
        for (fingerprint, tokens) in [(a, 10), (a, 10), (b, 30)] {
            let mut r = ending_at(at(60), tokens, "m");
            r.labels.fingerprint = fingerprint;
            production.add(&r);
        }
        let now = at(120);
        let tokens = |filter: &FingerprintFilter| {
            production
                .matrix_of(Window::All, Some("m"), now, filter)
                .map_or(0, |doc| {
                    doc.decode
                        .iter()
                        .filter_map(|c| c.output_tokens)
                        .sum::<u64>()
                })
        };
        assert_eq!(tokens(&FingerprintFilter::Only(vec![a])), 20);
        assert_eq!(tokens(&FingerprintFilter::Only(vec![b])), 30);
        assert_eq!(tokens(&FingerprintFilter::All), 50);
        assert_eq!(
            tokens(&FingerprintFilter::Only(vec![FingerprintId::UNKNOWN])),
            0
        );
        assert_eq!(
            production.fingerprints(Window::All, "m", now),
            [(a, 2), (b, 1)]
        );
        // Past MAX_FINGERPRINTS_PER_MODEL since start, the first seen goes.
        for i in 0..MAX_FINGERPRINTS_PER_MODEL as u64 {
            let mut r = ending_at(at(60), 1, "m");
            r.labels.fingerprint = FingerprintId::from_hash(0x100 + i);
            production.add(&r);
        }
        let kept = production.fingerprints(Window::All, "m", now);
        assert_eq!(kept.len(), MAX_FINGERPRINTS_PER_MODEL);
        assert!(kept.iter().all(|(id, _)| *id != a && *id != b), "{kept:?}");
    }
}
