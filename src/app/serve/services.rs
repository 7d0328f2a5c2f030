//! What `tokentap serve` builds once from its configuration, before anything listens: the
//! proxy, the meter's sinks (Prometheus, OTLP, the production matrix, the workload capture), the
//! store, the sweep manager, the drift references and the admin API's state that holds them.

use std::sync::Arc;

use anyhow::Context as _;

use crate::admin::{self, AdminState};
use crate::aggregate::drift::Drift;
use crate::aggregate::ProductionMatrix;
use crate::app::proxy::build_proxy;
use crate::base::Source;
use crate::config::Config;
use crate::net::faults::FaultCounters;
use crate::proxy::Proxy;
use crate::store::Store;
use crate::telemetry::names::{WORKLOAD_EXPORTS_REFUSED_TOTAL, WORKLOAD_ROWS_LOST_TOTAL};
use crate::telemetry::otel::OtelSink;
use crate::telemetry::prometheus::PrometheusMetrics;
use crate::workload::WorkloadCapture;

/// The services of one server, each built once and shared by the listeners and the tasks.
pub struct Services {
    pub proxy: Arc<Proxy>,
    pub metrics: Arc<PrometheusMetrics>,
    /// The OTLP exporter, when `[telemetry]` names an endpoint.
    pub otel: Option<Arc<OtelSink>>,
    /// The production matrix aggregator (also `admin.production`).
    pub production: Arc<ProductionMatrix>,
    /// The SQLite store, when `store.data_dir` is set (also `admin.store`).
    pub store: Option<Arc<Store>>,
    /// What the admin API serves from; also holds the sweeps, the drift references and the
    /// workload capture.
    pub admin: Arc<AdminState>,
}

impl Services {
    /// Builds the proxy and registers every sink on its meter, opens the store, and loads the
    /// pinned drift references (the store's, then each upstream's `reference_file`).
    pub async fn build(config: &Config) -> anyhow::Result<Self> {
        let proxy = build_proxy(config)?;
        let metrics = PrometheusMetrics::with_budget(
            config.metering.contexts.clone(),
            config.metering.concurrency.clone(),
            config.telemetry.max_series,
        )
        .context("cannot set up the Prometheus exporter")?;
        proxy.meter.add_sink(metrics.clone());
        let otel = OtelSink::start(
            &config.telemetry,
            config.metering.contexts.clone(),
            config.metering.concurrency.clone(),
            config.telemetry.metric_interval,
        )?;
        if let Some(otel) = &otel {
            proxy.meter.add_sink(otel.clone());
        }
        let production = ProductionMatrix::with_evidence(
            config.metering.contexts.clone(),
            config.metering.concurrency.clone(),
            Source::Production,
            config.evidence,
        );
        proxy.meter.add_sink(production.clone());
        let store = open_store(config)?;
        let workload = config
            .workload
            .capture
            .then(|| WorkloadCapture::start(&config.workload, store.clone()));
        if let Some(workload) = &workload {
            proxy.meter.add_sink(workload.clone());
        }
        let admin = admin_state(config, &proxy, &metrics, &production, &store, workload).await?;
        metrics.register_login_failures(&admin::session::LoginFailure::ALL.map(|r| r.label()));
        Ok(Self {
            proxy,
            metrics,
            otel,
            production,
            store,
            admin,
        })
    }

    /// Points the Prometheus exporter at what is counted outside the meter: both listeners'
    /// faults (the data listener's are the proxy's), the clamped counts, the workload
    /// capture's lost rows and refused exports, the upstreams' state and identities.
    pub fn export_counters(&self, admin_faults: &Arc<FaultCounters>) {
        let metrics = &self.metrics;
        metrics.watch_faults("proxy", Arc::clone(&self.proxy.faults));
        metrics.watch_faults("admin", Arc::clone(admin_faults));
        metrics.watch_clamped_counts(&self.proxy.meter);
        if let Some(workload) = &self.admin.workload {
            let (behind, failed) = workload.lost_counters();
            metrics.watch_count(
                WORKLOAD_ROWS_LOST_TOTAL,
                &[("reason", "writer_behind")],
                behind,
            );
            metrics.watch_count(
                WORKLOAD_ROWS_LOST_TOTAL,
                &[("reason", "store_failed")],
                failed,
            );
            metrics.watch_count(
                WORKLOAD_EXPORTS_REFUSED_TOTAL,
                &[],
                workload.refused_exports(),
            );
        }
        metrics.watch_server_state(&self.proxy.meter);
        metrics.watch_identities(&self.proxy.meter);
        if let Some(turns) = &self.proxy.turns {
            metrics.watch_sessions(turns.table(), turns.stats());
        }
    }
}

