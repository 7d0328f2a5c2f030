//! The like-production shape of a sweep (`like_production`): per context, what production's
//! own requests of the model looked like — the share of the prompt the server found cached,
//! and how many tokens the answers ran to — read from the production matrix of that model
//! (its cells' `prompt_cache.cached_share`, weighted by requests, and each cell's output
//! tokens per completed request, as often as that cell's requests). Pure.
//!
//! A shaped stream sends the context's prompt with its first `cached_share` of tokens shared
//! by every stream (warmed by the scout: a prefix-cache hit) and the rest unique to the
//! stream (cold: the server pays its prefill), and asks for an output length drawn from
//! production's. Its cells answer "what does this deployment give the traffic production
//! sends", not the seed method's "what does it give identical warm streams", and are labelled
//! so (`matrix::doc::LIKE_PRODUCTION`): the two are never compared.

use serde::{Deserialize, Serialize};

use crate::matrix::units::context_label;
use crate::matrix::{CellStatus, MatrixDoc};
use crate::synthetic::prompt::mix;

/// Most output lengths kept per context (one per production cell, bounded).
pub const MAX_OUTPUT_DRAWS: usize = 64;

/// What production's requests of one context looked like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextShape {
    /// The production context bucket (tokens, as its cells are keyed).
    pub context: u64,
    /// Cached prompt tokens ÷ prompt tokens (0–1); 0 where the server reported no cached
    /// counts (every prompt taken as cold).
    pub cached_share: f64,
    /// Whether the server reported cached counts for this context's requests.
    pub cache_reported: bool,
    /// The share of production's requests that were warm (at least half their prompt cached:
    /// a prefix-cache hit), where the server reported it; 0 otherwise.
    #[serde(default)]
    pub warm_share: f64,
    /// Output lengths to draw from, each as often as production's requests had it (the
    /// output tokens per completed request of each production cell, weighted by its requests).
    pub outputs: Vec<(u64, u64)>,
    /// Production requests behind these figures.
    pub requests: u64,
}

impl ContextShape {
    /// The share of a cold request's prompt that is shared (cached): what is left of
    /// [`cached_share`](ContextShape::cached_share) once the warm requests, taken as cached
    /// whole, are set apart.
    pub fn cold_cached_share(&self) -> f64 {
        let warm = self.warm_share.clamp(0.0, 1.0);
        if warm >= 1.0 {
            return 0.0;
        }
        ((self.cached_share - warm) / (1.0 - warm)).clamp(0.0, 1.0)
    }

    /// Whether the `serial`-th stream of a cell is warm: spread evenly, so that of the first
    /// n streams ⌊n × warm share⌋ are.
    pub fn warm_stream(&self, serial: u64) -> bool {
        let share = self.warm_share.clamp(0.0, 1.0);
        ((serial + 1) as f64 * share).floor() > (serial as f64 * share).floor()
    }

    /// The output length of the stream whose tag hashes to `seed`: drawn from [`outputs`]
    /// (deterministic in the seed), at least 1, at most `max`.
    ///
    /// [`outputs`]: ContextShape::outputs
    pub fn output_for(&self, seed: u64, max: u64) -> u64 {
        let total: u64 = self.outputs.iter().map(|(_, weight)| *weight).sum();
        if total == 0 {
            return max.max(1);
        }
        let mut pick = mix(seed) % total;
        for &(tokens, weight) in &self.outputs {
            if pick < weight {
                return tokens.clamp(1, max.max(1));
            }
            pick -= weight;
        }
        max.max(1)
    }

    /// The mean output length production asked of this context (requests-weighted).
    pub fn mean_output(&self) -> Option<f64> {
        let total: u64 = self.outputs.iter().map(|(_, weight)| *weight).sum();
        (total > 0).then(|| {
            self.outputs
                .iter()
                .map(|(tokens, weight)| *tokens as f64 * *weight as f64)
                .sum::<f64>()
                / total as f64
        })
    }
}

/// Production's shape of one model, per context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProductionShape {
    /// Ascending by context.
    pub contexts: Vec<ContextShape>,
}

impl ProductionShape {
    /// The shape of production's matrix `doc` (its `Valid`, `Low evidence` and `Delivered in
    /// bursts` cells with completed requests: traffic whatever its figures); `None` when no
    /// cell has any (no evidence).
    pub fn from_matrix(doc: &MatrixDoc) -> Option<Self> {
        let mut contexts: Vec<ContextShape> = Vec::new();
        for cell in &doc.decode {
            if !matches!(
                cell.status,
                CellStatus::Valid | CellStatus::LowEvidence | CellStatus::Bursts(_)
            ) {
                continue;
            }
            let Some(requests) = cell.completed_requests.filter(|&n| n > 0) else {
                continue;
            };
            if !contexts.iter().any(|c| c.context == cell.context_tokens) {
                contexts.push(ContextShape {
                    context: cell.context_tokens,
                    cached_share: 0.0,
                    cache_reported: false,
                    warm_share: 0.0,
                    outputs: Vec::new(),
                    requests: 0,
                });
            }
            let Some(entry) = contexts
                .iter_mut()
                .find(|c| c.context == cell.context_tokens)
            else {
                continue;
            };
            if let Some(share) = cell.prompt_cache.and_then(|p| p.cached_share) {
                // Requests-weighted means of the cells' shares.
                let before = if entry.cache_reported {
                    entry.requests
                } else {
                    0
                } as f64;
                let now = requests as f64;
                let total = before + now;
                entry.cached_share =
                    (entry.cached_share * before + share.clamp(0.0, 1.0) * now) / total;
                let cache = cell.prompt_cache.unwrap_or_default();
                let warm = cache.warm_requests.unwrap_or(0.0);
                let counted = warm + cache.cold_requests.unwrap_or(0.0);
                let warm_share = if counted > 0.0 { warm / counted } else { 0.0 };
                entry.warm_share = (entry.warm_share * before + warm_share * now) / total;
                entry.cache_reported = true;
            }
            if let Some(output) = cell.output_tokens {
                let per_request = (output as f64 / requests as f64).round().max(1.0) as u64;
                if entry.outputs.len() < MAX_OUTPUT_DRAWS {
                    entry.outputs.push((per_request, requests));
                }
            }
            entry.requests += requests;
        }
        contexts.retain(|c| c.requests > 0);
        contexts.sort_by_key(|c| c.context);
        (!contexts.is_empty()).then_some(Self { contexts })
    }

