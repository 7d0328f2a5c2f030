//! The verdict's first clause: whether a model's upstream answers now — the same probe
//! `/readyz` asks (`proxy::readiness`) — and how the window's requests of the model ended
//! (`aggregate::cell::OutcomeSum`: every request, placed in a cell or not). Bad when the
//! upstream does not answer now, or when the share of requests that failed on the server's
//! side (upstream errors, tokentap's own 502/503/504, upstream aborts and stalls, timeouts,
//! requests the engine shed; client aborts are not counted against it) exceeds the error
//! budget: the `[slo]`'s (1 − its objective) where the model has targets, else
//! [`DEFAULT_ERROR_BUDGET`]. A bad clause is the verdict's headline (docs/capacity.md, "The
//! verdict"). Pure: the probe's answer and the sums in, the clause's figures and words out.

use std::time::SystemTime;

use serde::Serialize;

use crate::aggregate::cell::{Failure, OutcomeSum};
use crate::base::wallclock::format_rfc3339;
use crate::matrix::units::format_percent;
use crate::meter::record::Outcome;
use crate::proxy::readiness::UpstreamAnswer;

/// The error budget of a model without `[slo]` targets: past 5 % of its requests failing
/// (the share past which a matrix cell is `Error`, `aggregate::cell::ERROR_SHARE`), the
/// upstream is called unavailable.
pub const DEFAULT_ERROR_BUDGET: f64 = crate::aggregate::cell::ERROR_SHARE;

/// What the clause says the upstream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AvailabilityKind {
    /// It answers, and the window's failures are within the budget.
    Available,
    /// It does not answer now, or more of the window's requests failed than the budget
    /// allows, most of them not shed.
    Unavailable,
    /// It answers, but the engine refused more of the window's requests for load than the
    /// budget allows (429, 503: `shed`).
    Shedding,
}

/// The error budget a clause is held to, and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ErrorBudget {
    /// The share of requests that may fail (0–1).
    pub share: f64,
    /// From the model's `[slo]` objective (else [`DEFAULT_ERROR_BUDGET`]).
    pub from_slo: bool,
}

impl ErrorBudget {
    /// The `[slo]`'s budget (1 − `objective`) when the model has targets, else the default.
    pub fn of(targets_set: bool, objective: f64) -> Self {
        if targets_set {
            Self {
                share: (1.0 - objective).max(0.0),
                from_slo: true,
            }
        } else {
            Self {
                share: DEFAULT_ERROR_BUDGET,
                from_slo: false,
            }
        }
    }

    /// `the 1.0% error budget of the [slo] objective`, `the default 5.0% error budget (no
    /// [slo] targets)`.
    fn text(self) -> String {
        if self.from_slo {
            format!(
                "the {} error budget of the [slo] objective",
                format_percent(self.share)
            )
        } else {
            format!(
                "the default {} error budget (no [slo] targets)",
                format_percent(self.share)
            )
        }
    }
}

/// One model's availability over the window (or one upstream's, without traffic).
#[derive(Debug, Clone, Serialize)]
pub struct Availability {
    pub kind: AvailabilityKind,
    /// Not answering now, or failures past the budget: the verdict's headline.
    pub bad: bool,
    pub upstream: String,
    /// Whether the upstream answers `/readyz`'s probe now.
    pub ready: bool,
    /// The requests judged: every one in the window but client aborts.
    pub requests: u64,
    /// Of those, the server's failures, shed requests included.
    pub failed: u64,
    /// Of those, the requests the engine shed for load.
    pub shed: u64,
    /// `failed ÷ requests` (absent without requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_share: Option<f64>,
    pub budget: ErrorBudget,
    /// Since when (RFC 3339): where the run of failures going on now began, or when the probe
    /// first found the upstream not answering, whichever is earlier; the window's first
    /// failure where failures and successes mix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// The latest failure in words (`502 from tokentap at …: the upstream could not be
    /// reached`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub text: String,
}

/// `502 from tokentap at 2026-01-01T12:00:03Z: the upstream could not be reached, or broke
/// before answering`.
fn failure_text(failure: &Failure) -> String {
    let at = format_rfc3339(failure.at);
    let status = failure.status;
    if !failure.upstream_answered {
        let why = match (failure.outcome, status) {
            (Outcome::Timeout, _) | (_, 504) => "no response head within the upstream timeout",
            (_, 503) => "the upstream's connection limit (upstream.max_connections) was full",
            (_, 502) => "the upstream could not be reached, or broke before answering",
            _ => "the upstream gave no answer",
        };
        return format!("{status} from tokentap at {at}: {why}");
    }
    let what = match failure.outcome {
        Outcome::Shed => "the engine refused it for load (shed)",
        Outcome::UpstreamAborted => {
            "the upstream reset the connection or ended the stream without its end marker"
        }
        Outcome::UpstreamStalled => "the upstream's stream went silent past stream_idle_timeout",
        Outcome::Timeout => "the upstream did not answer in time",
        _ if status >= 400 => "an error answer",
        _ => "an error event inside the stream",
    };
    format!("{status} from the upstream at {at}: {what}")
}

