//! What a matrix implies about the server that produced it, for `simulate --from-matrix`:
//! the KV-cache budget bracketed by the Valid / Over capacity boundary, and the context length.
//!
//! The rule is the one the benchmark that made the seed pages applies: a cell is skipped as Over
//! capacity when C × (context + max output) > KV budget. So every cell that ran (Valid or Error)
//! needs at most the budget, and every Over capacity cell needs more than it. Pure functions.
use super::doc::{CellStatus, MatrixDoc};
use super::units::context_label;

/// The max output the seed pages and tokentap's sweeps use when a matrix does not say.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4096;

/// The headroom the sweep leaves between the top decode context and the context length.
pub const TOP_CONTEXT_HEADROOM_TOKENS: u64 = 1024;

/// The KV budget in tokens as far as the matrix pins it down: `at_least ≤ budget < below`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBudget {
    /// The largest C × (context + max output) of a cell that ran; 0 when none ran.
    pub at_least_tokens: u64,
    /// The smallest C × (context + max output) of an Over capacity cell; `None` when no cell was.
    pub below_tokens: Option<u64>,
}

impl KvBudget {
    /// One number inside the bracket: the midpoint, or twice the lower bound when the matrix never
    /// hit capacity (the server may have much more; the simulator then never reports Over capacity
    /// for the matrix's own cells).
    pub fn estimate_tokens(&self) -> u64 {
        match self.below_tokens {
            Some(below) => self.at_least_tokens + (below - self.at_least_tokens) / 2,
            None => self.at_least_tokens.saturating_mul(2),
        }
    }
}

/// A matrix whose statuses no single budget explains.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InferError {
    #[error("cell {ran} ran with C × (context + max output) = {ran_tokens} tokens, but cell {over} was Over capacity needing only {over_tokens}: no KV budget explains both")]
    InconsistentCapacity {
        ran: String,
        ran_tokens: u64,
        over: String,
        over_tokens: u64,
    },
}

fn need_tokens(context_tokens: u64, concurrency: u32, max_output_tokens: u64) -> u64 {
    u64::from(concurrency).saturating_mul(context_tokens.saturating_add(max_output_tokens))
}

/// Brackets the KV budget from the decode statuses. `max_output_tokens` is the matrix's
/// `metadata.run.max_output_tokens`, else [`DEFAULT_MAX_OUTPUT_TOKENS`].
pub fn kv_budget(doc: &MatrixDoc) -> Result<KvBudget, InferError> {
    let max_output = doc
        .metadata
        .run
        .max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
    let describe =
        |context: u64, concurrency: u32| format!("{} × {concurrency}", context_label(context));
    let mut ran: Option<(u64, String)> = None;
    let mut over: Option<(u64, String)> = None;
    for cell in &doc.decode {
        let need = need_tokens(cell.context_tokens, cell.concurrency, max_output);
        match cell.status {
            CellStatus::Valid
            | CellStatus::LowEvidence
            | CellStatus::OffTarget
            | CellStatus::Error(_)
            | CellStatus::Shed(_)
            | CellStatus::Bursts(_) => {
                if ran.as_ref().is_none_or(|(tokens, _)| need > *tokens) {
                    ran = Some((need, describe(cell.context_tokens, cell.concurrency)));
                }
            }
            CellStatus::OverCapacity => {
                if over.as_ref().is_none_or(|(tokens, _)| need < *tokens) {
                    over = Some((need, describe(cell.context_tokens, cell.concurrency)));
                }
            }
            CellStatus::NotRun => {}
        }
    }
    if let (Some((ran_tokens, ran_cell)), Some((over_tokens, over_cell))) = (&ran, &over) {
        if ran_tokens >= over_tokens {
            return Err(InferError::InconsistentCapacity {
                ran: ran_cell.clone(),
                ran_tokens: *ran_tokens,
                over: over_cell.clone(),
                over_tokens: *over_tokens,
            });
        }
    }
    Ok(KvBudget {
        at_least_tokens: ran.map_or(0, |(tokens, _)| tokens),
        below_tokens: over.map(|(tokens, _)| tokens),
    })
}

/// The server's context length as the sweep methodology implies it: the largest of the largest
/// prefill context and top decode context + max output + 1024. `None` for an empty matrix.
pub fn context_length(doc: &MatrixDoc) -> Option<u64> {
    let max_output = doc
        .metadata
        .run
        .max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
    let from_prefill = doc.prefill.iter().map(|row| row.context_tokens).max();
    let from_decode = doc.decode.iter().map(|cell| {
        cell.context_tokens
            .saturating_add(max_output)
            .saturating_add(TOP_CONTEXT_HEADROOM_TOKENS)
    });
    from_prefill.into_iter().chain(from_decode).max()
}
