//! The one place a configuration becomes the proxy's data path: [`build_proxy`]. `tokentap
//! serve` (and so `tokentap demo`, which runs a `serve::ProxyServer`), `tokentap sweep --target`
//! and `tokentap replay` all build their proxy here, so what a sweep or a replay measures goes
//! through the data path production runs.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::Config;
use crate::meter::Meter;
use crate::net::limits::{UpstreamDescriptors, HTTP2_UPSTREAM_CONNECTIONS};
use crate::proxy::routes::RoutePolicy;
use crate::proxy::service::{BodyBudget, BodyLimits, ModelLabels};
use crate::proxy::upstream::{Router, Upstream};
use crate::proxy::Proxy;
use crate::stream::fingerprint::PrefixSalt;

/// Builds the data path from configuration: the upstreams (with their connection pools), the
/// meter, and the limits and policies every proxied request goes through.
pub fn build_proxy(config: &Config) -> anyhow::Result<Arc<Proxy>> {
    let faults: Arc<crate::net::faults::FaultCounters> = Arc::default();
    let mut upstreams = Vec::new();
    // upstream.max_connections = 0: one connection per data-listener connection (every
    // proxied HTTP/1 stream holds one), so the upstream limit never cuts streams the
    // listener accepted; a small pool for HTTP/2, which multiplexes them.
    let (listener_limit, _) = crate::net::limits::data_listener_limit(
        config.proxy.max_connections,
        config.admin.max_connections,
        upstream_descriptors(config),
    );
    for upstream in &config.upstreams {
        let mut upstream = upstream.clone();
        if upstream.max_connections == 0 {
            upstream.max_connections = if upstream.http2 {
                HTTP2_UPSTREAM_CONNECTIONS
            } else {
                listener_limit
            };
        }
        upstreams.push(Arc::new(
            Upstream::new(
                upstream.clone(),
                config.proxy.max_stream_buffer,
                Arc::clone(&faults),
            )
            .with_context(|| format!("cannot set up TLS to upstream `{}`", upstream.name))?,
        ));
    }
    let router = Router::new(upstreams).context("no upstream configured")?;
    let prefix_salt = if config.workload.capture {
        Some(match &config.workload.salt {
            Some(secret) => PrefixSalt::from_secret(secret.as_bytes()),
            None => {
                PrefixSalt::random().context("no randomness for the workload fingerprint's salt")?
            }
        })
    } else {
        None
    };
    let meter = Meter::new(
        config.metering.contexts.clone(),
        config.metering.concurrency.clone(),
    );
    let turns = if config.sessions.enabled {
        let salt = match &prefix_salt {
            Some(salt) => salt.clone(),
            None => PrefixSalt::random().context("no randomness for the sessions' salt")?,
        };
        let turns = crate::proxy::turns::TurnTaker::new(&config.sessions, salt);
        for sink in turns.sinks() {
            meter.add_sink(sink);
        }
        Some(turns)
    } else {
        None
    };
    for upstream in router.all() {
        meter.identities().add(Arc::clone(&upstream.identity));
    }
    Ok(Arc::new(Proxy {
        router,
        meter,
        metering: config.metering.clone(),
        models: Arc::new(ModelLabels::new(config.metering.max_models)),
        limits: BodyLimits {
            idle: config.proxy.body_idle_timeout,
            metered_total: config.proxy.body_read_timeout,
        },
        body_budget: BodyBudget::new(config.metering.max_buffered_bytes),
        held_budget: crate::stream::held::HeldBudget::new(
            config.metering.max_held_bytes,
            Arc::clone(&faults),
        ),
        faults,
        prefix_salt,
        routes: RoutePolicy::from_config(&config.proxy.routes),
        code_fields: config.proxy.code_fields,
        tenants: crate::proxy::tenants::Tenants::new(config.tenants.clone()),
        refusals: Default::default(),
        sessions: Default::default(),
        turns,
        admin_address: Default::default(),
    }))
}

/// What the upstreams cost in descriptors beside the client connections: a fixed pool when
/// every upstream speaks HTTP/2 (streams multiplex), else one per stream. The data listener's
/// connection limit (`serve`) is sized with it too.
pub(super) fn upstream_descriptors(config: &Config) -> UpstreamDescriptors {
    if !config.upstreams.iter().all(|u| u.http2) {
        return UpstreamDescriptors::PerStream;
    }
    let pool: usize = config
        .upstreams
        .iter()
        .map(|u| match u.max_connections {
            0 => HTTP2_UPSTREAM_CONNECTIONS,
            n => n,
        })
        .sum();
    UpstreamDescriptors::Fixed(u64::try_from(pool).unwrap_or(u64::MAX))
}
