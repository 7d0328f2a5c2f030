//! The `tokentap serve` command: the configuration loaded, the server started, its first lines
//! logged, then the signals that drain it (the first) and cut the drain short (the second).

use std::process::ExitCode;

use super::args::ServeArgs;
use super::server::ProxyServer;
use crate::net;

/// `tokentap serve`: runs until a signal, then shuts down gracefully.
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
    tracing::info!("{}", server.judging_line());
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
