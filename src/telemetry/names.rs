//! Metric names, descriptions and which bucket bounds each histogram uses: declared once,
//! used everywhere. The bounds themselves belong to the meter (`meter::bounds`), which bins
//! per-request samples into them before any exporter sees them.
//!
//! Names live under `tokentap_` in base units (seconds, tokens, tokens per second).
//! Every histogram has explicit buckets (never summaries) so many replicas can be summed in
//! Prometheus and the fleet-wide matrix computed from the sums.

use crate::meter::bounds::{
    ACTIVE_BUCKETS, LATENCY_BUCKETS, OVERHEAD_BUCKETS, OVERLAP_COUNT_BUCKETS, RATE_BUCKETS,
    SHARE_BUCKETS, TOKENS_PER_EVENT_BUCKETS, TOKEN_COUNT_BUCKETS, TOKEN_GAP_BUCKETS,
};

pub const TIME_TO_FIRST_TOKEN: &str = "tokentap_time_to_first_token_seconds";
pub const TIME_TO_FIRST_ANSWER_TOKEN: &str = "tokentap_time_to_first_answer_token_seconds";
pub const TIME_TO_FIRST_TOOL_CALL: &str = "tokentap_time_to_first_tool_call_seconds";
pub const REASONING_TOKENS: &str = "tokentap_reasoning_tokens";
pub const TIME_BETWEEN_TOKENS: &str = "tokentap_time_between_tokens_seconds";
pub const INTER_TOKEN_LATENCY: &str = "tokentap_inter_token_latency_seconds";
pub const REQUEST_DURATION: &str = "tokentap_request_duration_seconds";
pub const PREFILL_TOKENS_PER_SECOND: &str = "tokentap_prefill_tokens_per_second";
pub const PER_REQUEST_TOKENS_PER_SECOND: &str = "tokentap_request_tokens_per_second";
pub const PROMPT_TOKENS: &str = "tokentap_prompt_tokens";
pub const COMPLETION_TOKENS: &str = "tokentap_completion_tokens";
pub const TOKENS_PER_EVENT: &str = "tokentap_tokens_per_event";
pub const PROXY_OVERHEAD: &str = "tokentap_proxy_overhead_seconds";
pub const REQUESTS_TOTAL: &str = "tokentap_requests_total";
pub const TOKENS_TOTAL: &str = "tokentap_tokens_total";
pub const DECODE_SECONDS: &str = "tokentap_decode_seconds";
pub const AVERAGE_ACTIVE_REQUESTS: &str = "tokentap_average_active_requests";
pub const INFLIGHT_REQUESTS: &str = "tokentap_inflight_requests";
pub const PREFILL_OVERLAP: &str = "tokentap_prefill_overlap_ratio";
pub const OVERLAPPING_PREFILLS: &str = "tokentap_overlapping_prefills";
pub const PREFILL_BUSY_SECONDS: &str = "tokentap_prefill_busy_seconds";
pub const FAULTS_TOTAL: &str = "tokentap_faults_total";
pub const CLAMPED_COUNTS_TOTAL: &str = "tokentap_clamped_token_counts_total";
pub const WORKLOAD_ROWS_LOST_TOTAL: &str = "tokentap_workload_rows_lost_total";
pub const WORKLOAD_EXPORTS_REFUSED_TOTAL: &str = "tokentap_workload_exports_refused_total";
pub const METRICS_SERIES: &str = "tokentap_metrics_series";
pub const METRICS_SERIES_BUDGET: &str = "tokentap_metrics_series_budget";
pub const METRICS_SERIES_DROPPED_TOTAL: &str = "tokentap_metrics_series_dropped_total";
pub const SLO_REQUESTS_TOTAL: &str = "tokentap_slo_requests_total";
pub const SLO_GOODPUT_TOKENS_TOTAL: &str = "tokentap_slo_goodput_tokens_total";
pub const SLO_HEADER_INVALID_TOTAL: &str = "tokentap_slo_header_invalid_total";
pub const UPSTREAM_RUNNING_REQUESTS: &str = "tokentap_upstream_running_requests";
pub const UPSTREAM_QUEUED_REQUESTS: &str = "tokentap_upstream_queued_requests";
pub const UPSTREAM_KV_CACHE_USAGE: &str = "tokentap_upstream_kv_cache_usage_ratio";
pub const UPSTREAM_PREFIX_CACHE_HIT_RATE: &str = "tokentap_upstream_prefix_cache_hit_ratio";
pub const UPSTREAM_SCRAPES_TOTAL: &str = "tokentap_upstream_scrapes_total";
pub const ADMIN_LOGIN_FAILURES_TOTAL: &str = "tokentap_admin_login_failures_total";

