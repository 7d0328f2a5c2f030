//! The simulator's files keep one direction: each imports only files of a lower layer (the
//! order ARCHITECTURE.md's `src/sim/` row and `src/sim/mod.rs` list them in), so no file
//! cycle can form inside `src/sim/`. Reads the sources as text.
use std::path::Path;

/// `src/sim/` files, lowest layer first; `api` stands for every file of `src/sim/api/`.
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

/// The `src/sim/` module a file belongs to (`api/openai.rs` → `api`), `None` for `mod.rs`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "mod").then(|| name.to_owned())
}

/// Every name a source reaches through `crate::sim::x` or (top-level files only) `super::x`,
/// outside comments and its test module: a module of `src/sim/`, or an item of `mod.rs`.
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
    let mut prefixes = vec!["crate::sim::"];
    if top_level {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sim");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > LAYERS.len(), "src/sim/ not found at {root:?}");
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
                None => violations.push(format!("{relative:?} imports `{import}` from mod.rs")),
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn an_upward_import_is_caught() {
    let upward = "use super::render::Renderer;\n";
    assert_eq!(imports(upward, true), ["render"]);
    let from_mod_rs = "use super::SimOptions;\nuse crate::sim::serve;\n";
    assert_eq!(imports(from_mod_rs, true), ["serve", "SimOptions"]);
    let in_docs = "//! Served by [`crate::sim::serve`].\n";
    assert!(imports(in_docs, true).is_empty());
    let in_tests = "fn f() {}\n#[cfg(test)]\nmod tests { use super::render; }\n";
    assert!(imports(in_tests, true).is_empty());
}
