//! Service-level objectives per request: the targets (TTFT ≤ x, TBT ≤ y, end-to-end ≤ z), where
//! they come from (the `[slo]` configuration, per model, or the `x-tokentap-slo` request
//! header) and the verdict a finished request gets against them (docs/metrics.md).
//!
//! Targets are resolved once per request when its head and body have been read, never per
//! event; the verdict is computed once when the record is built. Pure: no I/O, no clock.

use std::collections::BTreeMap;
use std::time::Duration;

use super::record::{Outcome, SloVerdict};

/// The request header a client may send to set its own targets, replacing the configured ones
/// for that request: `x-tokentap-slo: ttft=500ms,tbt=50ms,e2e=30s` (any subset), or `none` for
/// no SLO. It is forwarded to the upstream like every other header.
pub const SLO_HEADER: &str = "x-tokentap-slo";

/// Longest header value parsed; longer values are ignored (and counted as invalid).
pub const MAX_SLO_HEADER_BYTES: usize = 256;

/// The targets of one request; `None` means not set. All `None`: no SLO.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SloTargets {
    /// Time to first token: request head in → first token.
    pub ttft: Option<Duration>,
    /// Time between tokens: (last − first token) ÷ (completion tokens − 1).
    pub tbt: Option<Duration>,
    /// End to end: request head in → response end.
    pub e2e: Option<Duration>,
}

/// What the verdict is computed from (the record's own figures).
#[derive(Debug, Clone, Copy)]
pub struct SloFigures {
    pub outcome: Outcome,
    pub time_to_first_token: Option<Duration>,
    pub time_between_tokens: Option<Duration>,
    pub duration: Duration,
}

impl SloTargets {
    pub const NONE: SloTargets = SloTargets {
        ttft: None,
        tbt: None,
        e2e: None,
    };

    pub fn is_set(&self) -> bool {
        self.ttft.is_some() || self.tbt.is_some() || self.e2e.is_some()
    }

    /// The verdict of a finished request. A failed request (upstream error, upstream abort,
    /// timeout, stall: [`Outcome::is_failure`]) misses whatever was set: it served nothing
    /// usable. A request the client stopped is judged on what it saw until then (the sweep
    /// stops its streams at the window's end).
    /// A TTFT target without a first token is missed; a TBT target with fewer than two tokens
    /// has nothing to judge and does not count against the request.
    pub fn judge(&self, figures: &SloFigures) -> SloVerdict {
        if !self.is_set() {
            return SloVerdict::Unset;
        }
        let failed = figures.outcome.is_failure();
        let ttft_ok = self
            .ttft
            .is_none_or(|target| figures.time_to_first_token.is_some_and(|t| t <= target));
        let tbt_ok = match (self.tbt, figures.time_between_tokens) {
            (Some(target), Some(tbt)) => tbt <= target,
            _ => true,
        };
        let e2e_ok = self.e2e.is_none_or(|target| figures.duration <= target);
        if !failed && ttft_ok && tbt_ok && e2e_ok {
            SloVerdict::Met
        } else {
            SloVerdict::Missed
        }
    }

    /// Parses the header value: comma-separated `ttft=`, `tbt=`, `e2e=` with a duration each
    /// (`500ms`, `2s`, `1m`), or `none`. Bounded ([`MAX_SLO_HEADER_BYTES`]); any error rejects
    /// the whole value (the caller then keeps the configured targets).
    pub fn parse_header(value: &[u8]) -> Result<SloTargets, SloHeaderError> {
        if value.len() > MAX_SLO_HEADER_BYTES {
            return Err(SloHeaderError::TooLong);
        }
        let text = std::str::from_utf8(value).map_err(|_| SloHeaderError::NotText)?;
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(SloTargets::NONE);
        }
        let mut targets = SloTargets::NONE;
        for part in text.split(',') {
            let (key, value) = part.split_once('=').ok_or(SloHeaderError::Malformed)?;
            let duration = parse_target(value.trim()).ok_or(SloHeaderError::BadDuration)?;
            let slot = match key.trim().to_ascii_lowercase().as_str() {
                "ttft" => &mut targets.ttft,
                "tbt" => &mut targets.tbt,
                "e2e" => &mut targets.e2e,
                _ => return Err(SloHeaderError::UnknownKey),
            };
            if slot.replace(duration).is_some() {
                return Err(SloHeaderError::Repeated);
            }
        }
        if targets.is_set() {
            Ok(targets)
        } else {
            Err(SloHeaderError::Malformed)
        }
    }
}

