//! The log of what the data port refused: each refused path (a route `proxy.routes` does not
//! forward, a field run as code) logged once, at `warn`, with why and how to open it, so an
//! operator learns of a refusal from the log rather than from a client's 403. Bounded: past
//! [`MAX_LOGGED_PATHS`] distinct paths, one summary line a minute counts the rest. Client-sent
//! paths are logged as one printable line (`base::escape::terminal_safe`): a newline or an escape
//! in a percent-decoded path cannot forge a log line.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::escape::terminal_safe;
use crate::base::lock::lock;

/// Distinct refused paths logged one by one.
pub const MAX_LOGGED_PATHS: usize = 256;

/// How often the summary of paths past [`MAX_LOGGED_PATHS`] is logged.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Logged {
    paths: HashSet<String>,
    unlogged: u64,
    summarised_at: Option<Instant>,
}

/// What the data port refused and has said so (one per proxy).
#[derive(Debug, Default)]
pub struct Refusals(Mutex<Logged>);

impl Refusals {
    /// Logs the refusal of `path` for `why` (the 403's own words) unless that path was logged
    /// before. Once per refused request, never on a forwarded one.
    pub fn note(&self, kind: &'static str, path: &str, why: &dyn std::fmt::Display) {
        let mut logged = lock(&self.0);
        if logged.paths.contains(path) {
            return;
        }
        if logged.paths.len() < MAX_LOGGED_PATHS {
            logged.paths.insert(path.to_owned());
            drop(logged);
            let path = terminal_safe(path, false);
            let why = why.to_string();
            tracing::warn!(
                kind,
                path = %path,
                "refused on the data port (logged once per path): {}",
                terminal_safe(&why, false)
            );
            return;
        }
        logged.unlogged += 1;
        let now = Instant::now();
        if logged
            .summarised_at
            .is_none_or(|at| now.duration_since(at) >= SUMMARY_EVERY)
        {
            let unlogged = std::mem::take(&mut logged.unlogged);
            logged.summarised_at = Some(now);
            drop(logged);
            tracing::warn!(
                kind,
                refused = unlogged,
                "refused on the data port: {unlogged} more requests to paths past the first {MAX_LOGGED_PATHS} logged (tokentap_faults_total counts them all)"
            );
        }
    }

    /// Distinct paths logged so far.
    pub fn logged(&self) -> usize {
        lock(&self.0).paths.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_path_is_logged_once_and_the_set_is_bounded() {
        let refusals = Refusals::default();
        for _ in 0..3 {
            refusals.note("route_refused", "/flush_cache", &"a control route");
        }
        assert_eq!(refusals.logged(), 1);
        for n in 0..(MAX_LOGGED_PATHS * 4) {
            refusals.note("route_refused", &format!("/x/{n}"), &"unknown");
        }
        assert_eq!(refusals.logged(), MAX_LOGGED_PATHS);
        assert!(lock(&refusals.0).unlogged > 0);
        tokio::time::advance(SUMMARY_EVERY).await;
        refusals.note("route_refused", "/y", &"unknown");
        assert_eq!(lock(&refusals.0).unlogged, 0, "summarised");
    }
}
