//! `simulate --from-matrix`: builds a simulator [`Profile`] from a speed-test matrix (a seed
//! page or tokentap's JSON/Markdown), so a published page becomes a server that a sweep can
//! measure again.
//!
//! What is read and what is inferred (docs/simulator.md, "Profiles from a matrix"):
//! * prefill curve: the Valid prefill rows' prompt tok/s (or context ÷ TTFT when only TTFT is
//!   given);
//! * decode grid: the Valid decode cells' per-request tok/s; cached-TTFT grid: their TTFT;
//!   gaps inside a row are interpolated, a row's missing leading columns are scaled from the
//!   nearest row that has them, and trailing cells are left to `model.rs`'s fill rule;
//! * KV budget: the midpoint of the bracket the Valid / Over capacity boundary implies
//!   ([`tokentap_matrix::infer::kv_budget`]);
//! * context length, model path, reasoning, speculative decoding, chunked prefill and block size
//!   from the launch command when it says so, else inferred or defaulted;
//! * tokens per event: the caller's value, else [`SPECULATIVE_TOKENS_PER_EVENT`] when the launch
//!   command enables speculative decoding, else 1.
//!
//! Pure: a document in, a validated profile out. It must not read files (the CLI does) and must
//! not hold timing logic (`model.rs` interprets the profile).
use std::collections::BTreeSet;

use tokentap_matrix::infer::{self, InferError, DEFAULT_MAX_OUTPUT_TOKENS};
use tokentap_matrix::{CellStatus, MatrixDoc};

use super::profile::{
    CachedTtftGrid, Capacity, DecodeGrid, Labels, ModelSection, PrefillCurve, Profile, ProfileError,
};

/// Mean tokens per decode step assumed when the launch command enables speculative decoding
/// and the caller gives no `--tokens-per-event`: about what the seed tool reports for DFlash
/// and EAGLE-style drafts (an accept length near 2 plus the bonus token). A matrix does not
/// record it, and it changes only how many tokens each SSE event carries, never the speed.
pub const SPECULATIVE_TOKENS_PER_EVENT: f64 = 3.0;

/// sglang's default `--chunked-prefill-size` on large GPUs, used when the launch command does
/// not set one.
pub const DEFAULT_CHUNKED_PREFILL_SIZE: u32 = 16_384;

/// Served model name when the matrix names no model at all.
pub const FALLBACK_MODEL_NAME: &str = "tokentap-simulated";

/// Choices the matrix cannot make.
#[derive(Debug, Clone, Default)]
pub struct FromMatrixOptions {
    /// Mean tokens per decode step and stream; `None` = infer from the launch command.
    pub tokens_per_event: Option<f64>,
    /// Where the matrix came from (a path), recorded as `labels.source`.
    pub origin: String,
}

/// Why a matrix cannot become a profile. Each names what is missing or inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum FromMatrixError {
    #[error("the matrix has no Valid decode cell with a per-request tok/s figure, so there is no decode speed to simulate")]
    NoDecodeCells,
    #[error("the matrix has no Valid prefill row with prompt tok/s or TTFT, so there is no prefill speed to simulate")]
    NoPrefillRows,
    #[error("the matrix's Over capacity statuses do not imply one KV budget")]
    KvBudget(#[source] InferError),
    #[error("tokens per event must be a number between 1 and 64, got {0}")]
    TokensPerEvent(f64),
    #[error("the profile built from the matrix is not valid")]
    Invalid(#[source] ProfileError),
}

/// What [`Profile::from_matrix`] inferred, for `--print-profile` comments and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct Inference {
    /// `at_least ≤ KV < below` as the statuses imply it.
    pub kv_at_least_tokens: u64,
    pub kv_below_tokens: Option<u64>,
    /// The launch command gave the context length (else it was inferred from the cells).
    pub context_length_from_launch: bool,
    /// Tokens per event came from the caller (else from the launch command rule).
    pub tokens_per_event_given: bool,
}

