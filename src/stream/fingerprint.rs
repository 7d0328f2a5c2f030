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

use ring::hmac;
use ring::rand::SystemRandom;

/// Bytes of prompt JSON per fingerprint block (≈ 512 tokens at ≈ 4 bytes a token).
pub const BLOCK_BYTES: usize = 2048;

/// Most blocks fingerprinted per prompt: 64 KiB, ≈ 16K tokens of shared prefix.
pub const MAX_BLOCKS: usize = 32;

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
