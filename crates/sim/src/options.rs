//! What a simulator run is asked to be: the server it impersonates on the wire ([`Dialect`])
//! and the run-time options that are not part of a deployment's profile ([`SimOptions`]),
//! including the order its scheduler takes waiting requests in ([`QueueOrder`]).
//! A leaf: every other part of the simulator reads these, none is read here.

/// Which server the simulator impersonates on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dialect {
    /// sglang: headers at first token on OpenAI routes, `reasoning_content`, `sglang:` metrics.
    #[default]
    Sglang,
    /// vLLM: headers at once, `reasoning`, usage on every chunk with continuous stats,
    /// finish reason on the last content chunk, `vllm:` metrics with `cache_config_info`.
    Vllm,
}

/// Run-time options that are not part of the deployment's profile.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Seeds ids, output text, accept lengths and natural output lengths.
    pub seed: u64,
    pub dialect: Dialect,
    /// Overrides the profile's `served_model_name`.
    pub served_model_name: Option<String>,
    /// sglang `--enable-cache-report`: fill `prompt_tokens_details.cached_tokens`.
    pub enable_cache_report: bool,
    /// A vocabulary of this many ids: `/tokenize` answers ids below it, and a prompt with a
    /// larger id is refused as the engine refuses it (vLLM: status 200, then an error event).
    /// `None`: every id is valid.
    pub vocab_size: Option<u64>,
    /// sglang `--stream-response-default-include-usage`: every stream gets the final usage
    /// chunk, asked or not, and `/server_info` says so.
    pub stream_response_default_include_usage: bool,
    /// `/server_info` (`/get_server_info`) never answers, as sglang's does while its scheduler
    /// does not answer the tokenizer manager's internal-state request (a scheduler stuck in a
    /// long step; the conformance harness's fake scheduler never answers it).
    pub hang_server_info: bool,
    /// Present this engine version (`/server_info`, `/version`) instead of the profile's.
    pub engine_version: Option<String>,
    /// Extra or replaced server arguments in `/server_info` (`key`, value as JSON text, or a
    /// string if it is not JSON): another configuration of the same profile.
    pub server_args: Vec<(String, String)>,
    /// Every prefill and decode time multiplied by this (1.5: 1.5 times slower); 0 or 1: the
    /// profile's speed. Not shown anywhere: a slow node looks like any other.
    pub slowdown: f64,
    /// sglang `--enable-priority-scheduling`, vLLM `--scheduling-policy priority`: waiting
    /// requests are admitted by their `priority` field, in the dialect's direction
    /// ([`SimOptions::queue_order`]); off: first come first served, the field ignored.
    pub priority_scheduling: bool,
    /// sglang `--schedule-low-priority-values-first`: with `priority_scheduling`, smaller
    /// values go first instead of sglang's default larger-first. The vLLM dialect always
    /// takes smaller values first, so it ignores this.
    pub low_priority_values_first: bool,
    /// The engine's caps on its waiting queue (sglang `--max-queued-requests`, vLLM
    /// `--max-num-queued-reqs`/`--max-num-queued-tokens`): a request over one is refused with
    /// the engine's 503. Default: no cap, as in both engines.
    pub queue_caps: QueueCaps,
}

/// Caps on the scheduler's waiting queue (requests not yet admitted to run), checked when a
/// request arrives: over one, the request is shed (refused with 503) and never queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCaps {
    /// At most this many requests wait (sglang `--max-queued-requests`: a request arriving at
    /// a full queue is aborted with "The request queue is full."; vLLM `--max-num-queued-reqs`:
    /// `QueueOverflowError`).
    pub requests: Option<u64>,
    /// At most this many prompt tokens wait for prefill, the arriving request's included (vLLM
    /// `--max-num-queued-tokens`: `MaxQueuedTokensError`).
    pub tokens: Option<u64>,
    /// sglang under `--enable-priority-scheduling` (`_abort_on_queued_limit`): a request
    /// arriving at a full queue that is preferred to the least-preferred waiting one aborts
    /// that one instead ("The request is aborted by a higher priority request.") and is queued.
    /// Set by the server from the dialect and the scheduling flags.
    pub abort_least_preferred: bool,
}

/// Which cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedCause {
    /// [`QueueCaps::requests`].
    QueuedRequests,
    /// [`QueueCaps::tokens`].
    QueuedTokens,
    /// [`QueueCaps::abort_least_preferred`]: a waiting request aborted for a preferred one.
    PreferredArrival,
}

