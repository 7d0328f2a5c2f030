//! Text in and out of the simulator: the documented prompt-token rule for text prompts
//! (shared by the generation routes and `/tokenize`, so they always agree), prompt
//! fingerprints for the prompt cache (a whole-prompt key and a chain of block keys,
//! [`PrefixKeys`]), and the deterministic filler words of the output.
//!
//! Rules (docs/simulator.md):
//! * A text prompt of `b` UTF-8 bytes is `ceil(b / 4)` tokens.
//! * A chat prompt is `3 + Σ over messages (4 + ceil(bytes(content) / 4))` tokens
//!   (3 for the assistant generation prompt, 4 per message for the role markers). A content
//!   given as parts counts the bytes of its text parts.
//! * Token-id prompts are exactly their length.
//! * Every output token is one filler word with a leading space (`" alpha"`), token id
//!   `1000 + index of the word`.
//!
//! Nothing here allocates per output token beyond the text it returns.
use serde_json::Value;

use super::model::SplitMix64;

/// Tokens of a text prompt under the simulator's rule.
pub fn text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// Token ids for a text prompt under the same rule: one id per 4-byte group.
pub fn text_token_ids(text: &str) -> Vec<u64> {
    text.as_bytes()
        .chunks(4)
        .map(|group| {
            let mut word = [0u8; 4];
            word[..group.len()].copy_from_slice(group);
            1000 + u64::from(u32::from_le_bytes(word)) % 150_000
        })
        .collect()
}

/// Chat template overhead: tokens for the assistant generation prompt.
pub const CHAT_GENERATION_PROMPT_TOKENS: u64 = 3;
/// Chat template overhead: tokens per message (role markers).
pub const CHAT_TOKENS_PER_MESSAGE: u64 = 4;

/// The text of one chat message's `content` (a string, or text parts), or `None` when it
/// is neither.
pub fn message_content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Null => Some(String::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            Some(text)
        }
        _ => None,
    }
}

/// Tokens and ids of a chat prompt under the simulator's rule. `messages` must be an
/// array of objects with a `role`; the caller validates.
pub fn chat_prompt(messages: &[(String, String)]) -> (u64, Vec<u64>) {
    let mut ids = Vec::new();
    for (role, content) in messages {
        ids.extend(std::iter::repeat_n(
            role_marker(role),
            CHAT_TOKENS_PER_MESSAGE as usize,
        ));
        ids.extend(text_token_ids(content));
    }
    ids.extend(std::iter::repeat_n(
        role_marker("assistant"),
        CHAT_GENERATION_PROMPT_TOKENS as usize,
    ));
    (ids.len() as u64, ids)
}

/// Count only (no id list): what the generation routes need.
pub fn chat_prompt_tokens(messages: &[(String, String)]) -> u64 {
    CHAT_GENERATION_PROMPT_TOKENS
        + messages
            .iter()
            .map(|(_, content)| CHAT_TOKENS_PER_MESSAGE + text_tokens(content))
            .sum::<u64>()
}

fn role_marker(role: &str) -> u64 {
    match role {
        "system" => 100,
        "user" => 101,
        "assistant" => 102,
        "tool" => 103,
        _ => 104,
    }
}

/// FNV-1a 64 over bytes: the prompt-cache key.
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    pub fn bytes(mut self, bytes: &[u8]) -> Fingerprint {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    pub fn number(self, n: u64) -> Fingerprint {
        self.bytes(&n.to_le_bytes())
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// A prompt as the prompt cache sees it: its token count, the whole-prompt key (which also
/// seeds the output, so identical requests answer identically) and its chain of block keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptKey {
    pub tokens: u64,
    pub cache_key: u64,
    pub prefix: PrefixKeys,
}

/// The block chain of a prompt: the prompt's tokens cut into blocks of `block_tokens` (the last
/// one may be shorter), each keyed by a hash of every token from the prompt's start to the
/// block's end — its parent's key extended by the block's tokens. Two prompts share block `i`'s
/// key exactly when their first `i + 1` blocks hold the same tokens (up to a 64-bit hash
/// collision), so a prompt that extends another shares its leading full blocks, and an
/// identical prompt shares every block, its short last one included.
///
/// Blocks never mix prompt kinds: text, chat and token-id prompts start their chains from
/// different roots, as their whole-prompt keys do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixKeys {
    keys: Vec<u64>,
    block_tokens: u64,
    prompt_tokens: u64,
}

impl PrefixKeys {
    /// Every block's key, the prompt's first block first.
    pub fn keys(&self) -> &[u64] {
        &self.keys
    }

    /// Prompt tokens the chain covers (all of them).
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// Tokens of block `index` (the block size, or what is left for the last block; 0 past
    /// the end).
    pub fn block_len(&self, index: usize) -> u64 {
        let start = (index as u64).saturating_mul(self.block_tokens);
        self.prompt_tokens
            .saturating_sub(start)
            .min(self.block_tokens)
    }

