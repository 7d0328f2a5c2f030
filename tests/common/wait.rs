//! Bounded waits for a condition, shared by every test file: a test that needs something to
//! have happened (a server up, a record written, a metric moved, a child exited) looks again
//! and again and returns as soon as it holds, instead of pausing a fixed time that is too
//! long on a quiet machine and too short on a loaded one. Every wait has a limit and fails the
//! test with what it waited for. The looks start 1 ms apart and back off to 50 ms apart, so a
//! condition that holds at once costs nothing and a slow one costs at most 50 ms more than it
//! took. The pauses between looks here are the only ones of tests/ that poll.

use std::fmt::Display;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use tokio::time::Instant;

/// The longest pause between two looks.
const MOST_BETWEEN_LOOKS: Duration = Duration::from_millis(50);

/// The pauses between looks: 1 ms, 2 ms, 4 ms, … then 50 ms.
struct Looks(Duration);

impl Looks {
    fn new() -> Self {
        Self(Duration::from_millis(1))
    }

    fn next(&mut self) -> Duration {
        let pause = self.0;
        self.0 = (self.0 * 2).min(MOST_BETWEEN_LOOKS);
        pause
    }
}

/// Looks at `look` until it answers `Ok` (its value), or until `limit` has passed: then the
/// last `Err` it answered (the state to show in the caller's failure message).
pub async fn eventually<T, E>(
    limit: Duration,
    mut look: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + limit;
    let mut looks = Looks::new();
    loop {
        let last = look().await;
        if last.is_ok() || Instant::now() >= deadline {
            return last;
        }
        tokio::time::sleep(looks.next()).await;
    }
}

/// Waits until `check` holds; fails the test naming `what` after `limit`.
pub async fn until(what: impl Display, limit: Duration, mut check: impl FnMut() -> bool) {
    let held = eventually(limit, async || if check() { Ok(()) } else { Err(()) }).await;
    assert!(held.is_ok(), "waited {limit:?} for {what}");
}

/// Waits until the async `check` holds; fails the test naming `what` after `limit`.
pub async fn until_async(
    what: impl Display,
    limit: Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let held = eventually(limit, async || if check().await { Ok(()) } else { Err(()) }).await;
    assert!(held.is_ok(), "waited {limit:?} for {what}");
}

/// The child's exit status once it has exited, or `None` if it is still running after
/// `limit` (the caller kills it and says so). Blocks the thread: for tests without a runtime
/// and for code run on the blocking pool.
pub fn child_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    let mut looks = Looks::new();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(looks.next());
    }
}

/// [`child_exit`] for async tests: the runtime's thread is not blocked while the child runs.
pub async fn child_exit_async(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    eventually(limit, async || child.try_wait().unwrap().ok_or(()))
        .await
        .ok()
}
