//! Undoing usage injection in the client-facing stream.
//!
//! When tokentap adds `stream_options.include_usage` / `continuous_usage_stats` to a request
//! that lacked them (so that token counts are exact), the upstream's stream changes: a final
//! usage chunk with `"choices":[]` appears and chunks carry a `usage` member. This module
//! decides, for one raw SSE block, how to give the client what it would have received without
//! injection: keep the block, drop it, remove the `usage` member, or put back the `"usage":null`
//! the serializer would have written. Decisions are byte ranges into the raw block; the body
//! wrapper applies them with `Bytes::slice`, so nothing is copied for blocks inside one frame.
//!
//! Some engines change more than usage when usage is asked for: vLLM moves
//! `system_fingerprint` from the finish chunk to the usage chunk (fixtures
//! `tests/fixtures/engines/vllm-0.32.0/`). So when the final usage chunk will be dropped, a
//! block that finishes a choice is marked to be *held* until the next event: if that event is
//! the dropped usage chunk, its members that are neither per-chunk bookkeeping (`id`,
//! `object`, `created`, `model`, `choices`, `usage`) nor already in the finish chunk are put
//! back at the end of the finish chunk ([`restorable_members`]), where the un-injected stream
//! carries them.
//!
//! Decisions are made on the event's data (the `data:` lines joined, as the scanner gives it)
//! and mapped back to the raw block, so any valid framing is handled: LF, CRLF or lone CR,
//! comments, `data:` with or without its space, one event over several `data:` lines.
//!
//! Which serializers write `"usage":null` and which omit the key (protocols.md §1, §5):
//! sglang's msgspec chat chunks omit it; its pydantic chat chunks (tool calls, recognisable by
//! `"role":null` in the delta) and its completions chunks (which carry `matched_stop`) write
//! `null`; vLLM (exclude_unset) omits it.

use super::json;

/// What tokentap added to the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected {
    /// `stream_options.include_usage` was added (or turned on): drop the final usage chunk.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` was added: strip per-chunk `usage`.
    pub continuous_usage: bool,
}

impl Injected {
    /// True if anything was injected, so the stream must be rewritten.
    pub fn any(self) -> bool {
        self.include_usage || self.continuous_usage
    }
}

/// The edit to apply to one raw block; ranges are offsets into the raw block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    Keep,
    Drop,
    /// Cut `[start, end)` out.
    Remove {
        start: usize,
        end: usize,
    },
    /// Replace `[start, end)` with `null`.
    ReplaceWithNull {
        start: usize,
        end: usize,
    },
}

/// Most top-level keys remembered of a held finish chunk (more are simply not remembered, so a
/// member the usage chunk carries could then be restored beside an existing one: no engine's
/// finish chunk comes near this).
const MAX_HELD_KEYS: usize = 24;

/// The top-level keys of a held finish chunk, as hashes in a fixed array (no allocation).
#[derive(Debug, Clone, Copy)]
pub struct KeySet {
    hashes: [u64; MAX_HELD_KEYS],
    len: usize,
}

impl Default for KeySet {
    fn default() -> Self {
        Self {
            hashes: [0; MAX_HELD_KEYS],
            len: 0,
        }
    }
}

impl KeySet {
    fn insert(&mut self, key: &[u8]) {
        if let Some(slot) = self.hashes.get_mut(self.len) {
            *slot = key_hash(key);
            self.len += 1;
        }
    }

    fn contains(&self, key: &[u8]) -> bool {
        let hash = key_hash(key);
        self.hashes
            .get(..self.len)
            .unwrap_or_default()
            .contains(&hash)
    }
}

/// FNV-1a over the raw key bytes (quotes included): keys are compared as written.
fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Everything decided about one block.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    pub edit: Edit,
    /// Hold this finish chunk until the next event: the dropped usage chunk may carry members
    /// that belong here (see the module doc).
    pub hold: bool,
    /// Raw offset of the payload's closing `}` (where restored members go) when `hold`.
    pub close: usize,
    /// The finish chunk's top-level keys when `hold`.
    pub keys: KeySet,
}

impl Decision {
    const KEEP: Decision = Decision {
        edit: Edit::Keep,
        hold: false,
        close: 0,
        keys: KeySet {
            hashes: [0; MAX_HELD_KEYS],
            len: 0,
        },
    };
}

