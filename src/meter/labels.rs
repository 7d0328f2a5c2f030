//! A request's labels, declared once: who it is ([`RequestLabels`]: model, upstream, route,
//! source, the upstream's configuration, and the [`TrafficSlice`] it belongs to), the
//! dimensions a slice is made of ([`Dimension`]: tenant, priority band, and any registered
//! one), and the filter that selects records by them ([`SliceFilter`]).
//!
//! Labels are fixed when a request starts and recorded when it ends (linkerd2-proxy's way):
//! the record holds them whole, and every reader takes what it keys on from here — the
//! window's accumulators, the Prometheus cell series (one label per slice dimension), the
//! admin's `?<dimension>=` parameters, and the store's per-slice snapshots. A new dimension is
//! one [`Dimension`] value, registered (built-ins in [`BUILT_IN`]), plus its producer on the
//! data path (`proxy::slice`): nothing else names it.

use std::sync::{Arc, RwLock};

use crate::base::lock;
use crate::base::{Route, Source};

use super::identity::FingerprintId;
use super::priority::PriorityBand;

/// Labels that a request could not know whole when it started: its upstream had not yet said
/// what it serves or what it runs (its first self-description read was under way). The meter
/// asks once more when the request's first token comes and when it ends, never per event;
/// until they are settled no series is made under the provisional labels (the client's name
/// for the model, fingerprint `unknown`).
pub trait SettleLabels: Send + Sync {
    /// Puts in `labels` what the upstream has said by now (the model it is recorded under,
    /// the configuration's fingerprint); whether nothing is left to wait for.
    fn settle(&self, labels: &mut RequestLabels) -> bool;

    /// Keeps the publication of a record that ended with provisional labels until they can
    /// settle (the upstream's first read is seconds at most); hands it back when that cannot
    /// be waited for (they can settle now, or too many wait), to be published at once.
    fn hold(&self, release: HeldRelease) -> Result<(), HeldRelease>;
}

/// The publication of a record held for its labels to settle ([`SettleLabels::hold`]).
pub struct HeldRelease(Box<dyn FnOnce() + Send>);

impl HeldRelease {
    pub fn new(release: impl FnOnce() + Send + 'static) -> Self {
        Self(Box::new(release))
    }

    /// Settles the record's labels and publishes it.
    pub fn run(self) {
        (self.0)();
    }
}

impl std::fmt::Debug for HeldRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldRelease")
    }
}

impl std::fmt::Debug for dyn SettleLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettleLabels")
    }
}

/// Who a metered request is, for labels and aggregation: fixed at its start (settled by its
/// end when its upstream had not said yet: [`SettleLabels`]).
#[derive(Debug, Clone)]
pub struct RequestLabels {
    pub route: Route,
    pub source: Source,
    /// The model the server serves (`proxy::phase::start`'s `recorded_model`): every matrix key.
    pub model: Arc<str>,
    /// The name the client sent, when it differs from `model` (bounded like model labels):
    /// an attribute of the request's span, never a key.
    pub asked_model: Option<Arc<str>>,
    pub upstream: Arc<str>,
    /// Free-form tag set by in-process callers (the sweep engine tags its cell's requests).
    pub tag: Option<Arc<str>>,
    /// The upstream's configuration when the request started (read from its lock-free slot
    /// by whoever begins the request; `unknown` if nobody does).
    pub fingerprint: FingerprintId,
    /// The slice of the traffic it is counted under (tenant, priority band, …): keys of the
    /// matrix and labels of the cell series.
    pub slice: TrafficSlice,
}

#[cfg(test)]
impl RequestLabels {
    /// A chat request to model `m` on upstream `default`, production, no slice.
    pub fn for_test() -> Self {
        Self {
            route: Route::ChatCompletions,
            source: Source::Production,
            model: Arc::from("m"),
            asked_model: None,
            upstream: Arc::from("default"),
            tag: None,
            fingerprint: FingerprintId::UNKNOWN,
            slice: TrafficSlice::default(),
        }
    }
}

/// One dimension of a [`TrafficSlice`]. Its values must be bounded by whoever produces them
/// (an allow list, a fixed set of bands): each is a label of the cell series.
#[derive(Debug)]
pub struct Dimension {
    /// Its name: the Prometheus label, the `/matrix?<name>=` parameter, the store's key.
    pub name: &'static str,
    /// The values it can take, in the order they are shown, when the set is fixed; `None`:
    /// whatever its producer allows, shown busiest first.
    pub values: Option<&'static [&'static str]>,
    /// A value as a user types it, made the value records carry (`priority=5` is band
    /// `1-9`), or why it is none.
    pub parse: fn(&str) -> Result<SliceValue, String>,
    /// Whether the store keeps a snapshot of each of its values beside the whole matrix.
    pub snapshots: bool,
}

