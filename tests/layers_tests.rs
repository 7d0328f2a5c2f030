//! The workspace's layer rule, checked on the source text: a top-level module of `src/` imports
//! only modules of lower layers (the order is the "Layers" block of ARCHITECTURE.md, read
//! from there), and the files of one module never import each other in a cycle, at any depth
//! of folders (`base::engine`'s files among themselves as much as `base`'s). `admin`'s files
//! also stand on at most four floors (the longest chain of imports between them, issue 47).
//!
//! `base`, `matrix` and `sim` are crates of the workspace (`crates/<name>/`, re-exported by
//! `src/lib.rs` under those names): the compiler already keeps them off the proxy, and this
//! test reads them as if they were the folders `src/<name>/`, so the same block orders them and
//! their files are held to the same cycle rule.
//!
//! An import is any `crate::<module>` path outside the file's `#[cfg(test)]` part, doc links
//! included (rustdoc resolves them, so they are dependencies too). Inside a module, a file
//! `m/x.rs` (or folder `m/x/`) imports its sibling `y` through `crate::m::y` or `super::y`;
//! `m/mod.rs` is the module's face and no node of that graph.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// File cycles that other branches of issue 12 remove; the lead deletes each line when the
/// branch named beside it is merged. A listed cycle that no longer exists fails the test, so
/// the list cannot outlive the cycles.
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[];

/// One source file: its path below `src/` (with `/` separators; a crate's files as
/// `<name>/…`, see [`read_workspace`]) and its text.
struct SourceFile {
    path: String,
    text: String,
}

fn read_tree(root: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap();
                let parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.push(SourceFile {
                    path: parts.join("/"),
                    text: std::fs::read_to_string(&path).unwrap(),
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// The text a file compiles outside tests: everything before its first `#[cfg(test)]` line.
fn non_test_part(text: &str) -> &str {
    if text.starts_with("#[cfg(test)]") {
        return "";
    }
    match text.find("\n#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    }
}

/// The names a path continues with right after `::`: one identifier (`proxy::X` → `proxy`), or
/// the first identifier of each item of a brace group, at any depth of nesting
/// (`{proxy::X, meter::{a, b}, self}` → `proxy`, `meter`; `self` names the prefix itself).
fn names_in(rest: &str) -> Vec<&str> {
    let ident_end = |text: &str| {
        text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(text.len())
    };
    let Some(group) = rest.strip_prefix('{') else {
        let end = ident_end(rest);
        return if end > 0 {
            vec![&rest[..end]]
        } else {
            Vec::new()
        };
    };
    // Split the group at its own commas (depth 1), up to its closing brace.
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut item_start = 0usize;
    let mut items = Vec::new();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[item_start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[item_start..i]);
                item_start = i + 1;
            }
            _ => {}
        }
    }
    for item in items {
        let item = item.trim_start();
        if item.starts_with('{') {
            names.extend(names_in(item)); // `crate::{{a, b}}`: a group in a group
            continue;
        }
        let end = ident_end(item);
        if end > 0 && &item[..end] != "self" {
            names.push(&item[..end]);
        }
    }
    names
}

/// Identifiers following `prefix` in `text` (`crate::` → `net`, `proxy`…), grouped imports
/// included (`crate::{net::X, proxy::{a, b}}` → `net`, `proxy`).
fn names_after<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(prefix).flat_map(move |(at, _)| {
        // `xcrate::` is not `crate::`.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Vec::new();
        }
        names_in(&text[at + prefix.len()..])
    })
}

/// The module path of a file (`meter/record.rs` → [meter, record]; `proxy/mod.rs` → [proxy]).
fn module_path(path: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = path.trim_end_matches(".rs").split('/').collect();
    if parts.last() == Some(&"mod") {
        parts.pop();
    }
    parts
}

/// Top-level module → the top-level modules it imports.
fn module_imports(files: &[SourceFile]) -> BTreeMap<String, BTreeSet<String>> {
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if file.path == "lib.rs" || file.path == "main.rs" {
            continue; // they declare the modules and call `app`; they belong to no layer
        }
        let module = module_path(&file.path);
        let Some(top) = module.first() else {
            continue;
        };
        let entry = imports.entry((*top).to_owned()).or_default();
        for name in names_after(non_test_part(&file.text), "crate::") {
            if name != *top {
                entry.insert(name.to_owned());
            }
        }
    }
    imports
}

