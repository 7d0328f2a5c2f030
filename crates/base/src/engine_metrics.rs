//! The engine metric names tokentap reads from sglang's and vLLM's `/metrics` pages, spelled
//! once: the upstreams' scraper (`upstream_metrics::known`), the sweep's discovery and load
//! reads, and the demo all take them from here. Names only; what each means to tokentap (an
//! engine-neutral gauge, how series combine) is `upstream_metrics::known`'s business.

/// sglang's metrics.
pub mod sglang {
    /// Requests running (decoding or prefilling) now.
    pub const RUNNING: &str = "sglang:num_running_reqs";
    /// Requests waiting in the queue now.
    pub const QUEUED: &str = "sglang:num_queue_reqs";
    /// The KV cache's share in use (0–1).
    pub const TOKEN_USAGE: &str = "sglang:token_usage";
    /// The prefix cache's hit rate (0–1), a gauge.
    pub const CACHE_HIT_RATE: &str = "sglang:cache_hit_rate";
}

/// vLLM's metrics.
pub mod vllm {
    /// Requests running now.
    pub const RUNNING: &str = "vllm:num_requests_running";
    /// Requests waiting now.
    pub const WAITING: &str = "vllm:num_requests_waiting";
    /// The KV cache's share in use (a 0–1 share despite its name).
    pub const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
    /// The same in older versions.
    pub const GPU_CACHE_USAGE: &str = "vllm:gpu_cache_usage_perc";
    /// The prefix-cache counters (accepted with or without prometheus_client's `_total`).
    pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits";
    pub const PREFIX_CACHE_HITS_TOTAL: &str = "vllm:prefix_cache_hits_total";
    pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries";
    pub const PREFIX_CACHE_QUERIES_TOTAL: &str = "vllm:prefix_cache_queries_total";
    /// The info metric whose labels hold `num_gpu_blocks` and `block_size` (the KV budget).
    pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
}

/// Every engine's running and queued gauges: a server showing none of them above zero holds
/// no request.
pub const LOAD_GAUGES: [&str; 4] = [
    sglang::RUNNING,
    sglang::QUEUED,
    vllm::RUNNING,
    vllm::WAITING,
];