/// The store in `store.data_dir`, when it is set.
fn open_store(config: &Config) -> anyhow::Result<Option<Arc<Store>>> {
    let Some(dir) = &config.store.data_dir else {
        return Ok(None);
    };
    let store = Store::open(dir).with_context(|| {
        format!(
            "cannot open the store in {} (store.data_dir)",
            dir.display()
        )
    })?;
    Ok(Some(Arc::new(store)))
}

/// The admin API's state: the sweep manager (its sweeps kept in the store, else in memory),
/// the drift references loaded, and the services built before it.
async fn admin_state(
    config: &Config,
    proxy: &Arc<Proxy>,
    metrics: &Arc<PrometheusMetrics>,
    production: &Arc<ProductionMatrix>,
    store: &Option<Arc<Store>>,
    workload: Option<Arc<WorkloadCapture>>,
) -> anyhow::Result<Arc<AdminState>> {
    let synthetic = crate::sweep::LatestMatrix::default();
    let sweep_store: Arc<dyn crate::sweep::SweepStore> = match store {
        Some(store) => store.clone(),
        None => Arc::new(crate::sweep::MemoryStore::default()),
    };
    let sweeps = crate::sweep::SweepManager::new(
        crate::synthetic::ProxyPath::shared(Arc::clone(proxy)),
        config.sweep.clone(),
        sweep_store,
        synthetic.clone(),
    );
    // Sweeps shaped like production (`like_production`) read its matrix of their model.
    let matrix_source = Arc::clone(production);
    sweeps.set_production(Arc::new(move |model: &str| {
        matrix_source.matrix(
            crate::aggregate::Window::All,
            Some(model),
            std::time::SystemTime::now(),
        )
    }));
    let drift = Drift::new(config.drift.clone());
    load_references(config, store.clone(), &drift).await?;
    Ok(Arc::new(AdminState {
        proxy: Arc::clone(proxy),
        metrics: Arc::clone(metrics),
        token: config.admin.token.clone(),
        sweeps,
        draining: Default::default(),
        production: Arc::clone(production),
        synthetic,
        store: store.clone(),
        drift,
        workload,
        capacity: crate::admin::capacity::CapacitySettings {
            config: config.capacity.clone(),
            slo: config.metering.slo.clone(),
            objectives: config.metering.objectives.clone(),
        },
        sessions: admin::session::Sessions::new(
            config.admin.session_ttl,
            config.admin.max_sessions,
            config.admin.max_failed_credentials_per_second,
        ),
        allowed_hosts: config.admin.allowed_hosts.clone(),
        readiness: Default::default(),
        login_bodies: admin::LoginBodies::default(),
    }))
}

/// Fills the drift references: what the store kept, then each upstream's `reference_file`
/// (pinned again at every start, so the file wins over an earlier pin of the same model).
async fn load_references(
    config: &Config,
    store: Option<Arc<Store>>,
    drift: &Drift,
) -> anyhow::Result<()> {
    if let Some(store) = store.clone() {
        let kept = tokio::task::spawn_blocking(move || store.references())
            .await
            .context("the store read stopped")?
            .context("cannot read the pinned reference matrices from the store")?;
        for reference in kept {
            drift.pin(reference);
        }
    }
    for upstream in &config.upstreams {
        let Some(path) = &upstream.reference_file else {
            continue;
        };
        let matrix = crate::matrix::load(path).with_context(|| {
            format!(
                "cannot read the reference matrix of upstream `{}` (reference_file)",
                upstream.name
            )
        })?;
        let model = matrix
            .metadata
            .model
            .served_model
            .clone()
            .or_else(|| upstream.default_model.clone())
            .unwrap_or_else(|| crate::proxy::upstream::UNKNOWN_MODEL.to_owned());
        let reference = crate::matrix::compare::Reference {
            upstream: upstream.name.clone(),
            model,
            source: format!("file {} (reference_file)", path.display()),
            pinned_at: std::time::SystemTime::now(),
            matrix,
        };
        if let Some(store) = store.clone() {
            let row = reference.clone();
            tokio::task::spawn_blocking(move || store.put_reference(&row))
                .await
                .context("the store write stopped")?
                .context("cannot keep the reference_file matrix in the store")?;
        }
        drift.pin(reference);
    }
    Ok(())
}
