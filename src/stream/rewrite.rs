//! Undoing usage injection in the client-facing stream.
//!
//! When tokentap adds `stream_options.include_usage` / `continuous_usage_stats` to a request
//! that lacked them (so that token counts are exact), the upstream's stream changes: a final
//! usage chunk with `"choices":[]` appears and chunks carry a `usage` member. This module
//! decides, for one raw SSE block, how to give the client what it would have received without
//! injection: keep the block, drop it, remove the `usage` member, or put back the `"usage":null`
//! the serializer would have written. Decisions are byte ranges into the block; the body
//! wrapper applies them with `Bytes::slice`, so nothing is copied for blocks inside one frame.
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

/// The edit to apply to one raw block; ranges are offsets into the block.
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

/// Decides the edit for one raw block (its lines and terminating blank line).
pub fn edit_for_block(block: &[u8], injected: Injected) -> Edit {
    if !injected.any() {
        return Edit::Keep;
    }
    let Some(payload_start) = single_data_payload(block) else {
        return Edit::Keep;
    };
    let start = json::skip_ws(block, payload_start);
    if block.get(start) != Some(&b'{') {
        return Edit::Keep; // `[DONE]`, or not JSON: never touched
    }
    // One pass over the top-level members: this runs for every event of a rewritten stream.
    let mut usage = None;
    let mut choices = None;
    for member in json::members(block, start) {
        match member.key.bytes(block) {
            b"\"usage\"" => usage = Some(member),
            b"\"choices\"" => choices = Some(member.value),
            _ => {}
        }
    }
    let Some(usage) = usage else {
        return Edit::Keep;
    };
    if json::is_null(block, usage.value) {
        return Edit::Keep;
    }
    let no_choices = choices.is_none_or(|c| json::is_empty_array(block, c));
    if no_choices {
        // The final usage chunk. Other `choices: []` chunks (sglang's sglext) carry no usage
        // and were kept above.
        return if injected.include_usage {
            Edit::Drop
        } else {
            Edit::Keep
        };
    }
    if !injected.continuous_usage {
        return Edit::Keep;
    }
    if writes_null_usage(block, start, choices) {
        Edit::ReplaceWithNull {
            start: usage.value.start,
            end: usage.value.end,
        }
    } else {
        let (start, end) = member_removal_range(block, usage);
        Edit::Remove { start, end }
    }
}

/// Offset of the payload of the block's only `data:` line; `None` for blocks with no data or
/// several data lines (left untouched: no OpenAI-compatible server writes those).
fn single_data_payload(block: &[u8]) -> Option<usize> {
    let mut found = None;
    let mut line_start = 0usize;
    while line_start < block.len() {
        let line_end = block
            .get(line_start..)?
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map_or(block.len(), |p| line_start + p);
        let line = block.get(line_start..line_end)?;
        if let Some(rest) = line.strip_prefix(b"data:") {
            if found.is_some() {
                return None;
            }
            let skip = usize::from(rest.first() == Some(&b' '));
            found = Some(line_start + 5 + skip);
        }
        line_start = line_end + 1;
    }
    found
}

/// True if the serializer that wrote this chunk writes `"usage":null` when there is no usage.
fn writes_null_usage(block: &[u8], start: usize, choices: Option<json::Span>) -> bool {
    let Some(choices) = choices else {
        return false;
    };
    let completion = json::get(block, start, b"object")
        .is_some_and(|o| json::string_eq(block, o, b"text_completion"));
    json::elements(block, choices.start).any(|choice| {
        if completion {
            json::get(block, choice.start, b"matched_stop").is_some()
        } else {
            json::path(block, choice.start, &[b"delta", b"role"])
                .is_some_and(|role| json::is_null(block, role))
        }
    })
}

/// The range that removes `member` together with one adjoining comma.
fn member_removal_range(block: &[u8], member: json::Member) -> (usize, usize) {
    let mut before = member.key.start;
    while before > 0
        && block
            .get(before - 1)
            .is_some_and(|b| b.is_ascii_whitespace())
    {
        before -= 1;
    }
    if before > 0 && block.get(before - 1) == Some(&b',') {
        return (before - 1, member.value.end);
    }
    // First member: take the comma after it instead.
    let after = json::skip_ws(block, member.value.end);
    if block.get(after) == Some(&b',') {
        (member.key.start, json::skip_ws(block, after + 1))
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

    const BOTH: Injected = Injected {
        include_usage: true,
        continuous_usage: true,
    };

    fn rewrite(block: &str, injected: Injected) -> String {
        String::from_utf8(apply(
            block.as_bytes(),
            edit_for_block(block.as_bytes(), injected),
        ))
        .unwrap()
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
