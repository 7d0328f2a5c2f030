//! Simulator profiles: the plain data that describes one deployment (model, capacity,
//! prefill curve, decode grid, cache-hit TTFT grid), loaded from TOML or built in code,
//! and validated in one place ([`Profile::validate`]).
//!
//! This module owns the file format and its checks. It must not hold timing logic: the
//! performance model that reads a profile lives in `model.rs`.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The profiles shipped inside the binary, by name. Their sources are
/// `config/profiles/<name>.toml`, each calibrated from one seed page.
pub const BUILTIN_PROFILES: &[(&str, &str)] = &[
    (
        "glm-5.3-flash-nvfp4-4x-rtx-pro-6000",
        include_str!("../../../config/profiles/glm-5.3-flash-nvfp4-4x-rtx-pro-6000.toml"),
    ),
    (
        "step-3.7-flash-fp8-4x-rtx-pro-6000",
        include_str!("../../../config/profiles/step-3.7-flash-fp8-4x-rtx-pro-6000.toml"),
    ),
];

/// Why a profile could not be loaded or is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read profile file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("profile {origin} is not valid TOML for a simulator profile")]
    Parse {
        origin: String,
        #[source]
        source: toml::de::Error,
    },
    #[error(
        "no built-in profile named `{name}` and no such file (built-in profiles: {available})"
    )]
    Unknown { name: String, available: String },
    #[error("profile key `{key}`: {problem}")]
    Invalid { key: String, problem: String },
}

/// One simulated deployment. A plain data structure: build it in code (the matrix
/// importer does) or load it from TOML; either way call [`Profile::validate`] before use
/// ([`crate::serve`] does).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub model: ModelSection,
    #[serde(default)]
    pub labels: Labels,
    pub capacity: Capacity,
    pub prefill: PrefillCurve,
    pub decode: DecodeGrid,
    pub cached_ttft: CachedTtftGrid,
}

/// What the server says it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The `model` echoed in responses and listed by `/v1/models`.
    pub served_model_name: String,
    /// `model_path` in `/model_info` and `/server_info`.
    pub model_path: String,
    /// Maximum prompt + output tokens of one request (`max_model_len`, `context_length`).
    pub context_length: u64,
    /// Whether chat responses start with reasoning (`reasoning_content` / vLLM `reasoning`).
    #[serde(default)]
    pub reasoning: bool,
    /// How many leading output tokens of a chat response are reasoning when `reasoning` is on.
    #[serde(default = "default_reasoning_tokens")]
    pub reasoning_tokens: u32,
    /// Token id reported as `matched_stop` when a request ends on its end-of-sequence token.
    #[serde(default = "default_eos_token_id")]
    pub eos_token_id: u32,
    /// Mean output length (tokens) of a request that may stop on EOS (no `ignore_eos`).
    #[serde(default = "default_natural_output_tokens")]
    pub natural_output_tokens: u32,
}

fn default_reasoning_tokens() -> u32 {
    64
}
fn default_eos_token_id() -> u32 {
    2
}
fn default_natural_output_tokens() -> u32 {
    256
}

/// Labels for metadata endpoints and matrices; they change no timing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Labels {
    #[serde(default)]
    pub engine: String,
    #[serde(default)]
    pub engine_version: String,
    #[serde(default)]
    pub quantization: String,
    #[serde(default)]
    pub hardware: String,
    #[serde(default)]
    pub gpu_count: u32,
    #[serde(default)]
    pub speculative_algorithm: String,
    /// Where the numbers came from (a seed page, a matrix file).
    #[serde(default)]
    pub source: String,
}

/// Memory and batching limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capacity {
    /// KV cache size in tokens (`max_total_num_tokens`).
    pub kv_tokens: u64,
    /// Most requests admitted at once (prefilling, joining or decoding).
    pub max_running_requests: u32,
    /// Most prompt tokens prefilled in one scheduler step.
    pub chunked_prefill_size: u32,
    /// vLLM dialect only: KV block size reported in `vllm:cache_config_info`.
    #[serde(default = "default_kv_block_size")]
    pub kv_block_size: u32,
}

fn default_kv_block_size() -> u32 {
    16
}

/// Cold prefill throughput by prompt length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillCurve {
    /// Prompt lengths in tokens, ascending.
    pub contexts: Vec<u64>,
    /// Prefill throughput (prompt tokens per second) at each context.
    pub tok_s: Vec<f64>,
}