impl Inference {
    /// TOML comment lines saying where the inferred numbers came from (for `--print-profile`).
    pub fn toml_comment(&self, profile: &Profile) -> String {
        let below = self.kv_below_tokens.map_or_else(
            || "no cell was Over capacity".to_owned(),
            |b| format!("< {b}"),
        );
        format!(
            "# Simulator profile inferred from the matrix {} by `tokentap simulate --from-matrix`.\n\
             # capacity.kv_tokens: the statuses bound the KV budget to >= {} and {}; this is the midpoint.\n\
             # model.context_length: {}.\n\
             # decode.tokens_per_step: {}.\n\n",
            if profile.labels.source.is_empty() { "(unnamed)" } else { &profile.labels.source },
            self.kv_at_least_tokens,
            below,
            if self.context_length_from_launch {
                "from the launch command"
            } else {
                "inferred: the largest prefill context or top decode context + max output + 1024"
            },
            if self.tokens_per_event_given {
                "given by --tokens-per-event"
            } else if profile.labels.speculative_algorithm.is_empty() {
                "1 (no speculative decoding in the launch command)"
            } else {
                "3 (the launch command enables speculative decoding; --tokens-per-event overrides)"
            },
        )
    }
}

impl Profile {
    /// A validated profile that reproduces `doc`'s Valid cells and statuses (see the module
    /// documentation for every inference and default).
    pub fn from_matrix(
        doc: &MatrixDoc,
        options: &FromMatrixOptions,
    ) -> Result<Profile, FromMatrixError> {
        profile_from_matrix(doc, options).map(|(profile, _)| profile)
    }
}

/// [`Profile::from_matrix`] plus what was inferred.
pub fn profile_from_matrix(
    doc: &MatrixDoc,
    options: &FromMatrixOptions,
) -> Result<(Profile, Inference), FromMatrixError> {
    let launch = LaunchCommand::new(doc.metadata.launch_command.as_deref().unwrap_or(""));
    let max_output = doc
        .metadata
        .run
        .max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);

    let prefill = prefill_curve(doc)?;
    let (decode_contexts, batch_sizes, per_request) = grid(doc, |cell| cell.per_request_tok_s);
    if decode_contexts.is_empty() {
        return Err(FromMatrixError::NoDecodeCells);
    }
    let (ttft_contexts, ttft_batches, ttft_ms) = grid(doc, |cell| cell.ttft_ms);
    let cached_ttft = if ttft_contexts.is_empty() {
        // No TTFT anywhere: a cache hit costs one decode step at the smallest context.
        let step_ms = 1000.0 / per_request[0][0];
        CachedTtftGrid {
            contexts: vec![decode_contexts[0]],
            batch_sizes: vec![1],
            ms: vec![vec![step_ms]],
        }
    } else {
        CachedTtftGrid {
            contexts: ttft_contexts,
            batch_sizes: ttft_batches,
            ms: ttft_ms,
        }
    };

    let tokens_per_step = match options.tokens_per_event {
        Some(value) if value.is_finite() && (1.0..=64.0).contains(&value) => value,
        Some(value) => return Err(FromMatrixError::TokensPerEvent(value)),
        None if launch.speculative_algorithm().is_some() => SPECULATIVE_TOKENS_PER_EVENT,
        None => 1.0,
    };

    let budget = infer::kv_budget(doc).map_err(FromMatrixError::KvBudget)?;
    let needed_context = doc
        .decode
        .iter()
        .filter(|cell| cell.status.is_valid())
        .map(|cell| {
            cell.context_tokens
                .saturating_add(max_output)
                .saturating_add(1)
        })
        .max()
        .unwrap_or(0);
    let launch_context = launch
        .value(&["--context-length", "--max-model-len"])
        .and_then(|v| v.parse::<u64>().ok());
    let context_length = launch_context
        .or_else(|| infer::context_length(doc))
        .unwrap_or(needed_context)
        .max(needed_context)
        .max(16);
    let mut kv_tokens = budget.estimate_tokens();
    if budget.at_least_tokens == 0 {
        // Nothing ran: any budget explains the statuses; allow one full-length request.
        kv_tokens = budget
            .below_tokens
            .map_or(context_length, |below| below.saturating_sub(1))
            .max(16);
    }
    let max_running_requests = doc
        .decode
        .iter()
        .map(|cell| cell.concurrency)
        .max()
        .unwrap_or(1)
        .max(1);

    let metadata = &doc.metadata;
    let served_model_name = metadata
        .model
        .served_model
        .clone()
        .or_else(|| launch.value(&["--served-model-name"]).map(str::to_owned))
        .or_else(|| metadata.model.title_name().map(str::to_owned))
        .unwrap_or_else(|| FALLBACK_MODEL_NAME.to_owned());
    let model_path = metadata
        .model
        .model_path
        .clone()
        .or_else(|| {
            launch
                .value(&["--model-path", "--model"])
                .map(str::to_owned)
        })
        .or_else(|| launch.positional_after("serve").map(str::to_owned))
        .unwrap_or_else(|| served_model_name.clone());

    let profile = Profile {
        model: ModelSection {
            served_model_name,
            model_path,
            context_length,
            reasoning: launch.value(&["--reasoning-parser"]).is_some(),
            reasoning_tokens: 64,
            eos_token_id: 2,
            natural_output_tokens: 256,
        },
        labels: Labels {
            engine: metadata.engine.name.clone().unwrap_or_default(),
            engine_version: metadata.engine.version.clone().unwrap_or_default(),
            quantization: metadata.engine.quantization.clone().unwrap_or_default(),
            hardware: metadata.hardware.summary().unwrap_or_default(),
            gpu_count: metadata.hardware.gpu_count.unwrap_or(0),
            speculative_algorithm: launch.speculative_algorithm().unwrap_or_default(),
            source: options.origin.clone(),
        },
        capacity: Capacity {
            kv_tokens,
            max_running_requests,
            chunked_prefill_size: launch
                .value(&["--chunked-prefill-size", "--max-num-batched-tokens"])
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|v| *v >= 1)
                .unwrap_or(DEFAULT_CHUNKED_PREFILL_SIZE),
            kv_block_size: launch
                .value(&["--block-size", "--page-size"])
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|v| *v >= 1)
                .unwrap_or(16),
        },
        prefill,
        decode: DecodeGrid {
            tokens_per_step,
            accept_length_spread: accept_length_spread(tokens_per_step),
            contexts: decode_contexts,
            batch_sizes,
            per_request_tok_s: per_request,
        },
        cached_ttft,
    };
    profile.validate().map_err(FromMatrixError::Invalid)?;
    let inference = Inference {
        kv_at_least_tokens: budget.at_least_tokens,
        kv_below_tokens: budget.below_tokens,
        context_length_from_launch: launch_context.is_some(),
        tokens_per_event_given: options.tokens_per_event.is_some(),
    };
    Ok((profile, inference))
}

