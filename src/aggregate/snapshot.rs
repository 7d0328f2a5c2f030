//! The snapshot task: every `store.snapshot_interval` it writes the production matrix of the
//! interval just ended (one document per model with traffic, and one more per value of each
//! slice dimension that keeps snapshots: with `[tenants]` on, per tenant of that model) to the store, then deletes
//! snapshots older than `store.retention`. On shutdown it writes the part-interval since the
//! last snapshot, so a restart loses nothing. Owned and stopped by `serve::ProxyServer`.
//!
//! The store calls run on the blocking pool; a failed write is logged and retried at the next
//! interval's snapshot, never fatal to the proxy.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::meter::labels::SliceFilter;
use crate::net::Shutdown;
use crate::store::Store;

use super::window::{ProductionMatrix, RecordFilter, Window, MAX_WINDOW};

/// Writes one snapshot per model with records in the `length` before `now`, and one per
/// value of each snapshotted slice dimension (a tenant) of each; returns how many.
pub fn write_snapshots(
    production: &ProductionMatrix,
    store: &Store,
    length: Duration,
    now: SystemTime,
) -> Result<usize, crate::store::StoreError> {
    let window = Window::Last(length.min(MAX_WINDOW));
    let windows = production.window(window, now);
    let names: Vec<Arc<str>> = windows.iter().map(|w| Arc::clone(&w.model)).collect();
    for entry in &windows {
        let others: Vec<&str> = names
            .iter()
            .filter(|name| !Arc::ptr_eq(name, &entry.model))
            .map(|name| &**name)
            .collect();
        let doc = production.document(entry, &others);
        store.put_snapshot(now, length, &entry.model, &SliceFilter::default(), &doc)?;
    }
    let mut written = windows.len();
    for entry in &windows {
        let slicings = production.slicings(window, &entry.model, now);
        for (dimension, values) in &slicings.by_dimension {
            if !dimension.snapshots {
                continue;
            }
            for (value, _) in values {
                let only = RecordFilter {
                    slice: SliceFilter::only(dimension, value.clone()),
                    ..RecordFilter::default()
                };
                let Some(doc) = production.matrix_where(window, Some(&entry.model), now, &only)
                else {
                    continue;
                };
                store.put_snapshot(now, length, &entry.model, &only.slice, &doc)?;
                written += 1;
            }
        }
    }
    Ok(written)
}

/// Starts the task. `retention` zero keeps snapshots forever.
pub fn spawn(
    production: Arc<ProductionMatrix>,
    store: Arc<Store>,
    interval: Duration,
    retention: Duration,
    shutdown: Shutdown,
) -> JoinHandle<()> {
    spawn_clocked(
        production,
        store,
        interval,
        retention,
        shutdown,
        SystemTime::now,
    )
}

/// [`spawn`], with the wall clock that dates the snapshots and ends their windows as a
/// parameter (the proxy's is `SystemTime::now`; the tests' follows paused time from a start
/// they choose, so a window's minute is never waited for).
fn spawn_clocked(
    production: Arc<ProductionMatrix>,
    store: Arc<Store>,
    interval: Duration,
    retention: Duration,
    mut shutdown: Shutdown,
    clock: impl Fn() -> SystemTime + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = clock();
        let mut next = Instant::now() + interval;
        loop {
            let stopping = tokio::select! {
                () = tokio::time::sleep_until(next) => false,
                () = shutdown.wait() => true,
            };
            let now = clock();
            let length = now.duration_since(last).unwrap_or(interval);
            let production = Arc::clone(&production);
            let store = Arc::clone(&store);
            let result = tokio::task::spawn_blocking(move || {
                let written = write_snapshots(&production, &store, length, now)?;
                let pruned = match now.checked_sub(retention) {
                    Some(cutoff) if !retention.is_zero() => store.prune(cutoff)?,
                    _ => 0,
                };
                Ok::<_, crate::store::StoreError>((written, pruned))
            })
            .await;
            match result {
                Ok(Ok((written, pruned))) => {
                    last = now;
                    tracing::debug!(written, pruned, "production matrix snapshot");
                }
                Ok(Err(error)) => tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "cannot write the production matrix snapshot"
                ),
                Err(error) => tracing::warn!(%error, "the snapshot writer stopped unexpectedly"),
            }
            if stopping {
                break;
            }
            next += interval;
            // After a long stall (suspended machine), do not fire a burst of catch-up ticks.
            if next < Instant::now() {
                next = Instant::now() + interval;
            }
        }
    })
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
