//! What every connection of one simulator shares: the profile, the run options, the handle to
//! the scheduler task, and the request counter. Read-only apart from the counter; request
//! tasks reach the scheduler only through its channels.
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::model::{mix_seed, SplitMix64};
use super::options::SimOptions;
use super::profile::Profile;
use super::scheduler::SchedulerHandle;

/// sglang refuses a prompt that leaves fewer than this many tokens of the KV pool (or the
/// context) free: `max_req_input_len` is the smaller of the two minus this margin.
const INPUT_LENGTH_MARGIN: u64 = 5;

/// State shared by every connection.
#[derive(Debug)]
pub struct AppState {
    pub profile: Arc<Profile>,
    pub options: SimOptions,
    pub scheduler: SchedulerHandle,
    /// Numbers requests: the scheduler's id, and the seed of generated ids.
    pub next_request: AtomicU64,
    /// When the server started (`created` of `/v1/models`).
    pub started_unix: u64,
    /// vLLM's `system_fingerprint`.
    pub fingerprint: String,
}

impl AppState {
    /// The model name the server answers to (`--served-model-name`, else the profile's).
    pub fn served_model_name(&self) -> &str {
        self.options
            .served_model_name
            .as_deref()
            .unwrap_or(&self.profile.model.served_model_name)
    }

    /// sglang's `max_req_input_len`: the longest prompt it admits.
    pub fn max_request_input_tokens(&self) -> u64 {
        self.profile
            .capacity
            .kv_tokens
            .min(self.profile.model.context_length)
            .saturating_sub(INPUT_LENGTH_MARGIN)
    }

    /// `chars` lowercase hex digits drawn from the run's seed and `counter`: request ids
    /// repeat across runs with the same seed.
    pub fn hex_id(&self, counter: u64, chars: usize) -> String {
        let mut rng = SplitMix64::new(mix_seed(self.options.seed, counter));
        let mut out = String::with_capacity(chars);
        while out.len() < chars {
            out.push_str(&format!("{:016x}", rng.next_u64()));
        }
        out.truncate(chars);
        out
    }
}
