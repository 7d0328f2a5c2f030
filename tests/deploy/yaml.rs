//! The deploy tests' view of YAML: `yaml-rust2` parses, and this file turns its events into a
//! small tree with the accessors the tests use (dotted paths, scalars as text).
//!
//! Scalars stay text as written: `30000` and `"30000"` both read as "30000" (the tests compare
//! ports and names as strings); plain `null`, `~` and empty values read as [`Yaml::Null`].
//! Docker Compose's `!reset` reads as null and `!override` as its value, as Compose means them;
//! any other local tag, and a key given twice in one mapping (which YAML readers resolve
//! differently), is an error naming the file and line. Anchors and aliases are resolved.
//! Where python3 has PyYAML, a test compares this reading with PyYAML's.

use std::collections::HashMap;
use std::fmt;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

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
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// What a node's tag asks for.
enum TagMeaning {
    /// No tag, a standard `!!` tag or Compose's `!override`: the node as written.
    Plain,
    /// Compose's `!reset`: the value is reset, read as null.
    Reset,
}

/// A collection being built: its entries so far, its anchor and what its tag asks for.
enum Open {
    Seq(Vec<Yaml>, usize, TagMeaning),
    /// Entries so far and a key waiting for its value.
    Map(Vec<(String, Yaml)>, Option<String>, usize, TagMeaning),
}

/// Every document of a (possibly multi-document) YAML text; empty documents are skipped.
pub fn parse_all(text: &str, file: &str) -> Result<Vec<Yaml>, YamlError> {
    let error = |mark: &Marker, message: String| YamlError {
        file: file.to_string(),
        line: mark.line(),
        message,
    };
    let tag_meaning = |tag: &Option<Tag>, mark: &Marker| match tag {
        None => Ok(TagMeaning::Plain),
        Some(tag) if tag.handle == "!!" => Ok(TagMeaning::Plain),
        Some(tag) if tag.handle == "!" && tag.suffix == "override" => Ok(TagMeaning::Plain),
        Some(tag) if tag.handle == "!" && tag.suffix == "reset" => Ok(TagMeaning::Reset),
        Some(tag) => Err(error(
            mark,
            format!("unknown tag {}{}", tag.handle, tag.suffix),
        )),
    };
    let mut parser = Parser::new_from_str(text);
    let mut documents = Vec::new();
    let mut anchors: HashMap<usize, Yaml> = HashMap::new();
    let mut stack: Vec<Open> = Vec::new();
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| error(e.marker(), e.info().to_string()))?;
        // A finished node: (node, its anchor, what its tag asks for).
        let finished = match event {
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart | Event::DocumentStart | Event::DocumentEnd => {
                continue
            }
            Event::SequenceStart(anchor, tag) => {
                stack.push(Open::Seq(Vec::new(), anchor, tag_meaning(&tag, &mark)?));
                continue;
            }
            Event::MappingStart(anchor, tag) => {
                stack.push(Open::Map(
                    Vec::new(),
                    None,
                    anchor,
                    tag_meaning(&tag, &mark)?,
                ));
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Open::Seq(items, anchor, meaning)) => (Yaml::Seq(items), anchor, meaning),
                Some(Open::Map(entries, None, anchor, meaning)) => {
                    (Yaml::Map(entries), anchor, meaning)
                }
                _ => return Err(error(&mark, "unbalanced collection".to_string())),
            },
            Event::Scalar(value, style, anchor, tag) => {
                let null = style == TScalarStyle::Plain
                    && matches!(value.as_str(), "" | "~" | "null" | "Null" | "NULL");
                let node = if null {
                    Yaml::Null
                } else {
                    Yaml::Scalar(value)
                };
                (node, anchor, tag_meaning(&tag, &mark)?)
            }
            Event::Alias(anchor) => {
                let node = anchors
                    .get(&anchor)
                    .cloned()
                    .ok_or_else(|| error(&mark, "alias of an unknown anchor".to_string()))?;
                (node, 0, TagMeaning::Plain)
            }
        };
        let (node, anchor, meaning) = finished;
        let node = match meaning {
            TagMeaning::Plain => node,
            TagMeaning::Reset => Yaml::Null,
        };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None if node == Yaml::Null => {}
            None => documents.push(node),
            Some(Open::Seq(items, ..)) => items.push(node),
            Some(Open::Map(entries, pending, ..)) => match pending.take() {
                Some(key) => entries.push((key, node)),
                None => {
                    let key = match node {
                        Yaml::Scalar(key) => key,
                        Yaml::Null => String::new(),
                        _ => return Err(error(&mark, "a mapping key that is not a scalar".into())),
                    };
                    if entries.iter().any(|(existing, _)| *existing == key) {
                        return Err(error(&mark, format!("the key `{key}` is given twice")));
                    }
                    *pending = Some(key);
                }
            },
        }
    }
    Ok(documents)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_deploy_files_use() {
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
    fn resolves_aliases_and_refuses_ambiguity() {
        let y = parse("a: &port 8000\nb: *port\nc: &list [x]\nd: *list\n", "t.yml").unwrap();
        assert_eq!(y.str_at("b"), "8000");
        assert_eq!(y.str_at("d.0"), "x");
        for bad in [
            "a: !tag x",
            "a:\n\t- x",
            "a: 1\na: 2",
            "a: 1\n  b: 2",
            "a: *nothing",
        ] {
            assert!(parse(bad, "bad.yml").is_err(), "{bad:?} should be refused");
        }
        let error = parse("x: 1\ny:\n  k: 1\n  k: 2\n", "dup.yml").unwrap_err();
        assert_eq!((error.file.as_str(), error.line), ("dup.yml", 4), "{error}");
    }

    #[test]
    fn splits_documents() {
        let docs = parse_all("---\na: 1\n---\nb: 2\n", "d.yml").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].str_at("b"), "2");
    }
}
