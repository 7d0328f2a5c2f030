//! The conversation a request continues, and which turn of it the request is: the session table.
//!
//! A request's session is keyed by the first session key it carries (a header or a body field
//! the proxy reads, `[sessions] keys`), kept only as a salted hash; a request with none
//! continues the session whose latest prompt it resends whole — one of its turn ends
//! (`stream::fingerprint::TurnEnds`) equals that prompt's last — else it starts one of its own.
//! Per turn the table says which turn it is, what came before it (the session's first turn, a
//! user's turn after an answer, a tool's result after an answer that called one, or a call made
//! while an earlier one was still answering), the gap from the previous turn's **end** (its last
//! byte) to this turn's start, and how much of this prompt the previous turn already sent.
//!
//! Bounded: at most `max_sessions` sessions, a quarter of them for sessions of one turn so far.
//! A new session goes into that quarter and moves to the rest at its second turn; each part
//! evicts its least recently active session first, and a session idle longer than `idle` is
//! forgotten. So a flood of one-turn "sessions" churns its quarter and never evicts a
//! conversation that has come back. Two locks per request (its start and its end), never one
//! per event; the work under each is a few hash-map operations.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::lock;

/// How many sessions the table keeps, for how long, and whether it infers sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationLimits {
    /// Most sessions kept at once (a quarter of them for sessions of one turn so far).
    pub max_sessions: usize,
    /// A session with no turn for this long is forgotten: its next request starts a new one.
    pub idle: Duration,
    /// A request with no session key continues the session whose prompt it extends.
    pub infer: bool,
}

impl Default for ConversationLimits {
    fn default() -> Self {
        Self {
            max_sessions: 65_536,
            idle: Duration::from_secs(2 * 3600),
            infer: true,
        }
    }
}

/// How a request's session was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionSource {
    /// From a session key the request carried.
    Key,
    /// From its prompt: it resends an earlier turn's prompt (or starts a session of its own).
    Inferred,
}

impl SessionSource {
    pub fn label(self) -> &'static str {
        match self {
            SessionSource::Key => "key",
            SessionSource::Inferred => "inferred",
        }
    }
}

/// What came before a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum After {
    /// Nothing: the session's first turn.
    First,
    /// The previous turn's answer ended without calling a tool: the gap is a user's.
    User,
    /// The previous turn's answer called a tool: the gap is the tool's run (and the agent's).
    Tool,
    /// The previous turn had not ended when this one started (parallel calls, sub-agents):
    /// there is no end-to-start gap.
    Overlap,
}

impl After {
    pub const ALL: [After; 4] = [After::First, After::User, After::Tool, After::Overlap];

    pub fn label(self) -> &'static str {
        match self {
            After::First => "first",
            After::User => "user",
            After::Tool => "tool",
            After::Overlap => "overlap",
        }
    }
}

/// One request as a turn of its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The session, as a salted hash (never the key itself).
    pub session: u64,
    pub source: SessionSource,
    /// 1 for the session's first turn.
    pub index: u32,
    pub after: After,
    /// From the previous turn's last byte to this turn's head in (user and tool turns).
    pub gap: Option<Duration>,
    /// Bytes of this prompt that are the previous turn's prompt resent (0: none, or its
    /// history was rewritten), and the prompt's own bytes: the share the previous turn could
    /// have left in the engine's prefix cache.
    pub shared_bytes: u32,
    pub prompt_bytes: u32,
}

impl Turn {
    /// The share (0–1) of this prompt the previous turn already sent; `None` on a first turn.
    pub fn theoretical_share(&self) -> Option<f64> {
        if self.after == After::First || self.prompt_bytes == 0 {
            return None;
        }
        Some((f64::from(self.shared_bytes) / f64::from(self.prompt_bytes)).min(1.0))
    }
}

/// What the proxy knows of a request when it asks for its turn.
#[derive(Debug, Clone, Copy)]
pub struct TurnQuery<'a> {
    /// The first session key the request carried (raw bytes; hashed here).
    pub key: Option<&'a [u8]>,
    pub model: &'a str,
    /// The prompt's turn ends (offset, salted id), in order.
    pub ends: &'a [(u32, u64)],
    /// The prompt member's length in bytes.
    pub prompt_bytes: usize,
}