/// (name, description) of the upstream-state gauges, in
/// [`ServerGauge::ALL`](crate::meter::server_state::ServerGauge::ALL) order. They are written
/// straight from the latest scrape (a gauge the server did not expose has no sample).
pub const UPSTREAM_STATE_GAUGES: [(&str, &str); 4] = [
    (UPSTREAM_RUNNING_REQUESTS, "Requests the upstream server reports running (sglang num_running_reqs, vLLM num_requests_running), at the latest scrape of its /metrics."),
    (UPSTREAM_QUEUED_REQUESTS, "Requests the upstream server reports waiting for a place in its batch (sglang num_queue_reqs, vLLM num_requests_waiting), at the latest scrape."),
    (UPSTREAM_KV_CACHE_USAGE, "Share (0-1) of the upstream server's KV cache in use (sglang token_usage, vLLM kv_cache_usage_perc), at the latest scrape."),
    (UPSTREAM_PREFIX_CACHE_HIT_RATE, "Share (0-1) of prompt tokens found in the upstream server's prefix cache (sglang cache_hit_rate; vLLM prefix_cache_hits / prefix_cache_queries increments between the latest two scrapes)."),
];
/// Written as text from `meter::identity` (kept configurations come and go), so not in
/// [`DESCRIPTIONS`].
pub const SESSIONS: &str = "tokentap_sessions";
pub const SESSIONS_HELP: &str = "Sessions the session table keeps now ([sessions] max_sessions bounds it; docs/metrics.md, \"Sessions and turns\").";
pub const SESSION_TURNS_TOTAL: &str = "tokentap_session_turns_total";
pub const SESSION_TURNS_HELP: &str = "Production turns by what came before them (after: first, user, tool, overlap) and, for user and tool turns, the gap from the previous turn's end to this turn's start (gap: the bin's upper bound; none for first and overlap turns).";
pub const SESSION_PROMPT_TOKENS_TOTAL: &str = "tokentap_session_prompt_tokens_total";
pub const SESSION_PROMPT_TOKENS_HELP: &str = "Prompt tokens of user and tool turns whose usage counted them, by end-to-start gap bin: the denominator of the KV-retention curve.";
pub const SESSION_CACHED_TOKENS_TOTAL: &str = "tokentap_session_cached_tokens_total";
pub const SESSION_CACHED_TOKENS_HELP: &str = "Of those prompt tokens, what the engine reported cached (usage), by gap bin: the realized share is this over tokentap_session_prompt_tokens_total.";
pub const SESSION_SHARED_TOKENS_TOTAL: &str = "tokentap_session_shared_tokens_total";
pub const SESSION_SHARED_TOKENS_HELP: &str = "Of those prompt tokens, the ones the session's previous turn had already sent (the most a prefix cache could have kept), by gap bin: the theoretical share is this over tokentap_session_prompt_tokens_total.";
pub const UPSTREAM_CONFIG_INFO: &str = "tokentap_upstream_config_info";
pub const UPSTREAM_CONFIG_INFO_HELP: &str = "A configuration (fingerprint) the upstream ran, always 1: the current one and at most three before it per upstream (docs/fleet.md lists the fields the fingerprint covers). The per-cell series carry the same fingerprint label.";
pub const UPSTREAM_CONFIG_CHANGES_TOTAL: &str = "tokentap_upstream_config_changes_total";
pub const UPSTREAM_CONFIG_CHANGES_HELP: &str = "Times the upstream's configuration fingerprint changed since start (the first read is not a change).";
pub const UPSTREAM_CONFIG_FLAPPING: &str = "tokentap_upstream_config_flapping";
pub const UPSTREAM_CONFIG_FLAPPING_HELP: &str = "1 while the upstream's fingerprint changes more than 6 times an hour: its requests are labelled fingerprint=\"flapping\" and no new configuration is kept until an hour passes with at most 6 changes.";
pub const UPSTREAM_UNCLASSIFIED_ROUTES: &str = "tokentap_upstream_unclassified_routes";
pub const UPSTREAM_UNCLASSIFIED_ROUTES_HELP: &str = "Routes the upstream publishes (its /openapi.json) that no route table of tokentap classifies, at its latest read: the data port refuses them unless proxy.routes opens them; the start-up log and /status name them. No sample while the upstream publishes no route list.";
pub const UPSTREAM_SCRAPES_HELP: &str = "Reads of an upstream's /metrics page by result: ok, unreachable, status (not 200), timeout, too_large, unreadable (not text, or no metric tokentap knows).";

