//! One background task per upstream that reads its `/metrics` page every `metrics_interval`
//! (or at once when asked: `ServerStateRegistry::scrape_now`) and publishes the known gauges to
//! the meter.
//!
//! The page is fetched straight from the upstream (never through the proxy, so it is not
//! metered and routing cannot send it elsewhere) with a timeout and a size bound. Every scrape
//! is counted by outcome; a failure is logged once when the upstream starts failing and once
//! when it answers again, not per scrape. While it fails, the upstream's state is unknown (no
//! value is held across a failure) and the task asks less often, doubling its wait up to
//! [`BACKOFF_MAX`], so a server without the page costs a request a minute.

use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{header, Method, Request};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::known::Page;
use crate::meter::server_state::{ScrapeOutcome, GAUGES};
use crate::meter::Meter;
use crate::proxy::body::RequestBody;
use crate::proxy::upstream::{Router, Upstream};

/// Largest page read. vLLM's page with every histogram is a few hundred KB per model; a page
/// past this is not read further (counted `too_large`).
pub const MAX_PAGE_BYTES: usize = 8 << 20;
/// Longest wait between two tries while the page fails (or the interval, if longer).
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Failed scrapes in a row before a warning is logged.
pub const WARN_AFTER: u32 = 2;

/// The longest wait for one whole page: the interval, within 1–10 s, so a slow page never
/// piles up scrapes and a fast interval still gives a loaded server a second.
pub fn timeout_for(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// Starts one task per upstream whose `metrics_interval` is not zero. Each holds weak
/// references, so it ends when the proxy (and its meter) is dropped.
pub fn spawn_scrapers(router: &Router, meter: &Arc<Meter>) {
    for upstream in router.all() {
        if upstream.config.metrics_interval.is_zero() {
            continue;
        }
        meter.server_state().watch(&upstream.name);
        tokio::spawn(scrape_forever(
            Arc::downgrade(upstream),
            Arc::downgrade(meter),
        ));
    }
}

/// Reads the page once: its text, or why not.
pub async fn fetch(upstream: &Upstream, timeout: Duration) -> Result<String, ScrapeOutcome> {
    let uri = upstream
        .uri(&upstream.config.metrics_path)
        .map_err(|_| ScrapeOutcome::Unreachable)?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header(header::ACCEPT, "text/plain")
        .body(RequestBody::Full(None))
        .map_err(|_| ScrapeOutcome::Unreachable)?;
    let exchange = async {
        let response = upstream
            .send(request)
            .await
            .map_err(|_| ScrapeOutcome::Unreachable)?;
        if response.status() != http::StatusCode::OK {
            return Err(ScrapeOutcome::Status);
        }
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ScrapeOutcome::Unreachable)?;
            if let Ok(data) = frame.into_data() {
                if bytes.len().saturating_add(data.len()) > MAX_PAGE_BYTES {
                    return Err(ScrapeOutcome::TooLarge);
                }
                bytes.extend_from_slice(&data);
            }
        }
        String::from_utf8(bytes).map_err(|_| ScrapeOutcome::Unreadable)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ScrapeOutcome::Timeout)?
}

async fn scrape_forever(upstream: Weak<Upstream>, meter: Weak<Meter>) {
    scrape_with(upstream, meter, async |upstream, timeout| {
        fetch(&upstream, timeout).await
    })
    .await;
}

