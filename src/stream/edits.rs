//! The client-byte edit queue of a rewritten stream: which of the upstream's bytes the client
//! gets, held back, dropped or edited, in order. It applies [`super::rewrite`]'s decisions
//! (undoing tokentap's usage injection) with `Bytes::slice`, and owns the two holds the
//! invariants allow: the unfinished tail of an event that straddles frames (bounded by the
//! event limit; past it the event passes through untouched) and, when the final usage chunk
//! will be dropped, the finish chunk until the next event (so what the engine moved into the
//! usage chunk can be put back).
//!
//! Pure: frame in, pieces out — no body, no waker, no I/O. Per frame the caller opens
//! [`EditQueue::frame`], hands it each block the scanner finds in the frame
//! ([`FrameEdits::block`]), and closes it ([`FrameEdits::finish`]): either the frame goes to
//! the client whole (nothing in it was edited: the caller forwards the same `Bytes`, zero
//! copy), or its pieces are queued for [`EditQueue::pop`]. [`EditQueue::end`] lets go of what
//! is held when the stream ends. Per event nothing allocates except the copy of an event that
//! straddled frames (into a buffer that is reused).

use std::collections::VecDeque;

use std::sync::Arc;

use bytes::Bytes;

use super::held::{EventBytes, HeldBudget};
use super::rewrite::{decide, restorable_members, Edit, Injected, KeySet};
use super::sse::{Block, SseScanner};

/// Most pieces a held finish chunk may gather (its own, restored members, trailing comments)
/// before it is let go regardless: the hold is bounded.
const MAX_FINISH_PIECES: usize = 16;

/// The edit queue of one rewritten stream.
#[derive(Debug)]
pub struct EditQueue {
    injected: Injected,
    /// Bytes of an unfinished event, not yet forwarded (within the held budget past a free
    /// part: an event it cannot cover passes through untouched, as one past the limit does).
    held: EventBytes,
    /// The current event outgrew the limit: forward the rest of it untouched.
    passthrough: bool,
    /// The previous block was dropped (its CRLF's stray LF must go too).
    previous_dropped: bool,
    limit: usize,
    /// A finish chunk, already edited, held until the next event (see `rewrite`): its pieces,
    /// then any comment blocks that followed it. Empty when nothing is held.
    finish: VecDeque<Bytes>,
    /// Index in `finish` of the piece that starts with the finish chunk's closing `}`.
    finish_close: usize,
    finish_keys: KeySet,
    /// Pieces ready for the client, in order.
    out: VecDeque<Bytes>,
}

/// One complete block to decide: `src[start..end]`, whose data is `payload` (none for a
/// comment, or an event too large to keep).
#[derive(Debug, Clone, Copy)]
struct RawBlock<'a> {
    src: &'a Bytes,
    start: usize,
    end: usize,
    payload: Option<&'a [u8]>,
}

/// Where a block lies.
#[derive(Debug)]
enum Place<'c> {
    /// In the frame being forwarded, whose bytes before `cursor` are decided (queued, held or
    /// dropped). A block kept as it is stays where it is (the cursor is not moved past it),
    /// so a frame with nothing to edit is forwarded whole.
    Frame { cursor: &'c mut usize },
    /// In a copy (an event that straddled frames, or the unfinished last one): always queued.
    Copy,
}

impl Place<'_> {
    /// Queues the frame's undecided bytes before `start` (a copy has none).
    fn catch_up(&mut self, out: &mut VecDeque<Bytes>, src: &Bytes, start: usize) {
        if let Place::Frame { cursor } = self {
            push_slice(out, src, **cursor, start);
        }
    }

    /// Everything before `end` is decided.
    fn decided(&mut self, end: usize) {
        if let Place::Frame { cursor } = self {
            **cursor = end;
        }
    }
}

impl EditQueue {
    /// A queue that undoes `injected`, holding at most `limit` bytes of an unfinished event,
    /// its copy charged to `budget` past the free part.
    pub fn new(injected: Injected, limit: usize, budget: Option<Arc<HeldBudget>>) -> Self {
        Self {
            injected,
            held: EventBytes::new(budget),
            passthrough: false,
            previous_dropped: false,
            limit,
            finish: VecDeque::with_capacity(MAX_FINISH_PIECES),
            finish_close: 0,
            finish_keys: KeySet::default(),
            out: VecDeque::with_capacity(4),
        }
    }