/// Decides the edit for one raw block (its lines and terminating blank line). `payload` is the
/// event's data as the scanner joined it.
pub fn decide(block: &[u8], payload: &[u8], injected: Injected) -> Decision {
    if !injected.any() {
        return Decision::KEEP;
    }
    let start = json::skip_ws(payload, 0);
    if payload.get(start) != Some(&b'{') {
        return Decision::KEEP; // `[DONE]`, or not JSON: never touched
    }
    // One pass over the top-level members and at most one over the choices: this runs for
    // every event of a rewritten stream.
    let mut usage = None;
    let mut choices = None;
    let mut object = None;
    for member in json::members(payload, start) {
        match member.key.bytes(payload) {
            b"\"usage\"" => usage = Some(member),
            b"\"choices\"" => choices = Some(member.value),
            b"\"object\"" => object = Some(member.value),
            _ => {}
        }
    }
    let no_choices = choices.is_none_or(|c| json::is_empty_array(payload, c));
    let usage = usage.filter(|u| !json::is_null(payload, u.value));
    let strip_member = usage.is_some() && !no_choices && injected.continuous_usage;
    let completion = object.is_some_and(|o| json::string_eq(payload, o, b"text_completion"));
    let facts = match choices {
        Some(c) if strip_member || injected.include_usage => scan_choices(payload, c, completion),
        _ => ChoiceFacts::default(),
    };
    let map = RawMap::new(block, payload);
    let edit = match usage {
        None => Edit::Keep,
        // The final usage chunk. Other `choices: []` chunks (sglang's sglext) carry no usage
        // and are kept.
        Some(_) if no_choices && injected.include_usage => Edit::Drop,
        Some(_) if !strip_member => Edit::Keep,
        Some(usage) => {
            let (from, to, null) = if facts.writes_null_usage {
                (usage.value.start, usage.value.end, true)
            } else {
                let (from, to) = member_removal_range(payload, usage);
                (from, to, false)
            };
            match (map.raw(block, from), map.raw(block, to)) {
                (Some(start), Some(end)) if start <= end && null => {
                    Edit::ReplaceWithNull { start, end }
                }
                (Some(start), Some(end)) if start <= end => Edit::Remove { start, end },
                _ => Edit::Keep,
            }
        }
    };
    let close = if injected.include_usage && facts.finishes {
        json::value_end(payload, start)
            .and_then(|end| end.checked_sub(1))
            .and_then(|brace| map.raw(block, brace))
    } else {
        None
    };
    // The keys are only needed for a held chunk (once per choice): a second pass then.
    let mut keys = KeySet::default();
    if close.is_some() {
        for member in json::members(payload, start) {
            keys.insert(member.key.bytes(payload));
        }
    }
    Decision {
        edit,
        hold: close.is_some(),
        close: close.unwrap_or(0),
        keys,
    }
}

/// What the choices of a chunk say, read in one pass.
#[derive(Debug, Clone, Copy, Default)]
struct ChoiceFacts {
    /// Some choice has a non-null `finish_reason`.
    finishes: bool,
    /// The serializer that wrote this chunk writes `"usage":null` when there is no usage.
    writes_null_usage: bool,
}

fn scan_choices(payload: &[u8], choices: json::Span, completion: bool) -> ChoiceFacts {
    let mut facts = ChoiceFacts::default();
    for choice in json::elements(payload, choices.start) {
        for member in json::members(payload, choice.start) {
            match member.key.bytes(payload) {
                b"\"finish_reason\"" => facts.finishes |= !json::is_null(payload, member.value),
                b"\"matched_stop\"" if completion => facts.writes_null_usage = true,
                b"\"delta\"" if !completion => {
                    facts.writes_null_usage |= json::get(payload, member.value.start, b"role")
                        .is_some_and(|role| json::is_null(payload, role));
                }
                _ => {}
            }
        }
    }
    facts
}

/// Maps offsets in an event's joined data to offsets in its raw block. When the data lies
/// inside the block (one `data:` line, scanned in place: nearly every event) that is one
/// addition; otherwise the block's lines are walked ([`raw_offset`]).
#[derive(Debug, Clone, Copy)]
struct RawMap {
    base: Option<usize>,
}

impl RawMap {
    fn new(block: &[u8], payload: &[u8]) -> Self {
        let (b, p) = (block.as_ptr() as usize, payload.as_ptr() as usize);
        let inside = p >= b && p + payload.len() <= b + block.len();
        Self {
            base: inside.then(|| p - b),
        }
    }

