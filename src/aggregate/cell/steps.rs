//! Tokens per decode step over a cell's streamed requests ([`StepSum`]).

use crate::meter::record::RequestRecord;

/// Tokens per decode step over a cell's streamed requests: Σ completion tokens ÷ Σ token
/// events (speculative decoding's accept length where the engine streams one event per step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepSum {
    pub tokens: u64,
    pub events: u64,
}

impl StepSum {
    pub fn add(&mut self, record: &RequestRecord) {
        // Only exact counts say how many tokens a step gave; without usage each event is
        // counted as one token, which would say 1 whatever the engine did.
        if record.streaming && record.tokens.events > 0 && record.tokens.completion_exact {
            self.tokens = self.tokens.saturating_add(record.tokens.completion);
            self.events = self.events.saturating_add(record.tokens.events);
        }
    }

    pub fn merge(&mut self, other: &StepSum) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.events = self.events.saturating_add(other.events);
    }

    pub fn tokens_per_step(&self) -> Option<f64> {
        (self.events > 0).then(|| self.tokens as f64 / self.events as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(completion: u64, events: u64, exact: bool) -> RequestRecord {
        let mut r = RequestRecord::for_test();
        r.tokens.completion = completion;
        r.tokens.events = events;
        r.tokens.completion_exact = exact;
        r
    }

    #[test]
    fn only_exact_counts_of_streamed_requests_make_a_step() {
        let mut steps = StepSum::default();
        assert_eq!(steps.tokens_per_step(), None);
        steps.add(&streamed(30, 10, true));
        // Counted events (no usage), a request that was not streamed, and one without events
        // say nothing of the step.
        steps.add(&streamed(99, 99, false));
        let mut unary = streamed(50, 1, true);
        unary.streaming = false;
        steps.add(&unary);
        steps.add(&streamed(7, 0, true));
        assert_eq!((steps.tokens, steps.events), (30, 10));
        assert_eq!(steps.tokens_per_step(), Some(3.0));
    }

    #[test]
    fn merged_steps_are_the_steps_of_all_requests() {
        let (mut a, mut b) = (StepSum::default(), StepSum::default());
        a.add(&streamed(30, 10, true));
        b.add(&streamed(10, 10, true));
        a.merge(&b);
        assert_eq!(a.tokens_per_step(), Some(2.0));
    }
}
