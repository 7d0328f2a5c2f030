//! An incremental Server-Sent-Events scanner: bytes in, events out.
//!
//! Pure: no I/O, no await, no clock. It accepts any split of the stream (an event may arrive
//! in one chunk or one byte at a time), LF, CRLF or lone-CR line ends, comment lines, `event:`,
//! `id:` and `retry:` fields and multi-line `data:`. It never panics and its memory is bounded:
//! a block that grows past `max_event_bytes` is reported as `oversized` with no data, and the
//! scanner resynchronises at the next blank line.
//!
//! Events entirely inside one chunk are parsed in place (no copy). Only the bytes of an event
//! that straddles chunks are copied, into a buffer that is reused, so the steady state
//! allocates nothing. That copy is within the proxy's one memory budget past a small free part
//! ([`EventBytes`]), and a large one is freed when its event ends: an event the budget cannot
//! cover is read as too large (`oversized`), as one past `max_event_bytes` is.

use std::sync::Arc;

use super::held::{EventBytes, HeldBudget, FREE_EVENT_BYTES};

/// The fields of one dispatched event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field, empty if absent.
    pub name: &'a [u8],
    /// The `data:` lines joined with `\n`; `None` if the block had no `data:` field.
    pub data: Option<&'a [u8]>,
}

/// One blank-line-terminated block of the stream, with where it lies in the current chunk.
#[derive(Debug, Clone, Copy)]
pub struct Block<'a> {
    /// Offset of the block's first byte in the current chunk, or `None` if the block began
    /// in an earlier chunk.
    pub start_in_chunk: Option<usize>,
    /// Offset just past the block's terminating blank line in the current chunk.
    pub end_in_chunk: usize,
    /// Parsed fields (empty when `oversized`).
    pub event: SseEvent<'a>,
    /// The block was larger than the configured limit; its fields were not kept.
    pub oversized: bool,
    /// This "block" is only the LF completing the CRLF that ended the previous block, which
    /// arrived at the start of this chunk. It belongs with the previous block (a rewriter that
    /// dropped that block drops this byte too).
    pub terminator_tail: bool,
}

/// Incremental scanner state; one per response stream.
#[derive(Debug)]
pub struct SseScanner {
    /// Bytes of the current block when it began in an earlier chunk.
    carry: EventBytes,
    /// The current block began in an earlier chunk (its bytes so far are in `carry`).
    carrying: bool,
    /// The current block passed `max_event_bytes`; its bytes are being skipped.
    oversized: bool,
    /// The previous byte ended a line and nothing has started a new one yet.
    at_line_start: bool,
    /// The previous byte was a CR, so an LF right after it is part of the same line end.
    after_cr: bool,
    /// The last block ended on a CR that was the chunk's last byte; an LF starting the next
    /// chunk completes that terminator.
    terminator_cr_pending: bool,
    /// Scratch space for joining multi-line `data:` fields (engines send one `data:` line per
    /// event, so most streams never make it; a large one is freed after its event). Boxed so
    /// the scanner keeps one word for it in every stream's metering box, not a `Vec`'s three.
    #[allow(
        clippy::box_collection,
        reason = "one word in the metering box, not three"
    )]
    joined: Option<Box<Vec<u8>>>,
    /// `u32`: the scanner sits in every stream's metering box, and no event limit is 4 GiB.
    max_event_bytes: u32,
}

impl SseScanner {
    /// A scanner that keeps at most `max_event_bytes` of a single event, its copies uncharged
    /// (benches, tests, the sweep's own client).
    pub fn new(max_event_bytes: usize) -> Self {
        Self::within(max_event_bytes, None)
    }

    /// A scanner whose copy of a straddling event is charged to `budget` past its free part.
    pub fn within(max_event_bytes: usize, budget: Option<Arc<HeldBudget>>) -> Self {
        Self {
            carry: EventBytes::new(budget),
            carrying: false,
            oversized: false,
            at_line_start: true,
            after_cr: false,
            terminator_cr_pending: false,
            joined: None,
            max_event_bytes: u32::try_from(max_event_bytes).unwrap_or(u32::MAX),
        }
    }

    fn limit(&self) -> usize {
        self.max_event_bytes as usize
    }

    /// True if a block is in progress (bytes seen since the last blank line).
    pub fn mid_event(&self) -> bool {
        self.carrying || self.oversized
    }

    /// True while the block in progress is being skipped because it grew past
    /// `max_event_bytes` (its `oversized` block comes only when it ends), so a reader that
    /// treats an oversized event as an error can stop before the block ends.
    pub fn skipping_oversized(&self) -> bool {
        self.oversized
    }

