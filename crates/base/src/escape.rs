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
