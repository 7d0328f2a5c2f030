//! A reader for the subset of YAML that the files in `deploy/` use, so the deploy tests can
//! check the structure of compose files, Kubernetes manifests and provisioning files without a
//! YAML crate (the project takes no dependency just for tests of config files).
//!
//! Supported: block mappings and sequences (a sequence may sit at its key's indentation),
//! `- key: value` items, plain, single- and double-quoted scalars, flow sequences and mappings
//! (`[a, "b"]`, `{}`), plain scalars folded over several lines, block scalars (`|`, `|-`, `>`,
//! `>-`), comments, `---` document separators, and Docker Compose's `!reset` / `!override`
//! tags. Anything else (anchors, aliases, other tags, tabs, quoted scalars over several lines)
//! is an error naming the file and line,
//! so a file that strays outside the subset fails loudly rather than being misread. Scalars
//! stay strings: `30000` and `"30000"` both read as "30000"; plain `null` and `~` read as
//! [`Yaml::Null`]. Where python3 has PyYAML, a test compares this reader's output with PyYAML's.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Yaml {
    Null,
    Scalar(String),
    Seq(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    /// The value at a dotted path of mapping keys and sequence indices: `"spec.ports.0.name"`.
    pub fn at(&self, path: &str) -> Option<&Yaml> {
        let mut node = self;
        for part in path.split('.').filter(|p| !p.is_empty()) {
            node = match node {
                Yaml::Map(entries) => entries.iter().find(|(k, _)| k == part).map(|(_, v)| v)?,
                Yaml::Seq(items) => items.get(part.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(node)
    }

    /// The value of one mapping key, dots and all (`nvidia.com/gpu`, `tokentap.toml`).
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        self.entries()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The string at `path`, or a panic naming the path (tests only).
    pub fn str_at(&self, path: &str) -> &str {
        match self.at(path) {
            Some(Yaml::Scalar(s)) => s,
            other => panic!("expected a scalar at `{path}`, found {other:?}"),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Yaml::Scalar(s) => Some(s),
            _ => None,
        }
    }

    pub fn seq(&self) -> &[Yaml] {
        match self {
            Yaml::Seq(items) => items,
            _ => &[],
        }
    }

    pub fn entries(&self) -> &[(String, Yaml)] {
        match self {
            Yaml::Map(entries) => entries,
            _ => &[],
        }
    }

    /// The scalars of a sequence (non-scalars skipped).
    pub fn strings(&self) -> Vec<&str> {
        self.seq().iter().filter_map(Yaml::as_str).collect()
    }

    /// As JSON, scalars as strings: for comparing with another reader's output.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Yaml::Null => serde_json::Value::Null,
            Yaml::Scalar(s) => serde_json::Value::String(s.clone()),
            Yaml::Seq(items) => serde_json::Value::Array(items.iter().map(Yaml::to_json).collect()),
            Yaml::Map(entries) => serde_json::Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

#[derive(Debug)]
pub struct YamlError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} (the deploy tests read a YAML subset: see tests/deploy/yaml.rs)",
            self.file, self.line, self.message
        )
    }
}

/// Every document of a (possibly multi-document) YAML text.
pub fn parse_all(text: &str, file: &str) -> Result<Vec<Yaml>, YamlError> {
    let mut documents = Vec::new();
    let mut current: Vec<(usize, &str)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_end() == "---" {
            documents.push(std::mem::take(&mut current));
        } else {
            current.push((index + 1, line));
        }
    }
    documents.push(current);
    let mut out = Vec::new();
    for lines in documents {
        let mut parser = Parser {
            lines: lines.into_iter().map(|(n, l)| (n, l.to_string())).collect(),
            pos: 0,
            file,
        };
        if parser.next_significant().is_none() {
            continue;
        }
        let indent = parser.indent_of(parser.pos);
        let node = parser.node(indent)?;
        if let Some(pos) = parser.next_significant() {
            return Err(parser.error_at(pos, "unexpected content after the document"));
        }
        out.push(node);
    }
    Ok(out)
}

