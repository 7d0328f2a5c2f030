//! The drift refresher: every `drift.refresh_interval`, production (the aggregator) against
//! the pinned references (`aggregate::drift`), written into the drift gauges `/metrics` shows
//! (`telemetry::drift`). Wiring between two domains of the same layer, hence here.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use crate::aggregate::drift::{gauge_samples, Drift};
use crate::aggregate::ProductionMatrix;
use crate::net::Shutdown;
use crate::telemetry::drift::DriftGauges;
use crate::telemetry::prometheus::PrometheusMetrics;

/// Recomputes the gauges now.
pub fn refresh(production: &ProductionMatrix, drift: &Drift, gauges: &DriftGauges) {
    gauges.replace(gauge_samples(production, drift, SystemTime::now()));
}

/// Starts the refresher: the gauges are recomputed every `drift.refresh_interval` (and at once,
/// so a restart with pinned references shows them at the first scrape that has enough traffic).
pub fn spawn(
    production: Arc<ProductionMatrix>,
    drift: Arc<Drift>,
    gauges: Arc<PrometheusMetrics>,
    mut shutdown: Shutdown,
) -> JoinHandle<()> {
    let interval = drift
        .settings
        .refresh_interval
        .max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.wait() => break,
            }
            // The comparison merges up to a day of slices per reference: keep it off the
            // runtime's worker threads.
            let (production, drift, gauges) = (
                Arc::clone(&production),
                Arc::clone(&drift),
                Arc::clone(&gauges),
            );
            if let Err(error) =
                tokio::task::spawn_blocking(move || refresh(&production, &drift, &gauges.drift))
                    .await
            {
                tracing::warn!(%error, "the drift refresher stopped unexpectedly");
            }
        }
    })
}
