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

    /// The second line `serve` logs: the SLO the verdict judges against and the evidence a
    /// production cell needs before it is judged, so an operator reading the log knows what
    /// "meets" will mean on the page.
    pub fn judging_line(&self) -> String {
        judging_line(&self.config)
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

/// See [`ProxyServer::judging_line`].
fn judging_line(config: &Config) -> String {
    let slo = &config.metering.slo;
    let targets = |t: &crate::meter::slo::SloTargets| {
        let parts: Vec<String> = [("TTFT", t.ttft), ("TBT", t.tbt), ("end to end", t.e2e)]
            .into_iter()
            .filter_map(|(name, target)| Some(format!("{name} ≤ {}", millis(target?))))
            .collect();
        parts.join(", ")
    };
    let judged = if slo.default.is_set() || !slo.models.is_empty() {
        let mut text = if slo.default.is_set() {
            format!(
                "SLO {} on {}% of requests",
                targets(&slo.default),
                percent(config.metering.objectives.default)
            )
        } else {
            "SLO for named models only".to_string()
        };
        if slo.ttft_of == crate::meter::slo::TtftOf::Answer {
            text.push_str(" (TTFT of the first answer token)");
        }
        if !slo.models.is_empty() {
            text.push_str(&format!("; {} model(s) with their own", slo.models.len()));
        }
        text
    } else {
        "no SLO ([slo] unset): figures are shown, not judged".to_string()
    };
    let evidence = &config.evidence;
    format!(
        "judging: {judged}; a production cell is judged once it has {} completed requests, {} s measured and {} output tokens ([evidence])",
        evidence.min_requests, evidence.min_measured_s, evidence.min_output_tokens
    )
}

/// `250 ms`, `2 s`, `1.5 s`.
fn millis(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms >= 1000 {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{ms} ms")
    }
}

/// `99`, `99.9`.
fn percent(share: f64) -> String {
    let p = (share * 1000.0).round() / 10.0;
    format!("{p}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judging_line_names_the_targets_the_objective_and_the_evidence_rule() {
        let mut config = Config::defaults().unwrap();
        let unset = judging_line(&config);
        assert!(unset.starts_with("judging: no SLO"), "{unset}");
        assert!(
            unset.contains("20 completed requests, 10 s measured and 500 output tokens"),
            "{unset}"
        );
        config.metering.slo.default.ttft = Some(std::time::Duration::from_secs(2));
        config.metering.slo.default.tbt = Some(std::time::Duration::from_millis(50));
        config.metering.objectives.default = 0.99;
        let set = judging_line(&config);
        assert!(
            set.contains("SLO TTFT ≤ 2 s, TBT ≤ 50 ms on 99% of requests"),
            "{set}"
        );
    }
}