/// The one document of a YAML text.
pub fn parse(text: &str, file: &str) -> Result<Yaml, YamlError> {
    let mut documents = parse_all(text, file)?;
    match documents.len() {
        1 => Ok(documents.remove(0)),
        n => Err(YamlError {
            file: file.to_string(),
            line: 1,
            message: format!("expected one document, found {n}"),
        }),
    }
}

struct Parser<'a> {
    lines: Vec<(usize, String)>,
    pos: usize,
    file: &'a str,
}

impl Parser<'_> {
    fn error_at(&self, pos: usize, message: &str) -> YamlError {
        YamlError {
            file: self.file.to_string(),
            line: self.lines.get(pos).map_or(0, |(n, _)| *n),
            message: message.to_string(),
        }
    }

    fn is_blank_or_comment(line: &str) -> bool {
        let t = line.trim_start();
        t.is_empty() || t.starts_with('#')
    }

    /// Moves to the next line with content; returns its position.
    fn next_significant(&mut self) -> Option<usize> {
        while self.pos < self.lines.len() && Self::is_blank_or_comment(&self.lines[self.pos].1) {
            self.pos += 1;
        }
        (self.pos < self.lines.len()).then_some(self.pos)
    }

    fn indent_of(&self, pos: usize) -> usize {
        let line = &self.lines[pos].1;
        line.len() - line.trim_start_matches(' ').len()
    }

    fn content(&self, pos: usize) -> Result<String, YamlError> {
        let line = &self.lines[pos].1;
        let indent = self.indent_of(pos);
        if line[indent..].starts_with('\t') {
            return Err(self.error_at(pos, "tab in indentation"));
        }
        Ok(strip_comment(&line[indent..]).trim_end().to_string())
    }

    fn node(&mut self, indent: usize) -> Result<Yaml, YamlError> {
        let Some(pos) = self.next_significant() else {
            return Ok(Yaml::Null);
        };
        let text = self.content(pos)?;
        if text == "-" || text.starts_with("- ") {
            self.sequence(indent)
        } else if split_key(&text).is_some() {
            self.mapping(indent)
        } else {
            self.pos += 1;
            let value = self.inline_value(&text, pos, indent)?;
            Ok(value)
        }
    }

    fn mapping(&mut self, indent: usize) -> Result<Yaml, YamlError> {
        let mut entries: Vec<(String, Yaml)> = Vec::new();
        while let Some(pos) = self.next_significant() {
            let line_indent = self.indent_of(pos);
            if line_indent < indent {
                break;
            }
            if line_indent > indent {
                return Err(self.error_at(pos, "unexpected indentation inside a mapping"));
            }
            let text = self.content(pos)?;
            if text == "-" || text.starts_with("- ") {
                break;
            }
            let Some((key, rest)) = split_key(&text) else {
                return Err(self.error_at(pos, "expected `key: value`"));
            };
            let key = unquote_key(&key).map_err(|m| self.error_at(pos, &m))?;
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(self.error_at(pos, &format!("duplicate key `{key}`")));
            }
            self.pos += 1;
            let value = if rest.is_empty() {
                match self.next_significant() {
                    Some(next) if self.indent_of(next) > indent => {
                        let child = self.indent_of(next);
                        self.node(child)?
                    }
                    Some(next) if self.indent_of(next) == indent => {
                        let next_text = self.content(next)?;
                        if next_text == "-" || next_text.starts_with("- ") {
                            self.sequence(indent)?
                        } else {
                            Yaml::Null
                        }
                    }
                    _ => Yaml::Null,
                }
            } else {
                self.inline_value(&rest, pos, indent)?
            };
            entries.push((key, value));
        }
        Ok(Yaml::Map(entries))
    }

    fn sequence(&mut self, indent: usize) -> Result<Yaml, YamlError> {
        let mut items = Vec::new();
        while let Some(pos) = self.next_significant() {
            let line_indent = self.indent_of(pos);
            if line_indent != indent {
                if line_indent > indent {
                    return Err(self.error_at(pos, "unexpected indentation inside a sequence"));
                }
                break;
            }
            let text = self.content(pos)?;
            if !(text == "-" || text.starts_with("- ")) {
                break;
            }
            let after_dash = &text[1..];
            let rest = after_dash.trim_start();
            if rest.is_empty() {
                self.pos += 1;
                match self.next_significant() {
                    Some(next) if self.indent_of(next) > indent => {
                        let child = self.indent_of(next);
                        items.push(self.node(child)?);
                    }
                    _ => items.push(Yaml::Null),
                }
                continue;
            }
            // `- key: value` or `- - item`: the item starts at the column after the dash;
            // rewrite this line with the dash blanked and read a node at that column.
            let column = indent + 1 + (after_dash.len() - rest.len());
            if split_key(rest).is_some() || rest == "-" || rest.starts_with("- ") {
                let line = &mut self.lines[pos].1;
                let raw_dash = line.find('-').unwrap_or(indent);
                line.replace_range(raw_dash..raw_dash + 1, " ");
                items.push(self.node(column)?);
            } else {
                self.pos += 1;
                items.push(self.inline_value(rest, pos, indent)?);
            }
        }
        Ok(Yaml::Seq(items))
    }

    /// A value written on the line itself: scalar, flow collection, block scalar header, or a
    /// compose tag followed by one of these.
    fn inline_value(&mut self, text: &str, pos: usize, indent: usize) -> Result<Yaml, YamlError> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("!reset") {
            // Docker Compose: drop the inherited value; what follows is ignored.
            let _ = rest;
            return Ok(Yaml::Null);
        }
        if let Some(rest) = text.strip_prefix("!override") {
            return self.inline_value(rest, pos, indent);
        }
        if text.starts_with('&') || text.starts_with('*') || text.starts_with('!') {
            return Err(self.error_at(pos, "anchors, aliases and tags are not supported"));
        }
        if let Some(header) = text.strip_prefix('|').or_else(|| text.strip_prefix('>')) {
            let folded = text.starts_with('>');
            let strip = match header {
                "" => false,
                "-" => true,
                _ => return Err(self.error_at(pos, "unsupported block scalar header")),
            };
            return Ok(Yaml::Scalar(self.block_scalar(indent, folded, strip)));
        }
        if text.starts_with('[') || text.starts_with('{') {
            let mut flow = Flow {
                chars: text.chars().collect(),
                at: 0,
            };
            let value = flow.value().map_err(|m| self.error_at(pos, &m))?;
            flow.skip_spaces();
            if flow.at != flow.chars.len() {
                return Err(self.error_at(pos, "unexpected text after a flow collection"));
            }
            return Ok(value);
        }
        if matches!(text.chars().next(), Some('"' | '\'')) {
            if self.continues(indent)? {
                return Err(self.error_at(self.pos, "multi-line quoted scalars are not supported"));
            }
            return scalar(text).map_err(|m| self.error_at(pos, &m));
        }
        // A plain scalar may continue on deeper lines; its line breaks fold into spaces.
        let mut folded = text.to_string();
        while self.continues(indent)? {
            let next = self.pos;
            folded.push(' ');
            folded.push_str(&self.content(next)?);
            self.pos += 1;
        }
        scalar(&folded).map_err(|m| self.error_at(pos, &m))
    }

    /// Whether the next line with content continues a scalar begun at `indent`: deeper, and
    /// neither a mapping entry nor a sequence item.
    fn continues(&mut self, indent: usize) -> Result<bool, YamlError> {
        let Some(next) = self.next_significant() else {
            return Ok(false);
        };
        if self.indent_of(next) <= indent {
            return Ok(false);
        }
        let text = self.content(next)?;
        Ok(split_key(&text).is_none() && !(text == "-" || text.starts_with("- ")))
    }

    fn block_scalar(&mut self, parent: usize, folded: bool, strip: bool) -> String {
        let mut raw: Vec<&str> = Vec::new();
        let mut block_indent = None;
        while self.pos < self.lines.len() {
            let line = &self.lines[self.pos].1;
            let indent = line.len() - line.trim_start_matches(' ').len();
            if line.trim().is_empty() {
                raw.push("");
                self.pos += 1;
                continue;
            }
            if indent <= parent {
                break;
            }
            let block = *block_indent.get_or_insert(indent);
            if indent < block {
                break;
            }
            raw.push(&line[block..]);
            self.pos += 1;
        }
        while raw.last() == Some(&"") {
            raw.pop();
        }
        let mut text = if folded {
            let mut out = String::new();
            for (i, line) in raw.iter().enumerate() {
                if i > 0 {
                    out.push(if line.is_empty() || raw[i - 1].is_empty() {
                        '\n'
                    } else {
                        ' '
                    });
                }
                out.push_str(line);
            }
            out
        } else {
            raw.join("\n")
        };
        if !strip && !text.is_empty() {
            text.push('\n');
        }
        text
    }
}

