//! The Azure LLM inference trace (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps
//! like `2023-11-16 18:15:46.6805900`, UTC). It carries no prefix information, so every
//! request's prompt is its own.

use crate::base::wallclock::{format_rfc3339, from_unix_millis, parse_rfc3339, unix_millis};

use super::trace::{Trace, TraceError, TraceRequest, MAX_REQUESTS};

/// Reads the Azure CSV (header required; column order taken from it) into a trace.
pub fn read(text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (index, header) = lines.next().ok_or(TraceError::Empty)?;
    let columns: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| TraceError::Line {
                line: index + 1,
                message: format!("no {name} column in the CSV header"),
            })
    };
    let (at, context, generated) = (
        column("timestamp")?,
        column("contexttokens")?,
        column("generatedtokens")?,
    );
    let mut rows: Vec<(i64, u64, u64)> = Vec::new();
    for (index, line) in lines {
        if rows.len() >= MAX_REQUESTS {
            return Err(TraceError::TooLarge);
        }
        let error = |message: String| TraceError::Line {
            line: index + 1,
            message,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |i: usize, name: &str| {
            fields
                .get(i)
                .copied()
                .ok_or_else(|| error(format!("no {name} field")))
        };
        let time = field(at, "TIMESTAMP")?;
        let millis = parse_timestamp(time)
            .ok_or_else(|| error(format!("TIMESTAMP {time:?} is not a date and time")))?;
        let count = |i: usize, name: &str| {
            let text = field(i, name)?;
            text.parse::<u64>()
                .map_err(|_| error(format!("{name} {text:?} is not a token count")))
        };
        rows.push((
            millis,
            count(context, "ContextTokens")?,
            count(generated, "GeneratedTokens")?,
        ));
    }
    let first = rows.iter().map(|r| r.0).min().ok_or(TraceError::Empty)?;
    let requests = rows
        .into_iter()
        .map(|(millis, prompt, output)| TraceRequest {
            at_ms: u64::try_from(millis.saturating_sub(first)).unwrap_or(0),
            route: None,
            model: None,
            stream: true,
            prompt_tokens: prompt,
            cached_tokens: None,
            max_tokens: Some(output),
            output_tokens: output,
            outcome: None,
            hash_ids: Vec::new(),
            turn: super::trace::SessionTurn::default(),
        })
        .collect();
    Ok(Trace::new(
        "azure",
        Some(format_rfc3339(from_unix_millis(first))),
        requests,
    ))
}

/// `2023-11-16 18:15:46.6805900` (or with a `T`, with or without a zone) → Unix milliseconds.
fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim().trim_matches('"');
    let (date_time, fraction) = match text.get(..19) {
        Some(head) => (head, text.get(19..)?),
        None => return None,
    };
    let date_time = date_time.replacen(' ', "T", 1);
    let mut zone = "Z";
    let mut millis = String::from("000");
    let mut rest = fraction;
    if let Some(digits) = rest.strip_prefix('.') {
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        let kept = digits.get(..end.min(3))?;
        millis = format!("{kept:0<3}");
        rest = digits.get(end..)?;
    }
    if !rest.is_empty() {
        zone = rest;
    }
    let time = parse_rfc3339(&format!("{date_time}.{millis}{zone}"))?;
    Some(unix_millis(time))
}

#[cfg(test)]
mod tests {
    const SAMPLE: &str = "TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:47.0000000,879,31
";

    #[test]
    fn reads_the_published_columns_in_arrival_order() {
        let trace = crate::workload::read_trace(SAMPLE).unwrap();
        assert_eq!(trace.header.origin, "azure");
        assert_eq!(trace.header.start.as_deref(), Some("2023-11-16T18:15:46Z"));
        let shapes: Vec<_> = trace
            .requests
            .iter()
            .map(|r| (r.at_ms, r.prompt_tokens, r.output_tokens))
            .collect();
        assert_eq!(shapes, vec![(0, 374, 44), (320, 879, 31), (4315, 396, 109)]);
        assert!(trace.requests.iter().all(|r| r.hash_ids.is_empty()));
    }

    #[test]
    fn bad_rows_are_named() {
        let error =
            crate::workload::read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n")
                .unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        assert!(crate::workload::read_trace("TIMESTAMP,Other\n").is_err());
    }
}
