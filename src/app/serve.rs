//! `tokentap serve`: wires the configuration, the meter and its sinks, the data listener and
//! the admin listener together, and owns their tasks and graceful shutdown.
//!
//! [`ProxyServer`] is the same wiring as a value, so tests, `tokentap demo` and standalone
//! sweeps run exactly what production runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState};
use crate::aggregate::{snapshot, ProductionMatrix};
use crate::base::Source;
use crate::config::{Config, ConfigLoader};
use crate::meter::Meter;
use crate::net::{self, ServerOptions, ShutdownTrigger};
use crate::proxy::routes::RoutePolicy;
use crate::proxy::service::{BodyBudget, BodyLimits, ModelLabels};
use crate::proxy::upstream::{Router, Upstream};
use crate::proxy::{Proxy, ProxyService};
use crate::store::Store;
use crate::stream::fingerprint::PrefixSalt;
use crate::telemetry::otel::OtelSink;
use crate::telemetry::prometheus::PrometheusMetrics;

/// Arguments of `tokentap serve`.
///
/// Example: `tokentap serve --upstream http://127.0.0.1:30000` puts tokentap on 0.0.0.0:8000
/// in front of an sglang server; point clients at port 8000 and Prometheus at
/// http://127.0.0.1:9464/metrics.
#[allow(
    rustdoc::invalid_html_tags,
    reason = "`<SECTION>` is a command-line placeholder"
)]
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The inference server to forward to (sets upstream.url). Default http://127.0.0.1:30000.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Data listener address (sets proxy.listen). Default 0.0.0.0:8000.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin listener for /metrics, /healthz, /readyz, /matrix, /sweeps (sets admin.listen).
    /// Default 127.0.0.1:9464; anything but loopback needs admin.token.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// TOML configuration file (see config/tokentap.toml for every key). Environment
    /// variables TOKENTAP_<SECTION>__<KEY> override it; these flags override both.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Set any key of config/tokentap.toml, e.g. --set proxy.listen=0.0.0.0:8100 --set
    /// slo.ttft=500ms (repeatable; over the file and the environment, under the flags above;
    /// keep secrets such as admin.token in the environment or the file, not on a command line
    /// others can read). A list of several upstreams (`[[upstreams]]`) is written in the file.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

/// The configuration file (`--config`), the environment and `--set`, layered as every command
/// that reads tokentap's configuration does.
pub fn config_layers(
    file: Option<&std::path::Path>,
    set: &[String],
) -> anyhow::Result<ConfigLoader> {
    let mut loader = ConfigLoader::new();
    if let Some(path) = file {
        loader = loader.file(path)?;
    }
    Ok(loader.process_env()?.set_args(set)?)
}

impl ServeArgs {
    /// Loads the configuration layers these arguments name.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut loader = config_layers(self.config.as_deref(), &self.set)?;
        if let Some(url) = &self.upstream {
            loader = loader.flag(
                "upstream",
                "url",
                toml::Value::String(url.clone()),
                "--upstream",
            );
        }
        if let Some(listen) = &self.listen {
            loader = loader.flag(
                "proxy",
                "listen",
                toml::Value::String(listen.clone()),
                "--listen",
            );
        }
        if let Some(admin) = &self.admin {
            loader = loader.flag(
                "admin",
                "listen",
                toml::Value::String(admin.clone()),
                "--admin",
            );
        }
        Ok(loader.load()?)
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = args.load_config()?;
    // Listening before the listeners open: a signal during start-up is not the default kill.
    let mut signals = net::Signals::new();
    let server = ProxyServer::start(config).await?;
    tracing::info!(
        proxy = %server.proxy_addr,
        admin = %server.admin_addr,
        upstream = %server.proxy.router.default_upstream().config.url,
        "{}",
        server.first_line()
    );
    tracing::info!("data listener: {}", server.connection_limit);
    let signal = signals.next().await;
    tracing::info!(
        signal,
        grace = ?server.config.proxy.shutdown_grace,
        "shutdown signal received: draining (a second signal closes what is left at once; SIGHUP does not reload: restart to apply a new configuration)"
    );
    let cut = server.grace_cut();
    tokio::spawn(async move {
        let signal = signals.next().await;
        tracing::warn!(signal, "second signal: cutting the grace period short");
        cut.trigger();
    });
    server.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// Which of `tokentap serve`'s listeners a bind failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The data listener: `--listen`, `proxy.listen` (default 0.0.0.0:8000).
    Data,
    /// The admin listener: `--admin`, `admin.listen` (default 127.0.0.1:9464).
    Admin,
}