/// Removes a trailing ` # comment` outside quotes.
fn strip_comment(text: &str) -> &str {
    let mut quote = None;
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (None, b'"') | (None, b'\'') => quote = Some(b),
            (Some(q), c) if c == q => quote = None,
            (None, b'#') if i == 0 || bytes[i - 1] == b' ' => return &text[..i],
            _ => {}
        }
    }
    text
}

/// Splits `key: rest` at the first `: ` (or a final `:`) outside quotes and brackets.
fn split_key(text: &str) -> Option<(String, String)> {
    let bytes = text.as_bytes();
    let mut quote = None;
    let mut depth = 0i32;
    if matches!(bytes.first(), Some(b'[' | b'{')) {
        return None;
    }
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (None, b'"') | (None, b'\'') if i == 0 => quote = Some(b),
            (Some(q), c) if c == q => quote = None,
            (None, b'[' | b'{') => depth += 1,
            (None, b']' | b'}') => depth -= 1,
            (None, b':') if depth == 0 => {
                let end = i + 1 == bytes.len();
                if end || bytes[i + 1] == b' ' {
                    let key = text[..i].trim_end().to_string();
                    let rest = if end { "" } else { text[i + 1..].trim() };
                    return Some((key, rest.to_string()));
                }
            }
            _ => {}
        }
    }
    None
}

