//! What sessions do to the server, per model, since start: turns by what came before them,
//! the end-to-start gap distribution, and the **KV-retention curve** — for turns that resend
//! the previous turn's prompt, the cached share the engine reported (`usage`) beside the share
//! the previous turn had already sent (the most its prefix cache could have kept), by the gap
//! since the previous turn ended. Where the realized share falls below half the theoretical
//! one, the prefix was evicted in between: the gap bin where that starts is the deployment's
//! effective retention ([`Retention`]). A record sink: one lock per finished turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::base::lock;

use super::conversation::After;
use super::metering::RecordSink;
use super::record::RequestRecord;

/// Upper bounds of the gap bins, seconds (the last bin is everything longer).
pub const GAP_BOUNDS: [u64; 10] = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400];

/// Gap bins: one per bound and one past the last.
pub const GAP_BINS: usize = GAP_BOUNDS.len() + 1;

/// The bin's label: its upper bound (`1s` … `40m`, `+Inf`).
pub fn gap_label(bin: usize) -> &'static str {
    const LABELS: [&str; GAP_BINS] = [
        "1s", "5s", "15s", "30s", "1m", "2m", "5m", "10m", "20m", "40m", "+Inf",
    ];
    LABELS.get(bin).copied().unwrap_or("+Inf")
}

/// The bin of `gap`.
pub fn gap_bin(gap: Duration) -> usize {
    let seconds = gap.as_secs_f64();
    GAP_BOUNDS
        .iter()
        .position(|&bound| seconds <= bound as f64)
        .unwrap_or(GAP_BOUNDS.len())
}

/// A realized share below this fraction of the theoretical one counts as the prefix lost.
pub const LOST_BELOW: f64 = 0.5;

/// Turns a gap bin needs before it can name the retention.
pub const MIN_TURNS: u64 = 5;

/// One gap bin of a model's retention curve: user and tool turns after an ended answer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GapBin {
    /// Turns by kind: [user, tool].
    pub turns: [u64; 2],
    /// Of them, turns whose usage counted the prompt (and its cached part).
    pub counted: u64,
    pub prompt_tokens: u64,
    /// What the engine reported cached.
    pub cached_tokens: u64,
    /// The prompt tokens the previous turn had already sent (theoretical share × prompt).
    pub shared_tokens: f64,
    /// Sum of TTFT over turns that had one, seconds, and how many.
    pub ttft_seconds: f64,
    pub ttft_count: u64,
}

impl GapBin {
    /// Cached ÷ prompt tokens, as the engine reported.
    pub fn realized_share(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }

    /// What the previous turns had sent ÷ prompt tokens.
    pub fn theoretical_share(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.shared_tokens / self.prompt_tokens as f64)
    }

    pub fn mean_ttft(&self) -> Option<f64> {
        (self.ttft_count > 0).then(|| self.ttft_seconds / self.ttft_count as f64)
    }
}

/// One model's session figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelSessions {
    /// Turns by what came before them, in [`After::ALL`] order.
    pub turns: [u64; 4],
    /// The highest turn index seen.
    pub max_turn: u32,
    pub bins: [GapBin; GAP_BINS],
}

/// Where production's turns start losing their prefix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retention {
    /// No gap bin has enough turns that resent a prefix.
    Unknown,
    /// Every bin with enough turns kept its prefix; `up_to` is the longest such bin's label.
    Kept { up_to: &'static str },
    /// Turns after gaps in bin `lost_from` (and its label) keep less than half what they
    /// could; the bins before it kept theirs (`kept_up_to`, `None` when none did).
    Lost {
        kept_up_to: Option<&'static str>,
        lost_from: &'static str,
    },
}

impl ModelSessions {
    /// Sessions started: first turns.
    pub fn sessions(&self) -> u64 {
        self.turns.first().copied().unwrap_or(0)
    }

