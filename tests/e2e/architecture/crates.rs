//! The walls the compiler keeps, checked against the map: each room folder of `src/` is a
//! crate whose manifest names exactly the rooms its row of the rooms table lets it import
//! (so the table cannot drift from what the compiler enforces), its tests reach no further
//! than its code (the shared builders of `gpu-warden-fixtures` excepted), and a pure room —
//! one with no shell — names only the crates the page allows pure rooms and carries the
//! clippy configuration that bans std's I/O, threads, environment, process and printing.

use super::doc::Doc;
use std::collections::BTreeSet;
use std::path::Path;

/// The test builders' crate: a folder of `testkit`, and the one workspace crate any room's
/// tests may use.
const FIXTURES: &str = "fixtures";

/// Calls, types and macros each pure room's `clippy.toml` must refuse (by path prefix), on
/// top of every entry of the root's `clippy.toml`.
const PURE_BANS: &[&str] = &[
    "std::fs::",
    "std::env::",
    "std::thread::",
    "std::process::",
    "std::net::",
    "std::os::unix::net::",
    "std::io::stdin",
    "std::io::stdout",
    "std::io::stderr",
    "std::println",
    "std::eprintln",
];

/// `name = …` keys of one `[section]` of a manifest (our manifests write one dependency per
/// line; a table form `[dependencies.x]` is refused so nothing hides from this reading).
fn section_keys(toml: &str, section: &str) -> Result<BTreeSet<String>, String> {
    let mut keys = BTreeSet::new();
    let mut inside = false;
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            if line.starts_with(&format!("[{section}.")) {
                return Err(format!(
                    "writes `{line}`: list each crate on one line of [{section}]"
                ));
            }
            inside = line == format!("[{section}]");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some((key, _)) = line.split_once('=') {
                keys.insert(key.trim().to_string());
            }
        }
    }
    Ok(keys)
}

/// The `path = "…"` entries of a clippy.toml.
fn banned_paths(toml: &str) -> BTreeSet<String> {
    toml.split("path = \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(str::to_string)
        .collect()
}

fn rooms_of(deps: &BTreeSet<String>) -> BTreeSet<String> {
    deps.iter()
        .filter_map(|d| d.strip_prefix("gpu-warden-"))
        .map(str::to_string)
        .collect()
}

/// The manifest, dependency and pure-room rules over `root`.
pub fn check(root: &Path, doc: &Doc) -> Vec<String> {
    let mut bad = Vec::new();
    let root_clippy = std::fs::read_to_string(root.join("clippy.toml")).unwrap_or_default();
    for (room, may) in &doc.rooms {
        let dir = root.join("src").join(room);
        if !dir.is_dir() {
            continue; // lib.rs, main.rs: the facade package
        }
        let manifest = format!("src/{room}/Cargo.toml");
        let Ok(toml) = std::fs::read_to_string(root.join(&manifest)) else {
            bad.push(format!("{manifest}: missing: each room is a crate"));
            continue;
        };
        if !toml.contains(&format!("name = \"gpu-warden-{room}\"")) {
            bad.push(format!(
                "{manifest}: the package is not named gpu-warden-{room}"
            ));
        }
        let (deps, dev) = match (
            section_keys(&toml, "dependencies"),
            section_keys(&toml, "dev-dependencies"),
        ) {
            (Ok(d), Ok(v)) => (d, v),
            (Err(e), _) | (_, Err(e)) => {
                bad.push(format!("{manifest}: {e}"));
                continue;
            }
        };
        let mut uses = rooms_of(&deps);
        if room == "testkit" {
            uses.remove(FIXTURES);
        }
        let want: BTreeSet<String> = match may {
            Some(m) => m.clone(),
            None => {
                bad.push(format!(
                    "docs/architecture.md: room `{room}` may import `all`: a crate names its rooms"
                ));
                continue;
            }
        };
        if uses != want {
            let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
            bad.push(format!(
                "{manifest}: depends on the rooms [{}] but its row of the rooms table says [{}]",
                list(&uses),
                list(&want)
            ));
        }
        for extra in rooms_of(&dev).difference(&uses) {
            if extra != FIXTURES && extra != room {
                bad.push(format!(
                    "{manifest}: its tests use gpu-warden-{extra}, a room its code may not: \
                     tests reach no further than the code"
                ));
            }
        }
        let pure = !doc
            .shells
            .iter()
            .any(|s| s.starts_with(&format!("{room}/")));
        if !pure {
            continue;
        }
        for dep in deps.iter().filter(|d| !d.starts_with("gpu-warden-")) {
            if !doc.pure_deps.contains(dep) {
                bad.push(format!(
                    "{manifest}: the pure room `{room}` depends on `{dep}`, which \
                     docs/architecture.md does not list for pure rooms"
                ));
            }
        }
        let clippy = format!("src/{room}/clippy.toml");
        let Ok(bans) = std::fs::read_to_string(root.join(&clippy)) else {
            bad.push(format!(
                "{clippy}: missing: a pure room bans std's I/O through clippy"
            ));
            continue;
        };
        let bans = banned_paths(&bans);
        for want in banned_paths(&root_clippy) {
            if !bans.contains(&want) {
                bad.push(format!(
                    "{clippy}: lacks the root clippy.toml's `{want}` (clippy reads the nearest file only)"
                ));
            }
        }
        for prefix in PURE_BANS {
            if !bans.iter().any(|b| b.starts_with(prefix)) {
                bad.push(format!("{clippy}: bans nothing under `{prefix}`"));
            }
        }
    }
    bad
}