/// Written by `telemetry::drift` itself rather than the exporter (a cell's series must vanish
/// when it falls below the request threshold), so it is not in [`DESCRIPTIONS`].
pub const CAPACITY_HEADROOM: &str = "tokentap_capacity_headroom_ratio";
pub const CAPACITY_HEADROOM_HELP: &str = "Live headroom under the [slo] targets: 1 - production load / capacity of the traffic's context mix over capacity.window (1 idle, 0 at the boundary, below 0 past it); capacity from the latest sweep of the model, else its pinned reference (docs/capacity.md); lower_bound=\"true\": some context's capacity is only a lower bound, so the headroom is at least this.";
pub const CAPACITY_LOAD: &str = "tokentap_capacity_load_streams";
pub const CAPACITY_LOAD_HELP: &str =
    "Production requests decoding at once, averaged over capacity.window, every context.";
pub const CAPACITY_RUNNING: &str = "tokentap_capacity_running_streams";
pub const CAPACITY_RUNNING_HELP: &str = "Requests of the model in flight through this proxy now (production and synthetic), beside tokentap_capacity_load_streams, the window's mean.";
pub const CAPACITY_BASIS: &str = "tokentap_capacity_headroom_basis";
pub const CAPACITY_BASIS_HELP: &str = "1 for what the model's headroom rests on: rests_on=\"production_misses\" (production's cells with evidence miss the [slo] objective, or the engine sheds more requests than its error budget allows: no headroom, whatever the sweep says), \"sweep_and_production\" (the sweep's boundary, production's cells with evidence meet the objective) or \"sweep_warm_prompts\" (the sweep alone, on warm prompts: some context has no production cell with evidence).";
pub const CAPACITY_ATTAINMENT: &str = "tokentap_capacity_production_attainment_ratio";
pub const CAPACITY_ATTAINMENT_HELP: &str = "SLO attainment (0-1) of each context's worst production cell with evidence over capacity.window, the cell named by context_bucket and concurrency_bucket; target: the targets it misses (ttft, tbt, e2e; every target where it meets). Below tokentap_capacity_objective_ratio the context has no headroom.";
pub const CAPACITY_OBJECTIVE: &str = "tokentap_capacity_objective_ratio";
pub const CAPACITY_OBJECTIVE_HELP: &str =
    "The [slo] objective (0-1) production's cells are held to for the model's headroom.";
pub const CAPACITY_STREAMS: &str = "tokentap_capacity_streams";
pub const CAPACITY_STREAMS_HELP: &str = "Streams a context can take under the [slo] targets (the capacity boundary), from the latest sweep of the model, else its pinned reference; lower_bound=\"true\": no measured cell missed, the context takes at least this many.";
pub const DRIFT_RATIO: &str = "tokentap_drift_ratio";
pub const DRIFT_RATIO_HELP: &str = "Per cell in drift.window that meets the evidence rule: production / pinned reference of per-request tokens per second (metric=\"per_request_tok_s\", below 1 is slower; the cell's measured time and output tokens) or of median time to first token (metric=\"ttft\", above 1 is slower; at least evidence.min_requests completed requests, warm TTFT where the server reports cached tokens).";

