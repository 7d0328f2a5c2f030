//! The snapshot task in paused time with a wall clock that starts where the test puts it (three
//! seconds before a minute ends), so what a window's minute slices cover is tested without
//! waiting for the clock's minute: a snapshot every interval, each covering the whole minute
//! its records ended in (and the second after it), nothing written for an interval without
//! records, and at shutdown the part-interval since the last one, which no longer reaches a
//! record of the minute before. The proxy writing snapshots into a real store and reading
//! them after a restart is `tests/production_tests.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::spawn_clocked;
use crate::aggregate::cell::test_records::record;
use crate::aggregate::window::ProductionMatrix;
use crate::base::Source;
use crate::matrix::evidence::EvidenceRule;
use crate::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use crate::meter::record::{Outcome, RequestRecord};
use crate::net::shutdown_pair;
use crate::store::Store;

/// A minute boundary (Unix seconds divisible by 60).
const MINUTE: u64 = 1_750_000_020;

/// A one-stream request of `tokens` tokens of model `m` that ended at `end`.
fn ending_at(end: SystemTime, tokens: u64) -> RequestRecord {
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
    r.labels.model = Arc::from("m");
    r
}

/// A store in a fresh directory, removed on drop.
struct TempStore(PathBuf, Arc<Store>);

impl TempStore {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tokentap-snapshot-test-{}-{nanos}",
            std::process::id()
        ));
        let store = Arc::new(Store::open(&dir).unwrap());
        Self(dir, store)
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Whole milliseconds after [`MINUTE`] (the store keeps milliseconds).
fn ms_after_minute(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH + Duration::from_secs(MINUTE))
        .unwrap()
        .as_millis()
}

#[tokio::test(start_paused = true)]
async fn snapshots_cover_the_minute_their_records_ended_in_and_shutdown_writes_the_part_interval() {
    // The wall clock reads 3 s before a minute ends when the test starts, and follows paused
    // time from there.
    let wall_start = SystemTime::UNIX_EPOCH + Duration::from_secs(MINUTE + 57);
    let start = Instant::now();
    let clock = move || wall_start + start.elapsed();
    let production = ProductionMatrix::starting_at(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        Source::Production,
        EvidenceRule::NONE,
        wall_start,
    );
    let store = TempStore::new();
    let (trigger, shutdown) = shutdown_pair();
    let task = spawn_clocked(
        Arc::clone(&production),
        Arc::clone(&store.1),
        Duration::from_secs(1),
        Duration::ZERO,
        shutdown,
        clock,
    );
    // One request ends at :57.5 of the first minute, 10 tokens.
    tokio::time::sleep_until(start + secs(0.5)).await;
    production.add(&ending_at(clock(), 10));
    // Snapshots at :58, :59, :00 (the next minute's first second still reaches back into the
    // minute before) hold it; the one at :01 would not, so none is written.
    tokio::time::sleep_until(start + secs(4.5)).await;
    // Another, 20 tokens, ends at :01.5 of the next minute; the shutdown at :01.8 writes the
    // 0.8 s since the last snapshot: this minute's request, not the one before.
    production.add(&ending_at(clock(), 20));
    tokio::time::sleep_until(start + secs(4.8)).await;
    trigger.trigger();
    tokio::time::timeout(secs(10.0), task)
        .await
        .unwrap()
        .unwrap();
    let written: Vec<(u128, u128, u64)> = store
        .1
        .snapshots(None, None)
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s.model, "m");
            (
                ms_after_minute(s.taken_at),
                s.window.as_millis(),
                s.output_tokens,
            )
        })
        .collect();
    assert_eq!(
        written,
        [
            (58_000, 1000, 10),
            (59_000, 1000, 10),
            (60_000, 1000, 10),
            (61_800, 800, 20),
        ],
        "(taken, ms after the minute; window, ms; output tokens)"
    );
}