/// Why an `x-tokentap-slo` value was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SloHeaderError {
    #[error("longer than {MAX_SLO_HEADER_BYTES} bytes")]
    TooLong,
    #[error("not text")]
    NotText,
    #[error("not key=duration pairs separated by commas")]
    Malformed,
    #[error("a duration is not like 500ms, 2s or 1m, or is zero")]
    BadDuration,
    #[error("a key is not ttft, tbt or e2e")]
    UnknownKey,
    #[error("a key appears twice")]
    Repeated,
}

/// A positive duration: `500ms`, `0.5s`, `2s`, `1m` (the configuration's units but `h`, which
/// no latency target needs; zero is refused: it cannot be met).
pub fn parse_target(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
}

/// The configured targets: a default for every model and per-model replacements (a model's
/// table replaces the default entirely, so a model can also be exempted with an empty table).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SloPolicy {
    pub default: SloTargets,
    pub models: BTreeMap<String, SloTargets>,
    /// Which first token the TTFT target judges (`[slo] ttft_of`).
    pub ttft_of: TtftOf,
}

/// Which first token an SLO's TTFT target judges: with a reasoning model the first token is
/// reasoning, and a user waits for the first answer token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TtftOf {
    /// The first token of any kind (reasoning, answer or tool call): the matrix's TTFT.
    #[default]
    Any,
    /// The first answer token (content) or tool-call delta, whichever came first; a request
    /// that streamed neither is judged by its first token.
    Answer,
}

impl TtftOf {
    /// `"any"` or `"answer"`.
    pub fn parse(text: &str) -> Option<TtftOf> {
        match text {
            "any" => Some(TtftOf::Any),
            "answer" => Some(TtftOf::Answer),
            _ => None,
        }
    }
}

/// The targets a request gets and whether its header was ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolvedSlo {
    pub targets: SloTargets,
    /// Which first token the TTFT target judges.
    pub ttft_of: TtftOf,
    /// The request carried an `x-tokentap-slo` header that could not be read.
    pub header_invalid: bool,
}

impl SloPolicy {
    /// The configured targets for `model` (the name the client sent, not the capped label).
    pub fn for_model(&self, model: Option<&str>) -> SloTargets {
        model
            .and_then(|m| self.models.get(m))
            .copied()
            .unwrap_or(self.default)
    }

