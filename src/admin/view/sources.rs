//! What the view layer reads: [`View`], the admin state's data sources borrowed (the proxy,
//! the production aggregator, the latest synthetic matrix, the store, the pinned references,
//! the capacity settings, the readiness probe `/readyz` asks), and which upstream and configurations a model's requests go to.

use std::sync::Arc;

use crate::aggregate::drift::Drift;
use crate::aggregate::{FingerprintFilter, ProductionMatrix};
use crate::config::CapacityConfig;
use crate::config::SloObjectives;
use crate::meter::identity::FingerprintId;
use crate::meter::slo::SloPolicy;
use crate::proxy::readiness::ReadinessProbe;
use crate::proxy::upstream::Upstream;
use crate::proxy::Proxy;
use crate::store::Store;
use crate::sweep::LatestMatrix;

/// The part of the admin state the view layer reads (`AdminState::view`): figures only, so a
/// view cannot reach the token, the sessions or the sweep manager.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub proxy: &'a Proxy,
    /// The production matrix aggregator (a sink of the proxy's meter).
    pub production: &'a ProductionMatrix,
    /// The latest synthetic matrix; the sweep engine fills it.
    pub synthetic: &'a LatestMatrix,
    /// The SQLite store, when `store.data_dir` is set.
    pub store: &'a Option<Arc<Store>>,
    /// The pinned reference matrices and the drift settings.
    pub drift: &'a Drift,
    /// How live headroom is computed.
    pub capacity: &'a CapacitySettings,
    /// Whether the upstreams answer: `/readyz`'s probe (the verdict's availability clause).
    pub readiness: &'a ReadinessProbe,
}

/// What live headroom is computed with: `[capacity]`, the `[slo]` targets and the `[slo]`
/// objectives (production's cells are held to them: `production_slo`).
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    pub config: CapacityConfig,
    pub slo: SloPolicy,
    pub objectives: SloObjectives,
}

/// The upstream requests for `model` go to (the default one when no model is named).
pub fn routed_upstream<'a>(view: View<'a>, model: Option<&str>) -> &'a Arc<Upstream> {
    let router = &view.proxy.router;
    model
        .and_then(|m| router.by_model(m))
        .unwrap_or_else(|| router.default_upstream())
}

/// The upstream a model's requests go to: the one named, which must exist, else the router's.
pub fn resolve_upstream(
    view: View<'_>,
    named: Option<&str>,
    model: &str,
) -> Result<String, String> {
    let router = &view.proxy.router;
    match named {
        Some(name) => {
            if router.all().iter().any(|u| &*u.name == name) {
                Ok(name.to_owned())
            } else {
                let known: Vec<&str> = router.all().iter().map(|u| &*u.name).collect();
                Err(format!(
                    "no upstream named `{name}`; configured: {}",
                    known.join(", ")
                ))
            }
        }
        None => Ok(router
            .by_model(model)
            .unwrap_or_else(|| router.default_upstream())
            .name
            .to_string()),
    }
}

/// The configuration each upstream runs now, and requests from before it was first read
/// (`fingerprint=current`; `/capacity` judges these too).
pub fn current_configurations(view: View<'_>) -> FingerprintFilter {
    let mut ids: Vec<FingerprintId> = view
        .proxy
        .meter
        .identities()
        .all()
        .iter()
        .map(|u| u.current())
        .collect();
    ids.push(FingerprintId::UNKNOWN);
    ids.sort();
    ids.dedup();
    FingerprintFilter::Only(ids)
}
