//! What `tokentap serve` runs in the background, as one value: both listeners' serving tasks,
//! the snapshot task, the drift refresher, the triggers that stop them, and the order
//! `Tasks::shutdown` stops them in.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::services::Services;
use crate::admin::{self, AdminState};
use crate::aggregate::snapshot;
use crate::config::Config;
use crate::net::{self, ServerOptions, ShutdownTrigger};
use crate::proxy::ProxyService;
use crate::telemetry::otel::OtelSink;

/// The running tasks of one server and what stops each.
#[derive(Debug)]
pub struct Tasks {
    data_trigger: ShutdownTrigger,
    /// Cuts the data listener's grace period short (a second signal).
    cut: Arc<ShutdownTrigger>,
    admin_trigger: ShutdownTrigger,
    /// Stops the snapshot task and the drift refresher.
    snapshot_trigger: ShutdownTrigger,
    data: JoinHandle<()>,
    admin: JoinHandle<()>,
    snapshot: Option<JoinHandle<()>>,
    drift: JoinHandle<()>,
    /// Marked draining, and its workload capture flushed, while the tasks stop.
    admin_state: Arc<AdminState>,
    /// Flushed last, once nothing records any more.
    otel: Option<Arc<OtelSink>>,
    /// Its upstreams' held records (requests that ended before the first read) are published
    /// once the data listener has stopped.
    proxy: Arc<crate::proxy::Proxy>,
}

impl Tasks {
    /// Starts the background tasks of `services`, then serves each listener with its options:
    /// the data listener through the proxy, the admin listener through the admin API.
    pub fn start(
        config: &Config,
        services: &Services,
        (data_listener, data_options): (TcpListener, ServerOptions),
        (admin_listener, admin_options): (TcpListener, ServerOptions),
    ) -> Self {
        let Services {
            proxy,
            metrics,
            otel,
            production,
            store,
            admin: admin_state,
        } = services;
        let (snapshot_trigger, snapshot_shutdown) = net::shutdown_pair();
        let drift = crate::app::drift::spawn(
            Arc::clone(production),
            Arc::clone(&admin_state.drift),
            Arc::clone(metrics),
            Arc::clone(admin_state),
            snapshot_shutdown.clone(),
        );
        let snapshot = store.as_ref().map(|store| {
            snapshot::spawn(
                Arc::clone(production),
                Arc::clone(store),
                config.store.snapshot_interval,
                config.store.retention,
                snapshot_shutdown,
            )
        });
        // These end with the proxy rather than at a trigger.
        crate::proxy::describe::spawn(proxy, config.fingerprint.interval);
        crate::upstream_identity::spawn(proxy, &config.fingerprint, store.clone());
        crate::upstream_metrics::spawn_scrapers(&proxy.router, &proxy.meter);
        let (data_trigger, data_shutdown) = net::shutdown_pair();
        let (cut, cut_short) = net::shutdown_pair();
        let (admin_trigger, admin_shutdown) = net::shutdown_pair();
        let service = ProxyService::new(Arc::clone(proxy));
        let data = tokio::spawn(net::serve_until(
            data_listener,
            data_options,
            move |_peer| service.clone(),
            data_shutdown,
            Some(cut_short),
        ));
        let served = Arc::clone(admin_state);
        let admin = tokio::spawn(net::serve(
            admin_listener,
            admin_options,
            move |peer| admin::service(Arc::clone(&served), Some(peer)),
            admin_shutdown,
        ));
        Self {
            data_trigger,
            cut: Arc::new(cut),
            admin_trigger,
            snapshot_trigger,
            data,
            admin,
            snapshot,
            drift,
            admin_state: Arc::clone(admin_state),
            otel: otel.clone(),
            proxy: Arc::clone(proxy),
        }
    }

    /// What cuts the data listener's grace period short.
    pub fn grace_cut(&self) -> Arc<ShutdownTrigger> {
        Arc::clone(&self.cut)
    }

    /// Stops the data listener (in-flight requests finish within the grace period), flushes
    /// the workload capture, lets the snapshot task write the part-interval since its last
    /// snapshot and the drift refresher end, stops the admin listener last (so /metrics stays
    /// scrapeable while streams drain), then flushes the OTLP exporter.
    pub async fn shutdown(self) {
        self.admin_state.draining.store(true, Ordering::Relaxed);
        self.data_trigger.trigger();
        let _ = self.data.await;
        for upstream in self.proxy.router.all() {
            upstream.release_held_now();
        }
        if let Some(workload) = &self.admin_state.workload {
            workload.flush().await;
        }
        self.snapshot_trigger.trigger();
        if let Some(task) = self.snapshot {
            let _ = task.await;
        }
        let _ = self.drift.await;
        self.admin_trigger.trigger();
        let _ = self.admin.await;
        if let Some(otel) = self.otel {
            otel.shutdown().await;
        }
    }
}
