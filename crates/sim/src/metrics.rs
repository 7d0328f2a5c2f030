//! The simulator's `/metrics`: the dialect's server metrics as a table of (name, help, kind,
//! labels, value), rendered in the Prometheus text format. Names, help texts and values are
//! the servers' own: dashboards and scrapers written for sglang or vLLM read them unchanged.
use std::fmt::Write as _;

use http::StatusCode;

use super::error_body::Reply;
use super::json_out::push_json_str;
use super::options::Dialect;
use super::profile::Profile;
use super::scheduler::SchedulerStats;
use super::state::AppState;

/// The Prometheus text exposition format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a metric's value is read from.
struct Inputs<'a> {
    stats: SchedulerStats,
    profile: &'a Profile,
}

impl Inputs<'_> {
    /// Share of the prompt tokens found in the prefix cache, since the start.
    fn cache_hit_rate(&self) -> f64 {
        if self.stats.prompt_tokens_total == 0 {
            0.0
        } else {
            self.stats.cached_tokens_total as f64 / self.stats.prompt_tokens_total as f64
        }
    }

    /// Share of the KV pool in use.
    fn kv_usage(&self) -> f64 {
        self.stats.used_tokens as f64 / self.stats.kv_tokens.max(1) as f64
    }
}

/// Which label set a metric carries.
#[derive(Clone, Copy)]
enum Labels {
    /// The dialect's per-model labels.
    Model,
    /// vLLM's `cache_config_info` labels (the KV cache's configuration; the value is 1).
    CacheConfig,
}

/// One metric of the table.
struct Metric {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    labels: Labels,
    value: fn(&Inputs) -> f64,
}

const fn gauge(name: &'static str, help: &'static str, value: fn(&Inputs) -> f64) -> Metric {
    Metric {
        name,
        help,
        kind: "gauge",
        labels: Labels::Model,
        value,
    }
}

const fn counter(name: &'static str, help: &'static str, value: fn(&Inputs) -> f64) -> Metric {
    Metric {
        name,
        help,
        kind: "counter",
        labels: Labels::Model,
        value,
    }
}

/// sglang's metrics, in its order.
const SGLANG: &[Metric] = &[
    gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        |i| i.stats.running as f64,
    ),
    gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        |i| i.stats.queued as f64,
    ),
    gauge(
        "sglang:num_used_tokens",
        "The number of used tokens.",
        |i| i.stats.used_tokens as f64,
    ),
    gauge("sglang:token_usage", "The token usage.", |i| i.kv_usage()),
    gauge(
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        |i| i.profile.capacity.kv_tokens as f64,
    ),
    gauge("sglang:context_len", "The context length.", |i| {
        i.profile.model.context_length as f64
    }),
    gauge(
        "sglang:gen_throughput",
        "The generation throughput (token/s).",
        |i| i.stats.gen_throughput,
    ),
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", |i| {
        i.cache_hit_rate()
    }),
    gauge(
        "sglang:spec_accept_length",
        "The average acceptance length of speculative decoding.",
        |i| i.profile.decode.tokens_per_step,
    ),
    counter(
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        |i| i.stats.prompt_tokens_total as f64,
    ),
    counter(
        "sglang:generation_tokens_total",
        "Number of generation tokens processed.",
        |i| i.stats.generation_tokens_total as f64,
    ),
    counter(
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens.",
        |i| i.stats.cached_tokens_total as f64,
    ),
    counter(
        "sglang:num_requests_total",
        "Number of requests processed.",
        |i| i.stats.requests_total as f64,
    ),
    counter(
        "sglang:num_aborted_requests_total",
        "Number of requests aborted.",
        |i| i.stats.aborted_total as f64,
    ),
];

/// vLLM's metrics, in its order.
const VLLM: &[Metric] = &[
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        |i| i.stats.running as f64,
    ),
    gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        |i| i.stats.queued as f64,
    ),
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        |i| i.kv_usage(),
    ),
    counter(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        |i| i.stats.prompt_tokens_total as f64,
    ),
    counter(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        |i| i.stats.cached_tokens_total as f64,
    ),
    counter(
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        |i| i.stats.prompt_tokens_total as f64,
    ),
    counter(
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        |i| i.stats.generation_tokens_total as f64,
    ),
    Metric {
        name: "vllm:cache_config_info",
        help: "Information of the LLMEngine CacheConfig",
        kind: "gauge",
        labels: Labels::CacheConfig,
        value: |_| 1.0,
    },
];