impl Listener {
    /// The flag and the setting that choose its address.
    fn chosen_by(self) -> &'static str {
        match self {
            Listener::Data => "--listen or proxy.listen",
            Listener::Admin => "--admin or admin.listen",
        }
    }
}

/// What `tokentap serve` says when `listener` cannot bind `addr`. A busy port is another
/// process's, named with the flag and setting that choose another (and, only for 8000, the
/// data listener's default, that vLLM listens there too); the admin listener on the data
/// listener's port (`data`, once bound) is said as such; any other failure keeps the system's
/// reason.
pub fn bind_error(
    listener: Listener,
    addr: SocketAddr,
    error: &std::io::Error,
    data: Option<SocketAddr>,
) -> String {
    let port = addr.port();
    let chosen_by = listener.chosen_by();
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return format!("cannot listen on {addr} (chosen by {chosen_by}): {error}");
    }
    if listener == Listener::Admin && data.is_some_and(|data| data.port() == port) {
        return format!(
            "cannot listen on {addr}: the data listener (--listen or proxy.listen) is on port {port}; give the admin listener another with {chosen_by}"
        );
    }
    let vllm = if listener == Listener::Data && port == 8000 {
        " (vLLM also listens on 8000 by default)"
    } else {
        ""
    };
    let example = match listener {
        Listener::Data if port == 8000 => ", e.g. --listen 0.0.0.0:8100",
        _ => "",
    };
    format!("cannot listen on {addr}: another process holds port {port}{vllm}; choose another with {chosen_by}{example}")
}

/// A running proxy: data listener, admin listener, meter and sinks.
#[derive(Debug)]
pub struct ProxyServer {
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub proxy: Arc<Proxy>,
    pub metrics: Arc<PrometheusMetrics>,
    pub admin: Arc<AdminState>,
    pub config: Config,
    otel: Option<Arc<OtelSink>>,
    /// The production matrix aggregator (also `admin.production`).
    pub production: Arc<ProductionMatrix>,
    /// The SQLite store, when `store.data_dir` is set (also `admin.store`).
    pub store: Option<Arc<Store>>,
    trigger: ShutdownTrigger,
    /// Cuts the data listener's grace period short (a second signal).
    cut: Arc<ShutdownTrigger>,
    admin_trigger: ShutdownTrigger,
    snapshot_trigger: ShutdownTrigger,
    data_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    snapshot_task: Option<JoinHandle<()>>,
    drift_task: JoinHandle<()>,
    /// How many connections the data listener holds and why (logged after the first line).
    pub connection_limit: String,
}

