//! What the server says it is running and queueing now, for the sweep's warm-up and drain
//! barriers and its samples during a window, and the replay's wait for an idle server: the
//! real reading behind [`super::DataPath::server_load`].
//!
//! When the upstream is scraped (`metrics_interval` not zero), the sweep asks the upstream's
//! scraper for the read instead of fetching the page itself: the read is published to the
//! meter's server-state tracker as it happens, so every read the sweep makes between and during
//! its cells also keeps the requests' "server state" figures fresh, and the engine's page is not
//! rendered twice for one look. Between a sweep's phases the state jumps (C requests to none and
//! back); at a periodic read's pace the old value stood for up to an interval (live vLLM 0.32:
//! server running 1.33 in a one-stream cell that followed an eight-stream one, 7.02 against
//! 7.97 average active in an eight-stream cell whose first second held the idle gap's 0).
//! Otherwise it fetches `/metrics` through the proxy and sums the engine's gauge (read by
//! `base::exposition`, the crate's one reader of the format).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::get_ok;
use crate::base::exposition::sum_of;
use crate::meter::server_state::{GaugeValues, ServerGauge};
use crate::proxy::Proxy;

/// Longest wait for a read asked of the scraper (a local page takes milliseconds).
const READ_LIMIT: Duration = Duration::from_secs(2);
/// How often that wait looks whether the read is in.
const READ_TICK: Duration = Duration::from_millis(5);

/// Which of the engine's gauges say its load (the names each engine declares in `base::engine`), and how long a
/// fetch of the page through the proxy may take.
#[derive(Debug, Clone)]
pub struct LoadGauges {
    pub running: &'static str,
    pub queued: Option<&'static str>,
    pub timeout: Duration,
}

/// Running and queued requests of the server serving `model` now (`None` when the server does
/// not say): the scraper's fresh read when the upstream is scraped, else the page through the
/// proxy.
pub async fn read_load(
    proxy: &Arc<Proxy>,
    model: &Arc<str>,
    gauges: &LoadGauges,
) -> Option<(f64, f64)> {
    if let Some(values) = fresh_scraped(proxy, model).await {
        let value = |gauge: ServerGauge| values.get(gauge.index()).copied().flatten();
        if let Some(running) = value(ServerGauge::RunningRequests) {
            return Some((running, value(ServerGauge::QueuedRequests).unwrap_or(0.0)));
        }
    }
    let page = get_ok(proxy, "/metrics", gauges.timeout).await?;
    let text = page.text();
    let running = sum_of(&text, gauges.running)?;
    let queued = gauges
        .queued
        .and_then(|name| sum_of(&text, name))
        .unwrap_or(0.0);
    Some((running, queued))
}

/// Asks the scraper of the upstream serving `model` for a read now and waits (at most
/// `READ_LIMIT`, 2 s) until it is published; then what the model's tracker holds. `None` when the
/// upstream is not scraped or the read did not come in time.
pub async fn fresh_scraped(proxy: &Proxy, model: &Arc<str>) -> Option<GaugeValues> {
    let router = &proxy.router;
    let upstream = router
        .by_model(model)
        .unwrap_or_else(|| router.default_upstream());
    let registry = proxy.meter.server_state();
    // The tracker first: one made after the read would hold nothing until the next.
    let tracker = registry.tracker(&upstream.name, model)?;
    let before = registry.scrape_now(&upstream.name)?;
    let deadline = Instant::now() + READ_LIMIT;
    while registry.scrapes_done(&upstream.name) <= before {
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(READ_TICK).await;
    }
    Some(tracker.current())
}
