//! Escaping text for HTML and XML, used by every page and chart tokentap writes (matrix
//! renderers, the admin page, the demo report).

/// Escapes text for XML and HTML (element content and attribute values).
/// Hand-written: XML 1.0 forbids control characters, so they become U+FFFD; general escapers
/// (quick-xml, html-escape) pass them through.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0; a page never needs them.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// `text` safe to print on an operator's terminal or in a text log line: every control character
/// (C0, DEL, C1: `ESC` of an ANSI or OSC sequence that could clear the screen or write the
/// clipboard, a newline that would forge a log line) and every line or paragraph separator and
/// bidirectional override is written as a visible escape (`\u{1b}`), the rest as it came.
/// `keep_lines` keeps `\n` and `\t` (a whole rendered table); else they are escaped too (one
/// name).
pub fn terminal_safe(text: &str, keep_lines: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && !(keep_lines && (c == '\n' || c == '\t')))
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod terminal_tests {
    use super::terminal_safe;

    #[test]
    fn escapes_and_separators_are_shown_not_obeyed() {
        let osc52 = "model\u{1b}]52;c;aGk=\u{7}";
        assert_eq!(terminal_safe(osc52, false), "model\\u{1b}]52;c;aGk=\\u{7}");
        assert_eq!(terminal_safe("a\nforged line", false), "a\\u{a}forged line");
        assert_eq!(
            terminal_safe("row\n\tcell\u{1b}[2J", true),
            "row\n\tcell\\u{1b}[2J"
        );
        assert_eq!(
            terminal_safe("x\u{202e}y\u{2028}", false),
            "x\\u{202e}y\\u{2028}"
        );
        assert!(matches!(
            terminal_safe("Qwen/Qwen3-8B", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