    /// Opens the edits of one frame, `data`: hand it the frame's blocks, then finish it.
    pub fn frame<'a>(&'a mut self, data: &'a Bytes) -> FrameEdits<'a> {
        FrameEdits {
            queue: self,
            data,
            cursor: 0,
            last_end: 0,
        }
    }

    /// The next piece for the client.
    #[inline]
    pub fn pop(&mut self) -> Option<Bytes> {
        self.out.pop_front()
    }

    /// Nothing is queued or held.
    #[inline]
    pub fn is_drained(&self) -> bool {
        self.out.is_empty() && self.held.is_empty() && !self.holding()
    }

    fn holding(&self) -> bool {
        !self.finish.is_empty()
    }

    /// Forwards the held finish chunk (and what was held after it).
    fn release(&mut self) {
        self.out.extend(self.finish.drain(..));
    }

    /// At the end of the stream (clean or not): the unfinished last event, which no blank
    /// line closed, is forwarded as the upstream sent it minus what tokentap injected, edited
    /// as the complete event would have been (the usage chunk tokentap asked for is dropped,
    /// injected per-chunk usage removed); then whatever else is held. Once per stream.
    pub fn end(&mut self) {
        let held = self.held.take_bytes();
        if held.is_empty() {
            self.release();
            return;
        }
        if self.passthrough {
            self.release();
            self.out.push_back(held);
            return;
        }
        // Its data, as a scanner reads it once the event is closed.
        let mut closed = Vec::with_capacity(held.len() + 2);
        closed.extend_from_slice(&held);
        closed.extend_from_slice(b"\n\n");
        let mut payload: Option<Vec<u8>> = None;
        let mut first = true;
        SseScanner::new(self.limit).feed(&closed, |block| {
            if std::mem::take(&mut first) && !block.oversized {
                payload = block.event.data.map(<[u8]>::to_vec);
            }
        });
        let block = RawBlock {
            src: &held,
            start: 0,
            end: held.len(),
            payload: payload.as_deref(),
        };
        self.on_block(block, Place::Copy);
        self.release();
    }

    /// Puts the members of the dropped usage chunk `block` that belong in the held finish
    /// chunk back into it, then forwards it.
    fn restore_and_release(&mut self, block: RawBlock<'_>, payload: &[u8]) {
        let RawBlock {
            src, start, end, ..
        } = block;
        let raw = src.get(start..end).unwrap_or_default();
        let mut at = self.finish_close;
        for (from, to) in restorable_members(raw, payload, &self.finish_keys) {
            let (from, to) = (start + from, start + to);
            if at > self.finish.len()
                || self.finish.len() + 2 > MAX_FINISH_PIECES
                || from >= to
                || to > src.len()
            {
                break;
            }
            self.finish.insert(at, Bytes::from_static(b","));
            self.finish.insert(at + 1, src.slice(from..to));
            at += 2;
        }
        self.release();
    }

    /// Handles one complete block at `place`.
    fn on_block(&mut self, block: RawBlock<'_>, mut place: Place<'_>) {
        let RawBlock {
            src,
            start,
            end,
            payload,
        } = block;
        let raw = src.get(start..end).unwrap_or_default();
        let decision = payload.map(|p| decide(raw, p, self.injected));
        if self.holding() {
            match decision {
                None if self.finish.len() < MAX_FINISH_PIECES => {
                    // A comment or other data-less block after the finish chunk: it stays
                    // after it.
                    place.catch_up(&mut self.out, src, start);
                    push_slice(&mut self.finish, src, start, end);
                    place.decided(end);
                    return;
                }
                Some(d) if d.edit == Edit::Drop => {
                    if let Some(payload) = payload {
                        self.restore_and_release(block, payload);
                    }
                }
                _ => self.release(),
            }
        }
        let Some(decision) = decision else {
            if let Place::Copy = place {
                push_slice(&mut self.out, src, start, end);
            }
            return;
        };
        self.previous_dropped = decision.edit == Edit::Drop;
        if decision.hold {
            place.catch_up(&mut self.out, src, start);
            self.finish_close = push_edited(
                &mut self.finish,
                src,
                start,
                end,
                decision.edit,
                Some(decision.close),
            );
            self.finish_keys = decision.keys;
            place.decided(end);
            return;
        }
        if let Place::Frame { .. } = place {
            if decision.edit == Edit::Keep {
                return;
            }
        }
        place.catch_up(&mut self.out, src, start);
        push_edited(&mut self.out, src, start, end, decision.edit, None);
        place.decided(end);
    }
}

