//! The process's file-descriptor budget, and the connection limit it allows.
//!
//! An LLM endpoint holds a connection per stream for as long as the stream lasts, and every
//! proxied stream holds two descriptors (the client's connection and the upstream's), so the
//! descriptor limit, not a fixed number, is what decides how many streams one process can
//! hold. At start tokentap raises its soft limit to the hard limit (what the operator allowed,
//! e.g. systemd `LimitNOFILE`), and `proxy.max_connections = 0` (the default) takes the limit
//! this leaves: (soft limit − reserve) ÷ 2.
use std::fmt;

/// Descriptors kept for everything but proxied streams: the store, logs, the upstreams' metric
/// scrapes and self-description reads, listeners, OpenTelemetry export.
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// The connection limit when the descriptor limit cannot be read.
pub const FALLBACK_MAX_CONNECTIONS: usize = 4096;

/// Most connections ever derived, whatever the limit (a million open streams is past any
/// machine tokentap runs on; the bound keeps the semaphore and arithmetic sane).
pub const MAX_DERIVED_CONNECTIONS: usize = 1 << 20;

/// Fewest connections ever derived: below this the limit is a misconfiguration to fix, and
/// tokentap still serves.
pub const MIN_DERIVED_CONNECTIONS: usize = 64;

/// The descriptor limit after start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// The soft limit in force (`None`: unlimited or unknown).
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
    /// The soft limit before tokentap raised it, when it did.
    pub raised_from: Option<u64>,
}

impl fmt::Display for DescriptorLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string());
        write!(f, "{} (hard {})", show(self.soft), show(self.hard))?;
        if let Some(from) = self.raised_from {
            write!(f, ", raised from {from}")?;
        }
        Ok(())
    }
}

/// Raises the soft descriptor limit to the hard one and says what is in force.
#[cfg(unix)]
pub fn raise_descriptor_limit() -> DescriptorLimit {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let mut raised_from = None;
    if let (Some(soft), hard) = (before.current, before.maximum) {
        // macOS refuses an unlimited soft limit for descriptors; a concrete hard limit works.
        if hard.is_some_and(|hard| hard > soft) {
            let wanted = Rlimit {
                current: hard,
                maximum: hard,
            };
            if setrlimit(Resource::Nofile, wanted).is_ok() {
                raised_from = Some(soft);
            }
        }
    }
    let now = getrlimit(Resource::Nofile);
    DescriptorLimit {
        soft: now.current,
        hard: now.maximum,
        raised_from,
    }
}

/// Raises the soft descriptor limit to the hard one and says what is in force.
#[cfg(not(unix))]
pub fn raise_descriptor_limit() -> DescriptorLimit {
    DescriptorLimit {
        soft: None,
        hard: None,
        raised_from: None,
    }
}

/// Connections an HTTP/2 upstream may open when `upstream.max_connections` is 0: hyper's pool
/// multiplexes every stream on one, so a few cover reconnects and a slow handshake.
pub const HTTP2_UPSTREAM_CONNECTIONS: usize = 32;

/// What the upstream side costs in descriptors beside each client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamDescriptors {
    /// One per proxied stream: an HTTP/1 upstream connection carries one stream at a time.
    PerStream,
    /// A fixed number whatever the streams: HTTP/2 upstreams multiplex every stream on a
    /// bounded pool (`upstream.max_connections`).
    Fixed(u64),
}

/// The data listener's connection limit a descriptor limit allows: one descriptor per client
/// connection plus what `upstream` costs (a second per stream, or a fixed pool), after
/// `reserved` (the admin listener's connections and [`RESERVED_DESCRIPTORS`]);
/// [`FALLBACK_MAX_CONNECTIONS`] when the limit is unknown, and within
/// [`MIN_DERIVED_CONNECTIONS`]‥[`MAX_DERIVED_CONNECTIONS`].
pub fn max_connections_for(
    limit: &DescriptorLimit,
    reserved: u64,
    upstream: UpstreamDescriptors,
) -> usize {
    let Some(soft) = limit.soft else {
        return if limit.hard.is_none() && limit.raised_from.is_none() {
            // Unlimited (or unknown): the fallback is as good as any number.
            FALLBACK_MAX_CONNECTIONS
        } else {
            MAX_DERIVED_CONNECTIONS
        };
    };
    let streams = match upstream {
        UpstreamDescriptors::PerStream => soft.saturating_sub(reserved) / 2,
        UpstreamDescriptors::Fixed(pool) => soft.saturating_sub(reserved.saturating_add(pool)),
    };
    usize::try_from(streams)
        .unwrap_or(MAX_DERIVED_CONNECTIONS)
        .clamp(MIN_DERIVED_CONNECTIONS, MAX_DERIVED_CONNECTIONS)
}

/// The data listener's connection limit: `configured`, or when it is 0 what the descriptor
/// limit allows after the admin listener's `admin_connections`, [`RESERVED_DESCRIPTORS`] and
/// the upstream side (the soft limit is raised to the hard one first). Returns the limit and
/// the descriptor limit it was judged against.
pub fn data_listener_limit(
    configured: usize,
    admin_connections: usize,
    upstream: UpstreamDescriptors,
) -> (usize, DescriptorLimit) {
    let descriptors = raise_descriptor_limit();
    if configured > 0 {
        return (configured, descriptors);
    }
    let reserved =
        RESERVED_DESCRIPTORS.saturating_add(u64::try_from(admin_connections).unwrap_or(u64::MAX));
    (
        max_connections_for(&descriptors, reserved, upstream),
        descriptors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(soft: Option<u64>) -> DescriptorLimit {
        DescriptorLimit {
            soft,
            hard: soft,
            raised_from: None,
        }
    }

    #[test]
    fn two_descriptors_per_stream_after_the_reserve() {
        let per_stream = |soft, reserved| {
            max_connections_for(&limit(soft), reserved, UpstreamDescriptors::PerStream)
        };
        // The shipped systemd unit's LimitNOFILE: far more than 10,000 streams.
        assert_eq!(per_stream(Some(1_048_576), 384), 524_096);
        // A shell's usual 1,024 leaves a few hundred, never fewer than the floor.
        assert_eq!(per_stream(Some(1024), 384), 320);
        assert_eq!(per_stream(Some(100), 384), MIN_DERIVED_CONNECTIONS);
        assert_eq!(per_stream(None, 384), FALLBACK_MAX_CONNECTIONS);
        assert_eq!(per_stream(Some(u64::MAX), 384), MAX_DERIVED_CONNECTIONS);
    }

    #[test]
    fn a_multiplexed_upstream_costs_its_pool_not_a_descriptor_per_stream() {
        // 20,000 descriptors hold 10,000 HTTP/2-upstream streams, not 9,808.
        assert_eq!(
            max_connections_for(&limit(Some(20_000)), 384, UpstreamDescriptors::Fixed(32)),
            19_584
        );
        assert_eq!(
            max_connections_for(&limit(Some(100)), 384, UpstreamDescriptors::Fixed(32)),
            MIN_DERIVED_CONNECTIONS
        );
    }
}
