//! Histogram bucket bounds, declared once. The meter bins each request's inter-token gaps and
//! per-frame overhead into them as they happen (fixed arrays, no allocation per event), and
//! every exporter (Prometheus, OpenTelemetry) publishes histograms with these same bounds, so
//! per-request bins add up exactly.

/// Latency buckets for TTFT and request duration: 5 ms … 20 min (1M-token prefills take minutes).
pub static LATENCY_BUCKETS: [f64; 24] = [
    0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0,
    10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1200.0,
];

/// Buckets for TBT and ITL: 0.5 ms … 2 s, dense where decode steps live (5–50 ms): 2.5 ms
/// wide from 15 to 30 ms and 5 ms wide to 50 ms, where decode steps sit under load (a p99 read
/// from 5 ms-wide bins there was 0.90–0.92 of the clients' own p99). At most
/// `meter::timeline::MAX_HISTOGRAM_BUCKETS` − 1 bounds: a request's own histogram uses them.
pub static TOKEN_GAP_BUCKETS: [f64; 29] = [
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.01, 0.012, 0.015, 0.0175,
    0.02, 0.0225, 0.025, 0.0275, 0.03, 0.035, 0.04, 0.045, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
    2.0,
];

/// Throughput buckets in tokens per second: 1 … 1M.
pub static RATE_BUCKETS: [f64; 22] = [
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0, 2500.0,
    5000.0, 10000.0, 15000.0, 25000.0, 50000.0, 100000.0, 1000000.0,
];

/// Token-count buckets: powers of two, 1 … 2M.
pub static TOKEN_COUNT_BUCKETS: [f64; 22] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0, 131072.0, 262144.0, 524288.0, 1048576.0, 2097152.0,
];

/// Tokens per event: 1 … 32.
pub static TOKENS_PER_EVENT_BUCKETS: [f64; 10] =
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0];

/// Proxy overhead: 1 µs … 100 ms.
pub static OVERHEAD_BUCKETS: [f64; 16] = [
    0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001,
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// The bounds of a request's own histograms (`meter::timeline::LocalHistogram`), reached
/// through one thin pointer each: every open stream carries two such histograms.
pub static TOKEN_GAP_BOUNDS: &[f64] = &TOKEN_GAP_BUCKETS;
/// [`OVERHEAD_BUCKETS`] for a request's own per-frame histogram, as [`TOKEN_GAP_BOUNDS`].
pub static OVERHEAD_BOUNDS: &[f64] = &OVERHEAD_BUCKETS;

/// Average active requests: the concurrency ladder and the points between.
pub static ACTIVE_BUCKETS: [f64; 19] = [
    1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0,
    256.0, 512.0, 1024.0,
];

/// Shares (prefill overlap): 0 … 1, fine near 0 where warm steady traffic lives.
pub static SHARE_BUCKETS: [f64; 11] = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0];

/// Overlapping prefills per request: 0 … 256.
pub static OVERLAP_COUNT_BUCKETS: [f64; 11] =
    [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0, 256.0];

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's own histograms keep every bound (past `MAX_HISTOGRAM_BUCKETS` − 1 they
    /// would be cut, and the exporter's buckets would no longer add up).
    #[test]
    fn a_request_histogram_holds_every_bound() {
        let most = super::super::timeline::MAX_HISTOGRAM_BUCKETS - 1;
        assert!(TOKEN_GAP_BOUNDS.len() <= most);
        assert!(OVERHEAD_BOUNDS.len() <= most);
        assert!(TOKEN_GAP_BUCKETS.windows(2).all(|pair| pair[0] < pair[1]));
        // 2.5 ms wide from 15 to 30 ms, where decode steps sit under load.
        let fine: Vec<f64> = TOKEN_GAP_BUCKETS
            .iter()
            .copied()
            .filter(|b| (0.015..=0.03).contains(b))
            .collect();
        assert!(fine.windows(2).all(|p| p[1] - p[0] <= 0.0025 + 1e-12));
    }
}