/// The latest sweep's gauges (`telemetry::sweep`), written as text at each scrape like the
/// drift ratio, so not in [`DESCRIPTIONS`].
pub const SWEEP_INFO: &str = "tokentap_sweep_info";
pub const SWEEP_INFO_HELP: &str = "The latest synthetic sweep whose cells tokentap_sweep_cell_* show: its model and id; the value is when it ended, in Unix seconds (0 when unknown).";
pub const SWEEP_CELL_TOTAL_TOKENS_PER_SECOND: &str = "tokentap_sweep_cell_total_tokens_per_second";
pub const SWEEP_CELL_REQUEST_TOKENS_PER_SECOND: &str =
    "tokentap_sweep_cell_request_tokens_per_second";
pub const SWEEP_CELL_TIME_TO_FIRST_TOKEN: &str = "tokentap_sweep_cell_time_to_first_token_seconds";
pub const SWEEP_CELL_TIME_BETWEEN_TOKENS: &str = "tokentap_sweep_cell_time_between_tokens_seconds";

/// (name, unit-bearing description) of every metric, for `# HELP` lines.
pub const DESCRIPTIONS: &[(&str, &str)] = &[
    (TIME_TO_FIRST_TOKEN, "Time from request head in to the first event carrying generated output, in seconds."),
    (TIME_TO_FIRST_ANSWER_TOKEN, "Time from request head in to the first answer token (content, after any reasoning), in seconds."),
    (TIME_TO_FIRST_TOOL_CALL, "Time from request head in to the first tool-call delta, in seconds."),
    (REASONING_TOKENS, "Reasoning tokens per request (usage completion_tokens_details.reasoning_tokens), when the server reports them."),
    (TIME_BETWEEN_TOKENS, "Per request (last token - first token) / (completion tokens - 1), in seconds."),
    (INTER_TOKEN_LATENCY, "Gap between token events divided over the tokens of each event, in seconds (weighted by tokens)."),
    (REQUEST_DURATION, "Time from request head in to the end of the response, in seconds."),
    (PREFILL_TOKENS_PER_SECOND, "(prompt tokens - cached tokens) / time to first token, in tokens per second."),
    (PER_REQUEST_TOKENS_PER_SECOND, "Per request 1 / time between tokens, in tokens per second."),
    (PROMPT_TOKENS, "Prompt tokens per request, from the upstream's usage."),
    (COMPLETION_TOKENS, "Completion tokens per request, from the upstream's usage (estimated when absent)."),
    (TOKENS_PER_EVENT, "Completion tokens per output event (above 1 with speculative decoding)."),
    (PROXY_OVERHEAD, "Time spent inside tokentap, in seconds: phase=request (head in to upstream send) or phase=frame (per forwarded frame)."),
    (REQUESTS_TOTAL, "Metered requests by outcome."),
    (TOKENS_TOTAL, "Tokens by type (prompt, cached, completion)."),
    (DECODE_SECONDS, "Decode time (first to last token) of each request, split by the concurrency bucket in force when each token event arrived, in seconds; its _sum is request-seconds of decode per cell."),
    (AVERAGE_ACTIVE_REQUESTS, "Per request, the time-weighted mean number of in-flight requests (same upstream and model) during its decode."),
    (INFLIGHT_REQUESTS, "Metered requests in flight."),
    (PREFILL_OVERLAP, "Per request, the share (0-1) of its decode (first to last token) during which another request to the same upstream and model was in prefill (head in to first token)."),
    (OVERLAPPING_PREFILLS, "Per request, the number of other requests' prefills that overlapped its decode."),
    (SLO_REQUESTS_TOTAL, "Requests with SLO targets (configured per model or from the x-tokentap-slo header) by verdict: met (every target met) or missed; counted at the request's own cell. met / (met + missed) is the matrix's SLO attainment."),
    (SLO_GOODPUT_TOKENS_TOTAL, "Completion tokens of requests that met their SLO targets, split by concurrency bucket like tokentap_tokens_total{type=\"completion\"}; its rate is the matrix's goodput."),
    (SLO_HEADER_INVALID_TOTAL, "Requests whose x-tokentap-slo header could not be read; it was ignored and the configured targets applied."),
    (PREFILL_BUSY_SECONDS, "Decode time during which another request was in prefill, split by concurrency bucket like tokentap_decode_seconds, in seconds; its _sum divided by tokentap_decode_seconds_sum is the matrix's Prefill overlap."),
    (FAULTS_TOTAL, "Faults tokentap cut short, by listener and fault (header_timeout, body_idle_timeout, body_read_timeout, upstream_timeout, upstream_stalled, connection_limit, accept_backoff, send_stalled, idle_closed, upstream_connection_limit); docs/operations.md."),
    (ADMIN_LOGIN_FAILURES_TOTAL, "Failed browser logins on the admin listener (POST /login) by reason: bad_token (the token given was wrong) or throttled (the address was still waiting after earlier failures; the token was not checked)."),
    (WORKLOAD_ROWS_LOST_TOTAL, "Workload capture rows lost, by reason: writer_behind (the writer's queue was full) or store_failed (a batch the store could not write; the log names the cause)."),
    (WORKLOAD_EXPORTS_REFUSED_TOTAL, "GET /workload exports refused (503) because workload.max_exports were already running."),
    (METRICS_SERIES, "Series tokentap's own metrics hold on this page, counted against telemetry.max_series (docs/operations.md, Metrics)."),
    (METRICS_SERIES_BUDGET, "The series budget, telemetry.max_series."),
    (METRICS_SERIES_DROPPED_TOTAL, "Series left off this page because the budget was spent, by what: cell_detail (a cell's series past its core ones), cell (a whole cell), base (per model, upstream, route and source) or slo (a cell's SLO series); each series counted once, when first refused."),
    (CLAMPED_COUNTS_TOTAL, "Requests with a token count from the upstream that no real server could send, clamped (their records are approximate)."),
];

