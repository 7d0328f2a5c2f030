//! What a simulator run is asked to be: the server it impersonates on the wire ([`Dialect`])
//! and the run-time options that are not part of a deployment's profile ([`SimOptions`]).
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
}

impl SimOptions {
    /// The engine version the simulator presents.
    pub fn engine_version<'a>(&'a self, profile_version: &'a str) -> &'a str {
        self.engine_version.as_deref().unwrap_or(profile_version)
    }
}
