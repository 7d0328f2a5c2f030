//! Prometheus exposition through `metrics-exporter-prometheus`, one file per job: the sink and
//! its text exposition (`sink`), what a finished request adds (`record`), the series budget
//! (`budget`, `telemetry.max_series`), the label sets' keys (`keys`) and their cached exporter
//! handles (`handles`), tokentap's own bucket-counter histograms behind those handles
//! (`histograms`), outside counts copied in at each render (`watched`), the series written as
//! text (`render`) and the flush of a request's own histograms (`flush`).

mod budget;
mod flush;
mod handles;
mod histograms;
mod keys;
mod record;
mod render;
mod sink;
mod watched;

pub use budget::{
    histogram_series, Dropped, SeriesBudget, CELL_CORE_HISTOGRAMS, CELL_DETAIL_HISTOGRAMS,
    DEFAULT_MAX_SERIES,
};
pub use sink::PrometheusMetrics;