/// Accept lengths vary by ± this many tokens around the mean: half the speculative surplus,
/// rounded down, so every step still emits at least one token (0 without speculation).
pub fn accept_length_spread(tokens_per_step: f64) -> u32 {
    ((tokens_per_step - 1.0) / 2.0).floor().clamp(0.0, 31.0) as u32
}

fn prefill_curve(doc: &MatrixDoc) -> Result<PrefillCurve, FromMatrixError> {
    let mut points: Vec<(u64, f64)> = doc
        .prefill
        .iter()
        .filter(|row| row.status.is_valid())
        .filter_map(|row| {
            let rate = row.prompt_tok_s.or_else(|| {
                row.ttft_ms
                    .filter(|ms| *ms > 0.0)
                    .map(|ms| row.prompt_tokens.unwrap_or(row.context_tokens) as f64 / ms * 1000.0)
            })?;
            (rate.is_finite() && rate > 0.0).then_some((row.context_tokens, rate))
        })
        .collect();
    points.sort_by_key(|(context, _)| *context);
    points.dedup_by_key(|(context, _)| *context);
    if points.is_empty() {
        return Err(FromMatrixError::NoPrefillRows);
    }
    Ok(PrefillCurve {
        contexts: points.iter().map(|(c, _)| *c).collect(),
        tok_s: points.iter().map(|(_, r)| *r).collect(),
    })
}