/// `/metrics`.
pub fn metrics(state: &AppState) -> Reply {
    let inputs = Inputs {
        stats: *state.scheduler.stats.borrow(),
        profile: &state.profile,
    };
    let mut model_name = String::new();
    push_json_str(&mut model_name, state.served_model_name());
    let (table, model_labels) = match state.options.dialect {
        Dialect::Sglang => (
            SGLANG,
            format!("model_name={model_name},engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\""),
        ),
        Dialect::Vllm => (VLLM, format!("engine=\"0\",model_name={model_name}")),
    };
    let mut out = String::new();
    for metric in table {
        let labels = match metric.labels {
            Labels::Model => model_labels.clone(),
            Labels::CacheConfig => cache_config_labels(inputs.profile),
        };
        let value = (metric.value)(&inputs);
        let _ = writeln!(out, "# HELP {} {}", metric.name, metric.help);
        let _ = writeln!(out, "# TYPE {} {}", metric.name, metric.kind);
        let _ = writeln!(out, "{}{{{labels}}} {value:?}", metric.name);
    }
    queue_time_histogram(
        &mut out,
        state.options.dialect,
        &model_labels,
        &inputs.stats,
    );
    Reply {
        status: StatusCode::OK,
        content_type: CONTENT_TYPE,
        body: out,
    }
}

/// sglang's `queue_time_seconds` bucket bounds (its list, up to 1,800 s).
const SGLANG_QUEUE_BOUNDS: &[f64] = &[
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0,
    900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0,
];
/// vLLM's request-latency buckets (`REQUEST_LATENCY_BUCKETS`, up to 1,920 s).
const VLLM_QUEUE_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0,
];

/// The queue-time histogram under the dialect's name and buckets: what an operator's
/// queue-time panel reads first when TTFT rises.
fn queue_time_histogram(out: &mut String, dialect: Dialect, labels: &str, stats: &SchedulerStats) {
    let (name, help, bounds) = match dialect {
        Dialect::Sglang => (
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            SGLANG_QUEUE_BOUNDS,
        ),
        Dialect::Vllm => (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_QUEUE_BOUNDS,
        ),
    };
    let times = &stats.queue_time;
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", times.sum_s);
    for bound in bounds {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{bound:?}\"}} {:?}",
            times.at_most(*bound) as f64
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels},le=\"+Inf\"}} {:?}",
        times.count as f64
    );
    let _ = writeln!(out, "{name}_count{{{labels}}} {:?}", times.count as f64);
}

/// vLLM's `cache_config_info` labels: the KV pool in blocks of `kv_block_size` tokens.
fn cache_config_labels(profile: &Profile) -> String {
    let block = u64::from(profile.capacity.kv_block_size.max(1));
    let blocks = profile.capacity.kv_tokens / block;
    format!(
        "block_size=\"{block}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",kv_cache_size_tokens=\"{}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\"",
        blocks * block
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{QueueTimes, QUEUE_TIME_BOUNDS};

    #[test]
    fn each_dialects_buckets_are_whole_spans_and_cumulative() {
        for bound in SGLANG_QUEUE_BOUNDS.iter().chain(VLLM_QUEUE_BOUNDS) {
            assert!(QUEUE_TIME_BOUNDS.contains(bound), "{bound}");
        }
        let mut times = QueueTimes::default();
        for seconds in [0.0, 0.0004, 0.3, 0.31, 7.0, 5000.0] {
            times.add(seconds);
        }
        assert_eq!(times.at_most(0.0), 1);
        assert_eq!(times.at_most(0.001), 2);
        assert_eq!(times.at_most(0.3), 3);
        assert_eq!(times.at_most(0.5), 4);
        assert_eq!(times.at_most(10.0), 5);
        assert_eq!(times.at_most(1920.0), 5);
        assert_eq!(times.count, 6);
    }
}
