//! The salted prefix fingerprint of a prompt, for the workload capture: which requests shared a
//! prompt prefix, without anything that tells what the prompt said.
//!
//! The prompt member's raw JSON bytes are cut into blocks of [`BLOCK_BYTES`] (about 512
//! tokens of English text, the block size of the Mooncake trace format); block `i`'s id is an
//! HMAC-SHA-256, under a secret salt, of the prompt's first `i + 1` blocks, truncated to 64
//! bits. Two prompts get the same id for block `i` exactly when their first `i + 1` blocks are
//! equal, so ids are a prefix-sharing pattern and nothing else: without the salt (random per
//! process unless configured) not even a guessed text can be checked against them. Only the
//! first [`MAX_BLOCKS`] blocks are hashed, so the cost per request is bounded (one pass over at
//! most 64 KiB), and it is paid once per request when the body is read, never per event.
//!
//! A prompt that is an array (`messages`, `input`) also gets its **turn ends**
//! ([`PrefixSalt::turn_ends`]): the salted id of the prompt up to the end of each of its last
//! [`MAX_TURN_ENDS`] elements. The next turn of a conversation resends this prompt's elements
//! and adds its own, so one of its turn ends equals this prompt's last one: that is how a
//! request without a session key is found to continue an earlier one (`meter::conversation`).

use ring::hmac;
use ring::rand::SystemRandom;

/// Bytes of prompt JSON per fingerprint block (≈ 512 tokens at ≈ 4 bytes a token).
pub const BLOCK_BYTES: usize = 2048;

/// Most blocks fingerprinted per prompt: 64 KiB, ≈ 16K tokens of shared prefix.
pub const MAX_BLOCKS: usize = 32;

/// Most element ends of one prompt given an id: enough for an answer and a run of tool
/// results between two turns, and a bounded cost (one HMAC finalisation each).
pub const MAX_TURN_ENDS: usize = 16;

/// Bytes of a prompt read for its turn ends: an element that ends later is not given an id
/// (≈ 256K tokens; one pass over at most this much, once per request).
pub const MAX_TURN_BYTES: usize = 1 << 20;

/// A prompt's turn ends: for each of its last elements (at most [`MAX_TURN_ENDS`], ending
/// within [`MAX_TURN_BYTES`]), the offset just past it and the salted id of the prompt up to
/// there; in prompt order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnEnds {
    pub ends: Vec<(u32, u64)>,
    /// The prompt member's length in bytes.
    pub len: usize,
}

impl TurnEnds {
    /// The id of the prompt up to its last element: what the next turn will resend.
    pub fn last(&self) -> Option<(u32, u64)> {
        self.ends.last().copied()
    }
}

/// The secret the block ids are keyed with.
#[derive(Clone)]
pub struct PrefixSalt {
    key: hmac::Key,
}

impl std::fmt::Debug for PrefixSalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The salt is a secret: never shown.
        f.write_str("PrefixSalt(..)")
    }
}