fn earliest(a: Option<SystemTime>, b: Option<SystemTime>) -> Option<SystemTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When the probe first found `answer` as it is now, on the wall clock of `now`.
fn probe_since(answer: &UpstreamAnswer, now: SystemTime) -> SystemTime {
    now.checked_sub(answer.since.elapsed()).unwrap_or(now)
}

/// The availability of a model whose requests go to the upstream `answer` is of (`None`: not
/// probed, taken as answering), over the window's `outcomes`, held to `budget`, at `now`.
pub fn availability(
    upstream: &str,
    answer: Option<&UpstreamAnswer>,
    outcomes: &OutcomeSum,
    budget: ErrorBudget,
    now: SystemTime,
) -> Availability {
    let ready = answer.is_none_or(|a| a.answering);
    let requests = outcomes.judged();
    let failed = outcomes.failed();
    let shed = outcomes.count(Outcome::Shed);
    let failed_share = (requests > 0).then(|| failed as f64 / requests as f64);
    let over = failed_share.is_some_and(|s| s > budget.share);
    let kind = if !ready || (over && shed * 2 <= failed) {
        AvailabilityKind::Unavailable
    } else if over {
        AvailabilityKind::Shedding
    } else {
        AvailabilityKind::Available
    };
    let last_error = outcomes.last_failure.as_ref().map(failure_text);
    // Failing now (nothing succeeded after the latest failure): since the run began, or since
    // the probe found the upstream down, whichever is earlier. Failures mixed with successes:
    // since the window's first failure.
    let failing_now = outcomes
        .last_failure
        .is_some_and(|f| outcomes.last_ok.is_none_or(|ok| f.at > ok));
    let down_since = answer.filter(|a| !a.answering).map(|a| probe_since(a, now));
    let since = match kind {
        AvailabilityKind::Available => None,
        AvailabilityKind::Unavailable if failing_now || !ready => {
            earliest(outcomes.failing_since, down_since)
        }
        _ => outcomes.first_failure,
    }
    .map(format_rfc3339);
    let share_text = failed_share.map_or_else(String::new, format_percent);
    let counted = |what: &str| {
        format!(
            "{failed} of {requests} requests in the window {what} ({share_text}, {} {})",
            if over { "over" } else { "within" },
            budget.text()
        )
    };
    let since_text = since
        .as_deref()
        .map_or_else(String::new, |s| format!(" since {s}"));
    let last_text = last_error
        .as_deref()
        .map_or_else(String::new, |e| format!("; last error: {e}"));
    let text = match kind {
        AvailabilityKind::Unavailable if !ready => {
            let url = answer.map_or("", |a| a.url.as_str());
            let requests_text = if requests == 0 {
                "no request ended in the window".to_owned()
            } else {
                counted("failed")
            };
            format!(
                "unavailable{since_text}: upstream `{upstream}` ({url}) does not answer (GET /v1/models, as /readyz asks: not ready); {requests_text}{last_text}"
            )
        }
        AvailabilityKind::Unavailable => format!(
            "unavailable{since_text}: {}{last_text}; upstream `{upstream}` answers /readyz's probe now",
            counted("failed")
        ),
        AvailabilityKind::Shedding => {
            let shed_share = format_percent(shed as f64 / requests.max(1) as f64);
            let others = if failed > shed {
                format!("; {failed} failed in all, {share_text}")
            } else {
                String::new()
            };
            format!(
                "shedding{since_text}: the engine refused {shed} of {requests} requests in the window for load ({shed_share}{others}, over {}){last_text}",
                budget.text()
            )
        }
        AvailabilityKind::Available if failed == 0 => format!(
            "available: upstream `{upstream}` answers (/readyz ready); none of {requests} requests in the window failed"
        ),
        AvailabilityKind::Available => format!(
            "available: upstream `{upstream}` answers (/readyz ready); {}{last_text}",
            counted("failed")
        ),
    };
    Availability {
        kind,
        bad: kind != AvailabilityKind::Available,
        upstream: upstream.to_owned(),
        ready,
        requests,
        failed,
        shed,
        failed_share,
        budget,
        since,
        last_error,
        text,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn answer(answering: bool) -> UpstreamAnswer {
        UpstreamAnswer {
            name: Arc::from("default"),
            url: "http://127.0.0.1:30000".to_owned(),
            answering,
            since: tokio::time::Instant::now(),
        }
    }

    fn at(second: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + second)
    }

    fn sum(ends: &[(Outcome, u64, u16, bool)]) -> OutcomeSum {
        let mut out = OutcomeSum::default();
        for &(outcome, second, status, answered) in ends {
            let mut one = OutcomeSum::default();
            let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap();
            one.counts[i] = 1;
            if outcome == Outcome::Ok {
                one.last_ok = Some(at(second));
            } else if outcome.is_failure() {
                one.first_failure = Some(at(second));
                one.failing_since = Some(at(second));
                one.last_failure = Some(Failure {
                    at: at(second),
                    outcome,
                    status,
                    upstream_answered: answered,
                });
            }
            out.merge(&one);
        }
        out
    }

    #[test]
    fn a_dead_upstream_is_unavailable_since_its_first_failure_with_the_last_error() {
        let outcomes = sum(&[
            (Outcome::Ok, 1, 200, true),
            (Outcome::Ok, 2, 200, true),
            (Outcome::UpstreamError, 10, 502, false),
            (Outcome::UpstreamError, 12, 502, false),
        ]);
        let a = availability(
            "default",
            Some(&answer(false)),
            &outcomes,
            ErrorBudget::of(false, 0.99),
            at(20),
        );
        assert!(a.bad);
        assert_eq!(a.kind, AvailabilityKind::Unavailable);
        assert_eq!(a.since.as_deref(), Some(format_rfc3339(at(10)).as_str()));
        assert!(a.text.starts_with("unavailable since "), "{}", a.text);
        assert!(a.text.contains("not ready"), "{}", a.text);
        assert!(a.text.contains("2 of 4 requests"), "{}", a.text);
        assert!(
            a.text.contains("last error: 502 from tokentap at"),
            "{}",
            a.text
        );
        assert!(a.text.contains("could not be reached"), "{}", a.text);
    }

    #[test]
    fn shedding_past_the_slo_budget_is_named_as_shedding() {
        let mut ends = vec![(Outcome::Ok, 1, 200, true)];
        ends.extend((2..11).map(|s| (Outcome::Shed, s, 503, true)));
        let a = availability(
            "default",
            Some(&answer(true)),
            &sum(&ends),
            ErrorBudget::of(true, 0.99),
            at(20),
        );
        assert_eq!(a.kind, AvailabilityKind::Shedding);
        assert!(a.bad);
        assert!(
            a.text.starts_with("shedding since ")
                && a.text.contains("9 of 10 requests")
                && a.text.contains("load (90.0%, over the 1.0%")
                && a.text.contains("1.0% error budget of the [slo]"),
            "{}",
            a.text
        );
    }

    #[test]
    fn a_healthy_upstream_and_client_aborts_are_available() {
        let outcomes = sum(&[
            (Outcome::Ok, 1, 200, true),
            (Outcome::ClientAborted, 2, 200, true),
            (Outcome::ClientAborted, 3, 200, true),
        ]);
        let a = availability(
            "default",
            Some(&answer(true)),
            &outcomes,
            ErrorBudget::of(false, 0.99),
            at(20),
        );
        assert!(!a.bad, "{}", a.text);
        assert_eq!(a.requests, 1);
        assert_eq!(a.since, None);
        // One failure in 40 is within the default budget, named all the same.
        let mut ends: Vec<_> = (0..39).map(|s| (Outcome::Ok, s, 200, true)).collect();
        ends.push((Outcome::UpstreamError, 50, 500, true));
        let a = availability(
            "default",
            None,
            &sum(&ends),
            ErrorBudget::of(false, 0.99),
            at(60),
        );
        assert!(!a.bad, "{}", a.text);
        assert!(a.text.contains("within the default 5.0%"), "{}", a.text);
        assert!(a.text.contains("500 from the upstream"), "{}", a.text);
    }

    #[test]
    fn a_dead_upstream_without_traffic_says_so() {
        let a = availability(
            "default",
            Some(&answer(false)),
            &OutcomeSum::default(),
            ErrorBudget::of(false, 0.99),
            at(20),
        );
        assert!(a.bad);
        assert!(
            a.text.contains("does not answer") && a.text.contains("no request ended"),
            "{}",
            a.text
        );
    }
}
