//! Graceful shutdown: the trigger and the signal every listener holds, and the process
//! signals (SIGTERM, SIGINT, SIGHUP) that pull it.

use tokio::sync::watch;

/// Fires shutdown for every listener holding a [`Shutdown`] from it.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Resolves once shutdown has been triggered (or the trigger was dropped).
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A trigger and the first of its listeners.
pub fn shutdown_pair() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Drop for ShutdownTrigger {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// Waits for the trigger.
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|&down| down).await;
    }

    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }
}

/// The stop signals: SIGTERM, SIGINT (Ctrl-C) and SIGHUP all drain (tokentap does not reload
/// its configuration: restart it for a new one), and one arriving while a drain runs cuts the
/// grace period short.
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Listens from now on (a signal that arrives before the first [`Signals::next`] is kept).
    pub fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            Self {
                term: listen(SignalKind::terminate(), "SIGTERM"),
                hup: listen(SignalKind::hangup(), "SIGHUP"),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// The next stop signal's name.
    pub async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn one(listener: &mut Option<tokio::signal::unix::Signal>) {
                match listener {
                    Some(listener) => {
                        if listener.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = one(&mut self.term) => "SIGTERM",
                _ = one(&mut self.hup) => "SIGHUP",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self::new()
    }
}