/// The scraper's loop, reading the page with `read` (the proxy's: [`fetch`]; the tests' a
/// scripted page in paused time).
pub(super) async fn scrape_with(
    upstream: Weak<Upstream>,
    meter: Weak<Meter>,
    read: impl AsyncFn(Arc<Upstream>, Duration) -> Result<String, ScrapeOutcome>,
) {
    let kick = match (upstream.upgrade(), meter.upgrade()) {
        (Some(upstream), Some(meter)) => meter.server_state().kick_signal(&upstream.name),
        _ => return,
    };
    let mut previous: Option<Page> = None;
    let mut failing: Option<ScrapeOutcome> = None;
    // Failed scrapes in a row: one alone is not worth a warning (uvicorn's 5 s keep-alive
    // closes a pooled connection just as the next scrape takes it), [`WARN_AFTER`] are.
    let mut failed_in_a_row = 0u32;
    // Nothing answered yet: no connection on the first scrape is said at once (an engine
    // still loading, or a wrong URL), later ones after `WARN_AFTER` in a row.
    let mut answered_once = false;
    let mut backoff = Duration::ZERO;
    loop {
        let wait = {
            let (Some(upstream), Some(meter)) = (upstream.upgrade(), meter.upgrade()) else {
                return;
            };
            let interval = upstream.config.metrics_interval;
            let result = read(Arc::clone(&upstream), timeout_for(interval)).await;
            let now = Instant::now();
            let page = result.and_then(|text| {
                let page = Page::read(&text);
                // A page without one metric tokentap knows is not an engine's page.
                if page.models.is_empty() {
                    Err(ScrapeOutcome::Unreadable)
                } else {
                    Ok(page)
                }
            });
            let registry = meter.server_state();
            let name = &upstream.name;
            match page {
                Ok(page) => {
                    let warned = failed_in_a_row >= WARN_AFTER;
                    failed_in_a_row = 0;
                    answered_once = true;
                    if let Some(was) = failing.take().filter(|_| warned) {
                        tracing::info!(
                            upstream = %name,
                            after = was.label(),
                            "the upstream's metrics page answers again"
                        );
                    }
                    for model in page.model_names() {
                        let _ = registry.tracker(name, &Arc::from(model));
                    }
                    for (model, tracker) in registry.trackers(name) {
                        let values = page.for_model(&model).map_or([None; GAUGES], |now| {
                            now.gauges_since(previous.as_ref().and_then(|p| p.for_model(&model)))
                        });
                        tracker.publish(now, values);
                    }
                    // Counted once published: a caller waiting on the count (`scrape_now`)
                    // then finds the new values in place.
                    registry.count_scrape(name, ScrapeOutcome::Ok);
                    previous = Some(page);
                    backoff = Duration::ZERO;
                    interval
                }
                Err(outcome) => {
                    failed_in_a_row = failed_in_a_row.saturating_add(1);
                    if !answered_once
                        && failed_in_a_row == 1
                        && outcome == ScrapeOutcome::Unreachable
                    {
                        // No connection at all, from the start: the server is not there (or not
                        // yet), which matters more than its metrics page.
                        tracing::warn!(
                            upstream = %name,
                            url = %upstream.config.url,
                            "upstream not answering (no connection) since start: requests to it get 502 while it does not answer, and /readyz is 503 while no upstream answers"
                        );
                        // Said once: the next failures in a row need no second line.
                        failed_in_a_row = WARN_AFTER;
                    } else if failed_in_a_row == WARN_AFTER && outcome == ScrapeOutcome::Unreachable
                    {
                        tracing::warn!(
                            upstream = %name,
                            url = %upstream.config.url,
                            "no connection to the upstream on {WARN_AFTER} metrics scrapes in a row: it may be down (requests to it would get 502, and /readyz is 503 while no upstream answers)"
                        );
                    } else if failed_in_a_row == WARN_AFTER {
                        tracing::warn!(
                            upstream = %name,
                            path = %upstream.config.metrics_path,
                            reason = outcome.label(),
                            "the upstream's metrics page failed {WARN_AFTER} scrapes in a row; its state is unknown until it answers (counted in tokentap_upstream_scrapes_total, retried less often)"
                        );
                    }
                    failing = Some(outcome);
                    for (_, tracker) in registry.trackers(name) {
                        tracker.publish(now, [None; GAUGES]);
                    }
                    registry.count_scrape(name, outcome);
                    previous = None;
                    backoff = (backoff * 2).max(interval).min(BACKOFF_MAX.max(interval));
                    backoff
                }
            }
        };
        match &kick {
            // A kick (a sweep between cells) reads at once; the interval starts over after it.
            Some(kick) => {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = kick.notified() => {}
                }
            }
            None => tokio::time::sleep(wait).await,
        }
    }
}