/// Decode speed by prompt context and batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeGrid {
    /// Mean tokens emitted per decode step and request (speculative decoding: > 1).
    pub tokens_per_step: f64,
    /// Per-step draws stay within `tokens_per_step ± accept_length_spread` (whole tokens).
    #[serde(default)]
    pub accept_length_spread: u32,
    /// Prompt contexts (tokens), ascending: the grid's rows.
    pub contexts: Vec<u64>,
    /// Running batch sizes, ascending: the grid's columns.
    pub batch_sizes: Vec<u32>,
    /// `per_request_tok_s[row][col]`: one stream's decode speed. Rows may be shorter than
    /// `batch_sizes` (cells over capacity or not measured); see `model.rs` for the fill rule.
    pub per_request_tok_s: Vec<Vec<f64>>,
}

/// TTFT of a request whose whole prompt is in the prompt cache, by context and by the
/// size of the batch it joins (itself included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachedTtftGrid {
    pub contexts: Vec<u64>,
    pub batch_sizes: Vec<u32>,
    /// `ms[row][col]`; rows may be shorter than `batch_sizes`.
    pub ms: Vec<Vec<f64>>,
}

impl Profile {
    /// The same deployment `factor` times slower: prefill and decode throughput divided by it,
    /// cached-prompt TTFT multiplied (so every prefill and decode time is `factor` times the
    /// profile's). A factor that is not finite and above 0 changes nothing.
    pub fn slowed(mut self, factor: f64) -> Self {
        if !(factor.is_finite() && factor > 0.0) || factor == 1.0 {
            return self;
        }
        self.prefill.tok_s.iter_mut().for_each(|v| *v /= factor);
        self.decode
            .per_request_tok_s
            .iter_mut()
            .flatten()
            .for_each(|v| *v /= factor);
        self.cached_ttft
            .ms
            .iter_mut()
            .flatten()
            .for_each(|v| *v *= factor);
        self
    }