/// A (context × concurrency) grid of one figure of the Valid cells, in the profile's shape:
/// rows without any value are dropped, every row starts at the first batch column and has no
/// gaps, and rows may end early (model.rs fills the rest).
fn grid(
    doc: &MatrixDoc,
    figure: impl Fn(&tokentap_matrix::DecodeCell) -> Option<f64>,
) -> (Vec<u64>, Vec<u32>, Vec<Vec<f64>>) {
    let batches: Vec<u32> = doc
        .decode
        .iter()
        .map(|cell| cell.concurrency)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index = doc.cell_index();
    let mut contexts = Vec::new();
    let mut sparse: Vec<Vec<Option<f64>>> = Vec::new();
    for context in doc.contexts() {
        let row: Vec<Option<f64>> = batches
            .iter()
            .map(|batch| {
                index
                    .get(&(context, *batch))
                    .filter(|cell| cell.status == CellStatus::Valid)
                    .and_then(|cell| figure(cell))
                    .filter(|v| v.is_finite() && *v > 0.0)
            })
            .collect();
        if row.iter().any(Option::is_some) {
            contexts.push(context);
            sparse.push(row);
        }
    }
    let dense = fill_rows(&batches, &sparse);
    (contexts, batches, dense)
}

/// Turns sparse rows into the profile's dense prefixes. Interior gaps: linear in batch size
/// between the nearest known columns (the model's own lookup rule). Leading gaps: the row's
/// first known value scaled by how the nearest row (shorter context first) that knows both
/// columns changes between them; held flat when no row does. Trailing gaps: cut.
fn fill_rows(batches: &[u32], rows: &[Vec<Option<f64>>]) -> Vec<Vec<f64>> {
    let mut out = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        let known: Vec<usize> = (0..row.len()).filter(|c| row[*c].is_some()).collect();
        let (Some(&first), Some(&last)) = (known.first(), known.last()) else {
            continue;
        };
        let mut dense: Vec<f64> = Vec::with_capacity(last + 1);
        for c in 0..=last {
            let value = match row[c] {
                Some(v) => v,
                None if c < first => leading_value(rows, r, c, first),
                None => {
                    let before = known
                        .iter()
                        .rev()
                        .find(|k| **k < c)
                        .copied()
                        .unwrap_or(first);
                    let after = known.iter().find(|k| **k > c).copied().unwrap_or(last);
                    let (x0, x1, x) = (
                        f64::from(batches[before]),
                        f64::from(batches[after]),
                        f64::from(batches[c]),
                    );
                    let (y0, y1) = (row[before].unwrap_or(0.0), row[after].unwrap_or(0.0));
                    if x1 > x0 {
                        y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                    } else {
                        y0
                    }
                }
            };
            dense.push(value);
        }
        out.push(dense);
    }
    out
}

fn leading_value(rows: &[Vec<Option<f64>>], r: usize, column: usize, first: usize) -> f64 {
    let anchor = rows[r][first].unwrap_or(0.0);
    let shorter = (0..r).rev();
    let longer = r + 1..rows.len();
    for other in shorter.chain(longer) {
        if let (Some(Some(at_column)), Some(Some(at_first))) =
            (rows[other].get(column), rows[other].get(first))
        {
            if *at_first > 0.0 {
                return anchor * at_column / at_first;
            }
        }
    }
    anchor
}

/// Flags of a launch command (sglang or vLLM), looked up by name.
struct LaunchCommand<'a> {
    words: Vec<&'a str>,
}

impl<'a> LaunchCommand<'a> {
    fn new(text: &'a str) -> LaunchCommand<'a> {
        LaunchCommand {
            words: text
                .split_whitespace()
                .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
                .collect(),
        }
    }

    /// The value of the first of `flags` present, as `--flag value` or `--flag=value`.
    fn value(&self, flags: &[&str]) -> Option<&'a str> {
        for flag in flags {
            for (i, word) in self.words.iter().enumerate() {
                if word == flag {
                    if let Some(next) = self.words.get(i + 1).filter(|n| !n.starts_with("--")) {
                        return Some(next);
                    }
                } else if let Some(value) = word
                    .strip_prefix(flag)
                    .and_then(|rest| rest.strip_prefix('='))
                {
                    return Some(value);
                }
            }
        }
        None
    }

