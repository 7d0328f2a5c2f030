//! The producers of a request's traffic slice (`meter::labels::TrafficSlice`): the tenant
//! (`[tenants]`, production only), the `priority` field's band, and a producer for each
//! dimension registered through [`register`], read once when a metered request starts.

use std::sync::RwLock;

use crate::base::lock;
use crate::meter::labels::{self, Dimension, SliceValue, TrafficSlice, PRIORITY, TENANT};
use crate::meter::priority::PriorityBand;
use crate::stream::request::RequestFacts;

/// Reads one dimension's value off a production request's head. It must bound what it
/// returns (an allow list, a fixed set): each value is a label of the cell series.
pub type Producer = fn(&http::request::Parts) -> Option<SliceValue>;

static PRODUCERS: RwLock<Vec<(&'static Dimension, Producer)>> = RwLock::new(Vec::new());

/// Adds a dimension of the traffic slice and the producer of its values: from now on every
/// production request carries it into its record, the cell series, the matrix's
/// `?<name>=` filter and, if the dimension asks, the store's snapshots.
pub fn register(dimension: &'static Dimension, produce: Producer) {
    labels::register(dimension);
    let mut producers = lock::write(&PRODUCERS);
    if !producers.iter().any(|(d, _)| d.name == dimension.name) {
        producers.push((dimension, produce));
    }
}

/// The slice a metered request is counted under. `tenant` is the tenant `[tenants]` counts a
/// production request under (`None` for the sweep's own, and when tenants are off).
pub(crate) fn slice_of(
    parts: &http::request::Parts,
    facts: &RequestFacts,
    tenant: Option<std::sync::Arc<str>>,
    production: bool,
) -> TrafficSlice {
    let mut values: Vec<(&'static Dimension, SliceValue)> = Vec::new();
    if let Some(tenant) = tenant {
        values.push((&TENANT, SliceValue::Shared(tenant)));
    }
    if let Some(priority) = facts.priority {
        values.push((
            &PRIORITY,
            SliceValue::Named(PriorityBand::of(priority).label()),
        ));
    }
    if production {
        for (dimension, produce) in lock::read(&PRODUCERS).iter() {
            if let Some(value) = produce(parts) {
                values.push((dimension, value));
            }
        }
    }
    TrafficSlice::of(values)
}