/// The edits of one frame in progress (see [`EditQueue::frame`]).
#[derive(Debug)]
pub struct FrameEdits<'a> {
    queue: &'a mut EditQueue,
    data: &'a Bytes,
    /// Bytes of the frame before this are decided.
    cursor: usize,
    /// The end of the last complete block seen in the frame.
    last_end: usize,
}

impl FrameEdits<'_> {
    /// One block the scanner found in the frame (`block.end_in_chunk` is an offset into it).
    pub fn block(&mut self, block: &Block<'_>) {
        let Self {
            queue,
            data,
            cursor,
            last_end,
        } = self;
        let end = block.end_in_chunk;
        *last_end = end;
        let dropped_before = std::mem::take(&mut queue.previous_dropped);
        let payload = if block.oversized {
            None
        } else {
            block.event.data
        };
        match block.start_in_chunk {
            Some(start) if block.terminator_tail => {
                // The LF of the previous block's CRLF: it goes where that block went.
                if dropped_before {
                    push_slice(&mut queue.out, data, *cursor, start);
                    *cursor = end;
                } else if queue.holding() {
                    push_slice(&mut queue.out, data, *cursor, start);
                    push_slice(&mut queue.finish, data, start, end);
                    *cursor = end;
                }
            }
            Some(start) => {
                let block = RawBlock {
                    src: data,
                    start,
                    end,
                    payload,
                };
                queue.on_block(block, Place::Frame { cursor });
            }
            None if queue.passthrough => {
                queue.release();
                push_slice(&mut queue.out, data, *cursor, end);
                *cursor = end;
                queue.passthrough = false;
            }
            None => {
                // The rare event that straddled frames: edit a copy.
                if !queue.held.extend(data.get(..end).unwrap_or_default()) {
                    // The budget cannot cover the whole event: it goes as it came.
                    queue.release();
                    let held = queue.held.take_bytes();
                    if !held.is_empty() {
                        queue.out.push_back(held);
                    }
                    push_slice(&mut queue.out, data, *cursor, end);
                    *cursor = end;
                    return;
                }
                let copy = queue.held.take_bytes();
                let block = RawBlock {
                    src: &copy,
                    start: 0,
                    end: copy.len(),
                    payload,
                };
                queue.on_block(block, Place::Copy);
                *cursor = end;
            }
        }
    }

    /// Closes the frame: true when it goes to the client whole (nothing in it was edited and
    /// nothing is queued before it), so the caller forwards the same `Bytes`; otherwise its
    /// complete events are queued and the unfinished tail is held (or, past the limit,
    /// forwarded as is).
    pub fn finish(self) -> bool {
        let Self {
            queue,
            data,
            cursor,
            last_end,
        } = self;
        let complete_end = last_end.max(cursor);
        if cursor == 0 && complete_end == data.len() && queue.out.is_empty() {
            return true;
        }
        push_slice(&mut queue.out, data, cursor, complete_end);
        if complete_end < data.len() {
            let tail = data.get(complete_end..).unwrap_or_default();
            if queue.passthrough {
                push_slice(&mut queue.out, data, complete_end, data.len());
            } else if queue.held.len() + tail.len() > queue.limit || !queue.held.extend(tail) {
                // Too big to hold (past the limit, or past what the budget covers): forward
                // what we held and the rest of this event as is.
                queue.release();
                let held = queue.held.take_bytes();
                if !held.is_empty() {
                    queue.out.push_back(held);
                }
                push_slice(&mut queue.out, data, complete_end, data.len());
                queue.passthrough = true;
            }
        }
        false
    }
}

