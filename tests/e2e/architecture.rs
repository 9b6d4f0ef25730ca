//! The architecture test: the code keeps the shape docs/architecture.md describes. It reads
//! the rooms table and the shell list from that page (so the page is the source of truth)
//! and fails when a file of `src/` names a room its room may not import, when a file that
//! is not a shell uses an I/O or runtime crate, when a file belongs to no room, or when a
//! non-test code file grows past the size limit.

use crate::support::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest non-test code file, in lines (generated code excepted).
const MAX_LINES: usize = 600;
/// What only shells may use.
const IO_PATHS: &[&str] = &[
    "tokio::",
    "kube::",
    "hyper::",
    "hyper_util::",
    "tonic::",
    "nvml_wrapper::",
    "sysinfo::",
    "std::fs",
    "std::net",
    "std::process",
    "std::thread",
];
/// Files that are produced by a tool, not written.
const GENERATED: &[&str] = &["attribute/podresources/generated.rs"];

struct Doc {
    /// Room → the rooms it may import (`None`: all).
    rooms: BTreeMap<String, Option<BTreeSet<String>>>,
    shells: BTreeSet<String>,
}

fn between<'a>(text: &'a str, tag: &str) -> &'a str {
    let open = format!("<!-- {tag} -->");
    let close = format!("<!-- /{tag} -->");
    let start = text
        .find(&open)
        .unwrap_or_else(|| panic!("docs/architecture.md lacks {open}"));
    let end = text
        .find(&close)
        .unwrap_or_else(|| panic!("docs/architecture.md lacks {close}"));
    &text[start + open.len()..end]
}

fn read_doc() -> Doc {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut rooms = BTreeMap::new();
    for line in between(&text, "rooms").lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `room` | what | may import |
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let room = cells[1]
            .trim_matches('`')
            .trim_end_matches(".rs")
            .to_string();
        let may = match cells[3] {
            "all" => None,
            "—" | "-" | "" => Some(BTreeSet::new()),
            list => Some(list.split(',').map(|s| s.trim().to_string()).collect()),
        };
        rooms.insert(room, may);
    }
    let shells = between(&text, "shells")
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Doc { rooms, shells }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code before its test module, without comment lines.
fn code(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .take_while(|l| *l != "#[cfg(test)]")
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(str::to_string)
        .collect()
}

/// Every `crate::<room>` the code names (in `use` lists too).
fn rooms_named(lines: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in lines {
        let mut rest = l.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

struct Finding(String);

fn check(doc: &Doc, src: &Path) -> Vec<Finding> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if GENERATED.contains(&rel.as_str()) {
            continue;
        }
        let room = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let Some(may) = doc.rooms.get(room) else {
            bad.push(Finding(format!(
                "{rel}: its room `{room}` is not in the rooms table"
            )));
            continue;
        };
        let lines = code(&path);
        if lines.len() > MAX_LINES {
            bad.push(Finding(format!(
                "{rel}: {} lines of non-test code (limit {MAX_LINES}): split it",
                lines.len()
            )));
        }
        if let Some(may) = may {
            for named in rooms_named(&lines) {
                if named != room && doc.rooms.contains_key(&named) && !may.contains(&named) {
                    bad.push(Finding(format!(
                        "{rel}: room `{room}` may not import `crate::{named}` (may import: {})",
                        if may.is_empty() {
                            "nothing".to_string()
                        } else {
                            may.iter().cloned().collect::<Vec<_>>().join(", ")
                        }
                    )));
                }
            }
        }
        if !doc.shells.contains(&rel) {
            for l in &lines {
                if let Some(p) = IO_PATHS.iter().find(|p| l.contains(*p)) {
                    bad.push(Finding(format!(
                        "{rel}: uses `{p}` but is not listed as a shell: `{}`",
                        l.trim()
                    )));
                }
            }
        }
    }
    for shell in &doc.shells {
        if !src.join(shell).exists() {
            bad.push(Finding(format!(
                "docs/architecture.md lists a shell that does not exist: {shell}"
            )));
        }
    }
    bad
}

#[test]
fn the_code_keeps_the_shape_of_docs_architecture_md() {
    let doc = read_doc();
    assert!(
        doc.rooms.len() >= 8,
        "rooms table not read: {:?}",
        doc.rooms.keys()
    );
    assert!(doc.rooms["model"].as_ref().is_some_and(BTreeSet::is_empty));
    let bad = check(&doc, &root().join("src"));
    let text: Vec<String> = bad.into_iter().map(|f| f.0).collect();
    assert!(
        text.is_empty(),
        "architecture violations:\n{}",
        text.join("\n")
    );
}

/// The checker itself: a pure room importing a shell room, a pure file using tokio, an
/// oversized file and a file of an unknown room are each found.
#[test]
fn the_checker_finds_each_kind_of_violation() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("model/a.rs", "use crate::guard::x;\n");
    write(
        "guard/b.rs",
        "use tokio::sync::watch;\nuse crate::model::y;\n",
    );
    write("guard/c.rs", &"let x = 1;\n".repeat(MAX_LINES + 1));
    write(
        "guard/d.rs",
        &format!(
            "{}#[cfg(test)]\n{}",
            "let x = 1;\n".repeat(10),
            "use tokio::x;\n".repeat(700)
        ),
    );
    write(
        "act/e.rs",
        "use tokio::net::TcpStream;\nuse crate::guard::z;\n",
    );
    write("mystery/f.rs", "\n");
    let doc = Doc {
        rooms: BTreeMap::from([
            ("model".to_string(), Some(BTreeSet::new())),
            (
                "guard".to_string(),
                Some(BTreeSet::from(["model".to_string()])),
            ),
            (
                "act".to_string(),
                Some(BTreeSet::from(["model".to_string(), "guard".to_string()])),
            ),
        ]),
        shells: BTreeSet::from(["act/e.rs".to_string()]),
    };
    let found: Vec<String> = check(&doc, src).into_iter().map(|f| f.0).collect();
    let has = |frag: &str| found.iter().any(|f| f.contains(frag));
    assert!(
        has("model/a.rs: room `model` may not import `crate::guard`"),
        "{found:#?}"
    );
    assert!(has("guard/b.rs: uses `tokio::`"), "{found:#?}");
    assert!(has("guard/c.rs: 601 lines"), "{found:#?}");
    assert!(has("mystery/f.rs: its room `mystery`"), "{found:#?}");
    assert!(!has("guard/d.rs"), "test code is not counted: {found:#?}");
    assert!(!has("act/e.rs"), "a shell may use tokio: {found:#?}");
    assert_eq!(found.len(), 4, "{found:#?}");
}
