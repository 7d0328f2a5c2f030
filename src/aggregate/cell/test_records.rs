//! Records built by hand for the aggregation tests, and the ladders they are bucketed on.

use std::time::{Duration, SystemTime};

use crate::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use crate::meter::record::{
    time_between_tokens, Buckets, Interference, Outcome, Overhead, RequestRecord, Timing, Tokens,
};
use crate::meter::timeline::{ConcurrencySplit, LocalHistogram};

static BOUNDS: &[f64] = &[1.0];

/// A streamed request of `prompt` tokens whose token events (one token each) arrived
/// `tbt` apart after `ttft`, spending `(bucket, tokens)` at each concurrency bucket.
pub fn record(
    prompt: Option<u64>,
    per_bucket: &[(usize, u64)],
    ttft: Duration,
    tbt: Duration,
    average_active: f64,
    outcome: Outcome,
) -> RequestRecord {
    let mut split = ConcurrencySplit::default();
    let completion: u64 = per_bucket.iter().map(|(_, t)| t).sum();
    let mut first = true;
    for &(bucket, tokens) in per_bucket {
        split.add_tokens(bucket, tokens);
        // Every token but the very first closes a gap of `tbt`.
        let gaps = if first {
            tokens.saturating_sub(1)
        } else {
            tokens
        };
        first = false;
        split.seconds[bucket] += gaps as f64 * tbt.as_secs_f64();
    }
    let decode = tbt * u32::try_from(completion.saturating_sub(1)).unwrap();
    let contexts = Ladder::contexts(&DEFAULT_CONTEXTS).unwrap();
    let concurrency = Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap();
    let first_token = (completion > 0).then_some(ttft);
    RequestRecord {
        outcome,
        timing: Timing {
            started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000),
            to_headers: Some(ttft),
            to_first_byte: Some(ttft),
            ttft: first_token,
            ttft_answer: first_token,
            ttft_tool_call: None,
            to_first_delivery: first_token,
            duration: ttft + decode,
            decode: (completion > 0).then_some(decode),
            tbt: time_between_tokens(Some(decode), completion),
            itl: LocalHistogram::new(&BOUNDS),
        },
        tokens: Tokens {
            prompt,
            completion,
            completion_exact: true,
            events: completion,
            coalesced_events: 0,
            ..Tokens::default()
        },
        interference: Interference {
            average_active,
            split,
            ..Interference::default()
        },
        buckets: Buckets {
            context: contexts.context_bucket(prompt.unwrap_or(0)),
            concurrency: concurrency.concurrency_bucket(average_active),
        },
        overhead: Overhead {
            per_frame: LocalHistogram::new(&BOUNDS),
            ..Overhead::default()
        },
        ..RequestRecord::for_test()
    }
}

/// The default context and concurrency ladders (8K … 1024K, 1 … 128).
pub fn ladders() -> (Ladder, Ladder) {
    (
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    )
}

/// Whether `a` is within `tolerance` (relative) of `b`.
pub fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * b.abs()
}