/// Queues the pieces of `src[start..end]` with `edit` applied (its ranges relative to
/// `start`), without copying. With `split` (a raw offset relative to `start`, after the edited
/// range), the last piece is cut there; returns the index in `out` of the piece that starts at
/// `split`.
fn push_edited(
    out: &mut VecDeque<Bytes>,
    src: &Bytes,
    start: usize,
    end: usize,
    edit: Edit,
    split: Option<usize>,
) -> usize {
    let (head, tail) = match edit {
        Edit::Drop => return out.len(),
        Edit::Keep => (None, start),
        Edit::Remove { start: a, end: b } => (Some((start + a, false)), start + b),
        Edit::ReplaceWithNull { start: a, end: b } => (Some((start + a, true)), start + b),
    };
    if let Some((head_end, null)) = head {
        push_slice(out, src, start, head_end);
        if null {
            out.push_back(Bytes::from_static(b"null"));
        }
    }
    // The split point (a closing `}`) follows every member, so it lies in the last piece.
    let cut = split.map(|s| (start + s).clamp(tail, end));
    match cut {
        Some(cut) => {
            push_slice(out, src, tail, cut);
            let index = out.len();
            push_slice(out, src, cut, end);
            index
        }
        None => {
            push_slice(out, src, tail, end);
            out.len()
        }
    }
}