    /// The shape for the sweep's `context`: production's bucket of that context, else the
    /// nearest (on a log scale) that production has.
    pub fn for_context(&self, context: u64) -> Option<&ContextShape> {
        let distance = |c: &ContextShape| {
            ((c.context.max(1) as f64).ln() - (context.max(1) as f64).ln()).abs()
        };
        self.contexts
            .iter()
            .min_by(|a, b| distance(a).total_cmp(&distance(b)))
    }

    /// What the shape is, in words, for the matrix notes, the preview and the capacity line:
    /// `like production: 8K 20 % cached, output ~64 tokens (120 requests)`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .contexts
            .iter()
            .map(|c| {
                let cached = if c.cache_reported {
                    format!(
                        "{:.0} % cached ({:.0} % of requests warm)",
                        c.cached_share * 100.0,
                        c.warm_share * 100.0
                    )
                } else {
                    "cache not reported (cold)".to_owned()
                };
                let output = c
                    .mean_output()
                    .map_or_else(String::new, |m| format!(", output ~{m:.0} tokens"));
                format!(
                    "{} {cached}{output} ({} requests)",
                    context_label(c.context),
                    c.requests
                )
            })
            .collect();
        format!("like production: {}", parts.join("; "))
    }

    /// The matrix note that says how the cells were shaped.
    pub fn note(&self) -> String {
        format!(
            "Shaped like production's traffic ({}): per context, the cached share of the prompt production showed is shared by every stream (warmed by the scout), the rest is cold and unique per request, and each stream's output length is drawn from production's. Not comparable with seed-method sweeps",
            self.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{DecodeCell, PromptCache};

    fn cell(context: u64, requests: u64, output: u64, share: Option<f64>) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, 1, CellStatus::Valid);
        cell.completed_requests = Some(requests);
        cell.output_tokens = Some(output);
        cell.prompt_cache = share.map(|s| PromptCache {
            cached_share: Some(s),
            ..PromptCache::default()
        });
        cell
    }

    #[test]
    fn production_cells_give_each_context_its_cached_share_and_outputs() {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = vec![
            cell(8192, 30, 30 * 64, Some(0.2)),
            cell(8192, 10, 10 * 32, Some(0.6)),
            cell(32768, 5, 5 * 100, None),
            DecodeCell {
                status: CellStatus::NotRun,
                ..cell(65536, 5, 5, Some(1.0))
            },
        ];
        let shape = ProductionShape::from_matrix(&doc).unwrap();
        assert_eq!(shape.contexts.len(), 2);
        let eight = shape.for_context(8192).unwrap();
        assert!((eight.cached_share - 0.3).abs() < 1e-9, "{eight:?}");
        assert_eq!(eight.outputs, [(64, 30), (32, 10)]);
        assert_eq!(eight.requests, 40);
        assert!((eight.mean_output().unwrap() - 56.0).abs() < 1e-9);
        // Draws follow the weights and stay within max.
        let draws: Vec<u64> = (0..400).map(|i| eight.output_for(i, 4096)).collect();
        let long = draws.iter().filter(|&&d| d == 64).count();
        assert!((250..350).contains(&long), "{long} of 400 drew 64");
        assert_eq!(eight.output_for(7, 16), 16);
        let cold = shape.for_context(30000).unwrap();
        assert_eq!((cold.context, cold.cache_reported), (32768, false));
        assert_eq!(cold.cached_share, 0.0);
        assert!(
            shape
                .describe()
                .contains("8K 30 % cached (0 % of requests warm), output ~56 tokens (40 requests)"),
            "{}",
            shape.describe()
        );
        // A fifth of the requests warm (cached whole), the rest cold: cold prompts share
        // nothing, and one stream in five is warm.
        let fifth = ContextShape {
            cached_share: 0.2,
            warm_share: 0.2,
            ..eight.clone()
        };
        assert_eq!(fifth.cold_cached_share(), 0.0);
        let warm: Vec<u64> = (0..10).filter(|&s| fifth.warm_stream(s)).collect();
        assert_eq!(warm, [4, 9]);
        assert!((eight.cold_cached_share() - 0.3).abs() < 1e-9);
        assert!(ProductionShape::from_matrix(&MatrixDoc::new(Default::default())).is_none());
    }
}
