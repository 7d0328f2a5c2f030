//! A request's own timing, handed back to its client as a W3C `Server-Timing` field: written
//! once, from the finished record, when the request ends (never per event). Pure: a record in,
//! the field's value out; the metering body (`body.rs`) decides where it goes — a response
//! header for a non-streamed answer (the proxy holds its body until then), a trailer or a final
//! SSE comment for a stream ([`TimingDelivery`]).
//!
//! The field lists what exists and omits what does not: `ttft` (a stream's first token; a
//! non-streamed answer's first body byte), `tbt`, `total`, `queue` (only where the engine said
//! how long the request queued: sglang's `meta_info.queue_time` in a non-streamed body), in
//! milliseconds; `cell`, `fingerprint` and `request` as descriptions, each an RFC 9110
//! quoted-string.

use std::fmt::Write as _;
use std::time::Duration;

use crate::meter::buckets::Ladder;
use crate::meter::identity::FingerprintId;
use crate::meter::record::RequestRecord;

use super::json;

/// The field's name, as a header and as a trailer.
pub const SERVER_TIMING: http::HeaderName = http::HeaderName::from_static("server-timing");

/// What opens the SSE comment line that carries the field where trailers cannot.
pub const COMMENT_PREFIX: &[u8] = b": server-timing ";

/// Where a request's timing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingDelivery {
    /// A response header: the non-streamed body is held until it is complete (the proxy does
    /// it; the body only computes the value).
    Header,
    /// A trailer after the stream's last bytes (HTTP/2, or HTTP/1.1 with `TE: trailers`).
    Trailer,
    /// A final SSE comment, `: server-timing …` and a blank line, after the upstream's last
    /// bytes: for clients that cannot read trailers.
    Comment,
}

/// The longest queue time read from an engine (a day): anything larger is not a queue time.
const MAX_QUEUE: Duration = Duration::from_secs(86_400);

/// The `Server-Timing` value for a finished request: its figures, then its cell, fingerprint
/// and request id. `queue` is the engine's own figure, when it gave one.
pub fn server_timing(
    record: &RequestRecord,
    (contexts, concurrency): (&Ladder, &Ladder),
    queue: Option<Duration>,
) -> String {
    let timing = &record.timing;
    // A non-streamed answer's first token reaches the client with its body.
    let ttft = if record.streaming {
        timing.ttft
    } else {
        timing.to_first_byte
    };
    let mut out = String::with_capacity(160);
    let mut metric = |name: &str, dur: Option<Duration>| {
        if let Some(dur) = dur {
            separate(&mut out);
            // Milliseconds to the microsecond: W3C Server-Timing's unit.
            let _ = write!(out, "{name};dur={:.3}", dur.as_secs_f64() * 1000.0);
        }
    };
    metric("ttft", ttft);
    metric("tbt", timing.tbt);
    metric("total", Some(timing.duration));
    metric("queue", queue);
    let cell = format!(
        "{} x {}",
        contexts.label(record.buckets.context),
        concurrency.label(record.buckets.concurrency)
    );
    description(&mut out, "cell", &cell);
    if record.labels.fingerprint != FingerprintId::UNKNOWN {
        description(
            &mut out,
            "fingerprint",
            record.labels.fingerprint.label().as_str(),
        );
    }
    if let Some(id) = &record.request_id {
        description(&mut out, "request", id);
    }
    out
}

/// The engine's own queue time in a non-streamed body: sglang's `meta_info.queue_time`
/// (seconds, a number) where the engine reports it; `None` otherwise or when implausible.
pub fn queue_time(body: &[u8]) -> Option<Duration> {
    let span = json::path(body, 0, &[b"meta_info", b"queue_time"])?;
    let seconds: f64 = std::str::from_utf8(span.bytes(body)).ok()?.parse().ok()?;
    // Checked before converting: `Duration::from_secs_f64` panics on what does not fit.
    (seconds.is_finite() && (0.0..=MAX_QUEUE.as_secs_f64()).contains(&seconds))
        .then(|| Duration::from_secs_f64(seconds))
}

fn separate(out: &mut String) {
    if !out.is_empty() {
        out.push_str(", ");
    }
}

/// `name;desc="text"`, the text an RFC 9110 quoted-string: `"` and `\` escaped, anything but
/// visible ASCII and spaces (which a header value cannot carry) written as `?`.
fn description(out: &mut String, name: &str, text: &str) {
    separate(out);
    out.push_str(name);
    out.push_str(";desc=\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' ' | '!'..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::meter::buckets::{DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
    use crate::meter::record::{Buckets, Timing};

    fn ladders() -> (Ladder, Ladder) {
        (
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        )
    }

    #[test]
    fn a_stream_s_figures_then_its_descriptions_and_nothing_unknown() {
        let (contexts, concurrency) = ladders();
        let record = RequestRecord {
            timing: Timing {
                ttft: Some(Duration::from_micros(123_400)),
                tbt: Some(Duration::from_micros(5_250)),
                duration: Duration::from_millis(900),
                ..Timing::default()
            },
            buckets: Buckets {
                context: 0,
                concurrency: 2,
            },
            request_id: Some(Arc::from(r#"a"b\c"#)),
            ..RequestRecord::for_test()
        };
        assert_eq!(
            server_timing(&record, (&contexts, &concurrency), None),
            r#"ttft;dur=123.400, tbt;dur=5.250, total;dur=900.000, cell;desc="8K x 4", request;desc="a\"b\\c""#
        );
        let bare = RequestRecord {
            streaming: false,
            ..RequestRecord::for_test()
        };
        assert_eq!(
            server_timing(
                &bare,
                (&contexts, &concurrency),
                Some(Duration::from_millis(2))
            ),
            r#"total;dur=0.000, queue;dur=2.000, cell;desc="8K x 1""#
        );
    }

    #[test]
    fn a_description_never_breaks_its_quotes_or_the_header() {
        let mut out = String::new();
        description(&mut out, "request", "x\u{7f}\n\"é");
        assert_eq!(out, r#"request;desc="x??\"?""#);
        assert!(http::HeaderValue::from_str(&out).is_ok());
    }

    #[test]
    fn the_queue_time_is_read_where_sglang_reports_it() {
        let body = br#"{"text":"x","meta_info":{"id":"a","queue_time":0.0125,"e2e_latency":1}}"#;
        assert_eq!(queue_time(body), Some(Duration::from_micros(12_500)));
        assert_eq!(queue_time(br#"{"meta_info":{"queue_time":null}}"#), None);
        assert_eq!(queue_time(br#"{"meta_info":{"queue_time":-1}}"#), None);
        assert_eq!(queue_time(br#"{"meta_info":{"queue_time":1e99}}"#), None);
        assert_eq!(queue_time(br#"{"choices":[]}"#), None);
        assert_eq!(queue_time(b"not json"), None);
    }
}
