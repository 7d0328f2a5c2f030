//! The capture writer's failure log in paused time (`start_paused`): failing batch writes are
//! told once when they start, with their cause, then at most once a minute with the rows lost
//! so far, and once when writing works again; a later episode is told afresh. The real store
//! losing its table under a running proxy is `tests/fault_tests.rs`
//! (`failing_capture_writes_are_logged_once_with_their_cause_and_the_lost_rows_counted`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::subscriber::DefaultGuard;

use super::{StoreFailures, FAILURE_LOG_EVERY};

/// What the log said, one line per event.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Collects this thread's log until the guard is dropped.
    fn capture() -> (Self, DefaultGuard) {
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (log, tracing::subscriber::set_default(subscriber))
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn failing_writes_are_told_once_then_at_most_once_a_minute_and_when_they_work_again() {
    let (log, _guard) = Log::capture();
    let said = |what: &str| {
        log.lines()
            .iter()
            .filter(|l| l.contains(what))
            .cloned()
            .collect::<Vec<_>>()
    };
    let cause = std::io::Error::other("no such table: workload");
    let mut failures = StoreFailures::default();
    // Sixty failed batches, one a second: told once, with the cause.
    for _ in 0..59 {
        failures.failed(&cause, 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let lost = said("cannot store captured workload rows");
    assert_eq!(lost.len(), 1, "{lost:#?}");
    assert!(lost[0].contains("no such table: workload"), "{}", lost[0]);
    assert!(lost[0].contains("rows_lost=2"), "{}", lost[0]);
    // A minute after that one, the next failure is told again, with the rows lost so far.
    assert_eq!(FAILURE_LOG_EVERY, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(1)).await;
    failures.failed(&cause, 2);
    let lost = said("cannot store captured workload rows");
    assert_eq!(lost.len(), 2, "{lost:#?}");
    assert!(
        lost[1].contains("batches=60") && lost[1].contains("rows_lost=120"),
        "{}",
        lost[1]
    );
    // Writing works again: said once; a later failure starts a new episode, told at once.
    failures.worked();
    failures.worked();
    let again = said("storing captured workload rows again");
    assert_eq!(again.len(), 1, "{again:#?}");
    assert!(again[0].contains("rows_lost=120"), "{}", again[0]);
    failures.failed(&cause, 1);
    let lost = said("cannot store captured workload rows");
    assert_eq!(lost.len(), 3, "{lost:#?}");
    assert!(
        lost[2].contains("batches=1") && lost[2].contains("rows_lost=1"),
        "{}",
        lost[2]
    );
}
