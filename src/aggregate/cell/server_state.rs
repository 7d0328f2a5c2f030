//! The server's scraped state over a cell's requests ([`ServerStateSum`]), weighted by the
//! seconds each request saw it.

use crate::matrix::doc::ServerState;
use crate::meter::record::RequestRecord;
use crate::meter::server_state::GAUGES;

/// The server's scraped state summed over requests (docs/metrics.md): the production
/// aggregator and the sweep's cells both use it.
///
/// Each request brings its own time-weighted mean of each gauge over its interval (head in →
/// end) and the seconds a value was known in it; the cell's figure weights each request by
/// those seconds, so it is the state averaged over the request-seconds the cell's requests
/// spent at the server — time-weighted, like prefill interference, and a long request counts
/// for what it lived through.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerStateSum {
    /// Σ mean × known seconds, per gauge.
    pub weighted: [f64; GAUGES],
    /// Σ known seconds, per gauge.
    pub seconds: [f64; GAUGES],
}

impl ServerStateSum {
    /// Adds what one request saw.
    pub fn add(&mut self, record: &RequestRecord) {
        for (i, mean) in record.server_state.0.iter().enumerate() {
            let Some(mean) = mean else { continue };
            if !(mean.mean.is_finite()
                && mean.known_seconds.is_finite()
                && mean.known_seconds > 0.0)
            {
                continue;
            }
            if let (Some(weighted), Some(seconds)) =
                (self.weighted.get_mut(i), self.seconds.get_mut(i))
            {
                *weighted += mean.mean * mean.known_seconds;
                *seconds += mean.known_seconds;
            }
        }
    }

    pub fn merge(&mut self, other: &ServerStateSum) {
        for i in 0..GAUGES {
            if let (Some(w), Some(s), Some(ow), Some(os)) = (
                self.weighted.get_mut(i),
                self.seconds.get_mut(i),
                other.weighted.get(i),
                other.seconds.get(i),
            ) {
                *w += ow;
                *s += os;
            }
        }
    }

    /// The cell's figures; `None` when no request saw any state.
    pub fn to_state(&self) -> Option<ServerState> {
        let mean = |i: usize| {
            let seconds = self.seconds.get(i).copied().unwrap_or(0.0);
            (seconds > 0.0).then(|| self.weighted.get(i).copied().unwrap_or(0.0) / seconds)
        };
        ServerState::from_values([mean(0), mean(1), mean(2), mean(3)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::server_state::{ServerGauge, StateMean};

    fn saw(gauge: ServerGauge, mean: f64, known_seconds: f64) -> RequestRecord {
        let mut r = RequestRecord::for_test();
        r.server_state.0[gauge.index()] = Some(StateMean {
            mean,
            known_seconds,
        });
        r
    }

    #[test]
    fn each_gauge_is_weighted_by_the_seconds_it_was_known() {
        let mut sum = ServerStateSum::default();
        assert_eq!(sum.to_state(), None);
        sum.add(&saw(ServerGauge::RunningRequests, 2.0, 3.0));
        sum.add(&saw(ServerGauge::RunningRequests, 6.0, 1.0));
        sum.add(&saw(ServerGauge::KvCacheUsage, 0.5, 2.0));
        let state = sum.to_state().unwrap();
        assert_eq!(state.running_requests, Some(3.0), "(2 × 3 + 6 × 1) ÷ 4");
        assert_eq!(state.kv_cache_usage, Some(0.5));
        assert_eq!(state.queued_requests, None, "no request saw it");
    }

    #[test]
    fn means_without_known_time_or_not_finite_are_left_out() {
        let mut sum = ServerStateSum::default();
        sum.add(&saw(ServerGauge::QueuedRequests, 9.0, 0.0));
        sum.add(&saw(ServerGauge::QueuedRequests, f64::NAN, 1.0));
        sum.add(&saw(ServerGauge::QueuedRequests, 1.0, f64::INFINITY));
        assert_eq!(sum.to_state(), None);
    }

    #[test]
    fn merged_sums_weigh_every_request_alike() {
        let (mut a, mut b) = (ServerStateSum::default(), ServerStateSum::default());
        a.add(&saw(ServerGauge::PrefixCacheHitRate, 0.2, 1.0));
        b.add(&saw(ServerGauge::PrefixCacheHitRate, 0.8, 3.0));
        a.merge(&b);
        let rate = a.to_state().unwrap().prefix_cache_hit_rate.unwrap();
        assert!((rate - 0.65).abs() < 1e-12, "{rate}");
    }
}
