//! The background task per upstream that follows its self-description (`spawn`, `follow`):
//! each read's facts become a configuration id in the upstream's slot, a change is logged,
//! stored and counted; and [`OutageWatch`], the record sink that notices the upstream
//! answering again.

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use crate::config::FingerprintConfig;
use crate::meter::identity::{ConfigEntry, IdentityRegistry, Observed, UpstreamIdentity};
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::RecordSink;
use crate::proxy::upstream::Upstream;
use crate::proxy::Proxy;
use crate::store::configs::ConfigRow;
use crate::store::Store;

use super::facts::{self, Operator};

/// Starts one reader per upstream (none when the interval is 0) and the sink that notices an
/// upstream coming back. The tasks end with the proxy.
pub fn spawn(proxy: &Arc<Proxy>, config: &FingerprintConfig, store: Option<Arc<Store>>) {
    if config.interval.is_zero() {
        return;
    }
    let operator = Operator {
        hardware: config.hardware.clone(),
        gpu_count: config.gpu_count,
        node: config.node.clone(),
        zone: config.zone.clone(),
        launch_command: config.launch_command.clone(),
    };
    proxy.meter.add_sink(Arc::new(OutageWatch {
        meter: Arc::downgrade(&proxy.meter),
    }));
    for upstream in proxy.router.all() {
        tokio::spawn(follow(
            Arc::downgrade(upstream),
            operator.clone(),
            store.clone(),
        ));
    }
}

/// Follows the upstream's reads: each one's facts and fingerprint are observed.
async fn follow(upstream: Weak<Upstream>, operator: Operator, store: Option<Arc<Store>>) {
    let Some(mut reads) = upstream.upgrade().map(|u| u.subscribe_description()) else {
        return;
    };
    loop {
        let answers = reads.borrow_and_update().clone();
        if let Some(answers) = answers {
            let Some(upstream) = upstream.upgrade() else {
                return;
            };
            let identity = Arc::clone(&upstream.identity);
            let facts = facts::facts(&answers, &operator);
            let id = facts::fingerprint(&facts);
            let observed = identity.observe(id, facts, SystemTime::now());
            // Requests that ended while the fingerprint was unknown are published under it.
            upstream.identity_observed();
            drop(upstream);
            report(&identity, &observed, store.as_ref()).await;
        }
        if reads.changed().await.is_err() {
            return;
        }
    }
}

/// Logs and stores what an observation changed.
async fn report(identity: &UpstreamIdentity, observed: &Observed, store: Option<&Arc<Store>>) {
    let upstream = &*identity.upstream;
    let entry = match observed {
        Observed::Same | Observed::StillFlapping => return,
        Observed::StartedFlapping => {
            tracing::warn!(
                upstream,
                changes_per_hour = crate::meter::identity::FLAP_CHANGES_PER_HOUR,
                "the upstream's configuration changes more than this an hour (flapping): its requests are labelled fingerprint=\"flapping\" until an hour passes with fewer changes"
            );
            return;
        }
        Observed::StoppedFlapping { id } | Observed::Changed { id, .. } => {
            let Some(entry) = identity.config(*id) else {
                return;
            };
            entry
        }
    };
    log_change(upstream, &entry, identity);
    if let Some(store) = store {
        let store = Arc::clone(store);
        let row = ConfigRow::from_entry(upstream, &entry);
        let written = tokio::task::spawn_blocking(move || store.put_config(&row)).await;
        if let Ok(Err(error)) = written {
            tracing::warn!(upstream, %error, "cannot keep the upstream's configuration in the store");
        }
    }
}

fn log_change(upstream: &str, entry: &ConfigEntry, identity: &UpstreamIdentity) {
    let previous = entry.previous.and_then(|p| identity.config(p));
    match previous {
        None => tracing::info!(
            upstream,
            fingerprint = %entry.id,
            engine = entry.engine(),
            version = entry.version(),
            facts = %facts::summary(&entry.facts.fields),
            "upstream configuration read"
        ),
        Some(previous) => {
            let changes: Vec<String> = facts::diff(&previous.facts, &entry.facts)
                .iter()
                .map(|c| {
                    format!(
                        "{}: {} → {}",
                        c.key,
                        c.before.as_deref().unwrap_or("(absent)"),
                        c.after.as_deref().unwrap_or("(absent)")
                    )
                })
                .collect();
            tracing::info!(
                upstream,
                fingerprint = %entry.id,
                previous = %previous.id,
                engine = entry.engine(),
                version = entry.version(),
                changed = %changes.join("; "),
                "upstream configuration changed"
            );
        }
    }
}

/// Notices an upstream answering requests again after failing (a request that could not
/// reach it, status 502), and wakes its reader. One lookup among the configured upstreams
/// per finished request; never per event.
pub struct OutageWatch {
    meter: Weak<crate::meter::Meter>,
}

impl RecordSink for OutageWatch {
    fn record(&self, record: &Arc<RequestRecord>) {
        let Some(meter) = self.meter.upgrade() else {
            return;
        };
        let registry: &IdentityRegistry = meter.identities();
        let Some(identity) = registry.get(&record.labels.upstream) else {
            return;
        };
        let unreachable = record.outcome == Outcome::UpstreamError && record.status == 502;
        let answered = record.status != 0 && record.status != 502 && record.status != 504;
        if unreachable {
            identity.note_answer(false);
        } else if answered {
            identity.note_answer(true);
        }
    }
}