    /// A request's targets: its valid header's, else the configuration's for its model.
    pub fn resolve(&self, model: Option<&str>, header: Option<&[u8]>) -> ResolvedSlo {
        match header.map(SloTargets::parse_header) {
            Some(Ok(targets)) => ResolvedSlo {
                targets,
                ttft_of: self.ttft_of,
                header_invalid: false,
            },
            Some(Err(_)) => ResolvedSlo {
                targets: self.for_model(model),
                ttft_of: self.ttft_of,
                header_invalid: true,
            },
            None => ResolvedSlo {
                targets: self.for_model(model),
                ttft_of: self.ttft_of,
                header_invalid: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn header_values_parse() {
        assert_eq!(
            SloTargets::parse_header(b"ttft=500ms,tbt=50ms,e2e=30s"),
            Ok(SloTargets {
                ttft: Some(ms(500)),
                tbt: Some(ms(50)),
                e2e: Some(ms(30_000)),
            })
        );
        assert_eq!(
            SloTargets::parse_header(b" TBT = 0.05s "),
            Ok(SloTargets {
                tbt: Some(ms(50)),
                ..SloTargets::NONE
            })
        );
        assert_eq!(SloTargets::parse_header(b"none"), Ok(SloTargets::NONE));
        for bad in [
            &b""[..],
            b"ttft",
            b"ttft=",
            b"ttft=0ms",
            b"ttft=5",
            b"ttft=5h",
            b"ttft=-5ms",
            b"ttft=1ms,ttft=2ms",
            b"latency=1s",
            b"ttft=1ms,",
            b"\xff\xfe",
        ] {
            assert!(SloTargets::parse_header(bad).is_err(), "{bad:?}");
        }
        let long = format!("ttft=1ms{}", " ".repeat(MAX_SLO_HEADER_BYTES));
        assert_eq!(
            SloTargets::parse_header(long.as_bytes()),
            Err(SloHeaderError::TooLong)
        );
    }

    #[test]
    fn a_valid_header_replaces_the_configuration_and_a_bad_one_is_ignored() {
        let tight = SloTargets {
            ttft: Some(ms(1)),
            ..SloTargets::NONE
        };
        let policy = SloPolicy {
            default: SloTargets {
                e2e: Some(ms(10_000)),
                ..SloTargets::NONE
            },
            models: BTreeMap::from([("m".to_owned(), tight)]),
            ttft_of: TtftOf::Any,
        };
        assert_eq!(policy.resolve(Some("m"), None).targets, tight);
        assert_eq!(policy.resolve(Some("other"), None).targets, policy.default);
        assert_eq!(policy.resolve(None, None).targets, policy.default);
        let header = policy.resolve(Some("m"), Some(b"tbt=20ms"));
        assert_eq!(header.targets.tbt, Some(ms(20)));
        assert_eq!(header.targets.ttft, None);
        assert!(!header.header_invalid);
        let bad = policy.resolve(Some("m"), Some(b"tbt=fast"));
        assert_eq!(bad.targets, tight);
        assert!(bad.header_invalid);
        assert!(!policy.resolve(Some("m"), Some(b"none")).targets.is_set());
    }

    proptest::proptest! {
        /// Any bytes: a result, never a panic; whatever parses is within the bound.
        #[test]
        fn any_header_value_is_read_or_refused(value in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if SloTargets::parse_header(&value).is_ok() {
                proptest::prop_assert!(value.len() <= MAX_SLO_HEADER_BYTES);
            }
        }
    }

    #[test]
    fn verdicts() {
        let targets = SloTargets {
            ttft: Some(ms(100)),
            tbt: Some(ms(20)),
            e2e: Some(ms(1_000)),
        };
        let good = SloFigures {
            outcome: Outcome::Ok,
            time_to_first_token: Some(ms(100)),
            time_between_tokens: Some(ms(20)),
            duration: ms(1_000),
        };
        assert_eq!(targets.judge(&good), SloVerdict::Met);
        assert_eq!(SloTargets::NONE.judge(&good), SloVerdict::Unset);
        let missed = [
            SloFigures {
                time_to_first_token: Some(ms(101)),
                ..good
            },
            SloFigures {
                time_to_first_token: None,
                ..good
            },
            SloFigures {
                time_between_tokens: Some(ms(21)),
                ..good
            },
            SloFigures {
                duration: ms(1_001),
                ..good
            },
            SloFigures {
                outcome: Outcome::UpstreamError,
                ..good
            },
            SloFigures {
                outcome: Outcome::Timeout,
                ..good
            },
            SloFigures {
                outcome: Outcome::UpstreamStalled,
                ..good
            },
            // Refused for load: it served nothing, an SLO miss.
            SloFigures {
                outcome: Outcome::Shed,
                ..good
            },
        ];
        for figures in missed {
            assert_eq!(targets.judge(&figures), SloVerdict::Missed, "{figures:?}");
        }
        // One token: no TBT to judge. A client stop is judged on what it saw.
        for figures in [
            SloFigures {
                time_between_tokens: None,
                ..good
            },
            SloFigures {
                outcome: Outcome::ClientAborted,
                ..good
            },
        ] {
            assert_eq!(targets.judge(&figures), SloVerdict::Met, "{figures:?}");
        }
    }
}