/// Every import from a module to one of the same or a higher layer, as readable lines; also
/// every module missing from the layer table.
fn layer_violations(
    layers: &[Vec<String>],
    imports: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(rank, layer)| layer.iter().map(move |m| (m.as_str(), rank)))
        .collect();
    let mut violations = Vec::new();
    for (module, targets) in imports {
        let Some(&own) = rank.get(module.as_str()) else {
            violations.push(format!("`{module}` is in no layer of ARCHITECTURE.md"));
            continue;
        };
        for target in targets {
            match rank.get(target.as_str()) {
                Some(&other) if other < own => {}
                Some(_) => violations.push(format!(
                    "`{module}` imports `{target}`, which is not in a lower layer"
                )),
                None => violations.push(format!(
                    "`{module}` imports `{target}`, which is in no layer of ARCHITECTURE.md"
                )),
            }
        }
    }
    violations
}

/// Per module that is a folder, at any depth (`proxy`, `base::engine`): child → the children
/// it imports. A file `m/f/x.rs` is a node of `m::f`'s graph (as `x`) and, through its folder,
/// of `m`'s (as `f`).
fn file_imports(files: &[SourceFile]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_path(&file.path);
        for depth in 1..module.len() {
            children
                .entry(module[..depth].join("::"))
                .or_default()
                .insert(module[depth].to_owned());
        }
    }
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        let module = module_path(&file.path);
        let text = non_test_part(&file.text);
        for depth in 1..module.len() {
            let (parent, child) = (&module[..depth], module[depth]);
            let name = parent.join("::");
            let siblings = &children[&name];
            let mut targets: BTreeSet<String> = names_after(text, &format!("crate::{name}::"))
                .map(str::to_owned)
                .collect();
            // `super::` climbs one level per occurrence; only paths that land on `parent` name a
            // sibling.
            for (at, _) in text.match_indices("super::") {
                if text[..at].ends_with("super::") {
                    continue; // counted from the first `super::` of the chain
                }
                let mut climbed = 0;
                let mut rest = &text[at..];
                while let Some(stripped) = rest.strip_prefix("super::") {
                    climbed += 1;
                    rest = stripped;
                }
                if module.len() == depth + climbed {
                    targets.extend(names_in(rest).into_iter().map(str::to_owned));
                }
            }
            let graph = graphs.entry(name).or_default();
            let edges = graph.entry(child.to_owned()).or_default();
            edges.extend(
                targets
                    .into_iter()
                    .filter(|target| target != child && siblings.contains(target)),
            );
        }
    }
    graphs
}

/// The strongly connected components with more than one node (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Search<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g str) {
            let index = self.index.len();
            self.index.insert(node, index);
            self.low.insert(node, index);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    component.insert(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.found
}

/// Every file cycle as `module: a ↔ b`, sorted.
fn file_cycles(files: &[SourceFile]) -> Vec<(String, BTreeSet<String>)> {
    let mut all = Vec::new();
    for (module, graph) in file_imports(files) {
        for cycle in cycles(&graph) {
            all.push((module.clone(), cycle));
        }
    }
    all.sort();
    all
}

/// The most floors `admin` may have (issue 47): the session table and the view; state and
/// query; the endpoint files; the route table.
const ADMIN_MAX_FLOORS: usize = 4;

/// A longest chain of imports in a module's file graph, importer first (`[routes, page, view]`:
/// `routes` imports `page`, which imports `view`). Its length is the module's floors: how many
/// files stand on each other, a file that imports no sibling being floor 1. A folder is one
/// file, as in [`file_imports`]. A cycle's files are walked once (the cycle test reports them).
fn longest_chain(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn chain_from<'g>(
        node: &'g str,
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        known: &mut BTreeMap<&'g str, Vec<String>>,
        walking: &mut BTreeSet<&'g str>,
    ) -> Vec<String> {
        if let Some(chain) = known.get(node) {
            return chain.clone();
        }
        walking.insert(node);
        let mut longest = Vec::new();
        for next in graph.get(node).into_iter().flatten() {
            if walking.contains(next.as_str()) {
                continue;
            }
            let below = chain_from(next, graph, known, walking);
            if below.len() > longest.len() {
                longest = below;
            }
        }
        walking.remove(node);
        let mut chain = vec![node.to_owned()];
        chain.extend(longest);
        known.insert(node, chain.clone());
        chain
    }
    let mut known = BTreeMap::new();
    let mut longest = Vec::new();
    for node in graph.keys() {
        let chain = chain_from(node, graph, &mut known, &mut BTreeSet::new());
        if chain.len() > longest.len() {
            longest = chain;
        }
    }
    longest
}

/// Per module with files of its own: a longest chain of imports between them (see
/// [`longest_chain`]).
fn module_floors(files: &[SourceFile]) -> BTreeMap<String, Vec<String>> {
    file_imports(files)
        .into_iter()
        .map(|(module, graph)| (module, longest_chain(&graph)))
        .collect()
}

