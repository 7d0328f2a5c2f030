//! Who may share the machine's cores. Every integration test runs in one binary, two at a
//! time on a 2-core machine. A few tests compare timings the proxy measured with timings a
//! client or the simulator's model measured, within a few percent; a few others keep both
//! cores busy for seconds (promtool, a real Prometheus, headless Chromium, a million-row
//! export, thousands of connections). Paired, the first kind measured the second's load (CI
//! saw the sweep-against-production agreement and the simulator's TTFT off by more than their
//! tolerance while promtool ran beside them). So a timing test holds the cores alone against
//! busy tests — not against the rest, which mostly wait on sockets — and busy tests share
//! them with each other. The lock is fair: a timing test waits for the busy ones running and
//! none start after it asked.

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static CORES: RwLock<()> = RwLock::const_new(());

/// Held for the whole of a test whose assertions compare timings: no busy test runs meanwhile.
pub async fn for_timing() -> RwLockWriteGuard<'static, ()> {
    CORES.write().await
}

/// Held for the whole of a test that keeps the cores busy (several may run together).
pub async fn busy() -> RwLockReadGuard<'static, ()> {
    CORES.read().await
}

/// [`busy`] for a test without a runtime.
pub fn busy_blocking() -> RwLockReadGuard<'static, ()> {
    CORES.blocking_read()
}
