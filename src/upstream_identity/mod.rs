//! Which configuration each upstream runs: one background task per upstream asks it what it
//! is (`read.rs`: sglang `/server_info`, `/model_info`; vLLM `/version`; `/v1/models`; the
//! `*_info` metrics) at start, every `[fingerprint] interval`, and again as soon as it answers
//! after failing (a restarted server may be another version); `facts.rs` turns the answers and
//! the operator's labels into facts and a fingerprint id, and the id goes into the upstream's
//! lock-free slot (`meter::identity`) that every request reads at its start.
//!
//! A new configuration is an event: logged with what changed, written to the store
//! (`store::configs`) and shown by `tokentap_upstream_config_info`, the page and
//! `/matrix?compare=previous`. A flapping upstream (more than
//! `meter::identity::FLAP_CHANGES_PER_HOUR` changes an hour) is logged once and its label
//! fixed. Nothing here is on a request's path and nothing here can stop serving: every
//! question has a deadline and a size bound, a fact that cannot be read is absent.
//!
//! [`OutageWatch`] is the record sink that notices the upstream answering again.

pub mod facts;
pub mod read;

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use crate::config::FingerprintConfig;
use crate::meter::identity::{ConfigEntry, IdentityRegistry, Observed, UpstreamIdentity};
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::RecordSink;
use crate::proxy::upstream::Upstream;
use crate::proxy::Proxy;
use crate::store::configs::ConfigRow;
use crate::store::Store;

use facts::{Answers, Operator};

/// How long one question may take (as every read of an upstream about itself).
pub const DEADLINE: Duration = crate::proxy::ask::DEADLINE;
/// While an upstream does not answer, it is asked again this often (or at the interval, if
/// shorter), so its return is read at once.
pub const RETRY_WHILE_DOWN: Duration = Duration::from_secs(5);

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
        tokio::spawn(read_forever(
            Arc::downgrade(upstream),
            operator.clone(),
            config.interval,
            store.clone(),
        ));
    }
}

async fn read_forever(
    upstream: Weak<Upstream>,
    operator: Operator,
    interval: Duration,
    store: Option<Arc<Store>>,
) {
    let mut last = Answers::default();
    // Woken because the upstream answered after failing: read everything afresh.
    let mut back = false;
    loop {
        let identity = {
            let Some(upstream) = upstream.upgrade() else {
                return;
            };
            let answers = read::read(&upstream, DEADLINE).await;
            let identity = Arc::clone(&upstream.identity);
            drop(upstream);
            if answers.any() {
                // After an outage everything is read afresh: the server may be another one.
                let answers = if identity.is_down() || back {
                    answers
                } else {
                    answers.or_from(&last)
                };
                identity.clear_down();
                let facts = facts::facts(&answers, &operator);
                let id = facts::fingerprint(&facts);
                last = answers;
                let observed = identity.observe(id, facts, SystemTime::now());
                report(&identity, &observed, store.as_ref()).await;
            } else {
                identity.note_answer(false);
            }
            identity
        };
        let wait = if identity.is_down() {
            interval.min(RETRY_WHILE_DOWN)
        } else {
            interval
        };
        back = tokio::select! {
            () = tokio::time::sleep(wait) => false,
            () = identity.back() => true,
        };
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
        let Some(identity) = registry.get(&record.upstream) else {
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
