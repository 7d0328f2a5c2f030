//! Counts kept elsewhere (listeners' faults, the meter's clamped counts, plain atomics) and
//! the meter's registries, shown on the page by copying them in at each render.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use metrics::Counter;

use crate::meter::conversation::Conversations;
use crate::meter::turn_stats::TurnStats;
use crate::meter::Meter;
use crate::net::faults::{Fault, FaultCounters};

use super::render::{render_identities, render_server_state, render_sessions};

/// An outside count and the exporter counter showing it.
pub(super) enum Watched {
    Faults {
        counters: Arc<FaultCounters>,
        // Boxed: one counter per fault makes this variant ten times the others.
        handles: Box<[Counter; Fault::ALL.len()]>,
    },
    Clamped {
        // Weak: the meter holds this sink, so a strong reference would keep both alive.
        meter: Weak<Meter>,
        handle: Counter,
    },
    /// A plain count kept elsewhere.
    Count {
        value: Arc<AtomicU64>,
        handle: Counter,
    },
    /// The upstreams' scraped state and scrape counts, written as text at each render (a
    /// state the server did not expose must have no sample, which the exporter's gauges
    /// cannot express).
    ServerState { meter: Weak<Meter> },
    /// The upstreams' configurations (`tokentap_upstream_config_*`), written as text.
    Identities { meter: Weak<Meter> },
    /// The session table's size and the session figures (`tokentap_session*`), as text.
    Sessions {
        table: Weak<Conversations>,
        stats: Weak<TurnStats>,
    },
}

impl Watched {
    /// Copies the count into its exporter counter, or writes the series the exporter cannot
    /// hold into `text`; a meter that is gone shows nothing.
    pub(super) fn show(&self, text: &mut String) {
        match self {
            Watched::Faults { counters, handles } => {
                for (fault, handle) in Fault::ALL.iter().zip(handles.iter()) {
                    handle.absolute(counters.get(*fault));
                }
            }
            Watched::Clamped { meter, handle } => {
                if let Some(meter) = meter.upgrade() {
                    handle.absolute(meter.clamped_counts());
                }
            }
            Watched::ServerState { meter } => {
                if let Some(meter) = meter.upgrade() {
                    render_server_state(meter.server_state(), text);
                }
            }
            Watched::Identities { meter } => {
                if let Some(meter) = meter.upgrade() {
                    render_identities(meter.identities(), text);
                }
            }
            Watched::Sessions { table, stats } => {
                if let (Some(table), Some(stats)) = (table.upgrade(), stats.upgrade()) {
                    render_sessions(&table, &stats, text);
                }
            }
            Watched::Count { value, handle } => {
                handle.absolute(value.load(Ordering::Relaxed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use metrics::{Key, Label, Recorder};
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    fn metadata() -> metrics::Metadata<'static> {
        metrics::Metadata::new(module_path!(), metrics::Level::INFO, None)
    }

    #[test]
    fn a_count_shows_its_latest_value_not_a_running_sum() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let value = Arc::new(AtomicU64::new(4));
        let watched = Watched::Count {
            value: Arc::clone(&value),
            handle: recorder.register_counter(&Key::from_name("lost_total"), &metadata()),
        };
        let mut text = String::new();
        watched.show(&mut text);
        value.store(9, Ordering::Relaxed);
        watched.show(&mut text);
        assert!(text.is_empty(), "a counter is set, not written: {text}");
        let page = recorder.handle().render();
        assert!(page.contains("lost_total 9\n"), "{page}");
    }

    #[test]
    fn each_fault_shows_its_own_count() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let counters = Arc::new(FaultCounters::default());
        counters.add(Fault::HeaderTimeout);
        counters.add(Fault::HeaderTimeout);
        counters.add(Fault::RouteRefused);
        let handles = Fault::ALL.map(|fault| {
            recorder.register_counter(
                &Key::from_parts("faults_total", vec![Label::new("fault", fault.label())]),
                &metadata(),
            )
        });
        Watched::Faults {
            counters,
            handles: Box::new(handles),
        }
        .show(&mut String::new());
        let page = recorder.handle().render();
        assert!(
            page.contains("faults_total{fault=\"header_timeout\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("faults_total{fault=\"route_refused\"} 1\n"),
            "{page}"
        );
        assert!(
            page.contains("faults_total{fault=\"idle_closed\"} 0\n"),
            "{page}"
        );
    }

    #[test]
    fn a_meter_that_is_gone_shows_nothing() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let mut text = String::new();
        let clamped = Watched::Clamped {
            meter: Weak::new(),
            handle: recorder.register_counter(&Key::from_name("clamped_total"), &metadata()),
        };
        clamped.show(&mut text);
        Watched::ServerState { meter: Weak::new() }.show(&mut text);
        Watched::Identities { meter: Weak::new() }.show(&mut text);
        assert!(text.is_empty(), "{text}");
        let page = recorder.handle().render();
        assert!(
            page.contains("clamped_total 0\n"),
            "registered, never set: {page}"
        );
    }
}
