//! The rules over a tree laid out like this repository (`src/`, `crates/*/src`,
//! `docs/architecture.md`): rooms import only what the rooms table lets them, only shells
//! name I/O and runtime crates, only `kubeapi` makes kube's typed calls, every file belongs to
//! a room, and no non-test code file grows past the size limit.

use super::doc::Doc;
use super::rust::{facts, module_of};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Longest non-test code file, in lines (generated code excepted).
pub const MAX_LINES: usize = 600;
/// Files that are produced by a tool, not written.
const GENERATED: &[&str] = &["src/attribute/podresources/generated.rs"];

/// Every file under `dir` whose name ends with `ext`, sorted; build output and hidden
/// folders left out.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                walk(&path, ext, out);
            } else if name.ends_with(ext) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, ext, &mut out);
    out.sort();
    out
}

pub fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// The rooms, shells and I/O rules over `root/src`.
pub fn check_rooms(root: &Path, doc: &Doc) -> Vec<String> {
    let src = root.join("src");
    let mut bad = Vec::new();
    let mut uses_io = BTreeSet::new();
    // Module → file, to tell when a pure file names an item of a shell.
    let modules: Vec<(Vec<String>, String)> = files(&src, ".rs")
        .iter()
        .map(|p| rel(&src, p))
        .filter(|r| r != "main.rs")
        .map(|r| (module_of(&r), r))
        .collect();
    let file_of = |path: &[String]| {
        modules
            .iter()
            .filter(|(m, _)| !m.is_empty() && path.starts_with(m))
            .max_by_key(|(m, _)| m.len())
            .map(|(_, r)| r.as_str())
    };
    for path in files(&src, ".rs") {
        let in_src = rel(&src, &path);
        if GENERATED.contains(&rel(root, &path).as_str()) {
            continue;
        }
        let room = in_src
            .split('/')
            .next()
            .unwrap_or("")
            .trim_end_matches(".rs");
        let Some(may) = doc.rooms.get(room) else {
            bad.push(format!(
                "src/{in_src}: its room `{room}` is not in the rooms table"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let facts = match facts(&text, &module_of(&in_src)) {
            Ok(f) => f,
            Err(e) => {
                bad.push(format!("src/{in_src}: {e}"));
                continue;
            }
        };
        for line in &facts.path_mods {
            bad.push(format!(
                "src/{in_src}:{line}: a `#[path]` module: a file is compiled in the crate of \
                 its own room's folder, nowhere else"
            ));
        }
        let shell = doc.shells.contains(&in_src);
        let mut seen = BTreeSet::new();
        for n in &facts.named {
            let p = &n.path;
            if p[0] == "<above the crate root>" {
                bad.push(format!(
                    "src/{in_src}:{}: a `super::` climbs above the crate root",
                    n.line
                ));
                continue;
            }
            if p[0] == "crate" && p.len() > 1 {
                let target = &p[1];
                let allowed = may.as_ref().is_none_or(|m| m.contains(target));
                if target != room
                    && doc.rooms.contains_key(target)
                    && !allowed
                    && seen.insert(format!("room {target}"))
                {
                    let list = may
                        .as_ref()
                        .map(|m| m.iter().cloned().collect::<Vec<_>>().join(", "))
                        .filter(|l| !l.is_empty())
                        .unwrap_or_else(|| "nothing".to_string());
                    bad.push(format!(
                        "src/{in_src}:{}: room `{room}` may not import `crate::{target}` \
                         (`{}`; may import: {list})",
                        n.line,
                        p.join("::")
                    ));
                }
            }
            // The facade (lib.rs) re-exports every room; main.rs wires them. A crate root's
            // alias of a room (`use gpu_warden_kubeapi as kubeapi;`, the path `crate::kubeapi`
            // alone) names no item of it.
            if p[0] == "crate" && p.len() > 2 && in_src != "main.rs" && in_src != "lib.rs" {
                if let Some(f) = file_of(&p[1..]).filter(|f| doc.shells.contains(*f)) {
                    uses_io.insert(in_src.clone());
                    if !shell && seen.insert(format!("shell {f}")) {
                        bad.push(format!(
                            "src/{in_src}:{}: is pure but names `{}` of the shell {f}: \
                             take it through a port",
                            n.line,
                            p.join("::")
                        ));
                    }
                }
            }
            if let Some(call) = doc.kubeapi_only.iter().find(|c| p.starts_with(c)) {
                if room != "kubeapi" && seen.insert(format!("kubeapi {}", call.join("::"))) {
                    bad.push(format!(
                        "src/{in_src}:{}: names `{}`: a typed Kubernetes API call is made \
                         through `kubeapi`, compiled once there",
                        n.line,
                        call.join("::")
                    ));
                }
            }
            if let Some(io) = doc.io.iter().find(|io| p.starts_with(io)) {
                uses_io.insert(in_src.clone());
                if !shell && seen.insert(format!("io {}", io.join("::"))) {
                    bad.push(format!(
                        "src/{in_src}:{}: uses `{}` but is not listed as a shell (`{}`)",
                        n.line,
                        io.join("::"),
                        p.join("::")
                    ));
                }
            }
        }
    }
    for shell in &doc.shells {
        if !src.join(shell).exists() {
            bad.push(format!(
                "docs/architecture.md lists a shell that does not exist: {shell}"
            ));
        } else if !uses_io.contains(shell) {
            bad.push(format!(
                "docs/architecture.md lists {shell} as a shell, but it uses no I/O or runtime crate \
                 and no other shell"
            ));
        }
    }
    bad
}

/// Non-test lines of each Rust file of `src/` and `crates/*/src`, over the limit, except
/// the allowed ones (each of which must still be over it: the list stays exact).
pub fn check_sizes(root: &Path, allowed: &[&str]) -> Vec<String> {
    let mut dirs = vec![root.join("src")];
    for c in std::fs::read_dir(root.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
    {
        dirs.push(c.path().join("src"));
    }
    let mut bad = Vec::new();
    let mut over = BTreeSet::new();
    for dir in dirs {
        for path in files(&dir, ".rs") {
            let name = rel(root, &path);
            if GENERATED.contains(&name.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            match facts(&text, &module_of(&rel(&dir, &path))) {
                Err(e) => bad.push(format!("{name}: {e}")),
                Ok(f) if f.code_lines > MAX_LINES => {
                    over.insert(name.clone());
                    if !allowed.contains(&name.as_str()) {
                        bad.push(format!(
                            "{name}: {} lines of non-test code (limit {MAX_LINES}): split it",
                            f.code_lines
                        ));
                    }
                }
                Ok(_) => {}
            }
        }
    }
    for a in allowed {
        if !over.contains(*a) {
            bad.push(format!(
                "{a} is allowed over the size limit but is not over it: take it off the list"
            ));
        }
    }
    bad
}
