//! The session structure of a trace: the checks a trace with sessions must pass (no cycle of
//! parents, no turn before its session's first), each session's turns numbered and linked to
//! their successors, the end-to-start gap between two turns, and what the writers of session
//! formats (AIPerf, Bailian) remember of each session's latest turn.
//!
//! Every check names the line of the request that broke it; none panics on any input.

use std::collections::HashMap;

use super::trace::{TraceError, TraceRequest};

/// Checks the session structure of `requests` (in file order; `lines[i]` is request `i`'s
/// line): an agent's chain of parents must not come back to it, and no turn of a session may
/// start before the session's first turn (the one with the lowest `turn`).
pub fn check(requests: &[TraceRequest], lines: &[usize]) -> Result<(), TraceError> {
    let line = |i: usize| lines.get(i).copied().unwrap_or(i + 1);
    // The session's first turn: (turn, at_ms, index).
    let mut firsts: HashMap<&str, (u32, u64, usize)> = HashMap::new();
    for (i, request) in requests.iter().enumerate() {
        if let (Some(session), Some(turn)) = (&request.turn.session, request.turn.turn) {
            let first = firsts.entry(session).or_insert((turn, request.at_ms, i));
            if turn < first.0 {
                *first = (turn, request.at_ms, i);
            }
        }
    }
    for (i, request) in requests.iter().enumerate() {
        let (Some(session), Some(turn)) = (&request.turn.session, request.turn.turn) else {
            continue;
        };
        if let Some(&(first_turn, first_at, first_index)) = firsts.get(session.as_str()) {
            if turn > first_turn && request.at_ms < first_at {
                return Err(TraceError::Line {
                    line: line(i),
                    message: format!(
                        "turn {turn} of session {session:?} starts at {} ms, before the \
                         session's first turn (turn {first_turn}, line {}) at {first_at} ms",
                        request.at_ms,
                        line(first_index)
                    ),
                });
            }
        }
    }
    let parents: Vec<(usize, &str, Option<&str>)> = requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let agent = r.turn.agent.as_deref()?;
            Some((line(i), agent, r.turn.parent.as_deref()))
        })
        .collect();
    roots(&parents, "agent").map(|_| ())
}

/// The root of each node of a forest given as (line, id, parent): the id reached by following
/// parents until one has none or is not in the list. A chain that comes back to a node is an
/// error naming the line of the node where it was found; `what` names the ids in it.
pub fn roots<'a>(
    nodes: &[(usize, &'a str, Option<&'a str>)],
    what: &str,
) -> Result<Vec<&'a str>, TraceError> {
    let mut parent_of: HashMap<&str, Option<&str>> = HashMap::with_capacity(nodes.len());
    for &(_, id, parent) in nodes {
        parent_of.entry(id).or_insert(parent);
    }
    let mut root_of: HashMap<&str, &str> = HashMap::with_capacity(nodes.len());
    let mut result = Vec::with_capacity(nodes.len());
    for &(line, id, _) in nodes {
        let mut chain = vec![id];
        let mut at = id;
        let root = loop {
            if let Some(&known) = root_of.get(at) {
                break known;
            }
            match parent_of.get(at).copied().flatten() {
                Some(parent) if parent_of.contains_key(parent) => {
                    if chain.contains(&parent) {
                        chain.push(parent);
                        return Err(TraceError::Line {
                            line,
                            message: format!(
                                "the parents of {what} {id:?} form a cycle ({})",
                                chain.join(" → ")
                            ),
                        });
                    }
                    chain.push(parent);
                    at = parent;
                }
                _ => break at,
            }
        };
        for node in chain {
            root_of.insert(node, root);
        }
        result.push(root);
    }
    Ok(result)
}

/// Milliseconds from `previous`'s end to `next`'s start: the recorded gap, else the start
/// times less the previous turn's recorded duration, else (a trace with neither) the
/// start-to-start difference, which also counts the previous turn's service.
pub fn end_to_start_gap_ms(previous: LatestTurn, next: &TraceRequest) -> u64 {
    if let Some(gap) = next.turn.gap_ms {
        return gap;
    }
    let start_to_start = next.at_ms.saturating_sub(previous.at_ms);
    match previous.end_ms {
        Some(end) => start_to_start.saturating_sub(end),
        None => start_to_start,
    }
}

/// What a writer needs of a session's latest turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatestTurn {
    /// Its number among the requests written (Bailian's `chat_id`).
    pub number: u64,
    pub at_ms: u64,
    pub end_ms: Option<u64>,
}

impl LatestTurn {
    pub fn of(request: &TraceRequest, number: u64) -> Self {
        Self {
            number,
            at_ms: request.at_ms,
            end_ms: request.turn.end_ms,
        }
    }
}

/// Sessions one generation of a [`SessionCursor`] remembers (≈ 20 MiB a generation).
pub const CURSOR_GENERATION: usize = 262_144;

/// What a writer of a session format remembers of each session's latest turn: bounded, two
/// generations of at most [`CURSOR_GENERATION`] sessions each (a session found in the older
/// moves to the newer; when the newer is full the older is dropped), so a streamed export of a
/// million one-turn sessions stays small. A session forgotten that way is written as if its
/// next turn were its first.
#[derive(Debug, Default)]
pub struct SessionCursor {
    current: HashMap<String, LatestTurn>,
    previous: HashMap<String, LatestTurn>,
    /// Requests written so far (the next one's number).
    pub written: u64,
}

impl SessionCursor {
    /// The session's previous turn before `request`, which becomes its latest; counts it.
    pub fn advance(&mut self, request: &TraceRequest) -> Option<LatestTurn> {
        let latest = LatestTurn::of(request, self.written);
        self.written += 1;
        let session = request.turn.session.as_ref()?;
        if let Some(slot) = self.current.get_mut(session) {
            return Some(std::mem::replace(slot, latest));
        }
        let before = self.previous.remove(session);
        if self.current.len() >= CURSOR_GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(session.clone(), latest);
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        line: usize,
        id: &'static str,
        parent: Option<&'static str>,
    ) -> (usize, &'static str, Option<&'static str>) {
        (line, id, parent)
    }

    #[test]
    fn roots_follow_parents_and_a_cycle_names_its_line() {
        let forest = [
            node(1, "a", None),
            node(2, "b", Some("a")),
            node(3, "c", Some("b")),
            node(4, "d", Some("gone")),
        ];
        assert_eq!(roots(&forest, "chat").unwrap(), ["a", "a", "a", "d"]);
        let cycle = [
            node(1, "a", Some("c")),
            node(2, "b", Some("a")),
            node(3, "c", Some("b")),
        ];
        let error = roots(&cycle, "chat").unwrap_err().to_string();
        assert!(
            error.starts_with("line 1:") && error.contains("cycle"),
            "{error}"
        );
        let own = roots(&[node(7, "x", Some("x"))], "agent")
            .unwrap_err()
            .to_string();
        assert!(own.starts_with("line 7:"), "{own}");
    }
}
