//! Notes as a person reads them: a sweep writes one note per cell when the same thing happens
//! to several cells ("8K × 4 is Off target: …", "16K × 8 is Off target: …"), which on a page
//! pushes the grid below the fold. [`collapsed`] groups notes that open with a cell label and
//! say the same thing once the numbers are set aside, and gives each cause once: the first
//! note whole, then the other cells by name and their count. Renderings for people (HTML, the
//! page) use it; the JSON and the Markdown keep every note as written, so they import back.

/// `note` split into its leading cell label (`8K × 4`) and the rest, when it opens with one.
fn cell_label(note: &str) -> Option<(&str, &str)> {
    let (context, rest) = note.split_once(" × ")?;
    let context_ok = !context.is_empty()
        && context
            .trim_end_matches('K')
            .bytes()
            .all(|b| b.is_ascii_digit())
        && context.bytes().next().is_some_and(|b| b.is_ascii_digit());
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if !context_ok || digits == 0 {
        return None;
    }
    let label_len = context.len() + " × ".len() + digits;
    Some((&note[..label_len], &note[label_len..]))
}

/// The cause of a note: its text after the cell label with every run of digits (and the
/// decimal points between them) set aside.
fn cause(rest: &str) -> String {
    let mut out = String::with_capacity(rest.len());
    let mut in_number = false;
    for c in rest.chars() {
        if c.is_ascii_digit() || (in_number && (c == '.' || c == ',')) {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The notes with each cause that several cells share given once, in the order of its first
/// note: `"8K × 4 is Off target: … (the same for 3 more cells: 8K × 8, 16K × 4, 16K × 8)"`.
pub fn collapsed(notes: &[String]) -> Vec<String> {
    /// One cause: its first note whole, and the cell labels of every note that says it.
    struct Cause<'a> {
        key: Option<String>,
        first: &'a str,
        labels: Vec<&'a str>,
    }
    let mut causes: Vec<Cause<'_>> = Vec::new();
    for note in notes {
        let Some((label, rest)) = cell_label(note) else {
            causes.push(Cause {
                key: None,
                first: note,
                labels: Vec::new(),
            });
            continue;
        };
        let key = cause(rest);
        match causes
            .iter_mut()
            .find(|c| c.key.as_deref() == Some(key.as_str()))
        {
            Some(found) => found.labels.push(label),
            None => causes.push(Cause {
                key: Some(key),
                first: note,
                labels: vec![label],
            }),
        }
    }
    causes
        .into_iter()
        .map(|cause| match cause.labels.len() {
            0 | 1 => cause.first.to_owned(),
            n => format!(
                "{} (the same for {} more cells: {})",
                cause.first,
                n - 1,
                cause.labels[1..].join(", ")
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_note_per_cause_with_the_other_cells_named() {
        let notes: Vec<String> = [
            "Token-id prompts draw from 500 ids the server's tokenizer produced (3–9000)",
            "8K × 4 is Off target: the server averaged 5.1 active requests, not 4; its figures measured another cell",
            "8K × 8 is Off target: the server averaged 11.0 active requests, not 8; its figures measured another cell",
            "16K × 4 was interrupted by production traffic (3 requests in flight > guard 0) and measured again",
            "16K × 8 is Off target: the server averaged 10.2 active requests, not 8; its figures measured another cell",
            "1019K × 1: the server counted 1,043,456 prompt tokens for a prompt of 1,043,450 token ids",
        ]
        .map(str::to_owned)
        .to_vec();
        let collapsed = collapsed(&notes);
        assert_eq!(collapsed.len(), 4, "{collapsed:#?}");
        assert_eq!(collapsed[0], notes[0]);
        assert_eq!(
            collapsed[1],
            format!("{} (the same for 2 more cells: 8K × 8, 16K × 8)", notes[1])
        );
        assert_eq!(collapsed[2], notes[3]);
        assert_eq!(collapsed[3], notes[5]);
        // Nothing to collapse: the notes come back as they were.
        assert_eq!(super::collapsed(&notes[..1]), notes[..1].to_vec());
        assert!(super::collapsed(&[]).is_empty());
    }
}