/// The session table.
#[derive(Debug)]
pub struct Conversations {
    hasher: RandomState,
    limits: ConversationLimits,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Slot {
    turns: u32,
    /// Turns started and not yet ended.
    open: u32,
    last_end: Option<Instant>,
    last_active: Instant,
    /// The latest ended turn's answer called a tool.
    last_tool: bool,
    /// The latest turn's prompt up to its last element (offset, id), and its anchor key.
    tail: Option<(u32, u64)>,
    anchor: Option<u64>,
    /// Which queue entry is this slot's current one.
    stamp: u64,
}

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    /// A latest prompt's tail (by model) → its session: how a keyless request is placed.
    anchors: HashMap<u64, u64>,
    /// (session, stamp), least recently active first; entries whose stamp is not the slot's
    /// are stale and skipped.
    fresh: VecDeque<(u64, u64)>,
    settled: VecDeque<(u64, u64)>,
    fresh_live: usize,
    settled_live: usize,
    next_stamp: u64,
}

impl Default for Conversations {
    fn default() -> Self {
        Self::new(ConversationLimits::default())
    }
}

impl Conversations {
    pub fn new(limits: ConversationLimits) -> Self {
        Self {
            hasher: RandomState::new(),
            limits: ConversationLimits {
                max_sessions: limits.max_sessions.max(4),
                ..limits
            },
            table: Mutex::new(Table::default()),
        }
    }

    pub fn limits(&self) -> ConversationLimits {
        self.limits
    }

    /// Sessions kept now.
    pub fn len(&self) -> usize {
        lock::lock(&self.table).slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn anchor_key(&self, model: &str, (end, id): (u32, u64)) -> u64 {
        self.hasher.hash_one((model, end, id))
    }

    /// The turn a request starting `now` is; `None` when it has no session (no key, and no
    /// array prompt or inference off).
    pub fn begin(&self, query: TurnQuery<'_>, now: Instant) -> Option<Turn> {
        let prompt_bytes = u32::try_from(query.prompt_bytes).unwrap_or(u32::MAX);
        let keyed = query.key.map(|key| self.hasher.hash_one((b"key", key)));
        if keyed.is_none() && (!self.limits.infer || query.ends.is_empty()) {
            return None;
        }
        let mut table = lock::lock(&self.table);
        let table = &mut *table;
        let (session, source, matched) = match keyed {
            Some(session) => (session, SessionSource::Key, None),
            None => {
                let found = query.ends.iter().rev().find_map(|&end| {
                    let session = *table.anchors.get(&self.anchor_key(query.model, end))?;
                    table
                        .slots
                        .contains_key(&session)
                        .then_some((session, end.0))
                });
                match found {
                    Some((session, end)) => (session, SessionSource::Inferred, Some(end)),
                    None => {
                        let stamp = table.next_stamp;
                        let session = self.hasher.hash_one((b"new", stamp, query.ends.last()));
                        (session, SessionSource::Inferred, None)
                    }
                }
            }
        };
        let idle = self.limits.idle;
        let existing = table
            .slots
            .get(&session)
            .filter(|slot| now.saturating_duration_since(slot.last_active) <= idle)
            .map(|slot| {
                (
                    slot.turns,
                    slot.open,
                    slot.last_end,
                    slot.last_tool,
                    slot.tail,
                )
            });
        let turn = match existing {
            None => Turn {
                session,
                source,
                index: 1,
                after: After::First,
                gap: None,
                shared_bytes: 0,
                prompt_bytes,
            },
            Some((turns, open, last_end, last_tool, tail)) => {
                let (after, gap) = match last_end {
                    Some(end) if open == 0 => (
                        if last_tool { After::Tool } else { After::User },
                        Some(now.saturating_duration_since(end)),
                    ),
                    _ => (After::Overlap, None),
                };
                let shared_bytes = matched
                    .or_else(|| tail.filter(|t| query.ends.contains(t)).map(|t| t.0))
                    .unwrap_or(0);
                Turn {
                    session,
                    source,
                    index: turns.saturating_add(1),
                    after,
                    gap,
                    shared_bytes,
                    prompt_bytes,
                }
            }
        };
        // The slot as this turn leaves it: a session idle past the limit starts over.
        if existing.is_none() {
            if let Some(old) = table.slots.remove(&session) {
                table.forget(&old);
            }
        }
        let stamp = table.next_stamp;
        table.next_stamp += 1;
        let tail = query.ends.last().copied();
        let anchor = tail
            .filter(|_| self.limits.infer)
            .map(|tail| self.anchor_key(query.model, tail));
        let slot = table.slots.entry(session).or_insert(Slot {
            turns: 0,
            open: 0,
            last_end: None,
            last_active: now,
            last_tool: false,
            tail: None,
            anchor: None,
            stamp,
        });
        let was_fresh = slot.turns == 1;
        slot.turns = turn.index;
        slot.open = slot.open.saturating_add(1);
        slot.last_active = now;
        slot.stamp = stamp;
        let old_anchor = std::mem::replace(&mut slot.anchor, anchor);
        if tail.is_some() {
            slot.tail = tail;
        }
        if let Some(old) = old_anchor.filter(|old| Some(*old) != anchor) {
            if table.anchors.get(&old) == Some(&session) {
                table.anchors.remove(&old);
            }
        }
        if let Some(anchor) = anchor {
            // The newest prompt with this tail wins: two sessions that sent the very same
            // prompt cannot be told apart, and the next turn most likely answers the latest.
            table.anchors.insert(anchor, session);
        }
        match turn.index {
            1 => {
                table.fresh_live += 1;
                table.fresh.push_back((session, stamp));
            }
            _ => {
                if was_fresh {
                    table.fresh_live = table.fresh_live.saturating_sub(1);
                    table.settled_live += 1;
                }
                table.settled.push_back((session, stamp));
            }
        }
        table.evict(self.limits, now);
        Some(turn)
    }

    /// The turn ended `now` (its last byte); `tool_called`: its answer called a tool.
    pub fn ended(&self, turn: &Turn, now: Instant, tool_called: bool) {
        let mut table = lock::lock(&self.table);
        if let Some(slot) = table.slots.get_mut(&turn.session) {
            slot.open = slot.open.saturating_sub(1);
            slot.last_end = Some(now);
            slot.last_active = now;
            slot.last_tool = tool_called;
        }
    }
}

impl Table {
    /// Drops what points at a removed slot.
    fn forget(&mut self, slot: &Slot) {
        if let Some(anchor) = slot.anchor {
            self.anchors.remove(&anchor);
        }
        if slot.turns == 1 {
            self.fresh_live = self.fresh_live.saturating_sub(1);
        } else if slot.turns > 1 {
            self.settled_live = self.settled_live.saturating_sub(1);
        }
    }