    /// `vllm serve MODEL`: the word after `serve` when it is not a flag.
    fn positional_after(&self, word: &str) -> Option<&'a str> {
        let at = self.words.iter().position(|w| *w == word)?;
        self.words
            .get(at + 1)
            .copied()
            .filter(|next| !next.starts_with('-'))
    }

    /// sglang `--speculative-algorithm NAME`; vLLM `--speculative-config '{"method": …}'` or
    /// `--speculative-model` (the method is then unnamed: `speculative`).
    fn speculative_algorithm(&self) -> Option<String> {
        if let Some(name) = self.value(&["--speculative-algorithm"]) {
            return Some(name.to_owned());
        }
        let has = |flag: &str| {
            self.words
                .iter()
                .any(|w| *w == flag || w.starts_with(&format!("{flag}=")))
        };
        if has("--speculative-config") || has("--speculative-model") {
            return Some("speculative".to_owned());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PerformanceModel;

    fn seed(name: &str) -> MatrixDoc {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/seeds")
            .join(name);
        tokentap_matrix::load(&path).unwrap()
    }

    const GLM: &str = "000_7bda87e292bd4f4e.txt";
    const STEP: &str = "003_5c468af628b56f4a.txt";

    #[test]
    fn both_seeds_build_profiles_that_predict_every_valid_cell() {
        for name in [GLM, STEP] {
            let doc = seed(name);
            let (profile, inference) =
                profile_from_matrix(&doc, &FromMatrixOptions::default()).unwrap();
            let model = PerformanceModel::new(&profile);
            let mut checked = 0;
            for cell in doc.decode.iter().filter(|c| c.status.is_valid()) {
                let ctx = cell.context_tokens;
                let batch = cell.concurrency as usize;
                let want = cell.per_request_tok_s.unwrap();
                let got = model.per_request_tok_s(ctx as f64, batch);
                assert!(
                    ((got - want) / want).abs() < 0.01,
                    "{name} {ctx}x{batch}: {got} vs {want}"
                );
                let want = cell.ttft_ms.unwrap();
                let got = model.cached_ttft(ctx, batch).as_secs_f64() * 1000.0;
                assert!(
                    ((got - want) / want).abs() < 0.01,
                    "{name} {ctx}x{batch} TTFT: {got} vs {want}"
                );
                checked += 1;
            }
            assert!(checked >= 20, "{name}: {checked}");
            for row in &doc.prefill {
                let want = row.prompt_tok_s.unwrap();
                let got = model.prefill_tok_s(row.context_tokens);
                assert!(
                    ((got - want) / want).abs() < 0.01,
                    "{name} prefill {}",
                    row.context_tokens
                );
            }
            let kv = profile.capacity.kv_tokens;
            assert!(kv >= inference.kv_at_least_tokens, "{name}: {kv}");
            assert!(kv < inference.kv_below_tokens.unwrap(), "{name}: {kv}");
            assert!(inference.context_length_from_launch);
        }
    }

    #[test]
    fn shipped_profiles_keep_their_seeds_capacity_statuses() {
        for (profile, seed_name) in [
            ("glm-5.3-flash-nvfp4-4x-rtx-pro-6000", GLM),
            ("step-3.7-flash-fp8-4x-rtx-pro-6000", STEP),
        ] {
            let kv = Profile::builtin(profile).unwrap().capacity.kv_tokens;
            let budget = infer::kv_budget(&seed(seed_name)).unwrap();
            assert!(kv >= budget.at_least_tokens, "{profile}: {kv}");
            assert!(kv < budget.below_tokens.unwrap(), "{profile}: {kv}");
        }
    }

    #[test]
    fn launch_command_sets_context_speculation_and_labels() {
        let glm = Profile::from_matrix(&seed(GLM), &FromMatrixOptions::default()).unwrap();
        assert_eq!(glm.model.context_length, 1_048_576);
        assert_eq!(glm.model.served_model_name, "nvidia/GLM-5.3-Flash-NVFP4");
        assert_eq!(glm.model.model_path, "nvidia/GLM-5.3-Flash-NVFP4");
        assert!(glm.model.reasoning);
        assert_eq!(glm.labels.speculative_algorithm, "DFLASH");
        assert_eq!(glm.decode.tokens_per_step, SPECULATIVE_TOKENS_PER_EVENT);
        assert_eq!(glm.decode.accept_length_spread, 1);
        assert_eq!(glm.labels.engine, "sglang");
        assert_eq!(glm.labels.quantization, "NVFP4");
        assert_eq!(glm.labels.gpu_count, 4);
        assert_eq!(glm.capacity.max_running_requests, 128);
        // KV: 32K × 32 ran (1,179,648), 1019K × 2 was over (2,095,104): the midpoint.
        assert_eq!(glm.capacity.kv_tokens, 1_637_376);

        let options = FromMatrixOptions {
            tokens_per_event: Some(1.0),
            origin: "seed".into(),
        };
        let step = Profile::from_matrix(&seed(STEP), &options).unwrap();
        assert_eq!(step.model.served_model_name, "step3p7");
        assert_eq!(step.model.model_path, "stepfun-ai/Step-3.7-Flash-FP8");
        assert_eq!(step.model.context_length, 262_144);
        assert_eq!(step.labels.speculative_algorithm, "");
        assert_eq!(step.decode.tokens_per_step, 1.0);
        assert_eq!(step.decode.accept_length_spread, 0);
        assert_eq!(step.labels.source, "seed");
        assert_eq!(step.capacity.kv_tokens, 589_824 + (655_360 - 589_824) / 2);
    }

    #[test]
    fn gaps_are_interpolated_and_leading_cells_scaled() {
        let mut doc = seed(STEP);
        // Knock out 8K × 4 (interior) and 16K × 1 (leading).
        for cell in doc.decode.iter_mut() {
            if (cell.context_tokens, cell.concurrency) == (8192, 4)
                || (cell.context_tokens, cell.concurrency) == (16384, 1)
            {
                *cell = tokentap_matrix::DecodeCell::status_only(
                    cell.context_tokens,
                    cell.concurrency,
                    CellStatus::error("stream reset"),
                );
            }
        }
        let profile = Profile::from_matrix(&doc, &FromMatrixOptions::default()).unwrap();
        let row8 = &profile.decode.per_request_tok_s[0];
        // Between 2 (87.7) and 8 (64.3), linear in batch: a third of the way.
        assert!(
            (row8[2] - (87.7 + (64.3 - 87.7) / 3.0)).abs() < 1e-9,
            "{row8:?}"
        );
        let row16 = &profile.decode.per_request_tok_s[1];
        // 16K × 1 from 16K × 2 (86.3) scaled like 8K: 118.5 / 87.7.
        assert!((row16[0] - 86.3 * 118.5 / 87.7).abs() < 1e-9, "{row16:?}");
    }

    #[test]
    fn bad_matrices_are_named() {
        let mut doc = seed(STEP);
        doc.decode.clear();
        let err = Profile::from_matrix(&doc, &FromMatrixOptions::default()).unwrap_err();
        assert!(matches!(err, FromMatrixError::NoDecodeCells), "{err}");
        let mut doc = seed(STEP);
        doc.prefill.clear();
        let err = Profile::from_matrix(&doc, &FromMatrixOptions::default()).unwrap_err();
        assert!(matches!(err, FromMatrixError::NoPrefillRows), "{err}");
        let options = FromMatrixOptions {
            tokens_per_event: Some(0.5),
            origin: String::new(),
        };
        let err = Profile::from_matrix(&seed(STEP), &options).unwrap_err();
        assert!(err.to_string().contains("0.5"), "{err}");
    }

    #[test]
    fn launch_flags_parse_both_spellings() {
        let launch = LaunchCommand::new(
            "vllm serve org/m --max-model-len=32768 --speculative-config '{\"method\":\"eagle\"}'",
        );
        assert_eq!(
            launch.value(&["--context-length", "--max-model-len"]),
            Some("32768")
        );
        assert_eq!(launch.positional_after("serve"), Some("org/m"));
        assert_eq!(
            launch.speculative_algorithm().as_deref(),
            Some("speculative")
        );
        assert_eq!(LaunchCommand::new("").value(&["--x"]), None);
        assert_eq!(LaunchCommand::new("--x").value(&["--x"]), None);
    }
}