impl Dimension {
    /// Whether `value` is one this dimension can take (always, without a fixed set).
    pub fn allows(&self, value: &str) -> bool {
        self.values.is_none_or(|values| values.contains(&value))
    }
}

fn any_name(text: &str) -> Result<SliceValue, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty".to_owned());
    }
    Ok(SliceValue::from(text))
}

const PRIORITY_BANDS: [&str; 4] = [
    PriorityBand::Negative.label(),
    PriorityBand::Zero.label(),
    PriorityBand::Low.label(),
    PriorityBand::High.label(),
];

fn priority_band(text: &str) -> Result<SliceValue, String> {
    PriorityBand::parse(text)
        .map(|band| SliceValue::Named(band.label()))
        .ok_or_else(|| {
            format!(
                "expected a band ({}) or an integer",
                PRIORITY_BANDS.join(", ")
            )
        })
}

/// The tenant a request is counted under (`[tenants]`: an allow-listed name or `other`).
pub static TENANT: Dimension = Dimension {
    name: "tenant",
    values: None,
    parse: any_name,
    snapshots: true,
};

/// The band of the request's `priority` field, when it sent one.
pub static PRIORITY: Dimension = Dimension {
    name: "priority",
    values: Some(&PRIORITY_BANDS),
    parse: priority_band,
    snapshots: false,
};

/// The dimensions every build has, in the order a slice lists them.
pub static BUILT_IN: [&Dimension; 2] = [&TENANT, &PRIORITY];

static REGISTERED: RwLock<Vec<&'static Dimension>> = RwLock::new(Vec::new());

/// Adds a dimension after the built-in ones (a name already known is ignored). Its values
/// reach records through a producer on the data path (`proxy::slice::register`).
pub fn register(dimension: &'static Dimension) {
    if dimension_named(dimension.name).is_some() {
        return;
    }
    lock::write(&REGISTERED).push(dimension);
}

/// Every dimension: the built-in ones, then the registered ones in registration order.
pub fn dimensions() -> Vec<&'static Dimension> {
    let mut all: Vec<&'static Dimension> = BUILT_IN.to_vec();
    all.extend(lock::read(&REGISTERED).iter().copied());
    all
}

/// The dimension called `name`.
pub fn dimension_named(name: &str) -> Option<&'static Dimension> {
    dimensions().into_iter().find(|d| d.name == name)
}

/// One value of a dimension: a name known at build time (a priority band) or one read from
/// the request (a tenant), shared.
#[derive(Debug, Clone)]
pub enum SliceValue {
    Named(&'static str),
    Shared(Arc<str>),
}

impl SliceValue {
    pub fn as_str(&self) -> &str {
        match self {
            SliceValue::Named(name) => name,
            SliceValue::Shared(name) => name,
        }
    }
}

impl From<&str> for SliceValue {
    fn from(text: &str) -> Self {
        SliceValue::Shared(Arc::from(text))
    }
}

impl From<Arc<str>> for SliceValue {
    fn from(text: Arc<str>) -> Self {
        SliceValue::Shared(text)
    }
}

impl PartialEq for SliceValue {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SliceValue {}

impl std::hash::Hash for SliceValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for SliceValue {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SliceValue {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::fmt::Display for SliceValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The slice of the traffic a request belongs to: at most one value per dimension, listed in
/// the dimensions' order. Empty for most requests (tenants off, no `priority`): no
/// allocation then; one shared list otherwise, cloned by reference count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TrafficSlice(Option<Arc<[(&'static str, SliceValue)]>>);

impl TrafficSlice {
    /// The slice of these values (the first of a dimension wins; order as [`dimensions`]).
    pub fn of(values: impl IntoIterator<Item = (&'static Dimension, SliceValue)>) -> Self {
        let mut entries: Vec<(usize, &'static str, SliceValue)> = Vec::new();
        for (dimension, value) in values {
            if !entries.iter().any(|(_, name, _)| *name == dimension.name) {
                entries.push((0, dimension.name, value));
            }
        }
        if entries.is_empty() {
            return Self::default();
        }
        let order = dimensions();
        for (rank, name, _) in &mut entries {
            *rank = order
                .iter()
                .position(|d| d.name == *name)
                .unwrap_or(order.len());
        }
        entries.sort_by_key(|(rank, _, _)| *rank);
        Self(Some(
            entries
                .into_iter()
                .map(|(_, name, value)| (name, value))
                .collect(),
        ))
    }

    /// Its (dimension, value) pairs, in the dimensions' order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &SliceValue)> + '_ {
        self.0
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|(name, value)| (*name, value))
    }

    /// Its value of the dimension called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(dimension, _)| *dimension == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn tenant(&self) -> Option<&str> {
        self.get(TENANT.name)
    }