impl QueueCaps {
    /// Whether a request of `prompt_tokens` arriving at a queue of `waiting` requests holding
    /// `waiting_tokens` prompt tokens is shed, and by which cap.
    pub fn shed(&self, waiting: u64, waiting_tokens: u64, prompt_tokens: u64) -> Option<ShedCause> {
        if self.requests.is_some_and(|cap| waiting >= cap) {
            return Some(ShedCause::QueuedRequests);
        }
        if self
            .tokens
            .is_some_and(|cap| waiting_tokens.saturating_add(prompt_tokens) > cap)
        {
            return Some(ShedCause::QueuedTokens);
        }
        None
    }
}

/// The order the scheduler admits waiting requests in; ties always go by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// First come first served (both engines' default policy).
    #[default]
    Arrival,
    /// Larger `priority` values first (sglang's default priority scheduling).
    LargerFirst,
    /// Smaller `priority` values first (vLLM's priority policy; sglang with
    /// `--schedule-low-priority-values-first`).
    SmallerFirst,
}

impl SimOptions {
    /// The engine version the simulator presents.
    pub fn engine_version<'a>(&'a self, profile_version: &'a str) -> &'a str {
        self.engine_version.as_deref().unwrap_or(profile_version)
    }

    /// The order the scheduler admits waiting requests in under these options.
    pub fn queue_order(&self) -> QueueOrder {
        match (self.priority_scheduling, self.dialect) {
            (false, _) => QueueOrder::Arrival,
            (true, Dialect::Sglang) if self.low_priority_values_first => QueueOrder::SmallerFirst,
            (true, Dialect::Sglang) => QueueOrder::LargerFirst,
            (true, Dialect::Vllm) => QueueOrder::SmallerFirst,
        }
    }

    /// The priority a request waits with: its own `priority`, or the engine's default for a
    /// request without one. vLLM's default is 0. sglang gives such a request the extreme value
    /// that sorts it behind every request that named one (`-sys.maxsize - 1` larger-first,
    /// `sys.maxsize` smaller-first, in its scheduler's `_set_or_validate_priority`).
    pub fn request_priority(&self, requested: Option<i64>) -> i64 {
        match (requested, self.queue_order(), self.dialect) {
            (Some(priority), _, _) => priority,
            (None, QueueOrder::LargerFirst, Dialect::Sglang) => i64::MIN,
            (None, QueueOrder::SmallerFirst, Dialect::Sglang) => i64::MAX,
            (None, _, _) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dialect: Dialect, on: bool, low_first: bool) -> SimOptions {
        SimOptions {
            dialect,
            priority_scheduling: on,
            low_priority_values_first: low_first,
            ..SimOptions::default()
        }
    }

    #[test]
    fn a_full_queue_sheds_by_requests_then_by_tokens() {
        let none = QueueCaps::default();
        assert_eq!(none.shed(1_000, 1 << 40, 1 << 20), None);
        let caps = QueueCaps {
            requests: Some(2),
            tokens: Some(10_000),
            ..QueueCaps::default()
        };
        assert_eq!(caps.shed(1, 4_000, 6_000), None);
        assert_eq!(caps.shed(2, 0, 1), Some(ShedCause::QueuedRequests));
        assert_eq!(caps.shed(1, 4_000, 6_001), Some(ShedCause::QueuedTokens));
    }

    #[test]
    fn the_dialect_decides_the_direction_of_priority_scheduling() {
        assert_eq!(
            options(Dialect::Sglang, false, true).queue_order(),
            QueueOrder::Arrival
        );
        assert_eq!(
            options(Dialect::Vllm, false, false).queue_order(),
            QueueOrder::Arrival
        );
        assert_eq!(
            options(Dialect::Sglang, true, false).queue_order(),
            QueueOrder::LargerFirst
        );
        assert_eq!(
            options(Dialect::Sglang, true, true).queue_order(),
            QueueOrder::SmallerFirst
        );
        assert_eq!(
            options(Dialect::Vllm, true, true).queue_order(),
            QueueOrder::SmallerFirst
        );
    }

    #[test]
    fn a_request_without_priority_waits_as_the_engine_defaults_it() {
        // sglang: behind every request that named a priority, whichever the direction.
        assert_eq!(
            options(Dialect::Sglang, true, false).request_priority(None),
            i64::MIN
        );
        assert_eq!(
            options(Dialect::Sglang, true, true).request_priority(None),
            i64::MAX
        );
        // vLLM: 0.
        assert_eq!(
            options(Dialect::Vllm, true, false).request_priority(None),
            0
        );
        assert_eq!(
            options(Dialect::Vllm, true, false).request_priority(Some(-3)),
            -3
        );
    }
}