    /// Tokens of the first `blocks` blocks.
    pub fn tokens_in(&self, blocks: usize) -> u64 {
        (blocks as u64)
            .saturating_mul(self.block_tokens)
            .min(self.prompt_tokens)
    }

    /// Blocks in the chain.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Builds a [`PrefixKeys`] one token at a time: O(1) per token, one key per block.
struct BlockHasher {
    running: Fingerprint,
    block_tokens: u64,
    in_block: u64,
    tokens: u64,
    keys: Vec<u64>,
}

impl BlockHasher {
    /// `root` keeps the prompt kinds apart; `block_tokens` of 0 counts as 1.
    fn new(root: &[u8], block_tokens: u64) -> BlockHasher {
        BlockHasher {
            running: Fingerprint::default().bytes(b"blocks").bytes(root),
            block_tokens: block_tokens.max(1),
            in_block: 0,
            tokens: 0,
            keys: Vec::new(),
        }
    }

    fn push(&mut self, token: u64) {
        self.running = self.running.number(token);
        self.tokens += 1;
        self.in_block += 1;
        if self.in_block == self.block_tokens {
            self.keys.push(self.running.finish());
            self.in_block = 0;
        }
    }

    /// The text rule's tokens of `text`: one per 4-byte group, each group's bytes and length
    /// in one word (below 2^35, so never a role marker's word).
    fn push_text(&mut self, text: &str) {
        for group in text.as_bytes().chunks(4) {
            let mut word = [0u8; 4];
            word[..group.len()].copy_from_slice(group);
            self.push(u64::from(u32::from_le_bytes(word)) | (group.len() as u64) << 32);
        }
    }

    fn finish(mut self) -> PrefixKeys {
        if self.in_block > 0 {
            self.keys.push(self.running.finish());
        }
        PrefixKeys {
            keys: self.keys,
            block_tokens: self.block_tokens,
            prompt_tokens: self.tokens,
        }
    }
}

/// A role marker's token for the block chain: the role's own hash with the top bit set, so
/// two roles the id rule folds together (every unknown role) still differ, as in the
/// whole-prompt key, and no text token is ever one.
fn role_token(role: &str) -> u64 {
    Fingerprint::default().bytes(role.as_bytes()).finish() | 1 << 63
}

/// Prompt tokens and prompt-cache keys of a text prompt, in blocks of `block_tokens`. The keys
/// are tagged `text` so a text prompt never shares a cache entry with a token-id or chat prompt
/// of the same bytes.
pub fn text_prompt_key(text: &str, block_tokens: u64) -> PromptKey {
    let cache_key = Fingerprint::default()
        .bytes(b"text")
        .bytes(text.as_bytes())
        .finish();
    let mut blocks = BlockHasher::new(b"text", block_tokens);
    blocks.push_text(text);
    PromptKey {
        tokens: text_tokens(text),
        cache_key,
        prefix: blocks.finish(),
    }
}

/// Prompt tokens (the documented chat rule) and prompt-cache keys of a conversation; the same
/// conversation has the same keys on every chat-shaped route. Its blocks follow the template's
/// tokens (four role markers per message, its text, three assistant markers to finish), so
/// the next turn — these messages, the answer, a new message — starts with this prompt's
/// tokens and shares its full blocks.
pub fn chat_prompt_key(messages: &[(String, String)], block_tokens: u64) -> PromptKey {
    let mut fingerprint = Fingerprint::default().bytes(b"chat");
    let mut blocks = BlockHasher::new(b"chat", block_tokens);
    for (role, content) in messages {
        fingerprint = fingerprint
            .bytes(role.as_bytes())
            .number(content.len() as u64)
            .bytes(content.as_bytes());
        let marker = role_token(role);
        for _ in 0..CHAT_TOKENS_PER_MESSAGE {
            blocks.push(marker);
        }
        blocks.push_text(content);
    }
    let assistant = role_token("assistant");
    for _ in 0..CHAT_GENERATION_PROMPT_TOKENS {
        blocks.push(assistant);
    }
    PromptKey {
        tokens: chat_prompt_tokens(messages),
        cache_key: fingerprint.finish(),
        prefix: blocks.finish(),
    }
}

/// Prompt tokens (exactly the length) and prompt-cache keys of a token-id prompt; `None` when
/// the value is not a list of non-negative integers.
pub fn token_ids_key(value: &Value, block_tokens: u64) -> Option<PromptKey> {
    let items = value.as_array()?;
    let mut fingerprint = Fingerprint::default().bytes(b"ids");
    let mut blocks = BlockHasher::new(b"ids", block_tokens);
    for item in items {
        let id = item.as_u64()?;
        fingerprint = fingerprint.number(id);
        blocks.push(id);
    }
    Some(PromptKey {
        tokens: items.len() as u64,
        cache_key: fingerprint.finish(),
        prefix: blocks.finish(),
    })
}

/// Filler vocabulary: readable, all ASCII, no word is a prefix-trap for JSON escaping.
pub const FILLER_WORDS: &[&str] = &[
    "the", "model", "answers", "with", "plain", "words", "that", "read", "like", "a", "calm",
    "report", "about", "speed", "tokens", "flow", "through", "each", "step", "of", "decode", "and",
    "prefill", "while", "requests", "wait", "in", "line", "for", "room", "cache", "keeps",
    "prompts", "warm", "so", "later", "streams", "start", "fast", "every", "batch", "shares",
    "time", "on", "four", "cards", "measured", "again", "under", "load", "simple", "steady",
    "numbers", "matter", "more", "than", "style", "here", "we", "count", "bytes", "not",
    "feelings", "today",
];

/// Deterministic filler text: one word per token.
#[derive(Debug, Clone)]
pub struct FillerText {
    rng: SplitMix64,
}

impl FillerText {
    pub fn new(seed: u64) -> FillerText {
        FillerText {
            rng: SplitMix64::new(seed),
        }
    }