    /// Scans `chunk`, calling `on_block` for every block that ends inside it, in order.
    pub fn feed(&mut self, chunk: &[u8], mut on_block: impl FnMut(Block<'_>)) {
        let mut block_start = 0usize;
        let mut i = 0usize;
        if std::mem::take(&mut self.terminator_cr_pending) && chunk.first() == Some(&b'\n') {
            self.after_cr = false;
            on_block(Block {
                start_in_chunk: Some(0),
                end_in_chunk: 1,
                event: SseEvent {
                    name: b"",
                    data: None,
                },
                oversized: false,
                terminator_tail: true,
            });
            block_start = 1;
            i = 1;
        }
        while let Some(&byte) = chunk.get(i) {
            i += 1;
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue; // the LF of a CRLF: the line already ended at the CR
                }
            }
            if byte != b'\n' && byte != b'\r' {
                self.at_line_start = false;
                // Skip the rest of the line in one search instead of byte by byte.
                let rest = chunk.get(i..).unwrap_or_default();
                i += memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                continue;
            }
            if byte == b'\r' {
                self.after_cr = true;
            }
            if !self.at_line_start {
                self.at_line_start = true;
                continue;
            }
            // A line end at the start of a line: the blank line that ends a block. Take the
            // LF of a CRLF with it when it is already here, so the next block starts clean.
            let mut end = i;
            if byte == b'\r' && chunk.get(end) == Some(&b'\n') {
                end += 1;
                self.after_cr = false;
            }
            i = end;
            self.terminator_cr_pending = byte == b'\r' && end == chunk.len();
            self.dispatch(chunk, block_start, end, &mut on_block);
            block_start = end;
        }
        // Whatever follows the last blank line belongs to a block that ends later.
        if block_start < chunk.len() {
            let tail = chunk.get(block_start..).unwrap_or_default();
            if !self.carrying && !self.oversized {
                self.carrying = true;
                self.carry.clear();
            }
            if !self.oversized
                && (self.carry.len() + tail.len() > self.limit() || !self.carry.extend(tail))
            {
                // Past the limit, or past what the budget covers: skipped to its end.
                self.oversized = true;
                self.carry.clear();
            }
        }
    }

    fn dispatch(
        &mut self,
        chunk: &[u8],
        start: usize,
        end: usize,
        on_block: &mut impl FnMut(Block<'_>),
    ) {
        let piece = chunk.get(start..end).unwrap_or_default();
        let began_here = !self.carrying && !self.oversized;
        let limit = self.limit();
        let oversized = self.oversized
            || (self.carrying && self.carry.len() + piece.len() > limit)
            || (began_here && piece.len() > limit)
            || (self.carrying && !self.carry.extend(piece));
        let start_in_chunk = began_here.then_some(start);
        if oversized {
            on_block(Block {
                start_in_chunk,
                end_in_chunk: end,
                event: SseEvent {
                    name: b"",
                    data: None,
                },
                oversized: true,
                terminator_tail: false,
            });
        } else {
            let event = if self.carrying {
                parse_fields(self.carry.as_slice(), &mut self.joined)
            } else {
                parse_fields(piece, &mut self.joined)
            };
            on_block(Block {
                start_in_chunk,
                end_in_chunk: end,
                event,
                oversized: false,
                terminator_tail: false,
            });
        }
        self.carrying = false;
        self.oversized = false;
        self.carry.clear();
        if self
            .joined
            .as_ref()
            .is_some_and(|joined| joined.capacity() > FREE_EVENT_BYTES)
        {
            self.joined = None;
        }
    }
}

/// Splits a block into lines (any of LF, CRLF, CR) without allocating.
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
        let line = rest.get(..cut).unwrap_or_default();
        let mut next = cut;
        if rest.get(next) == Some(&b'\r') {
            next += 1;
        }
        if rest.get(next) == Some(&b'\n') && (next == cut || rest.get(cut) == Some(&b'\r')) {
            next += 1;
        }
        rest = rest.get(next.min(rest.len())..).unwrap_or_default();
        Some(line)
    })
}

/// Parses the fields of one complete block. A single `data:` line is returned in place; several
/// are joined into `joined` (made at the first such event, reused across events).
#[allow(
    clippy::box_collection,
    reason = "the scanner's field, boxed to keep the metering box small"
)]
fn parse_fields<'a>(block: &'a [u8], joined: &'a mut Option<Box<Vec<u8>>>) -> SseEvent<'a> {
    let mut name: &[u8] = b"";
    let mut first_data: Option<&[u8]> = None;
    let mut data_lines = 0usize;
    for line in lines(block) {
        let (field, value) = split_field(line);
        match field {
            b"data" => {
                data_lines += 1;
                if data_lines == 1 {
                    first_data = Some(value);
                } else {
                    let joined = joined.get_or_insert_with(Box::default);
                    if data_lines == 2 {
                        joined.clear();
                        joined.extend_from_slice(first_data.unwrap_or_default());
                    }
                    joined.push(b'\n');
                    joined.extend_from_slice(value);
                }
            }
            b"event" => name = value,
            _ => {} // comments (empty field name), id, retry and unknown fields
        }
    }
    let data = if data_lines > 1 {
        joined.as_deref().map(Vec::as_slice)
    } else {
        first_data
    };
    SseEvent { name, data }
}

