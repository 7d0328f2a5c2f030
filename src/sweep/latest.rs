//! [`LatestMatrix`], the slots of the synthetic matrices the admin endpoints read: the last
//! **completed** sweep's (the comparison, the capacity source and the `tokentap_sweep_cell_*`
//! gauges) and the **running** sweep's partial one (its progress). A cancelled, failed or
//! interrupted sweep is kept in history with its status, but never becomes the completed one:
//! what production is compared with, what capacity rests on and what Grafana draws stay the last
//! sweep that finished.

use std::sync::{Arc, RwLock};

use crate::base::lock;
use crate::matrix::MatrixDoc;

#[derive(Debug, Default)]
struct Slots {
    completed: Option<Arc<MatrixDoc>>,
    running: Option<Arc<MatrixDoc>>,
}

/// The synthetic matrices shared between the sweep engine (writer) and the admin endpoints
/// (readers). Cloning shares the slots.
#[derive(Debug, Clone, Default)]
pub struct LatestMatrix(Arc<RwLock<Slots>>);

impl LatestMatrix {
    /// The running sweep's matrix so far.
    pub fn set_running(&self, doc: MatrixDoc) {
        lock::write(&self.0).running = Some(Arc::new(doc));
    }

    /// The sweep ended: its partial matrix is no longer shown as running; `completed`, when it
    /// finished, becomes the comparison.
    pub fn end_running(&self, completed: Option<MatrixDoc>) {
        let mut slots = lock::write(&self.0);
        slots.running = None;
        if let Some(doc) = completed {
            slots.completed = Some(Arc::new(doc));
        }
    }

    /// Sets the last completed sweep's matrix (at start, from the store).
    pub fn set_completed(&self, doc: MatrixDoc) {
        lock::write(&self.0).completed = Some(Arc::new(doc));
    }

    /// The last completed sweep's matrix: the comparison, the capacity source, the gauges.
    pub fn get(&self) -> Option<Arc<MatrixDoc>> {
        lock::read(&self.0).completed.clone()
    }

    /// The running sweep's matrix so far, if one runs.
    pub fn running(&self) -> Option<Arc<MatrixDoc>> {
        lock::read(&self.0).running.clone()
    }

    pub fn clear(&self) {
        *lock::write(&self.0) = Slots::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(model: &str) -> MatrixDoc {
        let mut doc = MatrixDoc::new(crate::matrix::Metadata::default());
        doc.metadata.model.served_model = Some(model.into());
        doc
    }

    fn model(doc: Option<Arc<MatrixDoc>>) -> Option<String> {
        doc.and_then(|d| d.metadata.model.served_model.clone())
    }

    #[test]
    fn only_a_finished_sweep_replaces_the_completed_matrix() {
        let slots = LatestMatrix::default();
        slots.set_completed(doc("first"));
        slots.set_running(doc("partial"));
        assert_eq!(model(slots.get()).as_deref(), Some("first"));
        assert_eq!(model(slots.running()).as_deref(), Some("partial"));
        // Cancelled, failed, interrupted: nothing replaces the completed one.
        slots.end_running(None);
        assert_eq!(model(slots.get()).as_deref(), Some("first"));
        assert!(slots.running().is_none());
        slots.set_running(doc("second"));
        slots.end_running(Some(doc("second")));
        assert_eq!(model(slots.get()).as_deref(), Some("second"));
    }
}
