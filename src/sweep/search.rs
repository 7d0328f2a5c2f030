//! The capacity search of one context (`find_capacity`): which concurrency level to measure
//! next, given what the cells measured so far said. Pure: levels and verdicts in, a level out.
//!
//! The levels are the plan's concurrency ladder less the cells over the KV budget, ascending.
//! The search brackets by doubling the ladder index (levels 0, 1, 3, 7, … and the last one),
//! so a low boundary is found after a few cheap cells, then bisects between the last level that
//! met the SLO and the first that missed, until they are neighbours on the ladder. It measures
//! about 2 log₂ n of the n levels and gives the answer the whole ladder would under one
//! assumption, which the report states: between two measured levels, a level below one that
//! met also meets (an SLO gets no easier with more streams). Every measured level is
//! consistent with the answer by construction: all below the boundary met, all above missed.

/// Where a context's search stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacitySearch {
    levels: Vec<u32>,
    /// Index of the highest level known to meet (`None`: none yet).
    met: Option<usize>,
    /// Index of the lowest level known to miss (`None`: none yet).
    missed: Option<usize>,
    /// The next bracketing index while no level has missed.
    bracket: usize,
    /// Levels measured, in order, with their verdicts.
    measured: Vec<(u32, bool)>,
}

impl CapacitySearch {
    /// A search over `levels` (ascending, without repeats).
    pub fn new(levels: Vec<u32>) -> Self {
        Self {
            levels,
            met: None,
            missed: None,
            bracket: 0,
            measured: Vec::new(),
        }
    }

    /// The next level to measure, or `None` when the boundary is known.
    pub fn next(&self) -> Option<u32> {
        let count = self.levels.len();
        let index = match self.missed {
            None => {
                let last = count.checked_sub(1)?;
                if self.met == Some(last) {
                    return None;
                }
                self.bracket.min(last)
            }
            Some(missed) => {
                let low = self.met.map_or(0, |met| met + 1);
                if low >= missed {
                    return None;
                }
                // Bisect the unknown levels low..missed.
                low + (missed - low) / 2
            }
        };
        self.levels.get(index).copied()
    }

    /// Records the verdict on `level` (the level [`next`](Self::next) gave).
    pub fn record(&mut self, level: u32, meets: bool) {
        let Some(index) = self.levels.iter().position(|&l| l == level) else {
            return;
        };
        self.measured.push((level, meets));
        if meets {
            self.met = Some(self.met.map_or(index, |met| met.max(index)));
            // Bracketing: 0, 1, 3, 7, … (2ᵏ − 1).
            self.bracket = 2 * index + 2 - 1;
            if self.bracket <= index {
                self.bracket = index + 1;
            }
        } else {
            self.missed = Some(self.missed.map_or(index, |missed| missed.min(index)));
        }
    }

    /// The levels measured, in order, and what each said.
    pub fn measured(&self) -> &[(u32, bool)] {
        &self.measured
    }

    /// The levels left unmeasured.
    pub fn skipped(&self) -> Vec<u32> {
        self.levels
            .iter()
            .copied()
            .filter(|level| !self.measured.iter().any(|(l, _)| l == level))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LADDER: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

    /// Runs a search whose true capacity is `capacity` (levels at or below it meet).
    fn run(levels: &[u32], meets: impl Fn(u32) -> bool) -> (Vec<u32>, Option<u32>) {
        let mut search = CapacitySearch::new(levels.to_vec());
        let mut steps = 0;
        while let Some(level) = search.next() {
            search.record(level, meets(level));
            steps += 1;
            assert!(steps <= levels.len(), "the search ends");
        }
        let answer = search
            .measured()
            .iter()
            .filter(|(_, met)| *met)
            .map(|(l, _)| *l)
            .max();
        (search.measured().iter().map(|(l, _)| *l).collect(), answer)
    }

    #[test]
    fn every_boundary_is_found_with_fewer_cells_than_the_ladder() {
        for capacity in [0, 1, 2, 4, 8, 16, 32, 64, 128] {
            let (measured, answer) = run(&LADDER, |c| c <= capacity);
            let want = (capacity > 0).then_some(capacity);
            assert_eq!(answer, want, "capacity {capacity}: measured {measured:?}");
            assert!(
                measured.len() < LADDER.len(),
                "capacity {capacity}: {measured:?}"
            );
            // The answer rests on its neighbour: the level above it was measured and missed
            // (unless it is the top).
            if let Some(index) = LADDER.iter().position(|&l| Some(l) == want) {
                if let Some(above) = LADDER.get(index + 1) {
                    assert!(measured.contains(above), "{capacity}: {measured:?}");
                }
            } else {
                assert_eq!(measured, [1], "the lowest missed: nothing else to measure");
            }
        }
    }

    #[test]
    fn the_bracket_doubles_then_bisects() {
        let (measured, answer) = run(&LADDER, |c| c <= 16);
        assert_eq!(measured, [1, 2, 8, 128, 32, 16]);
        assert_eq!(answer, Some(16));
        assert_eq!(run(&[1, 2, 4], |_| true).0, [1, 2, 4]);
        assert_eq!(run(&[], |_| true).0, Vec::<u32>::new());
    }

    #[test]
    fn unmeasured_levels_are_listed() {
        let mut search = CapacitySearch::new(LADDER.to_vec());
        while let Some(level) = search.next() {
            search.record(level, level <= 4);
        }
        assert_eq!(search.skipped(), [16, 32, 64, 128]);
    }
}