/// The buckets of every histogram.
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (TIME_TO_FIRST_TOKEN, &LATENCY_BUCKETS),
    (TIME_TO_FIRST_ANSWER_TOKEN, &LATENCY_BUCKETS),
    (TIME_TO_FIRST_TOOL_CALL, &LATENCY_BUCKETS),
    (REASONING_TOKENS, &TOKEN_COUNT_BUCKETS),
    (REQUEST_DURATION, &LATENCY_BUCKETS),
    (TIME_BETWEEN_TOKENS, &TOKEN_GAP_BUCKETS),
    (INTER_TOKEN_LATENCY, &TOKEN_GAP_BUCKETS),
    (PREFILL_TOKENS_PER_SECOND, &RATE_BUCKETS),
    (PER_REQUEST_TOKENS_PER_SECOND, &RATE_BUCKETS),
    (PROMPT_TOKENS, &TOKEN_COUNT_BUCKETS),
    (COMPLETION_TOKENS, &TOKEN_COUNT_BUCKETS),
    (TOKENS_PER_EVENT, &TOKENS_PER_EVENT_BUCKETS),
    (PROXY_OVERHEAD, &OVERHEAD_BUCKETS),
    (DECODE_SECONDS, &LATENCY_BUCKETS),
    (AVERAGE_ACTIVE_REQUESTS, &ACTIVE_BUCKETS),
    (PREFILL_OVERLAP, &SHARE_BUCKETS),
    (OVERLAPPING_PREFILLS, &OVERLAP_COUNT_BUCKETS),
    (PREFILL_BUSY_SECONDS, &LATENCY_BUCKETS),
];

/// Escapes a label value as the text exposition format requires (`\\`, `"` and newlines);
/// model names come from request bodies.
pub fn label_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
    out
}