    /// A built-in profile by name (see [`BUILTIN_PROFILES`]).
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let Some((_, text)) = BUILTIN_PROFILES.iter().find(|(n, _)| *n == name) else {
            return Err(ProfileError::Unknown {
                name: name.to_owned(),
                available: builtin_names(),
            });
        };
        Profile::from_toml_str(text, &format!("built-in `{name}`"))
    }

    /// A built-in profile by name, else a TOML file at that path.
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        if BUILTIN_PROFILES.iter().any(|(n, _)| *n == name_or_path) {
            return Profile::builtin(name_or_path);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(ProfileError::Unknown {
                name: name_or_path.to_owned(),
                available: builtin_names(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Profile::from_toml_str(&text, &path.display().to_string())
    }

    /// Parse and validate TOML text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Profile, ProfileError> {
        let profile: Profile = toml::from_str(text).map_err(|source| ProfileError::Parse {
            origin: origin.to_owned(),
            source,
        })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Every rule a profile must satisfy, checked in one place. Errors name the key.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let m = &self.model;
        require(
            !m.served_model_name.is_empty(),
            "model.served_model_name",
            "must not be empty",
        )?;
        require(
            m.context_length >= 16,
            "model.context_length",
            "must be at least 16 tokens",
        )?;
        require(
            m.natural_output_tokens >= 1,
            "model.natural_output_tokens",
            "must be at least 1",
        )?;
        let c = &self.capacity;
        require(
            c.kv_tokens >= 16,
            "capacity.kv_tokens",
            "must be at least 16",
        )?;
        require(
            c.max_running_requests >= 1,
            "capacity.max_running_requests",
            "must be at least 1",
        )?;
        require(
            c.chunked_prefill_size >= 1,
            "capacity.chunked_prefill_size",
            "must be at least 1",
        )?;
        require(
            c.kv_block_size >= 1,
            "capacity.kv_block_size",
            "must be at least 1",
        )?;

        let p = &self.prefill;
        check_axis_u64(&p.contexts, "prefill.contexts")?;
        require(
            p.tok_s.len() == p.contexts.len(),
            "prefill.tok_s",
            &format!(
                "has {} values but prefill.contexts has {}",
                p.tok_s.len(),
                p.contexts.len()
            ),
        )?;
        for (i, v) in p.tok_s.iter().enumerate() {
            check_positive(*v, &format!("prefill.tok_s[{i}]"))?;
        }

        let d = &self.decode;
        require(
            d.tokens_per_step.is_finite() && (1.0..=64.0).contains(&d.tokens_per_step),
            "decode.tokens_per_step",
            "must be between 1 and 64",
        )?;
        require(
            f64::from(d.accept_length_spread) < d.tokens_per_step,
            "decode.accept_length_spread",
            "must be below decode.tokens_per_step (every step emits at least one token)",
        )?;
        check_grid(
            &d.contexts,
            &d.batch_sizes,
            &d.per_request_tok_s,
            "decode",
            "per_request_tok_s",
        )?;
        let t = &self.cached_ttft;
        check_grid(&t.contexts, &t.batch_sizes, &t.ms, "cached_ttft", "ms")?;
        Ok(())
    }

    /// The TOML text of this profile (for `--print-profile` and round trips).
    pub fn to_toml_string(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }
}

fn builtin_names() -> String {
    BUILTIN_PROFILES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

fn require(ok: bool, key: &str, problem: &str) -> Result<(), ProfileError> {
    if ok {
        Ok(())
    } else {
        Err(ProfileError::Invalid {
            key: key.to_owned(),
            problem: problem.to_owned(),
        })
    }
}

fn check_positive(value: f64, key: &str) -> Result<(), ProfileError> {
    require(
        value.is_finite() && value > 0.0,
        key,
        &format!("must be a positive number, got {value}"),
    )
}

fn check_axis_u64(axis: &[u64], key: &str) -> Result<(), ProfileError> {
    require(!axis.is_empty(), key, "must not be empty")?;
    require(
        axis.iter().all(|v| *v >= 1),
        key,
        "values must be at least 1",
    )?;
    require(
        axis.windows(2).all(|w| w[0] < w[1]),
        key,
        "must be strictly ascending",
    )
}

fn check_grid(
    contexts: &[u64],
    batch_sizes: &[u32],
    rows: &[Vec<f64>],
    section: &str,
    values_key: &str,
) -> Result<(), ProfileError> {
    check_axis_u64(contexts, &format!("{section}.contexts"))?;
    let batches: Vec<u64> = batch_sizes.iter().map(|b| u64::from(*b)).collect();
    check_axis_u64(&batches, &format!("{section}.batch_sizes"))?;
    let key = format!("{section}.{values_key}");
    require(
        rows.len() == contexts.len(),
        &key,
        &format!(
            "has {} rows but {section}.contexts has {}",
            rows.len(),
            contexts.len()
        ),
    )?;
    for (r, row) in rows.iter().enumerate() {
        require(
            !row.is_empty(),
            &format!("{key}[{r}]"),
            "needs at least the batch-size-1 value",
        )?;
        require(
            row.len() <= batch_sizes.len(),
            &format!("{key}[{r}]"),
            &format!(
                "has {} values but {section}.batch_sizes has only {}",
                row.len(),
                batch_sizes.len()
            ),
        )?;
        for (c, v) in row.iter().enumerate() {
            check_positive(*v, &format!("{key}[{r}][{c}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_load_and_validate() {
        for (name, _) in BUILTIN_PROFILES {
            let profile = Profile::builtin(name).unwrap();
            assert!(profile.capacity.kv_tokens > 0, "{name}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let (_, text) = BUILTIN_PROFILES[0];
        let bad = text.replace("[capacity]", "[capacity]\nkv_tokenz = 3");
        let err = Profile::from_toml_str(&bad, "test").unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(chain.contains("kv_tokenz"), "{chain}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
        profile.decode.per_request_tok_s[1][0] = -1.0;
        let err = profile.validate().unwrap_err().to_string();
        assert!(err.contains("decode.per_request_tok_s[1][0]"), "{err}");
        let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
        profile.prefill.contexts = vec![8, 4];
        profile.prefill.tok_s = vec![1.0, 1.0];
        let err = profile.validate().unwrap_err().to_string();
        assert!(err.contains("prefill.contexts"), "{err}");
    }

    #[test]
    fn profile_round_trips_through_toml() {
        let profile = Profile::builtin(BUILTIN_PROFILES[1].0).unwrap();
        let text = profile.to_toml_string().unwrap();
        let back = Profile::from_toml_str(&text, "round trip").unwrap();
        assert_eq!(profile, back);
    }
}
