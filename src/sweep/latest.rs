//! [`LatestMatrix`], the slot holding the latest synthetic matrix: the sweep engine writes it
//! (a partial matrix while a sweep runs), the admin endpoints read it.

use std::sync::{Arc, RwLock};

use crate::base::lock;
use crate::matrix::MatrixDoc;

/// The latest synthetic matrix, shared between the sweep engine (writer) and the admin
/// endpoints (readers). Cloning shares the slot.
#[derive(Debug, Clone, Default)]
pub struct LatestMatrix(Arc<RwLock<Option<Arc<MatrixDoc>>>>);

impl LatestMatrix {
    /// Publishes `doc` as the latest synthetic matrix (a partial one while a sweep runs).
    pub fn set(&self, doc: MatrixDoc) {
        *lock::write(&self.0) = Some(Arc::new(doc));
    }

    pub fn clear(&self) {
        *lock::write(&self.0) = None;
    }

    pub fn get(&self) -> Option<Arc<MatrixDoc>> {
        lock::read(&self.0).clone()
    }
}