fn unquote_key(key: &str) -> Result<String, String> {
    match scalar(key)? {
        Yaml::Scalar(s) => Ok(s),
        _ => Ok(key.to_string()),
    }
}

/// A one-line scalar: quoted or plain.
fn scalar(text: &str) -> Result<Yaml, String> {
    let text = text.trim();
    if let Some(inner) = text.strip_prefix('"') {
        let inner = inner
            .strip_suffix('"')
            .ok_or_else(|| format!("unterminated double-quoted scalar `{text}`"))?;
        return unescape_double(inner).map(Yaml::Scalar);
    }
    if let Some(inner) = text.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or_else(|| format!("unterminated single-quoted scalar `{text}`"))?;
        return Ok(Yaml::Scalar(inner.replace("''", "'")));
    }
    if matches!(text, "null" | "~" | "Null" | "NULL") {
        return Ok(Yaml::Null);
    }
    if text.starts_with('&') || text.starts_with('*') || text.starts_with('!') {
        return Err(format!(
            "anchors, aliases and tags are not supported: `{text}`"
        ));
    }
    Ok(Yaml::Scalar(text.to_string()))
}

fn unescape_double(inner: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('/') => out.push('/'),
            Some(other) => return Err(format!("unsupported escape `\\{other}`")),
            None => return Err("dangling backslash".into()),
        }
    }
    Ok(out)
}

/// Flow collections on one line: `[a, "b", {k: v}]`.
struct Flow {
    chars: Vec<char>,
    at: usize,
}

impl Flow {
    fn skip_spaces(&mut self) {
        while self.chars.get(self.at) == Some(&' ') {
            self.at += 1;
        }
    }