    fn raw(self, block: &[u8], joined: usize) -> Option<usize> {
        match self.base {
            Some(base) => Some(base + joined).filter(|&raw| raw <= block.len()),
            None => raw_offset(block, joined),
        }
    }
}

/// The raw ranges of the members of a (dropped) usage chunk that the un-injected stream
/// carries in the finish chunk instead: every member but the per-chunk bookkeeping and those
/// `held` already has. Each range runs from the key to the end of the value.
pub fn restorable_members<'a>(
    block: &'a [u8],
    payload: &'a [u8],
    held: &'a KeySet,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let start = json::skip_ws(payload, 0);
    json::members(payload, start).filter_map(move |member| {
        let key = member.key.bytes(payload);
        let bookkeeping = matches!(
            key,
            b"\"id\""
                | b"\"object\""
                | b"\"created\""
                | b"\"model\""
                | b"\"choices\""
                | b"\"usage\""
        );
        if bookkeeping || held.contains(key) {
            return None;
        }
        let from = raw_offset(block, member.key.start)?;
        let to = raw_offset(block, member.value.end)?;
        (from < to).then_some((from, to))
    })
}

/// Maps an offset into the joined data of `block` (its `data:` values joined with `\n`) to
/// the raw offset of the same byte; the end of a line's value maps to the raw end of that
/// value. `None` if the offset lies past the data.
pub fn raw_offset(block: &[u8], joined: usize) -> Option<usize> {
    let mut consumed = 0usize; // joined bytes before the current data line's value
    let mut line_start = 0usize;
    while line_start < block.len() {
        let line_end = block
            .get(line_start..)?
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map_or(block.len(), |p| line_start + p);
        let line = block.get(line_start..line_end)?;
        if let Some(rest) = line.strip_prefix(b"data") {
            // `data` alone is a data line with an empty value; `data:` / `data: ` otherwise.
            let value_start = match rest.first() {
                None => Some(line_end),
                Some(b':') => Some(line_start + 5 + usize::from(rest.get(1) == Some(&b' '))),
                Some(_) => None, // another field whose name starts with "data"
            };
            if let Some(value_start) = value_start {
                let len = line_end - value_start;
                if joined <= consumed + len {
                    return Some(value_start + (joined - consumed));
                }
                consumed += len + 1; // the `\n` that joins it to the next data line
            }
        }
        let mut next = line_end + 1;
        if block.get(line_end) == Some(&b'\r') && block.get(line_end + 1) == Some(&b'\n') {
            next += 1;
        }
        line_start = next;
    }
    None
}

/// The range that removes `member` together with one adjoining comma.
fn member_removal_range(payload: &[u8], member: json::Member) -> (usize, usize) {
    let mut before = member.key.start;
    while before > 0
        && payload
            .get(before - 1)
            .is_some_and(|b| b.is_ascii_whitespace())
    {
        before -= 1;
    }
    if before > 0 && payload.get(before - 1) == Some(&b',') {
        return (before - 1, member.value.end);
    }
    // First member: take the comma after it instead.
    let after = json::skip_ws(payload, member.value.end);
    if payload.get(after) == Some(&b',') {
        (member.key.start, json::skip_ws(payload, after + 1))
    } else {
        (member.key.start, member.value.end)
    }
}