    pub fn priority(&self) -> Option<&str> {
        self.get(PRIORITY.name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// Which slice of the traffic a document covers: one value per dimension asked for
/// (`/matrix?tenant=…&priority=…`); empty selects all of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceFilter(Vec<(&'static Dimension, SliceValue)>);

impl SliceFilter {
    /// The filter on one value of one dimension.
    pub fn only(dimension: &'static Dimension, value: SliceValue) -> Self {
        Self(vec![(dimension, value)])
    }

    /// Adds `name=value` when `name` is a dimension: `Ok(false)` when it is not one (the
    /// parameter is someone else's), an error naming the parameter when the value is not one
    /// the dimension takes. An empty value asks for nothing.
    pub fn read_parameter(&mut self, name: &str, value: &str) -> Result<bool, String> {
        let Some(dimension) = dimension_named(name) else {
            return Ok(false);
        };
        if value.is_empty() {
            return Ok(true);
        }
        let value = (dimension.parse)(value).map_err(|why| format!("{name} `{value}`: {why}"))?;
        *self = self.with(dimension, Some(value));
        Ok(true)
    }

    /// Whether a record of `slice` is one this filter selects.
    pub fn admits(&self, slice: &TrafficSlice) -> bool {
        self.0
            .iter()
            .all(|(dimension, value)| slice.get(dimension.name) == Some(value.as_str()))
    }

    /// Says in words which slice it selects ("tenant search, priority 10+"; nothing for all).
    pub fn describe(&self) -> Option<String> {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(dimension, value)| format!("{} {}", dimension.name, one_line(value.as_str())))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The value asked of the dimension called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(dimension, _)| dimension.name == name)
            .map(|(_, value)| value.as_str())
    }

    /// What it asks for, in the dimensions' order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Dimension, &SliceValue)> + '_ {
        self.0.iter().map(|(dimension, value)| (*dimension, value))
    }

    /// This filter with `name` asked to be `value` (`None`: not asked), for links.
    pub fn with(&self, dimension: &'static Dimension, value: Option<SliceValue>) -> Self {
        let mut next = self.clone();
        next.0.retain(|(d, _)| d.name != dimension.name);
        if let Some(value) = value {
            next.0.push((dimension, value));
        }
        // In the dimensions' order, whatever order they were asked in: one slice, one key.
        let order = dimensions();
        next.0
            .sort_by_key(|(d, _)| order.iter().position(|o| o.name == d.name));
        next
    }

    /// The query parameters it stands for (`tenant=search&priority=10%2B` unescaped: the
    /// caller escapes).
    pub fn parameters(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.0
            .iter()
            .map(|(dimension, value)| (dimension.name, value.as_str()))
    }

    /// The store's key of a snapshot of this slice (`tenant=search`), `None` for all traffic.
    pub fn store_key(&self) -> Option<String> {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(dimension, value)| format!("{}={}", dimension.name, value.as_str()))
            .collect();
        (!parts.is_empty()).then(|| parts.join("&"))
    }

    pub fn is_all(&self) -> bool {
        self.0.is_empty()
    }
}

impl PartialEq for Dimension {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Dimension {}

/// Names that come from requests (models, tenants), made one printable line for a document.
pub fn one_line(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
    if trimmed.is_empty() {
        "unknown".to_owned()
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_lists_its_values_in_the_dimensions_order_and_the_filter_selects_by_them() {
        let slice = TrafficSlice::of([
            (&PRIORITY, SliceValue::Named("10+")),
            (&TENANT, SliceValue::from("search")),
        ]);
        let listed: Vec<_> = slice.iter().map(|(d, v)| (d, v.as_str())).collect();
        assert_eq!(listed, [("tenant", "search"), ("priority", "10+")]);
        assert_eq!(slice.tenant(), Some("search"));
        assert!(TrafficSlice::of([]).is_empty());

        let mut filter = SliceFilter::default();
        assert!(filter.admits(&slice) && filter.admits(&TrafficSlice::default()));
        assert_eq!(filter.read_parameter("window", "1h"), Ok(false));
        assert_eq!(filter.read_parameter("priority", "12"), Ok(true));
        assert_eq!(filter.get("priority"), Some("10+"));
        assert!(filter.admits(&slice));
        filter.read_parameter("tenant", "chat").unwrap_or_default();
        assert!(!filter.admits(&slice));
        assert_eq!(
            filter.describe().as_deref(),
            Some("tenant chat, priority 10+")
        );
        assert_eq!(
            filter.store_key().as_deref(),
            Some("tenant=chat&priority=10+")
        );
        let error = filter.read_parameter("priority", "urgent").unwrap_err();
        assert!(
            error.contains("priority `urgent`") && error.contains("10+"),
            "{error}"
        );
    }
}
