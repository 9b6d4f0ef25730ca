//! What docs/architecture.md says the code looks like: the rooms table (who may import whom),
//! the shells list, the I/O and runtime crates only shells may use, the crates a pure
//! room may depend on, and kube's typed calls only `kubeapi` may make. The page is the source
//! of truth; the checks read it rather than repeating it.

use std::collections::{BTreeMap, BTreeSet};

pub struct Doc {
    /// Room → the rooms it may import (`None`: all).
    pub rooms: BTreeMap<String, Option<BTreeSet<String>>>,
    /// Files of `src/` that may use I/O.
    pub shells: BTreeSet<String>,
    /// Paths only shells may name: a crate (`tokio`) or a module of `std` (`std::fs`), as
    /// segments.
    pub io: Vec<Vec<String>>,
    /// The crates outside the workspace a pure room's manifest may name.
    pub pure_deps: BTreeSet<String>,
    /// Paths only the `kubeapi` room may name: kube's generic typed calls.
    pub kubeapi_only: Vec<Vec<String>>,
}

fn between<'a>(text: &'a str, tag: &str) -> Result<&'a str, String> {
    let open = format!("<!-- {tag} -->");
    let close = format!("<!-- /{tag} -->");
    let start = text
        .find(&open)
        .ok_or_else(|| format!("docs/architecture.md lacks {open}"))?;
    let end = text[start..]
        .find(&close)
        .ok_or_else(|| format!("docs/architecture.md lacks {close}"))?;
    Ok(&text[start + open.len()..start + end])
}

/// The backticked words of `text`.
fn quoted(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

pub fn parse(text: &str) -> Result<Doc, String> {
    let mut rooms = BTreeMap::new();
    for line in between(text, "rooms")?.lines() {
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
    let shells = quoted(between(text, "shells")?)
        .map(str::to_string)
        .collect();
    let segments = |p: &str| p.split("::").map(str::to_string).collect();
    let io = quoted(between(text, "io")?).map(segments).collect();
    let kubeapi_only = quoted(between(text, "kubeapi-only")?)
        .map(segments)
        .collect();
    let pure_deps = quoted(between(text, "pure-deps")?)
        .map(str::to_string)
        .collect();
    Ok(Doc {
        rooms,
        shells,
        io,
        pure_deps,
        kubeapi_only,
    })
}