impl ProxyServer {
    /// Binds both listeners and starts serving.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        let proxy_listener = TcpListener::bind(config.proxy.listen)
            .await
            .map_err(|error| {
                anyhow::anyhow!(bind_error(
                    Listener::Data,
                    config.proxy.listen,
                    &error,
                    None
                ))
            })?;
        let data_addr = proxy_listener.local_addr().ok();
        let admin_listener = TcpListener::bind(config.admin.listen)
            .await
            .map_err(|error| {
                anyhow::anyhow!(bind_error(
                    Listener::Admin,
                    config.admin.listen,
                    &error,
                    data_addr
                ))
            })?;
        Self::start_on(config, proxy_listener, admin_listener).await
    }

    /// Starts on listeners the caller bound (tests bind port 0 first).
    pub async fn start_on(
        config: Config,
        proxy_listener: TcpListener,
        admin_listener: TcpListener,
    ) -> anyhow::Result<Self> {
        let proxy_addr = proxy_listener.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;
        let proxy = build_proxy(&config)?;
        let metrics = PrometheusMetrics::with_budget(
            config.metering.contexts.clone(),
            config.metering.concurrency.clone(),
            config.telemetry.max_series,
        )
        .context("cannot set up the Prometheus exporter")?;
        metrics.spawn_upkeep();
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
        let store = match &config.store.data_dir {
            Some(dir) => Some(Arc::new(Store::open(dir).with_context(|| {
                format!(
                    "cannot open the store in {} (store.data_dir)",
                    dir.display()
                )
            })?)),
            None => None,
        };

        let workload = config
            .workload
            .capture
            .then(|| crate::workload::WorkloadCapture::start(&config.workload, store.clone()));
        if let Some(workload) = &workload {
            proxy.meter.add_sink(workload.clone());
        }

        let tls = match &config.proxy.tls {
            Some(tls) => {
                let alpn: &[&[u8]] = if config.proxy.http2 {
                    &[b"h2", b"http/1.1"]
                } else {
                    &[b"http/1.1"]
                };
                Some(Arc::new(
                    net::tls::server_config(&tls.cert, &tls.key, tls.client_ca.as_deref(), alpn)
                        .context("cannot set up TLS on the data listener (tls.*)")?,
                ))
            }
            None => None,
        };
        let (trigger, shutdown) = net::shutdown_pair();
        let (cut, cut_short) = net::shutdown_pair();
        let (admin_trigger, admin_shutdown) = net::shutdown_pair();
        let synthetic = crate::sweep::LatestMatrix::default();
        let sweep_store: Arc<dyn crate::sweep::SweepStore> = match &store {
            Some(store) => store.clone(),
            None => Arc::new(crate::sweep::MemoryStore::default()),
        };
        let sweeps = crate::sweep::SweepManager::new(
            crate::synthetic::ProxyPath::shared(Arc::clone(&proxy)),
            config.sweep.clone(),
            sweep_store,
            synthetic.clone(),
        );
        let drift = crate::aggregate::drift::Drift::new(config.drift.clone());
        load_references(&config, store.clone(), &drift).await?;
        let admin = Arc::new(AdminState {
            proxy: Arc::clone(&proxy),
            metrics: Arc::clone(&metrics),
            token: config.admin.token.clone(),
            sweeps,
            draining: Default::default(),
            production: Arc::clone(&production),
            synthetic,
            store: store.clone(),
            drift: Arc::clone(&drift),
            workload: workload.clone(),
            capacity: crate::admin::capacity::CapacitySettings {
                config: config.capacity.clone(),
                slo: config.metering.slo.clone(),
            },
            sessions: admin::session::Sessions::new(
                config.admin.session_ttl,
                config.admin.max_sessions,
                config.admin.max_failed_credentials_per_second,
            ),
            allowed_hosts: config.admin.allowed_hosts.clone(),
        });
        metrics.register_login_failures(&admin::session::LoginFailure::ALL.map(|r| r.label()));
        let (snapshot_trigger, snapshot_shutdown) = net::shutdown_pair();
        let drift_task = super::drift::spawn(
            Arc::clone(&production),
            drift,
            Arc::clone(&metrics),
            Arc::clone(&admin),
            snapshot_shutdown.clone(),
        );
        let snapshot_task = store.as_ref().map(|store| {
            snapshot::spawn(
                Arc::clone(&production),
                Arc::clone(store),
                config.store.snapshot_interval,
                config.store.retention,
                snapshot_shutdown,
            )
        });

        // The descriptor limit decides how many streams one process can hold.
        let (max_connections, descriptors) = net::limits::data_listener_limit(
            config.proxy.max_connections,
            config.admin.max_connections,
            upstream_descriptors(&config),
        );
        // After the first line (`run`): a detail of sizing, not what an operator reads first.
        if config.proxy.max_connections == 0 {
            tracing::debug!(
                max_connections,
                descriptor_limit = %descriptors,
                "data listener: at most {max_connections} connections (proxy.max_connections = 0: what the descriptor limit allows after a reserve, at two descriptors per stream with HTTP/1 upstreams, one with HTTP/2 ones); raise LimitNOFILE (ulimit -Hn) to hold more"
            );
        }
        let connection_limit = format!(
            "at most {max_connections} connections ({})",
            if config.proxy.max_connections == 0 {
                format!("the descriptor limit {descriptors} allows; raise LimitNOFILE for more")
            } else {
                "proxy.max_connections".to_owned()
            }
        );
        // proxy.workers = 0: connections are tasks of the shared runtime.
        let workers = match config.proxy.workers {
            0 => None,
            count => {
                let workers = net::workers::ConnectionWorkers::start(count)
                    .context("cannot start the connection workers (proxy.workers)")?;
                tracing::info!(
                    workers = workers.len(),
                    "data listener: connections served on {count} worker threads of their own (proxy.workers)"
                );
                Some(workers)
            }
        };
        let data_options = ServerOptions {
            name: "proxy",
            header_read_timeout: config.proxy.header_read_timeout,
            max_header_bytes: config.proxy.max_header_bytes,
            http2: config.proxy.http2,
            tls,
            grace: config.proxy.shutdown_grace,
            max_connections,
            faults: Arc::clone(&proxy.faults),
            http2_max_concurrent_streams: config.proxy.http2_max_concurrent_streams,
            http2_max_send_buffer: config.proxy.max_stream_buffer,
            http2_keep_alive_interval: config.proxy.http2_keep_alive_interval,
            http2_keep_alive_timeout: config.proxy.http2_keep_alive_timeout,
            send_stall_timeout: config.proxy.send_stall_timeout,
            // Both listeners answer with `ResponseBody`, which paces what it hands over.
            flatten_writes: true,
            workers,
        };
        let admin_options = ServerOptions {
            header_read_timeout: config.proxy.header_read_timeout,
            flatten_writes: true,
            max_connections: config.admin.max_connections,
            // A streamed export (`GET /workload`) whose client stops reading is cut like a
            // proxied stream, freeing its export slot.
            send_stall_timeout: config.proxy.send_stall_timeout,
            ..ServerOptions::plain("admin")
        };
        metrics.watch_faults("proxy", Arc::clone(&proxy.faults));
        metrics.watch_faults("admin", Arc::clone(&admin_options.faults));
        metrics.watch_clamped_counts(&proxy.meter);
        if let Some(workload) = &workload {
            let (behind, failed) = workload.lost_counters();
            use crate::telemetry::names::WORKLOAD_ROWS_LOST_TOTAL;
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
                crate::telemetry::names::WORKLOAD_EXPORTS_REFUSED_TOTAL,
                &[],
                workload.refused_exports(),
            );
        }
        metrics.watch_server_state(&proxy.meter);
        metrics.watch_identities(&proxy.meter);
        crate::proxy::describe::spawn(&proxy, config.fingerprint.interval);
        crate::upstream_identity::spawn(&proxy, &config.fingerprint, store.clone());
        crate::upstream_metrics::spawn_scrapers(&proxy.router, &proxy.meter);
        let service = ProxyService::new(Arc::clone(&proxy));
        let data_task = tokio::spawn(net::serve_until(
            proxy_listener,
            data_options,
            move |_peer| hyper_util::service::TowerToHyperService::new(service.clone()),
            shutdown.clone(),
            Some(cut_short),
        ));
        let admin_state = Arc::clone(&admin);
        let admin_task = tokio::spawn(net::serve(
            admin_listener,
            admin_options,
            move |peer| admin::service(Arc::clone(&admin_state), Some(peer)),
            admin_shutdown,
        ));
        Ok(Self {
            proxy_addr,
            admin_addr,
            proxy,
            metrics,
            admin,
            config,
            otel,
            production,
            store,
            trigger,
            cut: Arc::new(cut),
            admin_trigger,
            snapshot_trigger,
            data_task,
            admin_task,
            snapshot_task,
            drift_task,
            connection_limit,
        })
    }

    /// The message of the first line a started proxy logs (its fields name the data port, the
    /// admin port and the upstream): where a person opens the page — its `/login` when a token
    /// guards it. Prometheus scrapes `/metrics` on the same admin port.
    pub fn first_line(&self) -> String {
        let page = if self.config.admin.token.is_some() {
            "/login"
        } else {
            "/"
        };
        format!(
            "tokentap is forwarding; page http://{}{page}",
            self.admin_addr
        )
    }

    /// What cuts the grace period of [`ProxyServer::shutdown`] short: triggered, the data
    /// listener closes its remaining connections at once.
    pub fn grace_cut(&self) -> Arc<ShutdownTrigger> {
        Arc::clone(&self.cut)
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, closes what
    /// is left (each cut request recorded as `client_aborted`), then returns.
    /// The admin listener stops last, so /metrics stays scrapeable while streams drain; the
    /// snapshot task writes the part-interval since its last snapshot once streams are done.
    pub async fn shutdown(self) {
        self.admin.draining.store(true, Ordering::Relaxed);
        self.trigger.trigger();
        let _ = self.data_task.await;
        if let Some(workload) = &self.admin.workload {
            workload.flush().await;
        }
        self.snapshot_trigger.trigger();
        if let Some(task) = self.snapshot_task {
            let _ = task.await;
        }
        let _ = self.drift_task.await;
        self.admin_trigger.trigger();
        let _ = self.admin_task.await;
        if let Some(otel) = self.otel {
            otel.shutdown().await;
        }
    }
}

/// Fills the drift references: what the store kept, then each upstream's `reference_file`
/// (pinned again at every start, so the file wins over an earlier pin of the same model).
async fn load_references(
    config: &Config,
    store: Option<Arc<Store>>,
    drift: &crate::aggregate::drift::Drift,
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

/// What the upstreams cost in descriptors beside the client connections: a fixed pool when
/// every upstream speaks HTTP/2 (streams multiplex), else one per stream.
fn upstream_descriptors(config: &Config) -> crate::net::limits::UpstreamDescriptors {
    use crate::net::limits::{UpstreamDescriptors, HTTP2_UPSTREAM_CONNECTIONS};
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

/// Builds the data path from configuration.
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
                crate::net::limits::HTTP2_UPSTREAM_CONNECTIONS
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
    for upstream in router.all() {
        meter.identities().add(Arc::clone(&upstream.identity));
    }
    Ok(Arc::new(Proxy {
        router,
        meter,
        metering: config.metering.clone(),
        models: ModelLabels::new(config.metering.max_models),
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
    }))
}
