//! What identifies a label set of the sink: a cell's key ([`CellKey`]), the per-model key
//! ([`BaseKey`]), and the Prometheus labels each one is written with.

use std::sync::Arc;

use metrics::Label;

use crate::base::Route;
use crate::base::Source;
use crate::meter::buckets::Ladder;
use crate::meter::identity::FingerprintId;
use crate::meter::labels::TrafficSlice;
use crate::meter::record::RequestRecord;

/// One cell's series: who (model, upstream, route, source, tenant, priority band), where
/// (context and concurrency buckets) and on what configuration (fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct CellKey {
    pub(super) model: Arc<str>,
    pub(super) upstream: Arc<str>,
    pub(super) route: Route,
    pub(super) source: Source,
    pub(super) context: usize,
    pub(super) concurrency: usize,
    pub(super) fingerprint: FingerprintId,
    /// Its traffic slice: one label per dimension it has a value of (no `tenant` label when
    /// tenants are off, no `priority` label when the request sent none).
    pub(super) slice: TrafficSlice,
}

impl CellKey {
    /// The cell a finished request's record lands in, at concurrency bucket `concurrency`
    /// (its tokens are split over the buckets they were emitted in).
    pub(super) fn of_record(r: &RequestRecord, concurrency: usize) -> Self {
        Self {
            model: Arc::clone(&r.labels.model),
            upstream: Arc::clone(&r.labels.upstream),
            route: r.labels.route,
            source: r.labels.source,
            context: r.buckets.context,
            concurrency,
            fingerprint: r.labels.fingerprint,
            slice: r.labels.slice.clone(),
        }
    }
}
/// (model, upstream, route, source).
pub(super) type BaseKey = (Arc<str>, Arc<str>, Route, Source);

/// The labels of the per-model series: model, upstream, route and source.
pub(super) fn base_labels(
    model: &Arc<str>,
    upstream: &Arc<str>,
    route: Route,
    source: Source,
) -> Vec<Label> {
    vec![
        Label::new("model", model.to_string()),
        Label::new("upstream", upstream.to_string()),
        Label::new("route", route.label()),
        Label::new("source", source.as_str()),
    ]
}

/// The labels of one cell: the base labels plus its context and concurrency buckets (as the
/// ladders name them) and the upstream's configuration (`fingerprint`: 12 hex, `unknown` or
/// `flapping`).
pub(super) fn cell_labels(key: &CellKey, contexts: &Ladder, concurrency: &Ladder) -> Vec<Label> {
    let mut labels = base_labels(&key.model, &key.upstream, key.route, key.source);
    labels.push(Label::new(
        "context_bucket",
        contexts.label(key.context).to_string(),
    ));
    labels.push(Label::new(
        "concurrency_bucket",
        concurrency.label(key.concurrency).to_string(),
    ));
    labels.push(Label::new(
        "fingerprint",
        key.fingerprint.label().as_str().to_owned(),
    ));
    // Bounded by each dimension's producer: the tenants' allow list plus `other`
    // (`proxy::tenants`), four priority bands.
    for (dimension, value) in key.slice.iter() {
        labels.push(Label::new(dimension, value.as_str().to_owned()));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::labels::{SliceValue, PRIORITY, TENANT};
    use crate::meter::priority::PriorityBand;

    fn pairs(labels: &[Label]) -> Vec<(String, String)> {
        labels
            .iter()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect()
    }

    fn ladders() -> (Ladder, Ladder) {
        (
            Ladder::contexts(&[1024, 4096]).unwrap(),
            Ladder::concurrency(&[1, 8]).unwrap(),
        )
    }

    #[test]
    fn a_record_lands_in_its_context_and_the_given_concurrency_bucket() {
        let mut record = RequestRecord::for_test();
        record.labels.slice = TrafficSlice::of([
            (&TENANT, SliceValue::from("acme")),
            (&PRIORITY, SliceValue::Named(PriorityBand::High.label())),
        ]);
        record.buckets.context = 1;
        record.buckets.concurrency = 0;
        let key = CellKey::of_record(&record, 2);
        assert_eq!((key.context, key.concurrency), (1, 2));
        assert_eq!(&*key.model, "m");
        assert_eq!(&*key.upstream, "default");
        assert_eq!(key.slice.tenant(), Some("acme"));
        assert_eq!(key.slice.priority(), Some("10+"));
        // Its other buckets are other cells, the same bucket the same cell.
        assert_ne!(key, CellKey::of_record(&record, 0));
        assert_eq!(key, CellKey::of_record(&record, 2));
    }

    #[test]
    fn a_cell_is_labelled_by_the_ladders_and_its_configuration() {
        let (contexts, concurrency) = ladders();
        let key = CellKey::of_record(&RequestRecord::for_test(), 2);
        let labels = pairs(&cell_labels(&key, &contexts, &concurrency));
        let expected = [
            ("model", "m"),
            ("upstream", "default"),
            ("route", Route::ChatCompletions.label()),
            ("source", Source::Production.as_str()),
            ("context_bucket", "1K"),
            ("concurrency_bucket", ">8"),
            ("fingerprint", "unknown"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(labels, expected, "no tenant or priority label when unset");
    }

    #[test]
    fn tenant_and_priority_labels_follow_the_configuration_ones() {
        let (contexts, concurrency) = ladders();
        let mut record = RequestRecord::for_test();
        record.labels.slice = TrafficSlice::of([
            (&PRIORITY, SliceValue::Named(PriorityBand::Negative.label())),
            (&TENANT, SliceValue::from("other")),
        ]);
        let labels = pairs(&cell_labels(
            &CellKey::of_record(&record, 0),
            &contexts,
            &concurrency,
        ));
        let tail: Vec<_> = labels.iter().skip(7).cloned().collect();
        assert_eq!(
            tail,
            [
                ("tenant".to_owned(), "other".to_owned()),
                (
                    "priority".to_owned(),
                    PriorityBand::Negative.label().to_owned()
                ),
            ]
        );
    }
}
