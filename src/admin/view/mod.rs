//! The admin's view layer: the figures the page and the endpoints share, read from a
//! [`View`] of the admin state — the production matrix (of a model, a configuration, a
//! tenant's or a priority band's requests), the latest synthetic matrix, production ÷ the
//! pinned reference, and live headroom. A view returns documents and reasons, never a
//! response: the endpoint files render them. Nothing here sees credentials, sessions or the
//! sweep manager.
//!
//! File order: `sources` ← `matrices` ← `compare`; `production_slo` (pure) ← `headroom`, which
//! also imports `sources`; `availability` (pure); `status` (the one verdict) imports them all and computes nothing of
//! its own. This file
//! only declares and re-exports.

mod availability;
mod compare;
mod headroom;
mod matrices;
mod production_slo;
mod sources;
mod status;

pub use availability::{
    availability, Availability, AvailabilityKind, ErrorBudget, DEFAULT_ERROR_BUDGET,
};
pub use compare::production_compare;
pub use headroom::{
    all_models, any_slo_targets, engine_advice, no_slo_targets, CapacityAnswer, CapacityWithAdvice,
    ContextBasis, ModelAdvice, ModelHeadroom, NoHeadroom, RestsOn, SET_SLO_TARGETS,
};
pub use matrices::{
    production_matrix, production_matrix_of, production_matrix_sliced, synthetic_matrix,
    FingerprintChoice, NO_SWEEP,
};
pub use production_slo::{
    duration_text, production_slo, shed_demand, targets_text, CellAttainment, ContextSlo,
    ProductionSlo, ShedDemand,
};
pub use sources::{
    current_configurations, resolve_upstream, routed_upstream, CapacitySettings, View,
};
pub use status::{
    routes_clause, status, sweep_agreement, Clause, ModelStatus, RoutesClause, State, Status,
    SweepAgreement, UpstreamReadiness, NAMED_IN_STATUS, STATUS_SCHEMA,
};