    /// Removes the least recently active live session of one part (`settled` or not); false
    /// when that part has none.
    fn evict_one(&mut self, settled: bool) -> bool {
        loop {
            let queue = if settled {
                &mut self.settled
            } else {
                &mut self.fresh
            };
            let Some((session, stamp)) = queue.pop_front() else {
                return false;
            };
            let live = self
                .slots
                .get(&session)
                .is_some_and(|slot| slot.stamp == stamp && (slot.turns > 1) == settled);
            if live {
                if let Some(slot) = self.slots.remove(&session) {
                    self.forget(&slot);
                }
                return true;
            }
        }
    }

    fn evict(&mut self, limits: ConversationLimits, now: Instant) {
        let fresh_share = limits.max_sessions / 4;
        while self.fresh_live + self.settled_live > limits.max_sessions {
            let settled = self.fresh_live <= fresh_share && self.settled_live > 0;
            if !self.evict_one(settled) && !self.evict_one(!settled) {
                break;
            }
        }
        // Idle sessions (and stale entries) at the front of either part, a few per call.
        for settled in [false, true] {
            for _ in 0..4 {
                let queue = if settled { &self.settled } else { &self.fresh };
                let Some(&(session, stamp)) = queue.front() else {
                    break;
                };
                let (current, idle) = match self.slots.get(&session) {
                    Some(slot) if slot.stamp == stamp => (
                        true,
                        now.saturating_duration_since(slot.last_active) > limits.idle
                            && slot.open == 0,
                    ),
                    _ => (false, true),
                };
                if !idle {
                    break;
                }
                let queue = if settled {
                    &mut self.settled
                } else {
                    &mut self.fresh
                };
                queue.pop_front();
                if current {
                    if let Some(slot) = self.slots.remove(&session) {
                        self.forget(&slot);
                    }
                }
            }
        }
        // Stale entries (a slot touched again leaves its older entry behind) kept bounded.
        let live = self.slots.len();
        if self.fresh.len() + self.settled.len() > 2 * live + 64 {
            let slots = &self.slots;
            let current = |&(session, stamp): &(u64, u64)| {
                slots.get(&session).is_some_and(|slot| slot.stamp == stamp)
            };
            self.fresh.retain(current);
            self.settled.retain(current);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query<'a>(key: Option<&'a [u8]>, ends: &'a [(u32, u64)]) -> TurnQuery<'a> {
        TurnQuery {
            key,
            model: "m",
            ends,
            prompt_bytes: ends.last().map_or(10, |e| e.0 as usize + 1),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_keyed_session_counts_turns_and_the_gap_from_the_previous_end() {
        let table = Conversations::default();
        let key: &[u8] = b"abc";
        let first = table
            .begin(query(Some(key), &[(10, 1)]), Instant::now())
            .unwrap();
        assert_eq!(
            (first.index, first.after, first.gap),
            (1, After::First, None)
        );
        assert_eq!(first.theoretical_share(), None);
        tokio::time::advance(Duration::from_millis(700)).await;
        table.ended(&first, Instant::now(), true);
        tokio::time::advance(Duration::from_millis(300)).await;
        let second = table
            .begin(
                query(Some(key), &[(10, 1), (30, 2), (50, 3)]),
                Instant::now(),
            )
            .unwrap();
        assert_eq!(second.session, first.session);
        assert_eq!((second.index, second.after), (2, After::Tool));
        assert_eq!(second.gap, Some(Duration::from_millis(300)));
        assert_eq!(second.shared_bytes, 10);
        // Started before the second ended: an overlap, no gap.
        let third = table
            .begin(query(Some(key), &[(70, 9)]), Instant::now())
            .unwrap();
        assert_eq!(
            (third.index, third.after, third.gap),
            (3, After::Overlap, None)
        );
        assert_eq!(third.shared_bytes, 0);
        // Another key is another session.
        let other = table
            .begin(query(Some(b"abd"), &[]), Instant::now())
            .unwrap();
        assert_ne!(other.session, first.session);
        assert_eq!(other.index, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_keyless_request_continues_the_session_whose_prompt_it_resends() {
        let table = Conversations::default();
        let one = table
            .begin(query(None, &[(5, 11), (20, 12)]), Instant::now())
            .unwrap();
        table.ended(&one, Instant::now(), false);
        tokio::time::advance(Duration::from_secs(4)).await;
        let two = table
            .begin(
                query(None, &[(5, 11), (20, 12), (40, 13), (60, 14)]),
                Instant::now(),
            )
            .unwrap();
        assert_eq!(
            (two.session, two.index, two.after),
            (one.session, 2, After::User)
        );
        assert_eq!(two.gap, Some(Duration::from_secs(4)));
        assert_eq!(two.shared_bytes, 20);
        // Same system prompt, another user message: a session of its own.
        let other = table
            .begin(query(None, &[(5, 11), (21, 99)]), Instant::now())
            .unwrap();
        assert_ne!(other.session, one.session);
        assert_eq!(other.index, 1);
        // No array prompt and no key: no session.
        assert_eq!(table.begin(query(None, &[]), Instant::now()), None);
        let off = Conversations::new(ConversationLimits {
            infer: false,
            ..ConversationLimits::default()
        });
        assert_eq!(off.begin(query(None, &[(5, 11)]), Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_one_turn_sessions_stays_bounded_and_evicts_no_conversation() {
        let limits = ConversationLimits {
            max_sessions: 400,
            ..ConversationLimits::default()
        };
        let table = Conversations::new(limits);
        // Conversations of two turns each, then a flood of 100,000 one-turn sessions.
        let keys: Vec<String> = (0..250).map(|i| format!("conv-{i}")).collect();
        for _ in 0..2 {
            for key in &keys {
                let turn = table
                    .begin(query(Some(key.as_bytes()), &[]), Instant::now())
                    .unwrap();
                table.ended(&turn, Instant::now(), false);
            }
        }
        for i in 0..100_000u64 {
            let ends = [(8, i)];
            let turn = table.begin(query(None, &ends), Instant::now()).unwrap();
            table.ended(&turn, Instant::now(), false);
            assert!(table.len() <= 400);
        }
        {
            let inner = lock::lock(&table.table);
            assert!(inner.fresh.len() + inner.settled.len() <= 2 * inner.slots.len() + 65);
            assert!(inner.anchors.len() <= inner.slots.len());
        }
        for key in &keys {
            let turn = table
                .begin(query(Some(key.as_bytes()), &[]), Instant::now())
                .unwrap();
            assert_eq!(turn.index, 3, "the conversation {key} was kept");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_session_starts_over() {
        let table = Conversations::new(ConversationLimits {
            idle: Duration::from_secs(60),
            ..ConversationLimits::default()
        });
        let first = table.begin(query(Some(b"k"), &[]), Instant::now()).unwrap();
        table.ended(&first, Instant::now(), false);
        tokio::time::advance(Duration::from_secs(61)).await;
        let again = table.begin(query(Some(b"k"), &[]), Instant::now()).unwrap();
        assert_eq!((again.index, again.after), (1, After::First));
        assert_eq!(table.len(), 1);
    }
}
