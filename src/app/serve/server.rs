//! [`ProxyServer`]: a running `tokentap serve` as a value — the services built once, the
//! listeners serving them, the tasks and their shutdown — so tests and `tokentap demo` run
//! exactly what production runs.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::listeners::{self, ListenerOptions};
use super::services::Services;
use super::tasks::Tasks;
use crate::admin::AdminState;
use crate::aggregate::ProductionMatrix;
use crate::config::Config;
use crate::net::ShutdownTrigger;
use crate::proxy::Proxy;
use crate::store::Store;
use crate::telemetry::prometheus::PrometheusMetrics;

/// A running proxy: data listener, admin listener, meter and sinks.
#[derive(Debug)]
pub struct ProxyServer {
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub proxy: Arc<Proxy>,
    pub metrics: Arc<PrometheusMetrics>,
    pub admin: Arc<AdminState>,
    pub config: Config,
    /// The production matrix aggregator (also `admin.production`).
    pub production: Arc<ProductionMatrix>,
    /// The SQLite store, when `store.data_dir` is set (also `admin.store`).
    pub store: Option<Arc<Store>>,
    /// How many connections the data listener holds and why (logged after the first line).
    pub connection_limit: String,
    tasks: Tasks,
}

impl ProxyServer {
    /// Binds both listeners and starts serving.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        let (proxy_listener, admin_listener) = listeners::bind(&config).await?;
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
        let services = Services::build(&config).await?;
        // The data port's 403 for an admin route names this address.
        let _ = services
            .proxy
            .admin_address
            .set(format!("http://{admin_addr}"));
        let ListenerOptions {
            data: data_options,
            admin: admin_options,
            connection_limit,
        } = ListenerOptions::new(&config, &services.proxy)?;
        services.export_counters(&admin_options.faults);
        let tasks = Tasks::start(
            &config,
            &services,
            (proxy_listener, data_options),
            (admin_listener, admin_options),
        );
        let Services {
            proxy,
            metrics,
            production,
            store,
            admin,
            ..
        } = services;
        Ok(Self {
            proxy_addr,
            admin_addr,
            proxy,
            metrics,
            admin,
            config,
            production,
            store,
            connection_limit,
            tasks,
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
        self.tasks.grace_cut()
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, closes what
    /// is left (each cut request recorded as `client_aborted`), then returns.
    /// The admin listener stops last, so /metrics stays scrapeable while streams drain; the
    /// snapshot task writes the part-interval since its last snapshot once streams are done.
    pub async fn shutdown(self) {
        self.tasks.shutdown().await;
    }
}
