//! Counters of the faults a listener and its data path cut short: timeouts, limits and accept
//! back-off. Plain atomics bumped where the fault happens (one relaxed add, no lock), read by
//! the Prometheus sink when `/metrics` is scraped (`tokentap_faults_total{listener, fault}`).
//! The fault set is a closed enum, so the label set stays bounded.

use std::sync::atomic::{AtomicU64, Ordering};

/// A fault tokentap cut short, each with its own setting (docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// A connection sent no complete first request head (TLS handshake and HTTP/1 vs HTTP/2
    /// detection included) within `header_read_timeout`; closed.
    HeaderTimeout,
    /// A request body went silent longer than `body_idle_timeout` between frames (answered 408).
    BodyIdleTimeout,
    /// A metered request body took longer than `body_read_timeout` in all (answered 408).
    BodyReadTimeout,
    /// The upstream sent no response head within its `response_timeout` (answered 504).
    UpstreamTimeout,
    /// The upstream's response body went silent longer than its `stream_idle_timeout`.
    UpstreamStalled,
    /// The listener reached `max_connections` and stopped accepting until one closed.
    ConnectionLimit,
    /// Accepting failed for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM);
    /// the accept loop backed off.
    AcceptBackoff,
    /// A response waited longer than `send_stall_timeout` for the client to take it (the
    /// client stopped reading, or never opened its HTTP/2 window); cancelled.
    SendStalled,
    /// An HTTP/2 connection had no stream for the idle time (`header_read_timeout`); closed
    /// with a GOAWAY.
    IdleClosed,
    /// A request needed a new connection to an upstream already at its `max_connections`
    /// and none came free within its `connect_timeout` (answered 503).
    UpstreamConnectionLimit,
    /// An upstream sent bytes after the end of an answer (more than its framing said): the
    /// connection was dropped, never reused, and its pool turned careful
    /// (`proxy::inline_pool`).
    UpstreamStrayBytes,
    /// An upstream response body broke off before its framing said it ended (a close or a
    /// reset mid-body): the client got the head and what had arrived, then an incomplete
    /// body. Counted on every route; a metered request's record also says `upstream_aborted`.
    UpstreamAborted,
    /// A client asked for a route `proxy.routes` does not forward (an engine's control route,
    /// by default): answered 403, never sent upstream.
    RouteRefused,
    /// A non-streamed answer on a metered route could not be held for metering (or for its
    /// timing header) within `metering.max_held_bytes`, shared by all answers: it passed
    /// through unheld, its usage unread (`stream::held`).
    AnswerUnheld,
    /// A request asked for a path `proxy.routes` cannot read as the engine would (a
    /// percent-escape that is not UTF-8, a target without a leading `/`): answered 400.
    PathUnreadable,
    /// A request carried a field an engine runs as code (sglang's
    /// `custom_logit_processor`): answered 403 naming the setting that opens it.
    CodeFieldRefused,
    /// A streamed event that straddled frames grew past what `metering.max_held_bytes` (shared
    /// with held answers) could cover: it passed through untouched, its figures unread
    /// (`stream::held::EventBytes`).
    EventUnheld,
    /// A request closed or continued an engine session another caller opened (sglang's
    /// `/close_session`, `session_params.id` on `/generate`): answered 403
    /// (`proxy::sessions`).
    SessionRefused,
    /// An engine session was opened while the table of who opened each one was full
    /// (`proxy::sessions::MAX_SESSIONS`): forwarded, its owner not remembered, so any caller
    /// may close it.
    SessionUntracked,
}

impl Fault {
    pub const ALL: [Fault; 19] = [
        Fault::HeaderTimeout,
        Fault::BodyIdleTimeout,
        Fault::BodyReadTimeout,
        Fault::UpstreamTimeout,
        Fault::UpstreamStalled,
        Fault::ConnectionLimit,
        Fault::AcceptBackoff,
        Fault::SendStalled,
        Fault::IdleClosed,
        Fault::UpstreamConnectionLimit,
        Fault::UpstreamStrayBytes,
        Fault::UpstreamAborted,
        Fault::RouteRefused,
        Fault::AnswerUnheld,
        Fault::PathUnreadable,
        Fault::CodeFieldRefused,
        Fault::EventUnheld,
        Fault::SessionRefused,
        Fault::SessionUntracked,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Fault::HeaderTimeout => "header_timeout",
            Fault::BodyIdleTimeout => "body_idle_timeout",
            Fault::BodyReadTimeout => "body_read_timeout",
            Fault::UpstreamTimeout => "upstream_timeout",
            Fault::UpstreamStalled => "upstream_stalled",
            Fault::ConnectionLimit => "connection_limit",
            Fault::AcceptBackoff => "accept_backoff",
            Fault::SendStalled => "send_stalled",
            Fault::IdleClosed => "idle_closed",
            Fault::UpstreamConnectionLimit => "upstream_connection_limit",
            Fault::UpstreamStrayBytes => "upstream_stray_bytes",
            Fault::UpstreamAborted => "upstream_aborted",
            Fault::RouteRefused => "route_refused",
            Fault::AnswerUnheld => "answer_unheld",
            Fault::PathUnreadable => "path_unreadable",
            Fault::CodeFieldRefused => "code_field_refused",
            Fault::EventUnheld => "event_unheld",
            Fault::SessionRefused => "session_refused",
            Fault::SessionUntracked => "session_untracked",
        }
    }

    fn index(self) -> usize {
        match self {
            Fault::HeaderTimeout => 0,
            Fault::BodyIdleTimeout => 1,
            Fault::BodyReadTimeout => 2,
            Fault::UpstreamTimeout => 3,
            Fault::UpstreamStalled => 4,
            Fault::ConnectionLimit => 5,
            Fault::AcceptBackoff => 6,
            Fault::SendStalled => 7,
            Fault::IdleClosed => 8,
            Fault::UpstreamConnectionLimit => 9,
            Fault::UpstreamStrayBytes => 10,
            Fault::UpstreamAborted => 11,
            Fault::RouteRefused => 12,
            Fault::AnswerUnheld => 13,
            Fault::PathUnreadable => 14,
            Fault::CodeFieldRefused => 15,
            Fault::EventUnheld => 16,
            Fault::SessionRefused => 17,
            Fault::SessionUntracked => 18,
        }
    }
}

/// Fault counts of one listener (and, for the data listener, its proxy).
#[derive(Debug, Default)]
pub struct FaultCounters {
    counts: [AtomicU64; Fault::ALL.len()],
}

impl FaultCounters {
    pub fn add(&self, fault: Fault) {
        if let Some(count) = self.counts.get(fault.index()) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, fault: Fault) -> u64 {
        self.counts
            .get(fault.index())
            .map_or(0, |count| count.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_has_its_own_counter() {
        let counters = FaultCounters::default();
        for (n, fault) in Fault::ALL.into_iter().enumerate() {
            for _ in 0..=n {
                counters.add(fault);
            }
        }
        for (n, fault) in Fault::ALL.into_iter().enumerate() {
            assert_eq!(counters.get(fault), n as u64 + 1, "{}", fault.label());
        }
    }
}
