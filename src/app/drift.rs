//! The drift refresher: every `drift.refresh_interval`, production (the aggregator) against
//! the pinned references (`aggregate::drift`), written into the drift gauges `/metrics` shows
//! (`telemetry::drift`), and live headroom (`admin::capacity`) into the capacity gauges
//! (`telemetry::capacity`). Wiring between two domains of the same layer, hence here.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use crate::admin::AdminState;
use crate::aggregate::drift::{gauge_samples, Drift};
use crate::aggregate::ProductionMatrix;
use crate::net::Shutdown;
use crate::telemetry::capacity::CapacityGauges;
use crate::telemetry::drift::DriftGauges;
use crate::telemetry::prometheus::PrometheusMetrics;

/// Recomputes the drift gauges now.
pub fn refresh(production: &ProductionMatrix, drift: &Drift, gauges: &DriftGauges) {
    gauges.replace(gauge_samples(production, drift, SystemTime::now()));
}

/// Recomputes the capacity gauges now (live headroom per model, `admin::capacity`).
pub fn refresh_capacity(admin: &AdminState, gauges: &CapacityGauges) {
    let answer = crate::admin::capacity::all_models(admin, SystemTime::now());
    gauges.replace(crate::admin::capacity::gauge_samples(admin, &answer));
}

/// Starts the refresher: the gauges are recomputed every `drift.refresh_interval` (and at once,
/// so a restart with pinned references shows them at the first scrape that has enough traffic).
pub fn spawn(
    production: Arc<ProductionMatrix>,
    drift: Arc<Drift>,
    gauges: Arc<PrometheusMetrics>,
    admin: Arc<AdminState>,
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
            let (production, drift, gauges, admin) = (
                Arc::clone(&production),
                Arc::clone(&drift),
                Arc::clone(&gauges),
                Arc::clone(&admin),
            );
            if let Err(error) = tokio::task::spawn_blocking(move || {
                refresh(&production, &drift, &gauges.drift);
                refresh_capacity(&admin, &gauges.capacity);
            })
            .await
            {
                tracing::warn!(%error, "the drift refresher stopped unexpectedly");
            }
        }
    })
}
