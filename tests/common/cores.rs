//! Who may share the machine's cores. Every integration test runs in one binary, several at a
//! time (`.cargo/config.toml` sets `RUST_TEST_THREADS`: most tests wait on sockets and on
//! simulators paced at their profiles' speeds, using a few per cent of a core). A few tests
//! compare timings the proxy measured with timings a client or the simulator's model measured,
//! within a few percent; a few others keep both cores busy for seconds (promtool, a real
//! Prometheus, headless Chromium, a million-row export, thousands of connections). Paired, the
//! first kind measured the second's load (CI saw the sweep-against-production agreement and the
//! simulator's TTFT off by more than their tolerance while promtool ran beside them).
//!
//! So the two kinds never run together: timing tests run beside each other (each uses ~3 % of
//! a core: `/usr/bin/time` of `interference_tests`' 20 s, 0.6 s of CPU) and beside the rest,
//! busy tests beside each other and the rest, and a test of one kind starts only when no test
//! of the other kind runs. The kinds take turns in batches (`Gate::try_start`): a turn admits
//! every test of its kind waiting when it began, so the suite switches kind a few times, not at
//! every change of kind in the binary's alphabetical order; no test waits more than one turn of
//! the other kind.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use tokio::time::Instant;

use tokio::sync::Notify;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Timing,
    Busy,
}

struct Gate {
    /// Tickets handed out so far (arrival order).
    tickets: u64,
    /// Tests waiting to start, by ticket.
    waiting: BTreeMap<u64, Kind>,
    /// Tests running, per kind: `[timing, busy]`.
    running: [usize; 2],
    /// The kind whose turn it is, and the tickets it admits whatever else waits: every test of
    /// its kind that was waiting when the turn began.
    turn: Option<(Kind, u64)>,
}

impl Gate {
    fn index(kind: Kind) -> usize {
        match kind {
            Kind::Timing => 0,
            Kind::Busy => 1,
        }
    }

    /// Starts the test holding `ticket` when it is its kind's turn. Turns alternate in
    /// batches: a turn admits every test of its kind waiting when it began, and later ones
    /// only while no test of the other kind waits; when its last test ends, the kind that has
    /// waited longest takes the next turn. So the suite switches between the two kinds a few
    /// times rather than at every test of alternating kinds in the binary's order.
    fn try_start(&mut self, ticket: u64, kind: Kind) -> bool {
        let other = Self::index(kind) ^ 1;
        if self.running[other] > 0 {
            return false;
        }
        let admitted = match self.turn {
            Some((turn, until)) if turn == kind => {
                ticket < until || self.waiting.values().all(|waiting| *waiting == kind)
            }
            // The other kind's turn is over (none of it runs): the longest waiting test's kind
            // takes the next one, with every test of it waiting now.
            _ => {
                let longest = self.waiting.values().next().copied();
                if longest == Some(kind) {
                    self.turn = Some((kind, self.tickets));
                    true
                } else {
                    false
                }
            }
        };
        if admitted {
            self.waiting.remove(&ticket);
            self.running[Self::index(kind)] += 1;
        }
        admitted
    }
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    tickets: 0,
    waiting: BTreeMap::new(),
    running: [0, 0],
    turn: None,
});
static CHANGED_ASYNC: Notify = Notify::const_new();
static CHANGED_BLOCKING: Condvar = Condvar::new();

fn gate() -> MutexGuard<'static, Gate> {
    // A test that panicked while holding the lock leaves the counts as they were: go on.
    GATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn take_ticket(kind: Kind) -> u64 {
    let mut gate = gate();
    let ticket = gate.tickets;
    gate.tickets += 1;
    gate.waiting.insert(ticket, kind);
    ticket
}

/// Held by a running test of its kind; lets the other kind in when the last one ends.
#[must_use]
pub struct Held {
    kind: Kind,
    asked: Instant,
    started: Instant,
}

impl Held {
    fn new(kind: Kind, asked: Instant) -> Self {
        Self {
            kind,
            asked,
            started: Instant::now(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        log(self);
        gate().running[Gate::index(self.kind)] -= 1;
        CHANGED_ASYNC.notify_waiters();
        CHANGED_BLOCKING.notify_all();
    }
}

/// With `TOKENTAP_TEST_GATE_LOG=<file>`: a line per gated test (its kind, when it asked, how
/// long it waited for the gate and how long it held it), to see where the suite's time goes.
fn log(held: &Held) {
    let Some(path) = std::env::var_os("TOKENTAP_TEST_GATE_LOG") else {
        return;
    };
    // Seconds since the binary's first gated test asked, so the lines make a timeline.
    static FIRST: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let first = *FIRST.get_or_init(|| held.asked);
    let line = format!(
        "{:?}\t{:.1}\t{:.1}\t{:.1}\t{}\n",
        held.kind,
        held.asked.saturating_duration_since(first).as_secs_f64(),
        (held.started - held.asked).as_secs_f64(),
        held.started.elapsed().as_secs_f64(),
        std::thread::current().name().unwrap_or("?")
    );
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        use std::io::Write as _;
        let _ = file.write_all(line.as_bytes());
    }
}

async fn enter(kind: Kind) -> Held {
    let asked = Instant::now();
    let ticket = take_ticket(kind);
    loop {
        let changed = CHANGED_ASYNC.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if gate().try_start(ticket, kind) {
            // Others of the same kind behind this one may start now too.
            CHANGED_ASYNC.notify_waiters();
            CHANGED_BLOCKING.notify_all();
            return Held::new(kind, asked);
        }
        changed.await;
    }
}

fn enter_blocking(kind: Kind) -> Held {
    let asked = Instant::now();
    let ticket = take_ticket(kind);
    let mut gate = gate();
    while !gate.try_start(ticket, kind) {
        gate = CHANGED_BLOCKING
            .wait(gate)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    drop(gate);
    CHANGED_ASYNC.notify_waiters();
    CHANGED_BLOCKING.notify_all();
    Held::new(kind, asked)
}

/// Held for the whole of a test whose assertions compare timings: no busy test runs meanwhile.
pub async fn for_timing() -> Held {
    enter(Kind::Timing).await
}

/// Held for the whole of a test that keeps the cores busy: no timing test runs meanwhile.
pub async fn busy() -> Held {
    enter(Kind::Busy).await
}

/// [`busy`] for a test without a runtime.
pub fn busy_blocking() -> Held {
    enter_blocking(Kind::Busy)
}