    /// The model's effective retention, from its curve.
    pub fn retention(&self) -> Retention {
        let mut kept = None;
        for (bin, figures) in self.bins.iter().enumerate() {
            if figures.counted < MIN_TURNS || figures.shared_tokens <= 0.0 {
                continue;
            }
            let (Some(realized), Some(theoretical)) =
                (figures.realized_share(), figures.theoretical_share())
            else {
                continue;
            };
            if realized < LOST_BELOW * theoretical {
                return Retention::Lost {
                    kept_up_to: kept,
                    lost_from: gap_label(bin),
                };
            }
            kept = Some(gap_label(bin));
        }
        match kept {
            Some(up_to) => Retention::Kept { up_to },
            None => Retention::Unknown,
        }
    }
}

/// The session figures of every model (production turns only), since start.
#[derive(Debug, Default)]
pub struct TurnStats {
    models: Mutex<HashMap<Arc<str>, ModelSessions>>,
}

impl TurnStats {
    /// Every model's figures, by model name.
    pub fn snapshot(&self) -> Vec<(Arc<str>, ModelSessions)> {
        let mut all: Vec<_> = lock::lock(&self.models)
            .iter()
            .map(|(model, figures)| (Arc::clone(model), figures.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn add(&self, record: &RequestRecord) {
        let Some(turn) = &record.turn else {
            return;
        };
        let mut models = lock::lock(&self.models);
        // Model labels are bounded (`metering.max_models`), so this map is too.
        let figures = models.entry(Arc::clone(&record.labels.model)).or_default();
        if let Some(count) = After::ALL
            .iter()
            .position(|after| *after == turn.after)
            .and_then(|i| figures.turns.get_mut(i))
        {
            *count += 1;
        }
        figures.max_turn = figures.max_turn.max(turn.index);
        let kind = match turn.after {
            After::User => 0,
            After::Tool => 1,
            After::First | After::Overlap => return,
        };
        let Some(gap) = turn.gap else {
            return;
        };
        let Some(bin) = figures.bins.get_mut(gap_bin(gap)) else {
            return;
        };
        if let Some(count) = bin.turns.get_mut(kind) {
            *count += 1;
        }
        if let Some(ttft) = record.timing.ttft {
            bin.ttft_seconds += ttft.as_secs_f64();
            bin.ttft_count += 1;
        }
        if let (Some(prompt), Some(share)) = (record.tokens.prompt, turn.theoretical_share()) {
            bin.counted += 1;
            bin.prompt_tokens += prompt;
            bin.cached_tokens += record.tokens.cached.unwrap_or(0).min(prompt);
            bin.shared_tokens += share * prompt as f64;
        }
    }
}

impl RecordSink for TurnStats {
    fn record(&self, record: &Arc<RequestRecord>) {
        self.add(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::conversation::{SessionSource, Turn};

    fn turn_record(after: After, gap_s: u64, prompt: u64, cached: u64) -> RequestRecord {
        let mut record = RequestRecord::for_test();
        record.turn = Some(Turn {
            session: 1,
            source: SessionSource::Key,
            index: 2,
            after,
            gap: Some(Duration::from_secs(gap_s)),
            shared_bytes: 900,
            prompt_bytes: 1000,
        });
        record.tokens.prompt = Some(prompt);
        record.tokens.cached = Some(cached);
        record
    }

    #[test]
    fn the_retention_is_the_gap_where_the_realized_share_falls_below_half() {
        let stats = TurnStats::default();
        for _ in 0..5 {
            stats.add(&turn_record(After::User, 3, 1000, 880));
            stats.add(&turn_record(After::Tool, 20, 1000, 850));
            stats.add(&turn_record(After::User, 400, 1000, 0));
        }
        let [(model, figures)] = stats.snapshot().try_into().unwrap();
        assert_eq!(&*model, "m");
        assert_eq!(figures.turns, [0, 10, 5, 0]);
        assert_eq!(figures.bins[gap_bin(Duration::from_secs(3))].turns, [5, 0]);
        let bin = figures.bins[1];
        assert_eq!(bin.realized_share(), Some(0.88));
        assert!((bin.theoretical_share().unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(
            figures.retention(),
            Retention::Lost {
                kept_up_to: Some("30s"),
                lost_from: "10m"
            }
        );
        assert_eq!(gap_label(gap_bin(Duration::from_secs(10_000))), "+Inf");
        assert_eq!(gap_bin(Duration::from_millis(1000)), 0);
        assert_eq!(ModelSessions::default().retention(), Retention::Unknown);
    }
}