    /// The next token: its word (with a leading space) and its id.
    pub fn next_token(&mut self) -> (&'static str, u32) {
        let index = self.rng.below(FILLER_WORDS.len() as u64) as usize;
        (FILLER_WORDS[index], 1000 + index as u32)
    }

    /// Append `count` tokens to `text` (and their ids to `ids` when given).
    pub fn append(&mut self, count: u32, text: &mut String, mut ids: Option<&mut Vec<u32>>) {
        for _ in 0..count {
            let (word, id) = self.next_token();
            text.push(' ');
            text.push_str(word);
            if let Some(ids) = ids.as_deref_mut() {
                ids.push(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_rule_is_ceil_bytes_over_four() {
        assert_eq!(text_tokens(""), 0);
        assert_eq!(text_tokens("abcd"), 1);
        assert_eq!(text_tokens("abcde"), 2);
        assert_eq!(text_token_ids("abcde").len(), 2);
        // Multi-byte characters count by bytes.
        assert_eq!(text_tokens("é"), 1);
    }

    #[test]
    fn chat_rule_counts_template_overhead() {
        let messages = vec![
            ("system".to_owned(), "be brief".to_owned()),
            ("user".to_owned(), "hello".to_owned()),
        ];
        // 3 + (4 + 2) + (4 + 2)
        assert_eq!(chat_prompt_tokens(&messages), 15);
        assert_eq!(chat_prompt(&messages).0, 15);
        assert_eq!(chat_prompt(&messages).1.len(), 15);
    }

    #[test]
    fn block_chains_share_exactly_the_common_leading_blocks() {
        let base = "0123456789abcdef".repeat(8); // 128 bytes: 32 tokens, 2 blocks of 16
        let short = text_prompt_key(&base, 16);
        assert_eq!((short.tokens, short.prefix.len()), (32, 2));
        let longer = text_prompt_key(&format!("{base}and a few more words"), 16);
        assert_eq!(longer.prefix.prompt_tokens(), longer.tokens);
        assert_eq!(longer.prefix.keys()[..2], short.prefix.keys()[..]);
        assert_ne!(longer.cache_key, short.cache_key);
        // The last block may be short; its length is what is left.
        assert_eq!(longer.prefix.block_len(2), longer.tokens - 32);
        assert_eq!(longer.prefix.tokens_in(99), longer.tokens);
        // One byte changed in the first block: nothing shared.
        let changed = text_prompt_key(&format!("X{}", &base[1..]), 16);
        assert_ne!(changed.prefix.keys()[0], short.prefix.keys()[0]);
        assert_ne!(changed.prefix.keys()[1], short.prefix.keys()[1]);
        // The same tokens as a chat, or as ids, start other chains.
        let ids: Vec<u64> = (0..32).collect();
        let as_ids = token_ids_key(&serde_json::json!(ids), 16).unwrap();
        let as_chat = chat_prompt_key(&[("user".to_owned(), base.clone())], 16);
        assert_eq!(as_chat.tokens, as_chat.prefix.prompt_tokens());
        for other in [&as_ids.prefix, &as_chat.prefix] {
            assert!(!other.keys().iter().any(|k| short.prefix.keys().contains(k)));
        }
        // Empty prompts have no blocks.
        assert!(text_prompt_key("", 16).prefix.is_empty());
        assert_eq!(chat_prompt_key(&[], 16).prefix.len(), 1);
    }

    #[test]
    fn filler_is_deterministic_and_readable() {
        let mut a = FillerText::new(3);
        let mut b = FillerText::new(3);
        let (mut ta, mut tb) = (String::new(), String::new());
        a.append(20, &mut ta, None);
        b.append(20, &mut tb, None);
        assert_eq!(ta, tb);
        assert_eq!(ta.split(' ').filter(|w| !w.is_empty()).count(), 20);
        assert!(ta.is_ascii());
    }
}
