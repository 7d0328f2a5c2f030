//! Text in and out of the simulator: the documented prompt-token rule for text prompts
//! (shared by the generation routes and `/tokenize`, so they always agree), prompt
//! fingerprints for the prompt cache, and the deterministic filler words of the output.
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

/// Prompt tokens and prompt-cache key of a text prompt. The key is tagged `text` so a text
/// prompt never shares a cache entry with a token-id or chat prompt of the same bytes.
pub fn text_prompt_key(text: &str) -> (u64, u64) {
    let key = Fingerprint::default()
        .bytes(b"text")
        .bytes(text.as_bytes())
        .finish();
    (text_tokens(text), key)
}

/// Prompt tokens (the documented chat rule) and prompt-cache key of a conversation; the same
/// conversation has the same key on every chat-shaped route.
pub fn chat_prompt_key(messages: &[(String, String)]) -> (u64, u64) {
    let mut fingerprint = Fingerprint::default().bytes(b"chat");
    for (role, content) in messages {
        fingerprint = fingerprint
            .bytes(role.as_bytes())
            .number(content.len() as u64)
            .bytes(content.as_bytes());
    }
    (chat_prompt_tokens(messages), fingerprint.finish())
}

/// Prompt tokens (exactly the length) and prompt-cache key of a token-id prompt; `None` when
/// the value is not a list of non-negative integers.
pub fn token_ids_key(value: &Value) -> Option<(u64, u64)> {
    let items = value.as_array()?;
    let mut fingerprint = Fingerprint::default().bytes(b"ids");
    for item in items {
        fingerprint = fingerprint.number(item.as_u64()?);
    }
    Some((items.len() as u64, fingerprint.finish()))
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