/// The layers, lowest first, from the fenced block under "## Layers" in ARCHITECTURE.md
/// (written top layer first, one layer per line, modules separated by spaces).
fn layers_from_architecture(text: &str) -> Vec<Vec<String>> {
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Layers` section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the Layers section opens with a fenced block");
    let mut layers: Vec<Vec<String>> = block
        .lines()
        .skip(1) // the fence's info string
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect();
    layers.reverse();
    layers
}

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A crate's source as if it were the folder `src/<name>/` of the root crate: its own paths
/// `crate::x` become `crate::<name>::x`, and a sibling crate's `tokentap_<other>::x` (one of
/// `crates`) becomes `crate::<other>::x` (the name `src/lib.rs` re-exports it under).
fn as_module(name: &str, crates: &[String], text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        out.push_str(&rest[..at + "crate::".len()]);
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            out.push_str(name);
            out.push_str("::");
        }
        rest = &rest[at + "crate::".len()..];
    }
    out.push_str(rest);
    for other in crates {
        out = out.replace(&format!("tokentap_{other}::"), &format!("crate::{other}::"));
    }
    out
}

/// The names of the workspace's crates below the root package: each folder `crates/<name>/`
/// with a `src/lib.rs`.
fn workspace_crates() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(crate_root().join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("src/lib.rs").is_file())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every file the layer rule covers: `src/`, and each crate's `src/` as `<name>/…` with
/// `lib.rs` as `<name>/mod.rs` and its paths rewritten by [`as_module`].
fn read_workspace() -> Vec<SourceFile> {
    let mut files = read_tree(&crate_root().join("src"));
    let crates = workspace_crates();
    for name in &crates {
        for file in read_tree(&crate_root().join("crates").join(name).join("src")) {
            let path = match file.path.as_str() {
                "lib.rs" => format!("{name}/mod.rs"),
                other => format!("{name}/{other}"),
            };
            files.push(SourceFile {
                path,
                text: as_module(name, &crates, &file.text),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

#[test]
fn no_module_imports_from_its_own_or_a_higher_layer() {
    let architecture = std::fs::read_to_string(crate_root().join("ARCHITECTURE.md")).unwrap();
    let layers = layers_from_architecture(&architecture);
    assert!(layers.len() >= 3, "layers read: {layers:?}");
    let files = read_workspace();
    assert!(
        ["base", "matrix", "sim"]
            .iter()
            .all(|c| files.iter().any(|f| f.path == format!("{c}/mod.rs"))),
        "the crates base, matrix and sim were not read"
    );
    let violations = layer_violations(&layers, &module_imports(&files));
    assert!(
        violations.is_empty(),
        "the layer rule of ARCHITECTURE.md is broken:\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_module_of_the_layers_exists_and_is_in_the_code_map() {
    let architecture = std::fs::read_to_string(crate_root().join("ARCHITECTURE.md")).unwrap();
    let src = crate_root().join("src");
    let crates = workspace_crates();
    for module in layers_from_architecture(&architecture).concat() {
        let (folder, is_there) = if crates.contains(&module) {
            (format!("crates/{module}/"), true)
        } else {
            let folder = format!("src/{module}/");
            (folder, src.join(&module).join("mod.rs").is_file())
        };
        assert!(
            is_there,
            "ARCHITECTURE.md's layers name `{module}`, which is no folder of src/ or crates/"
        );
        assert!(
            architecture.contains(&format!("`{folder}`")),
            "`{folder}` is missing from ARCHITECTURE.md's code map"
        );
    }
    for name in &crates {
        assert!(
            layers_from_architecture(&architecture)
                .concat()
                .contains(name),
            "the crate `crates/{name}/` is in no layer of ARCHITECTURE.md"
        );
    }
}

#[test]
fn no_file_cycle_within_a_module_beyond_the_known_ones() {
    let found = file_cycles(&read_workspace());
    let known: Vec<(String, BTreeSet<String>)> = KNOWN_FILE_CYCLES
        .iter()
        .map(|(module, files)| {
            (
                (*module).to_owned(),
                files.iter().map(|f| (*f).to_owned()).collect(),
            )
        })
        .collect();
    let new: Vec<_> = found.iter().filter(|c| !known.contains(c)).collect();
    assert!(new.is_empty(), "file import cycles: {new:?}");
    let gone: Vec<_> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(
        gone.is_empty(),
        "these cycles are gone: delete them from KNOWN_FILE_CYCLES: {gone:?}"
    );
}

#[test]
fn admin_stands_on_at_most_four_floors() {
    let floors = module_floors(&read_workspace());
    let table: Vec<String> = floors
        .iter()
        .map(|(module, chain)| format!("{module}: {} ({})", chain.len(), chain.join(" → ")))
        .collect();
    let admin = floors.get("admin").map_or(0, Vec::len);
    assert!(
        (1..=ADMIN_MAX_FLOORS).contains(&admin),
        "admin stands on {admin} floors, at most {ADMIN_MAX_FLOORS} wanted; floors per module (a longest chain, importer first):\n{}",
        table.join("\n")
    );
}

fn tree(files: &[(&str, &str)]) -> Vec<SourceFile> {
    files
        .iter()
        .map(|(path, text)| SourceFile {
            path: (*path).to_owned(),
            text: (*text).to_owned(),
        })
        .collect()
}

#[test]
fn the_checker_sees_an_upward_import_and_a_same_layer_import() {
    let layers = layers_from_architecture(
        "# A\n\n## Layers\n\n```text\napp\nproxy telemetry\nbase\n```\n\n## Next\n",
    );
    assert_eq!(
        layers,
        [vec!["base"], vec!["proxy", "telemetry"], vec!["app"]]
    );
    let files = tree(&[
        ("lib.rs", "pub mod app;"),
        ("base/mod.rs", "//! Uses [`crate::app`] in a doc link.\n"),
        (
            "proxy/mod.rs",
            "use crate::base::Route;\nuse crate::telemetry::x;\n",
        ),
        (
            "telemetry/mod.rs",
            "#[cfg(test)]\nmod tests { use crate::app::x; }\n",
        ),
        (
            "app/mod.rs",
            "use crate::proxy::Proxy;\nfn f() { xcrate::base::y(); }\n",
        ),
    ]);
    let imports = module_imports(&files);
    assert_eq!(imports["app"], BTreeSet::from(["proxy".to_owned()]));
    assert!(imports["telemetry"].is_empty(), "test modules do not count");
    let violations = layer_violations(&layers, &imports);
    assert_eq!(
        violations,
        [
            "`base` imports `app`, which is not in a lower layer",
            "`proxy` imports `telemetry`, which is not in a lower layer",
        ]
    );
}

#[test]
fn the_checker_sees_grouped_and_nested_imports() {
    assert_eq!(
        names_in("{proxy::X, meter::{record::{A, B}, slo}, self, {stream::sse}}; base::Y"),
        ["proxy", "meter", "stream"]
    );
    assert_eq!(names_in("net::X"), ["net"]);
    assert!(names_in("{}").is_empty());
    let layers = layers_from_architecture(
        "# A\n\n## Layers\n\n```text\napp\nsweep\nproxy telemetry\nbase\n```\n",
    );
    let files = tree(&[
        ("lib.rs", "pub mod app;"),
        (
            "proxy/mod.rs",
            "use crate::{\n    base::Route,\n    telemetry::{names::{A, B}, x},\n};\n",
        ),
        ("sweep/mod.rs", "use crate::{base::{self, X}, {app::Y}};\n"),
        ("sweep/a.rs", "use super::{b::X, c};\n"),
        ("sweep/b.rs", "use crate::sweep::{a, c::{D}};\n"),
        ("sweep/c.rs", "use super::{super::proxy::P};\n"),
    ]);
    let imports = module_imports(&files);
    assert_eq!(
        imports["proxy"],
        BTreeSet::from(["base".to_owned(), "telemetry".to_owned()])
    );
    assert_eq!(
        layer_violations(&layers, &imports),
        [
            "`proxy` imports `telemetry`, which is not in a lower layer",
            "`sweep` imports `app`, which is not in a lower layer",
        ]
    );
    let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(
        file_cycles(&files),
        [("sweep".to_owned(), set(&["a", "b"]))]
    );
}

#[test]
fn the_checker_sees_file_cycles_through_super_and_crate_paths() {
    let files = tree(&[
        (
            "meter/mod.rs",
            "pub mod record; pub mod slo; pub mod timeline;",
        ),
        (
            "meter/record.rs",
            "use super::slo::Verdict;\nuse super::Meter;\n",
        ),
        ("meter/slo.rs", "use crate::meter::record::Outcome;\n"),
        ("meter/timeline.rs", "use super::record::Outcome;\n"),
        (
            "proxy/body/mod.rs",
            "use super::super::proxy::timeout::X;\n",
        ),
        ("proxy/body/inner.rs", "use super::super::timeout::X;\n"),
        ("proxy/timeout.rs", "use super::body::BoxError;\n"),
        ("proxy/error.rs", "use super::timeout::X;\n"),
    ]);
    let found = file_cycles(&files);
    let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(
        found,
        [
            ("meter".to_owned(), set(&["record", "slo"])),
            ("proxy".to_owned(), set(&["body", "timeout"])),
        ]
    );
}

#[test]
fn floors_count_the_longest_chain_of_files() {
    let files = tree(&[
        ("admin/mod.rs", "pub mod routes; pub mod page; pub use routes::X;"),
        (
            "admin/routes.rs",
            "use super::{page, state::AdminState};\n#[cfg(test)]\nmod tests { use super::super::slices::S; }\n",
        ),
        ("admin/page/mod.rs", "mod render; pub use render::render;"),
        ("admin/page/render.rs", "use crate::admin::view::V;\n"),
        ("admin/view.rs", "use super::state::AdminState;\n"),
        ("admin/state.rs", "use crate::proxy::Proxy;\n"),
        ("admin/slices.rs", "use super::view::V;\n"),
        ("proxy/mod.rs", "pub mod body;"),
        ("proxy/body.rs", ""),
    ]);
    let floors = module_floors(&files);
    assert_eq!(floors["admin"], ["routes", "page", "view", "state"]);
    assert_eq!(floors["proxy"], ["body"]);
    // A cycle ends a chain where it would turn back.
    let cyclic = tree(&[
        ("m/a.rs", "use super::b::X;"),
        ("m/b.rs", "use super::a::Y;"),
    ]);
    assert_eq!(module_floors(&cyclic)["m"].len(), 2);
}

#[test]
fn the_checker_sees_a_file_cycle_inside_a_folder_of_a_crate() {
    let crates: Vec<String> = ["base", "matrix", "sim"].map(str::to_owned).to_vec();
    let sources = [
        ("base/mod.rs", "pub mod engine; pub mod lock;"),
        ("base/engine/mod.rs", "mod sglang; mod spec;"),
        (
            "base/engine/spec.rs",
            "use super::{sglang, vllm};\nfn f() { crate::lock::read(); }\n",
        ),
        ("base/engine/sglang.rs", "use super::spec::EngineSpec;\n"),
        ("base/engine/vllm.rs", "use crate::engine::spec::Metrics;\n"),
        ("base/lock.rs", "use crate::engine::Engine;\n"),
    ];
    let files: Vec<SourceFile> = sources
        .iter()
        .map(|(path, text)| SourceFile {
            path: (*path).to_owned(),
            text: as_module("base", &crates, text),
        })
        .collect();
    let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
    // `engine` ⇄ `lock` is a cycle between the folder and a file of `base` too.
    assert_eq!(
        file_cycles(&files),
        [
            ("base".to_owned(), set(&["engine", "lock"])),
            ("base::engine".to_owned(), set(&["sglang", "spec", "vllm"])),
        ]
    );
}

#[test]
fn a_crate_reads_as_a_module_of_the_layers() {
    let crates: Vec<String> = ["base", "matrix", "sim"].map(str::to_owned).to_vec();
    let text = "//! See [`crate::doc`].\nuse crate::{doc::X, units};\nuse tokentap_base::{json, Source};\nfn f() { xcrate::y(); }\nconst M: &str = \"tokentap_requests_total\";\n";
    assert_eq!(
        as_module("matrix", &crates, text),
        "//! See [`crate::matrix::doc`].\nuse crate::matrix::{doc::X, units};\nuse crate::base::{json, Source};\nfn f() { xcrate::y(); }\nconst M: &str = \"tokentap_requests_total\";\n"
    );
    let layers = layers_from_architecture("# A\n\n## Layers\n\n```text\nsim\nmatrix\nbase\n```\n");
    let sources = [
        ("matrix/mod.rs", "matrix", "use tokentap_base::Source;\n"),
        ("matrix/doc.rs", "matrix", "use crate::units::U;\n"),
        ("matrix/units.rs", "matrix", "use super::doc::D;\n"),
        ("base/mod.rs", "base", "use tokentap_sim::Profile;\n"),
    ];
    let files: Vec<SourceFile> = sources
        .iter()
        .map(|(path, name, text)| SourceFile {
            path: (*path).to_owned(),
            text: as_module(name, &crates, text),
        })
        .collect();
    assert_eq!(
        layer_violations(&layers, &module_imports(&files)),
        ["`base` imports `sim`, which is not in a lower layer"]
    );
    let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(
        file_cycles(&files),
        [("matrix".to_owned(), set(&["doc", "units"]))]
    );
}
