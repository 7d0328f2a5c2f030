//! The simulated engine's prefix cache: the blocks of prompts it has prefilled, keyed by
//! their chained block keys ([`PrefixKeys`]), at most `capacity` tokens, least recently used
//! evicted first. What sglang's radix cache and vLLM's automatic prefix caching do, at block
//! granularity: a prompt hits for the longest run of its leading blocks present.
//!
//! **LRU and leaves first.** The blocks form a tree (a block's parent is the block before it
//! in its prompt), kept as one recency list. Every use of a chain — a lookup's matched blocks,
//! an insert's blocks — touches it from its last block to its first, so a parent is always
//! more recent than each of its children. The least recently used block is therefore always a
//! leaf: evicting from that end never strands a cached block behind an evicted parent, and a
//! conversation's prefix is lost from its newest end first, as in the engines' radix trees.
//!
//! Not modeled: blocks in use by running requests are not pinned (the engines lock them until
//! the request ends), the cache's tokens are not taken out of the admission budget (the
//! scheduler reserves KV for every admitted request as if nothing were shared), and generated
//! tokens are never inserted (sglang inserts a finished request's output too; the simulator's
//! prompt rule cannot line an answer's text up with its output tokens).
//!
//! Pure data: no clock, no I/O. Each operation is O(blocks of the prompt); memory is bounded
//! by `capacity` (every entry holds at least one token).
use std::collections::HashMap;

use crate::text::PrefixKeys;

/// No neighbour in the recency list.
const NIL: usize = usize::MAX;

/// A prompt's longest cached run of leading blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Leading blocks found.
    pub blocks: usize,
    /// Their tokens.
    pub tokens: u64,
    /// Every block of the prompt was found (an identical prompt was cached).
    pub whole: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    key: u64,
    tokens: u64,
    /// Towards the most recently used end.
    newer: usize,
    /// Towards the least recently used end.
    older: usize,
}

/// Cached blocks in one recency list over a slab; a map from key to slot.
#[derive(Debug)]
pub struct PrefixCache {
    slots: HashMap<u64, usize>,
    entries: Vec<Entry>,
    free: Vec<usize>,
    newest: usize,
    oldest: usize,
    tokens: u64,
    capacity: u64,
}

impl PrefixCache {
    /// An empty cache of at most `capacity` tokens.
    pub fn new(capacity: u64) -> PrefixCache {
        PrefixCache {
            slots: HashMap::new(),
            entries: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            tokens: 0,
            capacity,
        }
    }

