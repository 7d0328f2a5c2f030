//! Live drift against pinned references: the references held in memory (one per upstream and
//! model; the store keeps them across restarts and the admin API changes them), the comparison
//! of a production window with its reference, and the refresher task that recomputes the
//! `tokentap_drift_ratio` gauges every `drift.refresh_interval`.
//!
//! Everything here runs off the request path: the refresher reads the production aggregator
//! the way `/matrix` does (one short lock per window), and the gauges are replaced whole.
//!
//! The production matrix is kept per model (whichever upstream served it); a reference is pinned
//! per upstream and model, and a model's production cells are compared with the reference of the
//! upstream the router sends that model to.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::config::DriftConfig;
use crate::matrix::compare::{
    compare, gauge_values, DriftSample, MatrixCompare, Reference, ReferenceInfo,
};
use crate::meter::buckets::Ladder;

use super::window::{ProductionMatrix, Window};
use crate::base::lock;
use crate::base::wallclock::format_rfc3339;

/// The pinned references and the drift settings, shared by the admin API and the refresher.
#[derive(Debug)]
pub struct Drift {
    pub settings: DriftConfig,
    references: RwLock<BTreeMap<(String, String), Arc<Reference>>>,
}

impl Drift {
    pub fn new(settings: DriftConfig) -> Arc<Self> {
        Arc::new(Self {
            settings,
            references: RwLock::new(BTreeMap::new()),
        })
    }

    /// Holds `reference` for its upstream and model, replacing any earlier one.
    pub fn pin(&self, reference: Reference) {
        let key = (reference.upstream.clone(), reference.model.clone());
        lock::write(&self.references).insert(key, Arc::new(reference));
    }

    /// Drops the reference of `upstream` and `model`; whether there was one.
    pub fn unpin(&self, upstream: &str, model: &str) -> bool {
        lock::write(&self.references)
            .remove(&(upstream.to_owned(), model.to_owned()))
            .is_some()
    }

    pub fn reference(&self, upstream: &str, model: &str) -> Option<Arc<Reference>> {
        lock::read(&self.references)
            .get(&(upstream.to_owned(), model.to_owned()))
            .cloned()
    }

    /// Every pinned reference, by upstream then model.
    pub fn references(&self) -> Vec<Arc<Reference>> {
        lock::read(&self.references).values().cloned().collect()
    }

    /// The window the gauges are computed over.
    pub fn window(&self) -> Window {
        Window::Last(self.settings.window)
    }
}

/// How a reference is shown beside a comparison.
pub fn reference_info(reference: &Reference) -> ReferenceInfo {
    ReferenceInfo {
        upstream: reference.upstream.clone(),
        model: reference.model.clone(),
        source: reference.source.clone(),
        pinned_at: format_rfc3339(reference.pinned_at),
        title: crate::matrix::page::title(&reference.matrix.metadata),
    }
}

/// The production window of the reference's model against the reference; `None` when no
/// production request of that model (on the reference's configuration, when it names one)
/// ended in the window.
pub fn compare_production(
    production: &ProductionMatrix,
    reference: &Reference,
    window: Window,
    evidence: &crate::matrix::EvidenceRule,
    now: SystemTime,
) -> Option<MatrixCompare> {
    // A reference pinned on one configuration (its `Fingerprint` fact) is compared with that
    // configuration's production only.
    let filter = match super::config::fingerprint_of(&reference.matrix.metadata) {
        Some(id) => super::window::FingerprintFilter::Only(vec![id]),
        None => super::window::FingerprintFilter::All,
    };
    let doc = production.matrix_of(window, Some(&reference.model), now, &filter)?;
    Some(compare(
        &doc,
        &reference.matrix,
        reference_info(reference),
        evidence,
    ))
}

/// The ladder label of a matrix value (the `context_bucket` / `concurrency_bucket` label the
/// other per-cell metrics carry), or the value itself when it is not on the ladder.
fn ladder_label(ladder: &Ladder, value: u64, fallback: impl FnOnce() -> String) -> String {
    ladder
        .values()
        .iter()
        .position(|v| *v == value)
        .map_or_else(fallback, |index| ladder.label(index).to_owned())
}

/// The gauge values of every reference whose model had production traffic in the drift window.
pub fn gauge_samples(
    production: &ProductionMatrix,
    drift: &Drift,
    now: SystemTime,
) -> Vec<DriftSample> {
    let mut samples = Vec::new();
    for reference in drift.references() {
        let Some(compared) = compare_production(
            production,
            &reference,
            drift.window(),
            &drift.settings.evidence,
            now,
        ) else {
            continue;
        };
        for (context, concurrency, metric, value) in gauge_values(&compared) {
            samples.push(DriftSample {
                upstream: reference.upstream.clone(),
                model: reference.model.clone(),
                context_bucket: ladder_label(production.contexts(), context, || {
                    crate::matrix::units::context_label(context)
                }),
                concurrency_bucket: ladder_label(
                    production.concurrency(),
                    u64::from(concurrency),
                    || concurrency.to_string(),
                ),
                metric: metric.label(),
                value,
            });
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::cell::test_records::record;
    use crate::aggregate::config::set_fingerprint;
    use crate::base::Source;
    use crate::matrix::doc::MatrixDoc;
    use crate::matrix::EvidenceRule;
    use crate::meter::buckets::{DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
    use crate::meter::identity::FingerprintId;
    use crate::meter::record::Outcome;
    use std::time::Duration;

    #[test]
    fn a_reference_on_one_configuration_meets_only_its_production() {
        let production = ProductionMatrix::new(
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
            Source::Production,
        );
        let ms = Duration::from_millis;
        let a = FingerprintId::from_hash(0xa);
        let mut r = record(Some(1000), &[(0, 20)], ms(100), ms(10), 1.0, Outcome::Ok);
        r.labels.model = "m".into();
        r.labels.fingerprint = a;
        production.add(&r);
        let now = SystemTime::now() + Duration::from_secs(1);
        let mut matrix = production.matrix(Window::All, Some("m"), now).unwrap();
        let reference = |matrix: &MatrixDoc| Reference {
            upstream: "u".into(),
            model: "m".into(),
            source: "test".into(),
            pinned_at: now,
            matrix: matrix.clone(),
        };
        let compare = |matrix: &MatrixDoc| {
            compare_production(
                &production,
                &reference(matrix),
                Window::All,
                &EvidenceRule::NONE,
                now,
            )
        };
        assert!(
            compare(&matrix).is_some(),
            "no fingerprint: every configuration"
        );
        set_fingerprint(&mut matrix.metadata, a);
        assert!(compare(&matrix).is_some(), "the same configuration");
        set_fingerprint(&mut matrix.metadata, FingerprintId::from_hash(0xb));
        assert!(
            compare(&matrix).is_none(),
            "another configuration has no production"
        );
    }
}