/// Applies `edit` to `block`, for tests and for the rare block that straddles frames.
pub fn apply(block: &[u8], edit: Edit) -> Vec<u8> {
    match edit {
        Edit::Keep => block.to_vec(),
        Edit::Drop => Vec::new(),
        Edit::Remove { start, end } => {
            let mut out = block.get(..start).unwrap_or_default().to_vec();
            out.extend_from_slice(block.get(end..).unwrap_or_default());
            out
        }
        Edit::ReplaceWithNull { start, end } => {
            let mut out = block.get(..start).unwrap_or_default().to_vec();
            out.extend_from_slice(b"null");
            out.extend_from_slice(block.get(end..).unwrap_or_default());
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::sse::SseScanner;

    const BOTH: Injected = Injected {
        include_usage: true,
        continuous_usage: true,
    };

    /// The decision for one complete block, with its data joined by the real scanner.
    fn decision(block: &str, injected: Injected) -> Decision {
        let mut scanner = SseScanner::new(1 << 16);
        let mut out = Decision::KEEP;
        scanner.feed(block.as_bytes(), |b| {
            if let Some(payload) = b.event.data {
                out = decide(block.as_bytes(), payload, injected);
            }
        });
        out
    }

    fn rewrite(block: &str, injected: Injected) -> String {
        let edit = decision(block, injected).edit;
        String::from_utf8(apply(block.as_bytes(), edit)).unwrap()
    }

    #[test]
    fn sglang_msgspec_chunk_loses_its_usage_member() {
        let with = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"prompt_tokens_details\":null}}\n\n";
        let without = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}\n\n";
        assert_eq!(rewrite(with, BOTH), without);
    }

    #[test]
    fn pydantic_tool_chunk_gets_null_back() {
        let with = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":null,\"reasoning_content\":null,\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":{\"completion_tokens\":2}}\n\n";
        let without = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":null,\"reasoning_content\":null,\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}\n\n";
        assert_eq!(rewrite(with, BOTH), without);
    }

    #[test]
    fn sglang_completion_chunk_gets_null_back_and_vllm_loses_the_key() {
        let sglang = "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\",\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],\"usage\":{\"completion_tokens\":1}}\n\n";
        assert!(rewrite(sglang, BOTH).ends_with(",\"usage\":null}\n\n"));
        let vllm_role = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":11,\"completion_tokens\":0},\"prompt_token_ids\":null}\n\n";
        assert_eq!(
            rewrite(vllm_role, BOTH),
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"prompt_token_ids\":null}\n\n"
        );
    }

    #[test]
    fn final_usage_chunk_dropped_only_when_include_usage_was_injected() {
        let block = "data: {\"id\":\"a\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4}}\n\n";
        assert_eq!(rewrite(block, BOTH), "");
        let continuous_only = Injected {
            include_usage: false,
            continuous_usage: true,
        };
        assert_eq!(rewrite(block, continuous_only), block);
    }

    #[test]
    fn finish_chunks_are_held_only_when_the_usage_chunk_will_be_dropped() {
        let finish = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":8}}\n\n";
        let d = decision(finish, BOTH);
        assert!(d.hold);
        assert_eq!(&finish[d.close..], "}\n\n");
        let continuous_only = Injected {
            include_usage: false,
            continuous_usage: true,
        };
        assert!(!decision(finish, continuous_only).hold);
        let unfinished = finish.replace("\"length\"", "null");
        assert!(!decision(&unfinished, BOTH).hold);
    }

    #[test]
    fn usage_chunk_gives_back_what_the_finish_chunk_lacks() {
        let finish = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"finish_reason\":\"length\"}],\"service_tier\":null}\n\n";
        let usage = "data: {\"id\":\"a\",\"object\":\"x\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"completion_tokens\":8},\"system_fingerprint\":\"fp\",\"service_tier\":null}\n\n";
        let held = decision(finish, BOTH);
        let payload = usage.strip_prefix("data: ").unwrap().trim_end();
        let restored: Vec<&str> =
            restorable_members(usage.as_bytes(), payload.as_bytes(), &held.keys)
                .map(|(a, b)| &usage[a..b])
                .collect();
        assert_eq!(restored, ["\"system_fingerprint\":\"fp\""]);
    }

    #[test]
    fn edits_map_back_through_any_framing() {
        // One event over three `data:` lines, CRLF, no space after the colon, a comment inside.
        let block = "data:{\"id\":\"a\",\r\n: note\r\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}],\"usage\":{\"completion_tokens\":1}\r\ndata:}\r\n\r\n";
        assert_eq!(
            rewrite(block, BOTH),
            "data:{\"id\":\"a\",\r\n: note\r\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]\r\ndata:}\r\n\r\n"
        );
        let lone_cr = "data: {\"choices\":[{\"index\":0}],\"usage\":{\"completion_tokens\":1}}\r\r";
        assert_eq!(
            rewrite(lone_cr, BOTH),
            "data: {\"choices\":[{\"index\":0}]}\r\r"
        );
    }

    #[test]
    fn other_blocks_are_untouched() {
        for block in [
            "data: [DONE]\n\n",
            "data: {\"id\":\"a\",\"choices\":[],\"sglext\":{}}\n\n",
            "data: {\"error\": {\"code\": 503}}\n\n",
            ": comment\n\n",
            "data: not json\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{}}],\"usage\":null}\n\n",
        ] {
            assert_eq!(rewrite(block, BOTH), block);
        }
    }
}
