//! A traffic phase's own production aggregator, and the barrier between phases: no production
//! request left in flight.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::aggregate::{ProductionMatrix, Window};
use crate::app::serve::ProxyServer;
use crate::base::Source;
use crate::matrix::MatrixDoc;
use crate::meter::Meter;
use crate::synthetic::{DataPath, ProxyPath, SinkScope};

/// One phase's own production aggregator, fed by the proxy's meter while the phase runs, so
/// each phase's cells hold only its own requests.
pub struct Phase {
    matrix: Arc<ProductionMatrix>,
    /// The aggregator's registration with the meter, removed when the phase ends or is dropped.
    scope: SinkScope,
}

impl Phase {
    pub fn begin(server: &ProxyServer) -> Phase {
        let matrix = ProductionMatrix::with_evidence(
            server.production.contexts().clone(),
            server.production.concurrency().clone(),
            Source::Production,
            server.production.evidence(),
        );
        let scope = ProxyPath::new(Arc::clone(&server.proxy)).collect(matrix.clone());
        Phase { matrix, scope }
    }

    pub fn end(self, model: &str) -> Option<MatrixDoc> {
        drop(self.scope);
        self.matrix
            .matrix(Window::All, Some(model), SystemTime::now())
    }
}

/// Waits (at most 10 s) until no production request is in flight, so one phase's last records
/// are published before the next begins and its streams do not count in the next one's
/// concurrency.
pub async fn wait_until_idle(meter: &Meter) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while meter.inflight(Source::Production) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