    /// Tokens held now (never more than the capacity).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.slots.len()
    }

    /// The longest run of `prefix`'s leading blocks that is cached; those blocks become the
    /// most recently used.
    pub fn lookup(&mut self, prefix: &PrefixKeys) -> PrefixMatch {
        let keys = prefix.keys();
        let blocks = keys
            .iter()
            .take_while(|key| self.slots.contains_key(key))
            .count();
        for key in keys[..blocks].iter().rev() {
            if let Some(slot) = self.slots.get(key).copied() {
                self.touch(slot);
            }
        }
        PrefixMatch {
            blocks,
            tokens: prefix.tokens_in(blocks),
            whole: blocks > 0 && blocks == keys.len(),
        }
    }

    /// Cache `prefix`'s blocks (a prompt just prefilled): as many leading blocks as the
    /// capacity holds, the most recently used afterwards, evicting the least recently used
    /// blocks of other prompts to make room.
    pub fn insert(&mut self, prefix: &PrefixKeys) {
        let keys = prefix.keys();
        // The leading blocks that fit: a prompt longer than the cache keeps its start.
        let fit = (0..=keys.len())
            .rev()
            .find(|blocks| prefix.tokens_in(*blocks) <= self.capacity)
            .unwrap_or(0);
        for (index, key) in keys[..fit].iter().enumerate().rev() {
            match self.slots.get(key).copied() {
                Some(slot) => self.touch(slot),
                None => self.add(*key, prefix.block_len(index).max(1)),
            }
        }
        // The chain just touched is the `fit` most recent entries and fits, so eviction
        // stops before it.
        while self.tokens > self.capacity && self.oldest != NIL {
            self.evict_oldest();
        }
    }

    fn add(&mut self, key: u64, tokens: u64) {
        let entry = Entry {
            key,
            tokens,
            newer: NIL,
            older: NIL,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.entries[slot] = entry;
                slot
            }
            None => {
                self.entries.push(entry);
                self.entries.len() - 1
            }
        };
        self.slots.insert(key, slot);
        self.tokens += tokens;
        self.push_newest(slot);
    }

    fn evict_oldest(&mut self) {
        let slot = self.oldest;
        self.unlink(slot);
        let Entry { key, tokens, .. } = self.entries[slot];
        self.slots.remove(&key);
        self.tokens = self.tokens.saturating_sub(tokens);
        self.free.push(slot);
    }

    fn touch(&mut self, slot: usize) {
        if self.newest != slot {
            self.unlink(slot);
            self.push_newest(slot);
        }
    }

    fn unlink(&mut self, slot: usize) {
        let Entry { newer, older, .. } = self.entries[slot];
        if newer == NIL {
            self.newest = older;
        } else {
            self.entries[newer].older = older;
        }
        if older == NIL {
            self.oldest = newer;
        } else {
            self.entries[older].newer = newer;
        }
        self.entries[slot].newer = NIL;
        self.entries[slot].older = NIL;
    }

    fn push_newest(&mut self, slot: usize) {
        self.entries[slot].older = self.newest;
        self.entries[slot].newer = NIL;
        if self.newest != NIL {
            self.entries[self.newest].newer = slot;
        }
        self.newest = slot;
        if self.oldest == NIL {
            self.oldest = slot;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{chat_prompt_key, token_ids_key};

    const BLOCK: u64 = 16;

    /// A token-id prompt of `len` ids, `seed` choosing them (equal seeds: equal prompts).
    fn ids(seed: u64, len: u64) -> Vec<u64> {
        (0..len)
            .map(|i| 1000 + (seed * 7919 + i * 31) % 9000)
            .collect()
    }

    fn prefix(ids: &[u64]) -> PrefixKeys {
        token_ids_key(&serde_json::json!(ids), BLOCK)
            .unwrap()
            .prefix
    }

    /// The tokens of the recency list, walked both ways: the list and the totals agree.
    fn check(cache: &PrefixCache) {
        let mut forward = 0;
        let (mut slot, mut count) = (cache.oldest, 0);
        while slot != NIL {
            forward += cache.entries[slot].tokens;
            slot = cache.entries[slot].newer;
            count += 1;
        }
        let (mut slot, mut back) = (cache.newest, 0);
        while slot != NIL {
            back += 1;
            slot = cache.entries[slot].older;
        }
        assert_eq!(
            (forward, count, back),
            (cache.tokens, cache.blocks(), count)
        );
        assert!(cache.tokens <= cache.capacity);
    }

    #[test]
    fn an_extended_prompt_hits_for_its_shared_full_blocks() {
        let mut cache = PrefixCache::new(100_000);
        let first = ids(1, 100);
        cache.insert(&prefix(&first));
        // The same 100 ids and 60 more: blocks 0..6 are shared, the first prompt's short
        // last block (4 ids) is not a block of the longer one.
        let mut extended = first.clone();
        extended.extend(ids(2, 60));
        let hit = cache.lookup(&prefix(&extended));
        assert_eq!(hit.blocks, 6);
        assert_eq!(hit.tokens, 96);
        assert!(!hit.whole);
        // The identical prompt: every block, the short one included.
        let again = cache.lookup(&prefix(&first));
        assert_eq!((again.blocks, again.tokens, again.whole), (7, 100, true));
        // An unrelated prompt: nothing.
        assert_eq!(cache.lookup(&prefix(&ids(3, 100))), PrefixMatch::default());
        check(&cache);
    }

    #[test]
    fn a_conversations_next_turn_shares_the_previous_prompt() {
        let turn = |messages: &[(&str, &str)]| {
            let owned: Vec<(String, String)> = messages
                .iter()
                .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
                .collect();
            chat_prompt_key(&owned, BLOCK)
        };
        let system = ("system", "You are a careful assistant who answers briefly.");
        let user = (
            "user",
            "What limits the decode speed of a large model on one card?",
        );
        let first = turn(&[system, user]);
        let second = turn(&[
            system,
            user,
            ("assistant", "Memory bandwidth, mostly."),
            ("user", "And prefill?"),
        ]);
        assert!(second.tokens > first.tokens);
        let mut cache = PrefixCache::new(10_000);
        cache.insert(&first.prefix);
        let hit = cache.lookup(&second.prefix);
        // Every full block of the first prompt (its template's assistant markers included).
        assert_eq!(hit.tokens, first.tokens / BLOCK * BLOCK);
        assert!(hit.tokens > 0);
        // A different system prompt shares nothing.
        let other = turn(&[("system", "Answer at length."), user]);
        assert_eq!(cache.lookup(&other.prefix).blocks, 0);
    }

    #[test]
    fn traffic_past_the_capacity_evicts_the_least_recently_used_prefix() {
        // Room for about three 1,000-token prompts.
        let mut cache = PrefixCache::new(3_200);
        let conversation = ids(1, 1000);
        cache.insert(&prefix(&conversation));
        cache.insert(&prefix(&ids(2, 1000)));
        cache.insert(&prefix(&ids(3, 1000)));
        // Before the eviction: still there, and now the most recently used.
        assert!(cache.lookup(&prefix(&conversation)).whole);
        cache.insert(&prefix(&ids(4, 1000)));
        // Prompt 2 was the least recently used: the 800 tokens over went from its end (50 of
        // its 63 blocks, its first 12 blocks left), the conversation kept everything.
        assert_eq!(cache.lookup(&prefix(&ids(2, 1000))).blocks, 12);
        assert!(cache.lookup(&prefix(&conversation)).whole);
        check(&cache);
        // Enough other traffic: the conversation's prefix is gone.
        for seed in 5..9 {
            cache.insert(&prefix(&ids(seed, 1000)));
            check(&cache);
        }
        assert_eq!(cache.lookup(&prefix(&conversation)).blocks, 0);
        assert!(cache.tokens() <= 3_200);
    }

    #[test]
    fn a_parent_block_outlives_its_children() {
        // Two prompts share 4 blocks; room for 8 blocks in all.
        let mut cache = PrefixCache::new(8 * BLOCK);
        let shared = ids(1, 4 * BLOCK);
        let mut a = shared.clone();
        a.extend(ids(2, 2 * BLOCK));
        let mut b = shared.clone();
        b.extend(ids(3, 2 * BLOCK));
        cache.insert(&prefix(&a));
        cache.insert(&prefix(&b));
        assert_eq!(cache.blocks(), 8);
        // A third prompt of 3 blocks: the three oldest leaves go (a's tail, then b's last
        // block), never a shared block.
        cache.insert(&prefix(&ids(4, 3 * BLOCK)));
        check(&cache);
        assert_eq!(cache.lookup(&prefix(&b)).blocks, 5);
        assert_eq!(cache.lookup(&prefix(&a)).blocks, 4);
        assert_eq!(cache.lookup(&prefix(&ids(4, 3 * BLOCK))).blocks, 3);
        // Every cached block is reachable: none sits behind an evicted parent.
        assert_eq!(cache.blocks(), 4 + 1 + 3);
    }

    #[test]
    fn pathological_prompts_do_not_break_the_cache() {
        let mut cache = PrefixCache::new(1_000);
        // Empty: no blocks, never a hit.
        let empty = prefix(&[]);
        cache.insert(&empty);
        assert_eq!(cache.lookup(&empty), PrefixMatch::default());
        assert_eq!(cache.tokens(), 0);
        // Larger than the cache: its leading blocks that fit are kept.
        let huge = ids(1, 5_000);
        cache.insert(&prefix(&huge));
        check(&cache);
        assert_eq!(cache.tokens(), 992);
        let hit = cache.lookup(&prefix(&huge));
        assert_eq!((hit.blocks, hit.tokens, hit.whole), (62, 992, false));
        // A cache of nothing holds nothing.
        let mut none = PrefixCache::new(0);
        none.insert(&prefix(&ids(2, 10)));
        assert_eq!((none.tokens(), none.blocks()), (0, 0));
        // A block size of 0 counts as 1.
        let one = token_ids_key(&serde_json::json!([5, 6, 7]), 0)
            .unwrap()
            .prefix;
        assert_eq!((one.len(), one.block_len(2), one.block_len(3)), (3, 1, 0));
        cache.insert(&one);
        assert!(cache.lookup(&one).whole);
        check(&cache);
    }
}
