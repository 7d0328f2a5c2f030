//! The simulator's files keep one direction: each imports only files of a lower layer (the
//! order ARCHITECTURE.md's `crates/sim/` row and `crates/sim/src/lib.rs` list them in), so no
//! file cycle can form inside the `tokentap-sim` crate. Reads the sources as text.
use std::path::Path;

/// `crates/sim/src/` files, lowest layer first; `api` stands for every file of `api/`.
const LAYERS: &[&str] = &[
    "options",
    "profile",
    "model",
    "text",
    "json_out",
    "scheduler",
    "from_matrix",
    "request",
    "error_body",
    "output",
    "state",
    "api",
    "render",
    "body",
    "generation",
    "engine_info",
    "metrics",
    "router",
    "server",
    "lag",
];

/// The module of the crate a file belongs to (`api/openai.rs` → `api`), `None` for `lib.rs`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_owned())
}

/// Every name a source reaches through `crate::x` or (top-level files only) `super::x`,
/// outside comments and its test module: a module of the crate, or an item of `lib.rs`.
fn imports(source: &str, top_level: bool) -> Vec<String> {
    let code: String = source
        .split("#[cfg(test)]")
        .next()
        .unwrap_or(source)
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut prefixes = vec!["crate::"];
    if top_level {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            found.extend(first_names(&code[at + prefix.len()..]));
        }
    }
    found
}

/// The identifier a path continues with (`render::X` → `render`), or the first identifier of
/// each item of a brace group (`{render::X, body::{A, B}, self}` → `render`, `body`).
fn first_names(rest: &str) -> Vec<String> {
    let ident = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return Some(ident(rest))
            .filter(|n| !n.is_empty())
            .into_iter()
            .collect();
    };
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .map(|item| ident(item.trim_start()))
        .filter(|n| !n.is_empty() && n != "self")
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_sim_file_imports_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/sim/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > LAYERS.len(),
        "crates/sim/src/ not found at {root:?}"
    );
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        let Some(module) = module_of(relative) else {
            continue;
        };
        let Some(layer) = LAYERS.iter().position(|m| *m == module) else {
            violations.push(format!(
                "{relative:?}: not in LAYERS; place it in the order"
            ));
            continue;
        };
        let top_level = relative.components().count() == 1;
        let source = std::fs::read_to_string(file).unwrap_or_default();
        for import in imports(&source, top_level) {
            match LAYERS.iter().position(|m| *m == import) {
                Some(used) if used < layer || import == module => {}
                Some(_) => {
                    violations.push(format!("{relative:?} imports `{import}`, a layer above"))
                }
                None => violations.push(format!("{relative:?} imports `{import}` from lib.rs")),
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn an_upward_import_is_caught() {
    let upward = "use super::render::Renderer;\n";
    assert_eq!(imports(upward, true), ["render"]);
    let from_lib_rs = "use super::SimOptions;\nuse crate::serve;\n";
    assert_eq!(imports(from_lib_rs, true), ["serve", "SimOptions"]);
    let grouped = "use crate::{\n    render::Renderer,\n    body::{A, B},\n    self,\n};\n";
    assert_eq!(imports(grouped, false), ["render", "body"]);
    let in_docs = "//! Served by [`crate::serve`].\n";
    assert!(imports(in_docs, true).is_empty());
    let in_tests = "fn f() {}\n#[cfg(test)]\nmod tests { use super::render; }\n";
    assert!(imports(in_tests, true).is_empty());
}