/// `field: value` → (field, value without its one optional leading space). A line starting
/// with `:` is a comment and yields an empty field name.
fn split_field(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b':') {
        Some(colon) => {
            let field = line.get(..colon).unwrap_or_default();
            let mut value = line.get(colon + 1..).unwrap_or_default();
            if value.first() == Some(&b' ') {
                value = value.get(1..).unwrap_or_default();
            }
            (field, value)
        }
        None => (line, b""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects (name, data, oversized) for every event of `chunks`.
    fn scan(chunks: &[&[u8]], max: usize) -> Vec<(String, Option<String>, bool)> {
        let mut scanner = SseScanner::new(max);
        let mut out = Vec::new();
        for chunk in chunks {
            scanner.feed(chunk, |b| {
                if b.terminator_tail {
                    return;
                }
                out.push((
                    String::from_utf8_lossy(b.event.name).into_owned(),
                    b.event
                        .data
                        .map(|d| String::from_utf8_lossy(d).into_owned()),
                    b.oversized,
                ))
            });
        }
        out
    }

    #[test]
    fn parses_sglang_framing() {
        let out = scan(&[b"data: {\"a\":1}\n\ndata: [DONE]\n\n"], 1024);
        assert_eq!(
            out,
            vec![
                (String::new(), Some("{\"a\":1}".into()), false),
                (String::new(), Some("[DONE]".into()), false),
            ]
        );
    }

    #[test]
    fn event_lines_comments_crlf_and_multiline_data() {
        let stream = b": keep-alive\r\n\r\nevent: message_start\r\ndata: {\"x\":\r\ndata: 2}\r\nid: 7\r\n\r\n";
        let out = scan(&[stream], 1024);
        assert_eq!(
            out,
            vec![
                (String::new(), None, false),
                ("message_start".into(), Some("{\"x\":\n2}".into()), false),
            ]
        );
    }

    #[test]
    fn lone_cr_line_ends() {
        let out = scan(&[b"data: a\r\rdata: b\r\r"], 1024);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].1.as_deref(), Some("b"));
    }

    #[test]
    fn every_split_gives_the_same_events() {
        let stream: &[u8] =
            b"data: {\"a\":1}\r\n\r\nevent: e\ndata: x\ndata: y\n\n: c\n\ndata: [DONE]\n\n";
        let whole = scan(&[stream], 1024);
        for cut in 0..=stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(scan(&[a, b], 1024), whole, "split at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(scan(&bytes, 1024), whole);
    }

    #[test]
    fn block_positions_cover_the_chunk() {
        let mut scanner = SseScanner::new(1024);
        let mut spans = Vec::new();
        scanner.feed(b"data: 1\n\ndata: 2\n\ndata: 3", |b| {
            spans.push((b.start_in_chunk, b.end_in_chunk))
        });
        assert_eq!(spans, vec![(Some(0), 9), (Some(9), 18)]);
        assert!(scanner.mid_event());
        spans.clear();
        scanner.feed(b"\n\n", |b| spans.push((b.start_in_chunk, b.end_in_chunk)));
        assert_eq!(spans, vec![(None, 2)]);
    }

    /// 50 streams with one open 1 MB event each held 109 MiB outside the 64 MiB budget:
    /// the copies are charged past their free part, the one the budget cannot cover is read
    /// as oversized (its stream resynchronises), and an ended event frees its room at once.
    #[test]
    fn open_events_are_held_within_the_budget() {
        use crate::net::faults::{Fault, FaultCounters};
        let faults = Arc::new(FaultCounters::default());
        let budget = HeldBudget::new(3 << 20, Arc::clone(&faults));
        let open = format!("data: {}", "x".repeat(1 << 20));
        let mut scanners: Vec<SseScanner> = (0..50)
            .map(|_| SseScanner::within(4 << 20, Some(Arc::clone(&budget))))
            .collect();
        let mut oversized = 0;
        for scanner in &mut scanners {
            scanner.feed(open.as_bytes(), |_| {});
            assert!(budget.held() <= 3 << 20);
            scanner.feed(b"\n\ndata: ok\n\n", |block| {
                oversized += usize::from(block.oversized);
            });
        }
        // Each event ended before the next stream's began: every one was held.
        assert_eq!((oversized, budget.held()), (0, 0));
        // Now all open at once: only what the budget covers is kept.
        for scanner in &mut scanners {
            scanner.feed(open.as_bytes(), |_| {});
        }
        assert!(budget.held() <= 3 << 20);
        assert!(
            faults.get(Fault::EventUnheld) >= 47,
            "{}",
            faults.get(Fault::EventUnheld)
        );
        let mut after = Vec::new();
        for scanner in &mut scanners {
            scanner.feed(b"\n\ndata: ok\n\n", |block| {
                after.push((block.oversized, block.event.data.map(<[u8]>::to_vec)));
            });
        }
        assert_eq!(budget.held(), 0, "every ended event handed its room back");
        let skipped = after.iter().filter(|(o, _)| *o).count();
        assert!(skipped >= 47, "{skipped}");
        // Every stream goes on with its next event.
        assert_eq!(
            after
                .iter()
                .filter(|(_, d)| d.as_deref() == Some(b"ok".as_slice()))
                .count(),
            50
        );
    }

    #[test]
    fn oversized_events_are_skipped_and_resynchronised() {
        let big = format!("data: {}\n\ndata: ok\n\n", "x".repeat(100));
        let out = scan(&[big.as_bytes()], 32);
        assert_eq!(
            out,
            vec![
                (String::new(), None, true),
                (String::new(), Some("ok".into()), false)
            ]
        );
        // The same, split so the big event straddles chunks.
        let (a, b) = big.as_bytes().split_at(50);
        assert_eq!(scan(&[a, b], 32), out);
        // Skipping shows before the big event ends, and stops at its end.
        let mut scanner = SseScanner::new(32);
        scanner.feed(a, |_| {});
        assert!(scanner.skipping_oversized());
        scanner.feed(b, |_| {});
        assert!(!scanner.skipping_oversized());
    }

    /// An event as the proptests write it: an optional name and its data lines.
    type Written = (Option<String>, Vec<String>);

    /// `events` in SSE framing with `ending` as every line end (LF, CRLF or lone CR).
    fn render(events: &[Written], ending: &str) -> Vec<u8> {
        let mut out = String::new();
        for (name, lines) in events {
            if let Some(name) = name {
                out.push_str(&format!("event: {name}{ending}"));
            }
            for line in lines {
                out.push_str(&format!("data: {line}{ending}"));
            }
            out.push_str(ending);
        }
        out.into_bytes()
    }

    /// Splits `bytes` at the given cut points (taken modulo its length, in any order).
    fn split_at_cuts(bytes: &[u8], cuts: &[proptest::sample::Index]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points
            .windows(2)
            .filter_map(|w| bytes.get(w[0]..w[1]).map(<[u8]>::to_vec))
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever the line ending and however the stream is cut into chunks, the scanner
        /// gives back exactly the events written, with their data lines joined by LF.
        #[test]
        fn written_events_come_back_whatever_the_ending_and_split(
            events in proptest::collection::vec(
                (
                    proptest::option::of("[a-z_]{1,12}"),
                    proptest::collection::vec("[ -~]{0,20}", 1..4),
                ),
                0..8,
            ),
            ending in proptest::sample::select(vec!["\n", "\r\n", "\r"]),
            cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..12),
        ) {
            let bytes = render(&events, ending);
            let chunks = split_at_cuts(&bytes, &cuts);
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let expected: Vec<(String, Option<String>, bool)> = events
                .iter()
                .map(|(name, lines)| {
                    (name.clone().unwrap_or_default(), Some(lines.join("\n")), false)
                })
                .collect();
            proptest::prop_assert_eq!(scan(&refs, 1 << 16), expected);
        }

        /// Arbitrary bytes in arbitrary chunks: no panic, every block lies inside its chunk,
        /// and an event past the limit is reported oversized (never kept).
        #[test]
        fn arbitrary_bytes_are_scanned_within_bounds(
            chunks in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec![b'\n', b'\r', b':', b' ', b'd', b'a', b't', b'x']), 0..48),
                0..12,
            ),
            max in 1usize..64,
        ) {
            let mut scanner = SseScanner::new(max);
            for chunk in &chunks {
                let mut ok = true;
                scanner.feed(chunk, |b| {
                    ok &= b.end_in_chunk <= chunk.len()
                        && b.start_in_chunk.is_none_or(|s| s <= b.end_in_chunk)
                        && b.event.data.is_none_or(|d| d.len() <= max)
                        && !(b.oversized && b.event.data.is_some());
                });
                proptest::prop_assert!(ok);
            }
        }
    }
}
