//! The first token of each kind over a cell's requests ([`FirstTokenSum`]): the first answer
//! and tool-call tokens, reasoning tokens, and the requests that offered tools.

use crate::aggregate::sketch::QuantileSketch;
use crate::matrix::doc::FirstTokens;
use crate::meter::record::RequestRecord;

use super::tails::tail_ms;

/// The first token of each kind over a cell's requests (docs/metrics.md "Answer TTFT"): the
/// production aggregator and the sweep's cells both use it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FirstTokenSum {
    /// Time to the first answer token, seconds, one per request that streamed one.
    pub answer: QuantileSketch,
    /// Time to the first tool-call delta, seconds, one per request that streamed one.
    pub tool_call: QuantileSketch,
    /// Σ reasoning tokens and the requests that reported them.
    pub reasoning_tokens: u64,
    pub reasoning_requests: u64,
    /// Requests that offered tools.
    pub with_tools: u64,
    /// Requests whose first answer token came after other output (reasoning, a tool call).
    pub answer_later: u64,
}

impl FirstTokenSum {
    pub fn add(&mut self, record: &RequestRecord) {
        // Every request that answered counts, so the cell's answer TTFT is over all of them;
        // the figures are shown only where some answer came after other output.
        if let Some(answer) = record.timing.ttft_answer {
            self.answer.add(answer.as_secs_f64(), 1.0);
            if record.timing.ttft.is_some_and(|first| answer > first) {
                self.answer_later += 1;
            }
        }
        if let Some(tool_call) = record.timing.ttft_tool_call {
            self.tool_call.add(tool_call.as_secs_f64(), 1.0);
        }
        if let Some(reasoning) = record.tokens.reasoning {
            self.reasoning_tokens = self.reasoning_tokens.saturating_add(reasoning);
            self.reasoning_requests += 1;
        }
        self.with_tools += u64::from(record.with_tools);
    }

    pub fn merge(&mut self, other: &FirstTokenSum) {
        self.answer.merge(&other.answer);
        self.tool_call.merge(&other.tool_call);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.reasoning_requests += other.reasoning_requests;
        self.with_tools += other.with_tools;
        self.answer_later += other.answer_later;
    }

    /// Bins held (for the aggregator's memory bound).
    pub fn bins(&self) -> usize {
        self.answer.bins() + self.tool_call.bins()
    }

    /// The cell's figures: absent when no request had reasoning, a tool call or tools (then
    /// the answer TTFT is the TTFT, and says nothing new).
    pub fn to_first_tokens(&self) -> Option<FirstTokens> {
        let answers = self.answer.weight();
        let tool_calls = self.tool_call.weight();
        let reasoning = self.reasoning_requests > 0 && self.reasoning_tokens > 0;
        if tool_calls <= 0.0 && !reasoning && self.with_tools == 0 && !self.answer_differs() {
            return None;
        }
        let ms = |sketch: &QuantileSketch, q: f64, n: f64| {
            if q <= 0.5 {
                sketch.median().map(|s| s * 1000.0)
            } else {
                tail_ms(sketch, q, n)
            }
        };
        let count = |n: f64| (n > 0.0).then_some(n);
        FirstTokens::from_values([
            ms(&self.answer, 0.5, answers),
            ms(&self.answer, 0.9, answers),
            ms(&self.answer, 0.99, answers),
            count(answers),
            ms(&self.tool_call, 0.5, tool_calls),
            ms(&self.tool_call, 0.9, tool_calls),
            ms(&self.tool_call, 0.99, tool_calls),
            count(tool_calls),
            reasoning.then(|| self.reasoning_tokens as f64 / self.reasoning_requests as f64),
            count(self.with_tools as f64),
        ])
    }

    /// Whether some answers came later than their request's first token.
    fn answer_differs(&self) -> bool {
        self.answer_later > 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn answered(ttft_ms: u64, answer_ms: u64) -> RequestRecord {
        let mut r = RequestRecord::for_test();
        r.timing.ttft = Some(Duration::from_millis(ttft_ms));
        r.timing.ttft_answer = Some(Duration::from_millis(answer_ms));
        r
    }

    #[test]
    fn plain_answers_say_nothing_beyond_the_ttft() {
        let mut sum = FirstTokenSum::default();
        for _ in 0..3 {
            sum.add(&answered(100, 100));
        }
        assert_eq!(sum.answer.weight(), 3.0);
        assert_eq!(sum.to_first_tokens(), None);
    }

    #[test]
    fn answers_after_reasoning_show_with_the_mean_reasoning_tokens() {
        let mut sum = FirstTokenSum::default();
        for reasoning in [100, 300] {
            let mut r = answered(50, 500);
            r.tokens.reasoning = Some(reasoning);
            sum.add(&r);
        }
        sum.add(&answered(50, 50));
        assert_eq!(sum.answer_later, 2);
        let first = sum.to_first_tokens().unwrap();
        assert_eq!(first.answer_requests, Some(3.0));
        assert_eq!(first.reasoning_tokens, Some(200.0));
        // Three answers carry a median, no tail.
        assert!(
            (first.answer_ttft_ms.unwrap() - 500.0).abs() < 6.0,
            "{first:?}"
        );
        assert_eq!(first.answer_ttft_p90_ms, None);
        assert_eq!(
            (first.tool_call_requests, first.with_tools_requests),
            (None, None)
        );
    }

    #[test]
    fn tool_calls_and_tools_offered_show_and_merge() {
        let mut a = FirstTokenSum::default();
        let mut call = RequestRecord::for_test();
        call.with_tools = true;
        call.timing.ttft_tool_call = Some(Duration::from_millis(80));
        a.add(&call);
        let mut b = FirstTokenSum::default();
        let mut offered = RequestRecord::for_test();
        offered.with_tools = true;
        b.add(&offered);
        a.merge(&b);
        let first = a.to_first_tokens().unwrap();
        assert_eq!(first.tool_call_requests, Some(1.0));
        assert_eq!(first.with_tools_requests, Some(2.0));
        assert!(
            (first.tool_call_ttft_ms.unwrap() - 80.0).abs() < 1.0,
            "{first:?}"
        );
        assert_eq!(first.answer_requests, None, "no request answered");
    }
}