fn push_slice(queue: &mut VecDeque<Bytes>, data: &Bytes, from: usize, to: usize) {
    if from < to && to <= data.len() {
        queue.push_back(data.slice(from..to));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LIMIT: usize = 1 << 16;

    const BOTH: Injected = Injected {
        include_usage: true,
        continuous_usage: true,
    };

    /// What the client gets of `frames`, and for each frame whether it went whole (the same
    /// `Bytes`). No body: a scanner finds the blocks, the queue edits them.
    fn client(frames: &[Bytes], injected: Injected, limit: usize) -> (Vec<u8>, Vec<bool>) {
        let mut scanner = SseScanner::new(limit);
        let mut queue = EditQueue::new(injected, limit, None);
        let (mut out, mut whole) = (Vec::new(), Vec::new());
        for frame in frames {
            let mut edits = queue.frame(frame);
            scanner.feed(frame, |block| edits.block(&block));
            let forwarded = edits.finish();
            if forwarded {
                out.extend_from_slice(frame);
            }
            whole.push(forwarded);
            while let Some(piece) = queue.pop() {
                out.extend_from_slice(&piece);
            }
        }
        queue.end();
        while let Some(piece) = queue.pop() {
            out.extend_from_slice(&piece);
        }
        assert!(queue.is_drained());
        (out, whole)
    }

    /// `bytes` cut at `cuts` (any order, duplicates and out-of-range points ignored).
    fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut points: Vec<usize> = cuts.iter().map(|&c| c.min(bytes.len())).collect();
        points.sort_unstable();
        points.dedup();
        let mut frames = Vec::new();
        let mut last = 0;
        for p in points.into_iter().chain([bytes.len()]) {
            if p > last {
                frames.push(Bytes::copy_from_slice(&bytes[last..p]));
                last = p;
            }
        }
        frames
    }

    /// A vLLM-shaped stream asked for usage by tokentap: content chunks with per-chunk usage,
    /// a finish chunk, a comment, the usage chunk carrying `system_fingerprint`, `[DONE]`;
    /// and what the client would have got without the injection.
    fn vllm(contents: &[&str], nl: &str) -> (String, String) {
        let (mut upstream, mut plain) = (String::new(), String::new());
        let end = format!("{nl}{nl}");
        for (i, content) in contents.iter().enumerate() {
            let finish = if i + 1 == contents.len() {
                "\"length\""
            } else {
                "null"
            };
            let choices = format!(
                r#"{{"id":"c","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":{finish}}}]"#
            );
            upstream.push_str(&format!(
                r#"data: {choices},"usage":{{"completion_tokens":{}}}}}{end}"#,
                i + 1
            ));
            let fingerprint = if i + 1 == contents.len() {
                r#","system_fingerprint":"fp""#
            } else {
                ""
            };
            plain.push_str(&format!("data: {choices}{fingerprint}}}{end}"));
        }
        upstream.push_str(&format!(": keep-alive{end}"));
        plain.push_str(&format!(": keep-alive{end}"));
        upstream.push_str(&format!(
            r#"data: {{"id":"c","choices":[],"usage":{{"completion_tokens":{}}},"system_fingerprint":"fp"}}{end}"#,
            contents.len()
        ));
        upstream.push_str(&format!("data: [DONE]{end}"));
        plain.push_str(&format!("data: [DONE]{end}"));
        (upstream, plain)
    }

    #[test]
    fn the_injection_is_undone_in_one_frame() {
        for nl in ["\n", "\r\n"] {
            let (upstream, plain) = vllm(&["a", "b", "c"], nl);
            let (out, whole) = client(&[Bytes::from(upstream)], BOTH, LIMIT);
            assert_eq!(String::from_utf8(out).unwrap(), plain);
            assert_eq!(whole, [false]);
        }
    }

    #[test]
    fn a_frame_with_nothing_to_edit_goes_whole() {
        // Whole events, no usage in them: every frame is the client's as it is.
        let events = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n",
            ": keep-alive\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":null}]}\n\n",
            "data: [DONE]\n\n",
        ];
        let frames: Vec<Bytes> = events
            .iter()
            .map(|e| Bytes::from_static(e.as_bytes()))
            .collect();
        let (out, whole) = client(&frames, BOTH, LIMIT);
        assert_eq!(whole, [true, true, true]);
        assert_eq!(out, events.concat().as_bytes());
        // The same `Bytes`, not a copy: nothing is queued to take its place.
        let mut queue = EditQueue::new(BOTH, LIMIT, None);
        let mut scanner = SseScanner::new(LIMIT);
        let mut edits = queue.frame(&frames[0]);
        scanner.feed(&frames[0], |block| edits.block(&block));
        assert!(edits.finish());
        assert!(queue.pop().is_none());
    }

    #[test]
    fn an_event_past_the_limit_passes_through_untouched() {
        let event = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"completion_tokens\":1}}}}\n\n",
            "x".repeat(200)
        );
        let stream = format!("{event}data: [DONE]\n\n");
        let frames = split(stream.as_bytes(), &[10, 50, 120, 230]);
        let (out, _) = client(&frames, BOTH, 64);
        assert_eq!(String::from_utf8(out).unwrap(), stream);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any split of the upstream's bytes into frames gives the client the same bytes as
        /// one frame does: the stream without the injection.
        #[test]
        fn every_split_gives_the_bytes_of_one_frame(
            words in proptest::collection::vec("[a-z]{0,3}", 1..6),
            crlf in any::<bool>(),
            cuts in proptest::collection::vec(0usize..2048, 0..16),
        ) {
            let contents: Vec<&str> = words.iter().map(String::as_str).collect();
            let (upstream, plain) = vllm(&contents, if crlf { "\r\n" } else { "\n" });
            let (one, _) = client(&[Bytes::from(upstream.clone())], BOTH, LIMIT);
            prop_assert_eq!(String::from_utf8(one).unwrap(), plain.as_str());
            let (many, _) = client(&split(upstream.as_bytes(), &cuts), BOTH, LIMIT);
            prop_assert_eq!(String::from_utf8(many).unwrap(), plain);
        }

        /// The same for arbitrary SSE-ish bytes, which never panic whatever the split.
        #[test]
        fn arbitrary_bytes_give_the_same_client_bytes_in_any_split(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'{'), Just(b'}'), Just(b'"'), Just(b':'),
                    Just(b','), Just(b'['), Just(b']'), any::<u8>()], 0..256),
            cuts in proptest::collection::vec(0usize..256, 0..12),
            prefix in prop_oneof![Just(&b""[..]), Just(&b"data: "[..])],
        ) {
            let bytes = [prefix, &bytes].concat();
            let (one, _) = client(&[Bytes::from(bytes.clone())], BOTH, LIMIT);
            let (many, _) = client(&split(&bytes, &cuts), BOTH, LIMIT);
            prop_assert_eq!(many, one);
        }
    }
}
