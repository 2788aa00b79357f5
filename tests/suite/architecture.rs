//! The house's shape, checked: no file of `src/` imports, directly or through others, a
//! file that imports it back, and no folder or file at the top of `src/` imports one of a
//! layer above its own. A circle means two layers that cannot be read, tested or changed
//! one without the other. The layers are stated once, in `src/lib.rs`, read from there,
//! and the README's list must be the same.
//!
//! A file's imports are the paths it names that start with `crate::`, `super::` or
//! `self::` (in `use` declarations and inline), outside comments, strings and its
//! `#[cfg(test)]` modules; each resolves to the deepest file of `src/` its path names (a
//! re-export counts as an import of the file that re-exports).

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every module of `src/` that has a file, with the file's text.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut found = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|l| l == "mod" || l == "lib") {
                module.pop();
            }
            if module == ["main"] {
                continue;
            }
            found.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
    found
}

/// `text` without comments, string literals and `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with("//") {
            i += text[i..].find('\n').unwrap_or(text.len() - i);
        } else if text[i..].starts_with("/*") {
            i += text[i..].find("*/").map_or(text.len() - i, |e| e + 2);
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if bytes[i] == b'\'' && bytes.get(i + 1) == Some(&b'\\') {
            // A character literal of an escape: `'\''`, `'\\'`, `'\n'`, ...
            i += 2 + text[i + 2..].find('\'').map_or(0, |e| e + 1);
            out.push_str("' '");
        } else if bytes[i] == b'\'' && bytes.get(i + 2) == Some(&b'\'') {
            // A plain character literal, which may be `'"'` (a lifetime never closes).
            i += 3;
            out.push_str("' '");
        } else if text[i..].starts_with("#[cfg(test)]") {
            let rest = &text[i + 12..];
            let item = rest.trim_start();
            let braces = rest.find('{').unwrap_or(usize::MAX);
            let declared = rest.find(';').is_some_and(|semi| semi < braces);
            if (item.starts_with("mod ") || item.starts_with("pub mod ")) && !declared {
                // Skip to the end of the module's braces.
                let open = i + 12 + braces;
                let mut depth = 0;
                let mut j = open;
                while j < bytes.len() {
                    match bytes[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                i = j + 1;
            } else {
                i += 12;
            }
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The paths of a `use` tree, `a::{b, c::{d, e}}` giving `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(&tree).to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len() - 1];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// The file a path named in `module` leads to: its deepest prefix that is a module with a
/// file, or `None` for paths outside the crate.
fn resolve(module: &[String], path: &str, files: &BTreeMap<Module, String>) -> Option<Module> {
    let mut segments = path.split("::").filter(|s| !s.is_empty());
    let mut base: Module = match segments.next()? {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    let mut segments = segments.peekable();
    while segments.peek() == Some(&"super") {
        segments.next();
        base.pop();
    }
    for segment in segments {
        let segment = segment.split("as").next().unwrap_or(segment);
        base.push(segment.to_owned());
        if !files.contains_key(&base) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// Each module's imports of other modules.
fn imports(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph = BTreeMap::new();
    for (module, text) in files {
        let code = code(text);
        let mut paths = Vec::new();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("use ") {
            let boundary = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
            let tail = &rest[at + 4..];
            if boundary {
                if let Some(end) = tail.find(';') {
                    let tree = tail[..end].trim();
                    if ["crate", "super", "self"]
                        .iter()
                        .any(|r| tree.starts_with(r))
                    {
                        paths.extend(expand(tree));
                    }
                }
            }
            rest = tail;
        }
        for root in ["crate::", "super::"] {
            let mut rest = code.as_str();
            while let Some(at) = rest.find(root) {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(tail.len());
                let boundary = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
                if boundary {
                    paths.push(tail[..end].to_owned());
                }
                rest = &tail[root.len()..];
            }
        }
        let targets = paths
            .iter()
            .filter_map(|p| resolve(module, p, files))
            .filter(|target| target != module)
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The layers of a numbered list, top to bottom: an entry is a line `N. ` and the lines
/// after it, and its modules are the names in backticks before the first `` `: ``.
/// `text` is `src/lib.rs`'s doc comment or the README's section.
fn layers(text: &str) -> Vec<Vec<String>> {
    let mut entries: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches("//!").trim();
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if numbered {
            entries.push(line.split_once(". ").unwrap().1.to_owned());
        } else if line.is_empty() || line.starts_with('#') {
            // A blank line or a heading ends the entry.
            if entries.last().is_some_and(|e| !e.is_empty()) {
                entries.push(String::new());
            }
        } else if let Some(entry) = entries.last_mut().filter(|e| !e.is_empty()) {
            entry.push(' ');
            entry.push_str(line);
        }
    }
    entries
        .iter()
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let names = entry.find("`: ").map_or("", |end| &entry[..=end]);
            names
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The layers as `src/lib.rs` states them.
fn stated_layers(src: &Path) -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let doc: String = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| format!("{l}\n"))
        .collect();
    layers(&doc)
}

/// Every import of a module of a higher layer than the importer's, as
/// `from -> to`, and every top-level module that stands in no layer.
fn upward(graph: &BTreeMap<Module, BTreeSet<Module>>, layers: &[Vec<String>]) -> Vec<String> {
    let layer = |top: &str| layers.iter().position(|l| l.iter().any(|m| m == top));
    let mut found = BTreeSet::new();
    // `lib.rs` (the empty path) only declares the modules.
    for (from, targets) in graph.iter().filter(|(from, _)| !from.is_empty()) {
        let Some(at) = layer(&from[0]) else {
            found.insert(format!("{} stands in no layer", from[0]));
            continue;
        };
        for to in targets
            .iter()
            .filter(|to| !to.is_empty() && to[0] != from[0])
        {
            match layer(&to[0]) {
                Some(above) if above < at => {
                    found.insert(format!(
                        "{} (layer {}) -> {} (layer {})",
                        from.join("/"),
                        at + 1,
                        to.join("/"),
                        above + 1
                    ));
                }
                _ => {}
            }
        }
    }
    found.into_iter().collect()
}

/// The imports between top-level modules (a folder is one module).
fn folders(graph: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut tops: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, targets) in graph.iter().filter(|(from, _)| !from.is_empty()) {
        let entry = tops.entry(vec![from[0].clone()]).or_default();
        for to in targets
            .iter()
            .filter(|to| !to.is_empty() && to[0] != from[0])
        {
            entry.insert(vec![to[0].clone()]);
        }
    }
    tops
}

#[test]
fn no_module_imports_one_of_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = stated_layers(&src);
    assert!(layers.len() > 1, "src/lib.rs states no layers: {layers:?}");
    let found = upward(&imports(&modules(&src)), &layers);
    assert!(
        found.is_empty(),
        "imports that run up:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_folder_imports_a_folder_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found: Vec<String> = circles(&folders(&imports(&modules(&src))))
        .into_iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|m| m.join("/")).collect();
            names.join(" <-> ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "circles between folders:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_readme_states_the_layers_of_src_lib_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("Layers, top to bottom")
        .expect("the README's Architecture section lists the layers");
    let section = &readme[start..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    assert_eq!(layers(section), stated_layers(&root.join("src")));
}

/// The layer checker sees an import that runs up, a module in no layer, and reads a
/// list whose entries run over several lines.
#[test]
fn the_checker_sees_an_import_that_runs_up() {
    let stated = layers(
        "//! 1. `top`, `edge`: the top.\n//! 2. `middle`: with `this` in\n//!    its text, and more\n//!\n//! 3. `low`,\n//!    `leaf`: the ground.\n",
    );
    assert_eq!(
        stated,
        [vec!["top", "edge"], vec!["middle"], vec!["low", "leaf"]]
    );
    let mut files = BTreeMap::new();
    let module = |name: &str| vec![name.to_owned()];
    files.insert(module("top"), "use crate::middle::Thing;".to_owned());
    files.insert(module("middle"), "fn f() { crate::leaf::go() }".to_owned());
    files.insert(
        module("leaf"),
        "// use crate::top;\nconst X: u8 = 1;".to_owned(),
    );
    files.insert(vec!["low".to_owned(), "deep".to_owned()], String::new());
    assert!(upward(&imports(&files), &stated).is_empty());
    files.insert(module("leaf"), "use crate::middle::Thing;".to_owned());
    assert_eq!(
        upward(&imports(&files), &stated),
        ["leaf (layer 3) -> middle (layer 2)"]
    );
    files.insert(module("stray"), String::new());
    assert!(upward(&imports(&files), &stated).contains(&"stray stands in no layer".to_owned()));
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let found: Vec<String> = circles(&imports(&files))
        .into_iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|m| m.join("/")).collect();
            names.join(" <-> ")
        })
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The checker finds a circle where there is one, and none where there is none.
#[test]
fn the_checker_sees_a_circle() {
    let mut files = BTreeMap::new();
    let module = |name: &str| vec![name.to_owned()];
    files.insert(module("a"), "use crate::b::{self, Thing};".to_owned());
    files.insert(module("b"), "fn f() { crate::c::go() }".to_owned());
    files.insert(module("c"), "// use crate::a;\nuse crate::a::x;".to_owned());
    files.insert(module("d"), "use super::a;".to_owned());
    let found = circles(&imports(&files));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3);
    files.insert(
        module("c"),
        "// use crate::a;\nconst X: &str = \"crate::a\";".to_owned(),
    );
    assert!(circles(&imports(&files)).is_empty());
}