    fn value(&mut self) -> Result<Yaml, String> {
        self.skip_spaces();
        match self.chars.get(self.at) {
            Some('[') => {
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_spaces();
                    if self.chars.get(self.at) == Some(&']') {
                        self.at += 1;
                        return Ok(Yaml::Seq(items));
                    }
                    items.push(self.value()?);
                    self.skip_spaces();
                    match self.chars.get(self.at) {
                        Some(',') => self.at += 1,
                        Some(']') => {}
                        _ => return Err("expected `,` or `]` in a flow sequence".into()),
                    }
                }
            }
            Some('{') => {
                self.at += 1;
                let mut entries = Vec::new();
                loop {
                    self.skip_spaces();
                    if self.chars.get(self.at) == Some(&'}') {
                        self.at += 1;
                        return Ok(Yaml::Map(entries));
                    }
                    let key = match self.scalar_token(true)? {
                        Yaml::Scalar(k) => k,
                        _ => return Err("a flow mapping key must be a scalar".into()),
                    };
                    self.skip_spaces();
                    if self.chars.get(self.at) != Some(&':') {
                        return Err("expected `:` in a flow mapping".into());
                    }
                    self.at += 1;
                    let value = self.value()?;
                    entries.push((key, value));
                    self.skip_spaces();
                    match self.chars.get(self.at) {
                        Some(',') => self.at += 1,
                        Some('}') => {}
                        _ => return Err("expected `,` or `}` in a flow mapping".into()),
                    }
                }
            }
            Some(_) => self.scalar_token(false),
            None => Err("unexpected end of a flow collection".into()),
        }
    }

    fn scalar_token(&mut self, key: bool) -> Result<Yaml, String> {
        self.skip_spaces();
        let start = self.at;
        match self.chars.get(self.at) {
            Some(&q @ ('"' | '\'')) => {
                self.at += 1;
                while let Some(&c) = self.chars.get(self.at) {
                    self.at += 1;
                    if c == '\\' && q == '"' {
                        self.at += 1;
                    } else if c == q {
                        if q == '\'' && self.chars.get(self.at) == Some(&'\'') {
                            self.at += 1;
                            continue;
                        }
                        let text: String = self.chars[start..self.at].iter().collect();
                        return scalar(&text);
                    }
                }
                Err("unterminated quoted scalar in a flow collection".into())
            }
            _ => {
                while let Some(&c) = self.chars.get(self.at) {
                    if c == ',' || c == ']' || c == '}' || (key && c == ':') {
                        break;
                    }
                    self.at += 1;
                }
                let text: String = self.chars[start..self.at].iter().collect();
                scalar(text.trim())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_subset() {
        let text = r#"
# comment
a: 1
b: "two # not a comment"   # a comment
c:
  - x
  - key: v
    other: [1, "2", {k: v}]
  -
    nested: true
d:
- same-indent item
e: |
  line one
    indented

  after blank
f: >-
  folded
  text
g: !reset null
h: 'it''s'
url: http://host:30000/path
long: folded plain
  scalar
empty: {}
n: ~
"#;
        let y = parse(text, "t.yml").unwrap();
        assert_eq!(y.str_at("a"), "1");
        assert_eq!(y.str_at("b"), "two # not a comment");
        assert_eq!(y.str_at("c.0"), "x");
        assert_eq!(y.str_at("c.1.key"), "v");
        assert_eq!(y.str_at("c.1.other.1"), "2");
        assert_eq!(y.str_at("c.1.other.2.k"), "v");
        assert_eq!(y.str_at("c.2.nested"), "true");
        assert_eq!(y.str_at("d.0"), "same-indent item");
        assert_eq!(y.str_at("e"), "line one\n  indented\n\nafter blank\n");
        assert_eq!(y.str_at("f"), "folded text");
        assert_eq!(y.at("g"), Some(&Yaml::Null));
        assert_eq!(y.str_at("h"), "it's");
        assert_eq!(y.str_at("url"), "http://host:30000/path");
        assert_eq!(y.str_at("long"), "folded plain scalar");
        assert_eq!(y.at("empty"), Some(&Yaml::Map(vec![])));
        assert_eq!(y.at("n"), Some(&Yaml::Null));
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        for bad in [
            "a: &anchor 1",
            "a: *alias",
            "a: !tag x",
            "a:\n\t- x",
            "a: 1\na: 2",
            "a: 'quoted\n  continued'",
            "a: 1\n  b: 2",
        ] {
            assert!(parse(bad, "bad.yml").is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn splits_documents() {
        let docs = parse_all("---\na: 1\n---\nb: 2\n", "d.yml").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].str_at("b"), "2");
    }
}