impl PrefixSalt {
    /// A fresh random salt: ids are comparable within this process only.
    pub fn random() -> Option<Self> {
        hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new())
            .ok()
            .map(|key| Self { key })
    }

    /// A configured salt: ids are comparable across processes that share it.
    pub fn from_secret(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// The block ids of `prompt` (raw JSON bytes of the prompt member), at most [`MAX_BLOCKS`].
    pub fn fingerprint(&self, prompt: &[u8]) -> Vec<u64> {
        let mut ids = Vec::with_capacity(prompt.len().div_ceil(BLOCK_BYTES).min(MAX_BLOCKS));
        let mut context = hmac::Context::with_key(&self.key);
        for block in prompt.chunks(BLOCK_BYTES).take(MAX_BLOCKS) {
            context.update(block);
            let tag = context.clone().sign();
            let mut id = [0u8; 8];
            for (slot, byte) in id.iter_mut().zip(tag.as_ref()) {
                *slot = *byte;
            }
            ids.push(u64::from_le_bytes(id));
        }
        ids
    }

    /// The turn ends of `prompt` (the raw JSON of the prompt member); none unless it is an
    /// array. One scan for the element ends, then one HMAC pass up to the last of them.
    pub fn turn_ends(&self, prompt: &[u8]) -> TurnEnds {
        let mut kept = [0usize; MAX_TURN_ENDS];
        let mut count = 0usize;
        for element in crate::stream::json::elements(prompt, 0) {
            if element.end > MAX_TURN_BYTES {
                break;
            }
            if let Some(slot) = kept.get_mut(count % MAX_TURN_ENDS) {
                *slot = element.end;
            }
            count += 1;
        }
        let first = count.saturating_sub(MAX_TURN_ENDS);
        let mut ends = Vec::with_capacity(count - first);
        let mut context = hmac::Context::with_key(&self.key);
        let mut hashed = 0usize;
        for index in first..count {
            let Some(&end) = kept.get(index % MAX_TURN_ENDS) else {
                break;
            };
            context.update(prompt.get(hashed..end).unwrap_or_default());
            hashed = end;
            let tag = context.clone().sign();
            let mut id = [0u8; 8];
            for (slot, byte) in id.iter_mut().zip(tag.as_ref()) {
                *slot = *byte;
            }
            // `end` ≤ MAX_TURN_BYTES, well inside u32.
            ends.push((
                u32::try_from(end).unwrap_or(u32::MAX),
                u64::from_le_bytes(id),
            ));
        }
        TurnEnds {
            ends,
            len: prompt.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_share_block_ids_and_nothing_more() {
        let salt = PrefixSalt::from_secret(b"test salt");
        let shared = vec![b'a'; BLOCK_BYTES * 2];
        let mut one = shared.clone();
        one.extend_from_slice(&[b'x'; 100]);
        let mut two = shared.clone();
        two.extend_from_slice(&[b'y'; 100]);
        let (one, two) = (salt.fingerprint(&one), salt.fingerprint(&two));
        assert_eq!(one.len(), 3);
        assert_eq!(one[..2], two[..2]);
        assert_ne!(one[2], two[2]);
        // Block ids chain: an equal second block after a different first one differs.
        let mut three = vec![b'b'; BLOCK_BYTES];
        three.extend_from_slice(&[b'a'; BLOCK_BYTES]);
        assert_ne!(salt.fingerprint(&three)[1], one[1]);
    }

    #[test]
    fn the_next_turn_resends_this_prompts_last_turn_end() {
        let salt = PrefixSalt::from_secret(b"test salt");
        let one = br#"[{"role":"system","content":"s"}, {"role":"user","content":"hi"}]"#;
        let two = br#"[{"role":"system","content":"s"}, {"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}]"#;
        let (one, two) = (salt.turn_ends(one), salt.turn_ends(two));
        assert_eq!(one.ends.len(), 2);
        assert_eq!(two.ends.len(), 4);
        let last = one.last().expect("an array prompt has ends");
        assert_eq!(two.ends[1], last);
        assert!(!two.ends[2..].contains(&last));
        // Another conversation with the same system prompt shares only that end.
        let other =
            salt.turn_ends(br#"[{"role":"system","content":"s"}, {"role":"user","content":"ho"}]"#);
        assert_eq!(other.ends[0], one.ends[0]);
        assert_ne!(other.last(), one.last());
        // Not an array, or not JSON: no ends; many elements: only the last 16.
        assert!(salt.turn_ends(br#""a string prompt""#).ends.is_empty());
        assert!(salt.turn_ends(b"[1, 2").ends.len() <= 2);
        let many = format!("[{}]", vec!["1"; 40].join(","));
        let many = salt.turn_ends(many.as_bytes());
        assert_eq!(many.ends.len(), MAX_TURN_ENDS);
        assert_eq!(many.last().map(|(end, _)| end), Some(80));
    }

    #[test]
    fn another_salt_gives_unrelated_ids_and_the_count_is_bounded() {
        let prompt = vec![b'q'; BLOCK_BYTES * (MAX_BLOCKS + 5)];
        let a = PrefixSalt::from_secret(b"one").fingerprint(&prompt);
        let b = PrefixSalt::from_secret(b"two").fingerprint(&prompt);
        assert_eq!(a.len(), MAX_BLOCKS);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        let random = PrefixSalt::random().expect("the system has randomness");
        assert_ne!(random.fingerprint(b"hello"), a[..1]);
        assert!(random.fingerprint(b"").is_empty());
    }
}
