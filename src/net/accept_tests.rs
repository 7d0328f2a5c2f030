//! The accept loop's back-off, driven failure by failure (no descriptors need to run out): the
//! pause doubles from 100 ms to a second, it is announced once per episode and its end once,
//! and an accept that works starts the next episode over. The real listener out of
//! descriptors is `tests/fault_tests.rs` (`out_of_descriptors_the_accept_loop_backs_off_and_says_so_once`).

use std::io::{Error, ErrorKind, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{AcceptBackoff, BACKOFF_MAX, BACKOFF_START};

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
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[test]
fn the_pause_doubles_to_a_second_and_each_episode_is_announced_once() {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let emfile = Error::from_raw_os_error(24);
    tracing::subscriber::with_default(subscriber, || {
        let mut backoff = AcceptBackoff::default();
        let pauses: Vec<Duration> = (0..7).map(|_| backoff.failed("proxy", &emfile)).collect();
        let ms = |ms: u64| Duration::from_millis(ms);
        assert_eq!(
            pauses,
            [100, 200, 400, 800, 1000, 1000, 1000].map(ms),
            "from BACKOFF_START, doubled, at most BACKOFF_MAX"
        );
        assert_eq!((BACKOFF_START, BACKOFF_MAX), (ms(100), ms(1000)));
        backoff.accepted("proxy");
        backoff.accepted("proxy");
        // The next episode starts over.
        assert_eq!(backoff.failed("proxy", &emfile), BACKOFF_START);
    });
    let lines = log.lines();
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("cannot accept connections"), 2, "{lines:#?}");
    assert_eq!(said("accepting connections again"), 1, "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("failures=7")), "{lines:#?}");
}

#[test]
fn a_connection_gone_before_it_was_taken_is_no_reason_to_back_off() {
    for kind in [
        ErrorKind::ConnectionAborted,
        ErrorKind::ConnectionReset,
        ErrorKind::Interrupted,
        ErrorKind::WouldBlock,
    ] {
        assert!(AcceptBackoff::is_per_connection(&Error::from(kind)));
    }
    // Out of descriptors (EMFILE, ENFILE) or buffers (ENOBUFS): the listener itself.
    for errno in [24, 23, 105] {
        assert!(!AcceptBackoff::is_per_connection(
            &Error::from_raw_os_error(errno)
        ));
    }
}
